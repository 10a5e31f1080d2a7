"""The resume ring (:class:`Ring`) and the append that fills it (:class:`RingAppender`, held by
:class:`kvgateway.log.ordered.MemoryLog`): the pure-Python reference of the compiled
``_ring_c.pyx``, which the gateway runs where it was built (the same API, entries, offsets, bounds
and calls: tests/unit/log/test_ring_differential.py).

Every record the log takes passes through :meth:`RingAppender.append` (in one process and on an
edge alike): its entry made at the next offset, kept, handed to every follower, the ring trimmed.
Interpreted, the append and the ring's were the two largest Python frames of a batch's path (about
190 opcodes); compiled, the ring and the appender are extension types whose fields are C fields,
and a Struct's fields are read from their slots (docs/performance.md, round twenty).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice

from kvgateway.log.entry import Entry, Follower
from kvgateway.log.records import BatchRecord, Record, make_entry
from kvgateway.protocol import render
from kvgateway.protocol.filters import EventFilterKey, select
from kvgateway.protocol.messages import OutMessage


class Ring:
    """The recent messages, offsets contiguous, bounded by count and by encoded bytes.

    Filtered variants are cached on their entry and count towards the byte bound too (it is a
    memory bound). A message larger than the whole byte bound is still delivered live but is not
    kept.
    """

    def __init__(self, max_messages: int, max_bytes: int, *, first_offset: int = 1) -> None:
        if max_messages < 0 or max_bytes < 0:
            raise ValueError("ring bounds must be >= 0")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._entries: deque[Entry] = deque()
        self._next = first_offset  # offset 0 is "before any message"; a shared log may start later
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def first_offset(self) -> int:
        """Offset of the oldest message held (last offset + 1 when empty)."""
        return self._next - len(self._entries)

    @property
    def last_offset(self) -> int:
        return self._next - 1

    def append(self, entry: Entry) -> int:
        """Add the next message, the oldest dropped first while the count bound leaves it no room;
        returns how many are held (``len``). Call :meth:`trim` once its fan-out is done if it
        holds more than either bound allows (the fan-out's variants count towards the bytes; a
        ring bounded to no message holds the new one until then): the messages kept are the same
        as if all were dropped then."""
        if entry.offset != self._next:
            raise ValueError(f"ring expected offset {self._next}, got {entry.offset}")
        entries = self._entries
        held = len(entries)
        while held and held >= self.max_messages:  # oldest first: dropped by the trim after anyway
            self.bytes -= entries.popleft().size
            held -= 1
        entries.append(entry)
        self._next += 1
        self.bytes += entry.size
        return held + 1

    def trim(self) -> int:
        """Drop the oldest messages beyond the bounds; returns how many are held (``len``)."""
        entries = self._entries
        while entries and (len(entries) > self.max_messages or self.bytes > self.max_bytes):
            self.bytes -= entries.popleft().size
        return len(entries)

    def since(self, offset: int) -> Iterator[Entry]:
        """Every entry after ``offset`` (which must satisfy ``first_offset - 1 <= offset``)."""
        start = offset + 1 - self.first_offset
        if start < 0:
            raise ValueError(f"offset {offset} is no longer in the ring")
        return islice(self._entries, start, None)

    def message_for(self, entry: Entry, key: EventFilterKey | None) -> OutMessage | None:
        """What a client with this event filter gets for ``entry``; None when no event passes."""
        if key is None or entry.batch is None:
            return entry.message
        variants = entry.variants
        if variants is None:
            variants = entry.variants = {}
        elif key in variants:
            return variants[key]
        chosen = select(entry.keys, key[0], key[1])
        variant = entry.batch.select(chosen) if chosen else None
        variants[key] = variant
        if variant is not None and variant is not entry.message:
            entry.size += len(variant.data)
            self.bytes += len(variant.data)
        return variant


class RingAppender:
    """The appending half of the ring log: its epoch, the last offset, the ring, the followers, and
    ``appended``, told each offset once its record is applied (an edge's read-back: what a resume
    ahead of the log waits for). The log (:class:`~kvgateway.log.ordered.MemoryLog`) reads and sets
    these for everything else it does."""

    def __init__(self, ring: Ring, epoch: str, *, appended: Callable[[int], None] | None = None) -> None:
        self.ring = ring
        self.epoch = epoch
        self.offset = ring.last_offset
        """The last offset appended (the ring's last before any)."""
        self.followers: list[Follower] = []
        self.appended = appended
        self.fed = False
        """Whether a record has been appended since the log started."""

    def append(self, record: Record) -> int:
        """Add ``record`` at the next offset: into the ring, to every follower, then the ring
        trimmed to its bounds; returns the offset. Raises
        :class:`kvgateway.protocol.messages.NoticeError` (and assigns nothing) for a wrong notice."""
        offset = self.offset + 1
        if type(record) is BatchRecord:  # make_entry's batch case in line: a Python call fewer a batch
            stream = record.stream
            batch = render.batch_message(
                self.epoch, offset, stream, seq=record.seq, ts=record.batch.ts, events=record.events
            )
            message = batch.message
            entry = Entry(offset, stream, message, batch, record.keys, len(message.data), record)
        else:
            entry = make_entry(self.epoch, offset, record)
        self.offset = offset
        self.fed = True
        ring = self.ring
        held = ring.append(entry)  # the oldest dropped already if the count bound has no room for it
        for follower in self.followers:
            follower(entry)
        # Followers have applied the record; the ring keeps the messages only (the decoded batch
        # would hold memory and give the garbage collector thousands of lists to walk).
        entry.record = None
        if held > ring.max_messages or ring.bytes > ring.max_bytes:
            ring.trim()  # after the followers: a message larger than the bound is still delivered live
        if self.appended is not None:
            self.appended(offset)
        return offset
