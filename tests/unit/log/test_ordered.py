"""kvgateway.log.ordered: the ring log, given its offsets by the stream (an edge), refuses a hole,
ignores a repeat, and lends a resuming client the entries older than its ring from a read-back."""

from __future__ import annotations

import asyncio

import pytest

from kvgateway.log.entry import Entry
from kvgateway.log.ordered import MemoryLog, OffsetGap
from kvgateway.log.records import NoticeRecord, Record, batch_record, make_entry
from tests.support import events


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


def test_an_appended_batch_is_the_entry_make_entry_makes() -> None:
    """The log's append (its RingAppender's) makes a batch's entry in line (a call fewer a batch):
    the entry make_entry makes, which a read-back's lent entries and a notice still get."""
    batch = events.batch(events.stored(1, 2, block_size=2), events.removed(3, medium="CPU"), ts=12.5)
    record = batch_record(("s", 1), 7, batch, received=13.0, replayed=False)
    log = MemoryLog()
    followed: list[tuple[Entry, object]] = []
    log.follow(lambda entry: followed.append((entry, entry.record)))
    log.append(NoticeRecord(("s", 1), "up", {"reason": "connected"}))
    log.append(record)
    (entry, followed_record), made = followed[1], make_entry(log.epoch, 2, record)
    assert followed_record is record and entry.record is None  # dropped once followed
    assert entry.batch is not None and made.batch is not None
    assert (entry.offset, entry.stream, entry.message.id, entry.message.data, entry.keys, entry.size) == (
        made.offset,
        made.stream,
        made.message.id,
        made.message.data,
        made.keys,
        made.size,
    )
    assert entry.batch.select([1]).data == made.batch.select([1]).data
