"""The resume ring: the recent messages of the ordered log, bounded by count and bytes, with the
filtered variant of each batch for each event filter that asked, made once and cached."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import islice
from typing import Any

import msgspec

from kvgateway.engine.wire import Stream
from kvgateway.protocol.filters import EventFilterKey, EventKey, select
from kvgateway.protocol.messages import EncodedBatch, OutMessage


class Entry(msgspec.Struct, gc=False, eq=False):
    """One message of the log at its offset: the record, its unfiltered encoding, and for a batch what
    filtering needs.

    Untracked by the garbage collector (``gc=False``, as its messages): the ring holds up to ten
    thousand, and with them tracked every full collection walked them all, a pause of tens of
    milliseconds for every client (:mod:`kvgateway.runtime.memory`). Nothing an entry refers to leads back
    to it, so no cycle needs the collector.
    """

    offset: int
    stream: Stream
    message: OutMessage
    batch: EncodedBatch | None  # None for a notice: event filters do not apply to notices
    keys: tuple[EventKey, ...]
    size: int  # len(message.data)
    record: Any = None  # what was appended (kvgateway.log.ordered.Record), while its followers apply it
    variants: dict[EventFilterKey, OutMessage | None] | None = None


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
