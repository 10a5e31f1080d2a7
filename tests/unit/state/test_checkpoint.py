"""Index checkpoints without sockets: an index loaded from a checkpoint at offset N and then fed the
log after N equals, at every later offset, the index that was fed the log from the start."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvgateway.config import StreamConfig
from kvgateway.engine.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored
from kvgateway.log.ordered import MemoryLog
from kvgateway.log.records import STATUS, NoticeRecord, Record, batch_record
from kvgateway.log.status import StreamStatus
from kvgateway.state import checkpoint
from kvgateway.state.occupancy import OccupancyIndex
from kvgateway.state.status_board import StatusBoard

STREAMS = [
    StreamConfig("a", 0, "tcp://a:1", None, "", False, {}),
    StreamConfig("b", 1, "tcp://b:1", None, "", False, {}),
]


def serving(clock: float = 1000.0) -> tuple[MemoryLog, OccupancyIndex, StatusBoard]:
    log = MemoryLog(100_000, 2**30)
    index = OccupancyIndex()
    board = StatusBoard(STREAMS, index)
    log.follow(index.follow)
    log.follow(board.follow)
    return log, index, board


def workload(rng: random.Random, count: int) -> list[Record]:
    """Stores (repeats inside a batch and across: reference counts), removes (some unknown), two
    mediums and two groups, clears, a restart, stale marks and status reports, on two streams."""
    pool = [rng.getrandbits(64) for _ in range(60)] + [rng.randbytes(8) for _ in range(10)]
    out: list[Record] = []
    seqs = {config.key: 0 for config in STREAMS}
    for _ in range(count):
        config = rng.choice(STREAMS)
        stream = config.key
        roll = rng.random()
        if roll < 0.04:
            out.append(NoticeRecord(stream, "stale", {"reason": "unrecovered", "seq": seqs[stream], "detail": "lost"}))
            continue
        if roll < 0.06:
            out.append(NoticeRecord(stream, "restart", {"seq": 0, "previous": seqs[stream], "reason": "seq_reset"}))
            continue
        if roll < 0.12:
            status = StreamStatus(config)
            status.connected = rng.random() < 0.8
            status.counters["gaps"] = rng.randint(0, 5)
            out.append(NoticeRecord(stream, STATUS, status.report(None, 1000.0)))
            continue
        medium = rng.choice([None, "GPU", "cpu"])
        extra: dict[str, Any] = {"group_idx": rng.choice([0, 1])}
        events: list[Any]
        if roll < 0.7:
            hashes = rng.choices(pool, k=rng.randint(1, 6))
            events = [BlockStored(hashes, None, [1] * 4 * len(hashes), 4, None, medium, None, extra)]
        elif roll < 0.97:
            events = [BlockRemoved(rng.choices(pool, k=rng.randint(1, 4)), medium, extra)]
        else:
            events = [AllBlocksCleared()]
        batch = Batch(999.0, events, stream[1])
        out.append(batch_record(stream, seqs[stream], batch, received=1000.0, replayed=rng.random() < 0.2))
        seqs[stream] += 1
    return out


def state(index: OccupancyIndex, board: StatusBoard) -> Any:
    """Everything the serving half shows of the blocks and statuses, rates aside."""
    streams = []
    for stream in index.streams():
        groups = [(m, g, size, set(blocks), dict(extra)) for m, g, size, blocks, extra in stream.block_groups()]
        streams.append((stream.source, stream.dp_rank, stream.unknown_removes, stream.stale_reason, groups))
        streams.append(stream.medium_counts())
    statuses = [{k: v for k, v in s.items() if k != "lag_seconds"} for s in board.to_json(1000.0)]
    return streams, statuses


@pytest.mark.parametrize("seed", range(6))
def test_a_checkpoint_then_the_rest_of_the_log_equals_the_whole_log(seed: int) -> None:
    rng = random.Random(seed)
    records = workload(rng, 600)
    cut = rng.randint(50, 550)
    whole_log, whole_index, whole_board = serving()
    for record in records[:cut]:
        whole_log.append(record)
    taken = checkpoint.capture(
        whole_index, whole_board, epoch=whole_log.epoch, offset=whole_log.last_offset, now=1000.0, extra={"k": 1}
    )
    # The whole index goes on changing after the capture: the checkpoint must not (copy on write).
    for record in records[cut:]:
        whole_log.append(record)
    data = checkpoint.encode(taken)

    loaded = checkpoint.decode(data)
    assert (loaded.offset, loaded.epoch, loaded.extra) == (cut, whole_log.epoch, {"k": 1})
    log, index, board = serving()
    checkpoint.restore(loaded, index, board)
    for record in records[cut:]:
        log.append(record)
    assert state(index, board) == state(whole_index, whole_board)


def test_a_checkpoint_of_an_empty_index_and_bad_bytes() -> None:
    _, index, board = serving()
    empty = checkpoint.decode(
        checkpoint.encode(checkpoint.capture(index, board, epoch="e", offset=0, now=1.0, extra={}))
    )
    assert empty.streams == [] and empty.offset == 0
    with pytest.raises(checkpoint.CheckpointError, match="not a kvgateway checkpoint"):
        checkpoint.decode(b"\x93garbage")
    future = checkpoint.encode(checkpoint.Checkpoint(99, "e", 0, 0.0, []))
    with pytest.raises(checkpoint.CheckpointError, match="version 99"):
        checkpoint.decode(future)
