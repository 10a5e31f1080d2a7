"""The record format and the edge's log, without I/O: what an edge rebuilds from the stream is what
the single process had (same message bytes at the same offset, same index)."""

from __future__ import annotations

import asyncio

import pytest

from kvgateway.cluster import records
from kvgateway.engine import wire
from kvgateway.log.ordered import MemoryLog, NoticeRecord, OffsetGap, Record, batch_record
from kvgateway.state.occupancy import OccupancyIndex

EVENTS: list[wire.Event] = [
    wire.BlockStored([1, 2, b"\x00\xff"], None, [5, 6, 7], 16, medium="cpu", extra={"group_idx": 2, "x": [1]}),
    wire.BlockRemoved([1], medium=None, extra={"group_idx": True}),
    wire.UnknownEvent("Future", {"medium": "GPU", "n": 1}),
    wire.AllBlocksCleared(),
    wire.BlockStored([9], 1, [], 0),
]


def batch(seq: int, events: list[wire.Event] = EVENTS) -> wire.Batch:
    return wire.Batch(1700000000.5 + seq, list(events))


def test_a_batch_travels_and_renders_the_same_bytes_and_index() -> None:
    single, edge = MemoryLog(), MemoryLog(100, 2**20)
    edge.start_at(single.epoch, 1)
    index_single, index_edge = OccupancyIndex(), OccupancyIndex()
    single.follow(index_single.follow)
    edge.follow(index_edge.follow)
    sent = [
        batch_record(("a.b", 3), 7, batch(7), received=10.0, replayed=True),
        NoticeRecord(("a.b", 3), "stale", {"reason": "unrecovered", "seq": 7, "detail": "batches lost"}),
        batch_record(("a.b", 3), 8, batch(8, EVENTS[:1]), received=11.0, replayed=False),
    ]
    for offset, record in enumerate(sent, start=1):
        single.append(record)
        edge.append_at(offset, records.decode_record(records.encode_record(record, generation=4)))
    assert [e.message.data for e in edge.read(0)] == [e.message.data for e in single.read(0)]
    assert index_edge.snapshot(3, 20.0) == index_single.snapshot(3, 20.0)
    assert index_edge.stream("a.b", 3).stale


def test_ids_name_a_batch_by_engine_generation_and_seq_and_notices_by_content() -> None:
    record = batch_record(("a b", 0), 5, batch(5), received=1.0, replayed=False)
    ident = records.msg_id(record, 2, 4)
    assert ident == records.msg_id(batch_record(("a b", 0), 5, batch(6), received=2.0, replayed=True), 2, 9)
    assert ident != records.msg_id(record, 3, 4)
    up = NoticeRecord(("a b", 0), "up", {"reason": "connected"})
    assert records.msg_id(up, 2, 4) != records.msg_id(up, 2, 5)
    assert records.msg_id(up, 2, 4) != records.msg_id(NoticeRecord(("a b", 0), "down", {"reason": "x"}), 2, 4)
    assert records.subject("kv", ("a b", 0)).startswith("kv.x") and records.subject("kv", ("s-1", 2)) == "kv.s-1.2"


def test_garbage_is_one_line_error() -> None:
    with pytest.raises(records.RecordError, match="not a kvgateway record"):
        records.decode_record(b"\x93\x01\x02")


class StoredElsewhere:
    """A read-back as JetStream after retention: it holds offsets 10 on, and no checkpoint."""

    def __init__(self, record: Record) -> None:
        self.record = record
        self.asked: list[tuple[int, int]] = []

    async def records(self, first: int, last: int) -> list[tuple[int, Record]]:
        self.asked.append((first, last))
        return [(offset, self.record) for offset in range(first, last + 1)] if first >= 10 else []

    async def checkpoint(self) -> tuple[str, int, bytes] | None:
        return None

    async def reached(self, offset: int) -> bool:
        return False

    def appended(self, offset: int) -> None:
        pass


def test_the_ring_log_refuses_a_hole_ignores_a_repeat_and_lends_older_entries_read_back() -> None:
    record = NoticeRecord(("s", 0), "up", {"reason": "connected"})
    stored = StoredElsewhere(record)
    alone, log = MemoryLog(2, 2**20), MemoryLog(2, 2**20, read_back=stored)
    for ring_log in (alone, log):
        ring_log.start_at("e", 10)
        for offset in (10, 11, 12, 12):
            ring_log.append_at(offset, record)
        with pytest.raises(OffsetGap):
            ring_log.append_at(14, record)
        assert ring_log.first_offset == 11 and ring_log.last_offset == 12

    async def resume(ring_log: MemoryLog, last_event_id: str | None) -> tuple[int, list[int]]:
        async with ring_log.holding(last_event_id):
            return ring_log.first_offset, [e.offset for e in ring_log.read(ring_log.first_offset - 1)]

    assert asyncio.run(resume(alone, "e:9")) == (11, [11, 12]), "no read-back: the ring only"
    assert asyncio.run(resume(log, "e:9")) == (10, [10, 11, 12]), "older than the ring: read back and lent"
    assert asyncio.run(resume(log, "e:11")) == (11, [11, 12]) and stored.asked == [(10, 10)], "in the ring: none"
    assert asyncio.run(resume(log, "other:9")) == (11, [11, 12]) and stored.asked == [(10, 10)], "another epoch"
    assert asyncio.run(resume(log, "e:8")) == (11, [11, 12]), "expired from the stream too: nothing lent"
    assert log.first_offset == 11


def test_the_supervisor_gives_children_the_shared_flags_only() -> None:
    from kvgateway.cluster.supervisor import _server_argv

    argv = ["serve", "--source", "name=a,endpoint=tcp://h:1", "--workers=2", "--port", "8080", "--state-dir", "/s"]
    assert _server_argv([*argv, "--token-file", "t"]) == ["--source", "name=a,endpoint=tcp://h:1", "--token-file", "t"]
    # The ingest has no flags for web clients' settings: they are left out of its command line.
    from kvgateway.config import CLIENT_ONLY

    clients = ["--token-file", "t", "--allow-unauthenticated", "--max-clients=5", "--allowed-origin=o", "--host", "h"]
    assert _server_argv([*argv, *clients], drop=CLIENT_ONLY) == ["--source", "name=a,endpoint=tcp://h:1", "--host", "h"]


def test_a_sequencer_continued_after_a_seq_replays_the_gap_or_sees_a_restart() -> None:
    from kvgateway.engine.sequencer import Deliver, GapDetected, RequestReplay, Restart, Sequencer

    seq = Sequencer(has_replay=True)
    seq.resume_after(10)
    assert seq.on_connected() == []  # no catch-up from 0: the stream has everything up to 10
    actions = seq.on_live(14, batch(14))
    assert GapDetected(11, 13) in actions
    assert any(type(a) is RequestReplay and a.start == 11 for a in actions)
    assert seq.on_live(11, batch(11)) and seq.cursor == 11

    restarted = Sequencer(has_replay=False)
    restarted.resume_after(10)
    restarted.on_connected()
    actions = restarted.on_live(0, batch(0))
    assert any(type(a) is Restart for a in actions)
    assert any(type(a) is Deliver and a.seq == 0 for a in actions)
    with pytest.raises(ValueError, match="before the first connection"):
        restarted.resume_after(3)


def test_a_late_batch_becomes_the_same_stale_notice_live_and_read_back() -> None:
    from kvgateway.cluster.order import OrderGuard

    guard = OrderGuard()

    def wire_batch(seq: int, generation: int = 0) -> records.WireRecord:
        record = batch_record(("s", 0), seq, batch(seq), received=1.0, replayed=False)
        return records.decode(records.encode_record(record, generation))

    assert type(guard.admit(1, wire_batch(5))).__name__ == "BatchRecord"
    assert type(guard.admit(2, wire_batch(7))).__name__ == "BatchRecord"
    late = guard.admit(3, wire_batch(6))
    assert isinstance(late, NoticeRecord) and late.kind == "stale" and late.fields["seq"] == 6
    assert guard.at(3, wire_batch(6)) == late  # a resume reading offset 3 back renders the same
    assert type(guard.at(2, wire_batch(7))).__name__ == "BatchRecord"
    assert type(guard.admit(4, wire_batch(0, generation=1))).__name__ == "BatchRecord"  # a restarted engine
    MemoryLog().append(late)  # a valid notice


def test_a_read_back_goes_on_until_it_meets_the_ring_that_moved_meanwhile() -> None:
    """Records appended while the older part is read trim the ring: what is lent must reach the
    ring as it is when the client subscribes, with no hole between them."""
    record = NoticeRecord(("s", 0), "up", {"reason": "connected"})
    stored = StoredElsewhere(record)
    log = MemoryLog(2, 2**20, read_back=stored)
    log.start_at("e", 10)
    for offset in (10, 11, 12):
        log.append_at(offset, record)

    async def records(first: int, last: int) -> list[tuple[int, Record]]:
        if len(stored.asked) == 0:  # the first read: two more records arrive meanwhile
            log.append_at(13, record)
            log.append_at(14, record)
        stored.asked.append((first, last))
        return [(offset, record) for offset in range(first, last + 1)]

    stored.records = records  # type: ignore[method-assign]

    async def resume() -> list[int]:
        async with log.holding("e:9"):
            return [e.offset for e in log.read(9)]

    assert asyncio.run(resume()) == [10, 11, 12, 13, 14]
    assert stored.asked == [(10, 10), (11, 12)]
