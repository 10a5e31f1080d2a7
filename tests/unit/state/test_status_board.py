"""The status board without sockets: statuses derived from the log's records alone (one process and
every edge of a cluster run this same code over the same records)."""

from __future__ import annotations

from typing import Any

from kvgateway.config import StreamConfig
from kvgateway.engine.wire import AllBlocksCleared, Batch
from kvgateway.ingest.outlet import StreamOutlet
from kvgateway.log.ordered import MemoryLog
from kvgateway.log.records import STATUS, NoticeRecord, batch_record
from kvgateway.log.status import StreamStatus
from kvgateway.state.occupancy import OccupancyIndex
from kvgateway.state.status_board import INGEST_UNREACHABLE, StatusBoard
from tests.support import events


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def config(source: str = "a", dp_rank: int = 0) -> StreamConfig:
    return StreamConfig(source, dp_rank, f"tcp://{source}:5557", f"tcp://{source}:5558", "", False, {})


def board_over_log(*streams: StreamConfig, silence: float | None = None) -> tuple[MemoryLog, StatusBoard, Clock]:
    clock = Clock()
    log = MemoryLog()
    index = OccupancyIndex()
    log.follow(index.follow)
    board = StatusBoard(streams, index, silence=silence, clock=clock)
    log.follow(board.follow)
    return log, board, clock


def report(stream: StreamConfig, **changes: Any) -> dict[str, Any]:
    status = StreamStatus(stream)
    for name, value in changes.items():
        setattr(status, name, value)
    return status.report(None, 999.0)


def batch(seq: int, *happened: Any, ts: float = 999.5) -> Batch:
    """The batch of ``seq``: ``happened``, or a store of block ``seq + 1``."""
    return events.batch(*(happened or [events.stored(seq + 1, tokens=[1, 2], block_size=2)]), ts=ts)


def test_a_status_record_replaces_the_status_and_batches_after_it_move_it_on() -> None:
    stream = config()
    log, board, clock = board_over_log(stream)
    (before,) = board.to_json(clock.now)
    assert (before["state"], before["reason"], before["last_seq"]) == ("down", "never connected", None)
    counters = dict.fromkeys(("batches", "gaps", "missed", "duplicates"), 0) | {"batches": 3, "gaps": 1, "missed": 2}
    log.append(NoticeRecord(stream.key, STATUS, report(stream, connected=True, last_seq=4, counters=counters)))
    log.append(batch_record(stream.key, 5, batch(5), received=1000.0, replayed=False))
    log.append(batch_record(stream.key, 6, batch(6), received=1000.0, replayed=True))
    (after,) = board.to_json(clock.now)
    assert (after["state"], after["connected"], after["reason"], after["last_seq"]) == ("up", True, None, "6")
    assert after["lag_seconds"] == 0.5, "the live batch's lag; the replayed one leaves it"
    assert (after["counters"]["batches"], after["counters"]["replayed"], after["counters"]["gaps"]) == (5, 1, 1)
    assert board.not_ready(clock.now) == []


def test_the_reason_code_travels_with_the_reason_and_an_older_record_gets_the_broadest() -> None:
    stream = config()
    log, board, clock = board_over_log(stream)
    (entry,) = board.to_json(clock.now)
    assert (entry["reason"], entry["reason_code"]) == ("never connected", "never_connected")
    down = report(stream, down_reason="x.invalid does not resolve", down_code="unresolved")
    log.append(NoticeRecord(stream.key, STATUS, down))
    (entry,) = board.to_json(clock.now)
    assert (entry["reason"], entry["reason_code"]) == ("x.invalid does not resolve", "unresolved")
    older = {
        name: value for name, value in down.items() if name != "reason_code"
    }  # an older ingest's, in a cluster's log
    log.append(NoticeRecord(stream.key, STATUS, older))
    (entry,) = board.to_json(clock.now)
    assert (entry["reason"], entry["reason_code"]) == ("x.invalid does not resolve", "disconnected")
    log.append(NoticeRecord(stream.key, STATUS, report(stream, connected=True)))
    (entry,) = board.to_json(clock.now)
    assert (entry["reason"], entry["reason_code"]) == (None, None)


def test_staleness_is_the_indexs_from_the_same_notices() -> None:
    stream = config()
    log, board, clock = board_over_log(stream)
    log.append(NoticeRecord(stream.key, STATUS, report(stream, connected=True)))
    log.append(NoticeRecord(stream.key, "stale", {"reason": "unrecovered", "seq": 3, "detail": "batches lost"}))
    (entry,) = board.to_json(clock.now)
    assert (entry["state"], entry["stale"], entry["stale_reason"]) == ("stale", True, "unrecovered")
    log.append(batch_record(stream.key, 9, batch(9, AllBlocksCleared()), received=1000.0, replayed=False))
    (entry,) = board.to_json(clock.now)
    assert (entry["state"], entry["stale"], entry["stale_reason"]) == ("up", False, None)


def test_a_stream_the_configuration_does_not_list_is_listed_from_its_first_status_record() -> None:
    known, other = config("a"), config("b", 1)
    log, board, clock = board_over_log(known)
    log.append(batch_record(other.key, 0, batch(0), received=1000.0, replayed=False))
    assert board.streams == [known.key], "a batch alone does not list a stream: its status is unknown"
    log.append(NoticeRecord(other.key, STATUS, report(other, connected=True, last_seq=0)))
    assert board.streams == [known.key, other.key]
    entry = board.to_json(clock.now)[1]
    assert (entry["source"], entry["dp_rank"], entry["endpoint"], entry["replay"]) == (
        "b",
        1,
        "tcp://b:5557",
        "tcp://b:5558",
    )


def test_a_stream_not_heard_from_within_the_silence_is_down_ingest_unreachable_until_it_is() -> None:
    stream = config()
    log, board, clock = board_over_log(stream, silence=15.0)
    log.append(NoticeRecord(stream.key, STATUS, report(stream, connected=True)))
    clock.now += 15.0
    assert board.to_json(clock.now)[0]["state"] == "up", "within the bound"
    clock.now += 0.5
    (entry,) = board.to_json(clock.now)
    assert (entry["state"], entry["connected"], entry["reason"]) == ("down", False, INGEST_UNREACHABLE)
    assert board.not_ready(clock.now) == [{"source": "a", "dp_rank": 0, "reason": INGEST_UNREACHABLE}]
    shown = board.status(stream.key, clock.now)
    assert shown is not None and not shown.connected
    held = board.status(stream.key)
    assert held is not None and held.connected, "the last report itself is kept as it was"
    log.append(NoticeRecord(stream.key, STATUS, report(stream, connected=True)))  # the ingest is back
    assert board.to_json(clock.now)[0]["state"] == "up"


def test_one_process_never_shows_a_stream_unreachable_for_its_silence() -> None:
    stream = config()
    log, board, clock = board_over_log(stream)  # no silence: the ingest half is in this process
    log.append(NoticeRecord(stream.key, STATUS, report(stream, connected=True)))
    clock.now += 3600
    assert board.to_json(clock.now)[0]["state"] == "up"


def test_the_outlets_heartbeat_reports_an_unchanged_status_again() -> None:
    stream = config()
    log, board, clock = board_over_log(stream, silence=15.0)
    outlet = StreamOutlet(stream, log, clock=clock)
    outlet.connection(True, "connected", "connected")
    offset = log.last_offset
    outlet.report()
    assert log.last_offset == offset, "nothing changed: no record"
    clock.now += 10
    outlet.heartbeat()
    assert log.last_offset == offset + 1
    clock.now += 10
    assert board.to_json(clock.now)[0]["state"] == "up", "heard 10 s ago, not 20"
