"""The record format and the edge's log, without I/O: what an edge rebuilds from the stream is what
the single process had (same message bytes at the same offset, same index)."""

from __future__ import annotations

import pytest

from kvgateway.cluster import records
from kvgateway.engine import wire
from kvgateway.log.ordered import MemoryLog
from kvgateway.log.records import NoticeRecord, batch_record
from kvgateway.state.occupancy import OccupancyIndex
from tests.support import events

EVENTS: list[wire.Event] = [
    wire.BlockStored([1, 2, b"\x00\xff"], None, [5, 6, 7], 16, medium="cpu", extra={"group_idx": 2, "x": [1]}),
    wire.BlockRemoved([1], medium=None, extra={"group_idx": True}),
    wire.UnknownEvent("Future", {"medium": "GPU", "n": 1}),
    wire.AllBlocksCleared(),
    wire.BlockStored([9], 1, [], 0),
]


def batch(seq: int, happened: list[wire.Event] = EVENTS) -> wire.Batch:
    return events.batch(*happened, ts=1700000000.5 + seq, dp_rank=None)


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
        edge.append_at(offset, records.to_record(records.decode(records.encode_record(record, generation=4))))
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
        records.decode(b"\x93\x01\x02")
