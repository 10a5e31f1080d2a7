"""The ordered log: the seam between ingest and everything downstream.

Ingest appends records (a delivered batch, or a notice about a stream) to an :class:`Appender`;
the log assigns each its offset in one sequence for the whole gateway, under an epoch it owns, and
renders its message at that offset. Downstream reads only from the :class:`Log`: the occupancy
index, the status board, the routers' state and the hub follow it (called for every entry, in
offset order, as it is appended), and a resuming client reads from an offset. Nothing downstream
reaches back into ingest.

:class:`MemoryLog` is the one log the serving half follows, in one process and on an edge alike:
what it can be read back from is bounded (the resume :class:`~kvgateway.log.ring.Ring`, which its
:class:`~kvgateway.log.ring.RingAppender` fills); an edge gives it a :class:`ReadBack` (its
JetStream stream) for what is older than the ring. In a cluster the ingest half appends to a
publisher instead; records carry no offset and their events are already encoded, so they are sent
as they are. What the log carries is :mod:`kvgateway.log.records`'.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from itertools import chain
from typing import Final, Protocol

from kvgateway.log.entry import Entry, Follower
from kvgateway.log.records import Record, make_entry
from kvgateway.log.ring import Ring, RingAppender
from kvgateway.protocol import messages
from kvgateway.protocol.filters import EventFilterKey
from kvgateway.protocol.messages import OutMessage


class Appender(Protocol):
    """What the ingest half writes to: the single process's log, or the cluster's publisher."""

    def append(self, record: Record) -> object:
        """Add a record (what it returns is the implementation's own: a log's offset)."""


class Log(Protocol):
    """What the serving half follows and reads back from (:class:`MemoryLog`, in both modes)."""

    @property
    def epoch(self) -> str:
        """Names this log's offsets: an id from another epoch cannot be resumed."""

    @property
    def last_offset(self) -> int:
        """The offset of the last record (0 before any)."""

    @property
    def first_offset(self) -> int:
        """The oldest offset still readable (``last_offset + 1`` when none is)."""

    def read(self, after: int) -> Iterator[Entry]:
        """Every entry after ``after`` (``first_offset - 1 <= after``), in order."""

    def message_for(self, entry: Entry, key: EventFilterKey | None) -> OutMessage | None:
        """``entry``'s message for a client with this event filter; None when no event passes."""

    def follow(self, follower: Follower) -> None:
        """Call ``follower`` with every entry appended from now on, in offset order."""

    def holding(self, last_event_id: str | None) -> AbstractAsyncContextManager[None]:
        """Within the block, :meth:`read` serves a client resuming after ``last_event_id``: a log
        whose older part lives elsewhere fetches it, one behind the id waits to reach it. Use no
        await inside the block (what is held is lent for one synchronous subscribe)."""

    async def checkpoint(self) -> bytes | None:
        """Before anything is followed: the latest checkpoint of what its followers derived
        (:mod:`kvgateway.state.checkpoint`) that this log can go on from, the log then positioned
        right after it; None when there is none (the followers start from the log's first
        record)."""


class ReadBack(Protocol):
    """Where a ring log's records are also kept, longer than its ring (an edge's JetStream stream):
    the part of the log that does I/O, given to :class:`MemoryLog`."""

    async def records(self, first: int, last: int) -> list[tuple[int, Record]]:
        """The records at offsets ``first..last`` (or fewer, contiguous from ``first``; none when
        ``first`` has expired)."""

    async def checkpoint(self) -> tuple[str, int, bytes] | None:
        """The latest checkpoint kept beside the records: (epoch, offset, bytes), or None."""

    async def reached(self, offset: int) -> bool:
        """Wait (a while) until the log has appended ``offset``; False when it has not."""

    def appended(self, offset: int) -> None:
        """Told after each append: what :meth:`reached` waits for."""


class OffsetGap(Exception):
    """A record did not come at the next offset (the stream lost messages under this log)."""


MAX_READ_BACK = 200_000
"""A resume further back than this many messages before the ring is not recovered: the backlog is
held in memory for the client (exempt from its queue bound, as a ring backlog is)."""


class MemoryLog:
    """The ring log: the single process's (offsets from 1, a random epoch per process) and an
    edge's (JetStream's sequences as offsets, the stream's identity as the epoch, :meth:`start_at`),
    readable back as far as its ring holds (bounded by count and bytes), and, given a
    :class:`ReadBack`, from where its records are also kept: an older part a client resumes from is
    fetched and lent to the log for one synchronous subscribe (:meth:`holding`)."""

    def __init__(
        self,
        max_messages: int = 10_000,
        max_bytes: int = 64 * 2**20,
        *,
        read_back: ReadBack | None = None,
    ) -> None:
        self._bounds = (max_messages, max_bytes)
        # Random per process: ids from another process (or before a restart) are not recovered.
        self._appender = RingAppender(
            Ring(max_messages, max_bytes),
            secrets.token_hex(8),
            appended=None if read_back is None else read_back.appended,
        )
        # Ingest's call a record goes to the appender itself: no Python frame of the log's.
        self.append = self._appender.append
        """Add a record at the next offset: into the ring, to every follower, then the ring trimmed to
        its bounds; returns the offset. Raises :class:`kvgateway.protocol.messages.NoticeError` (and
        assigns nothing) for a wrong notice."""
        self._read_back = read_back
        self._lent: Sequence[Entry] = ()
        self._scratch = Ring(0, 0)  # filtered variants of lent entries: cached on them, not counted

    def start_at(self, epoch: str, first_offset: int) -> None:
        """Before any record (an edge): the stream's epoch and the offset of the first record to come."""
        appender = self._appender
        appender.epoch = epoch
        appender.ring = Ring(*self._bounds, first_offset=first_offset)
        appender.offset = first_offset - 1

    @property
    def epoch(self) -> str:
        """Names this log's offsets: an id from another epoch cannot be resumed."""
        return self._appender.epoch

    @property
    def ring(self) -> Ring:
        """The recent messages, readable back."""
        return self._appender.ring

    @property
    def last_offset(self) -> int:
        return self._appender.offset

    @property
    def first_offset(self) -> int:
        if self._lent:
            return self._lent[0].offset
        return self.ring.first_offset

    @property
    def fed(self) -> bool:
        """Whether a record has been appended since the log started (a checkpoint loads only into
        followers that applied nothing)."""
        return self._appender.fed

    def follow(self, follower: Follower) -> None:
        self._appender.followers.append(follower)

    def append_at(self, offset: int, record: Record) -> None:
        """Append the record stored elsewhere at ``offset`` (an edge); one already applied (a
        repeat after a consumer reset) is ignored. Raises :class:`OffsetGap`."""
        last = self._appender.offset
        if offset <= last:
            return
        if offset != last + 1:
            raise OffsetGap(f"expected offset {last + 1}, the stream delivered {offset}")
        self.append(record)

    def read(self, after: int) -> Iterator[Entry]:
        if not self._lent:
            return self.ring.since(after)
        ring_first = self.ring.first_offset
        lent = (entry for entry in self._lent if after < entry.offset < ring_first)
        return chain(lent, self.ring.since(max(after, ring_first - 1)))

    def message_for(self, entry: Entry, key: EventFilterKey | None) -> OutMessage | None:
        ring = self.ring if entry.offset >= self.ring.first_offset else self._scratch
        return ring.message_for(entry, key)  # a new variant counts towards the ring's bytes bound

    def held(self) -> tuple[int, int]:
        """The messages and encoded bytes its ring holds now (the ring gauges, read when scraped:
        nothing is reported per append)."""
        ring = self.ring
        return len(ring), ring.bytes

    def holding(self, last_event_id: str | None) -> AbstractAsyncContextManager[None]:
        if self._read_back is None or last_event_id is None:
            return HELD  # everything this log can serve is in its ring already
        return self._holding(self._read_back, last_event_id)

    async def checkpoint(self) -> bytes | None:
        """Before any record: the latest checkpoint kept beside the records, of this log's epoch,
        that the records still go on from; the log then starts right after it."""
        if self._read_back is None or self._appender.fed:
            return None  # a process's own log starts with the process
        found = await self._read_back.checkpoint()
        if found is None:
            return None
        epoch, offset, data = found
        if epoch != self.epoch or offset < self.ring.first_offset - 1:
            return None  # another stream's, or older than what the stream still holds after it
        self.start_at(epoch, offset + 1)
        return data

    @asynccontextmanager
    async def _holding(self, read_back: ReadBack, last_event_id: str) -> AsyncIterator[None]:
        """An id ahead of this log waits for it to get there; an id older than the ring has its
        range read back and lent to the log for the block (no await inside it: nothing is
        appended between the read and the subscribe)."""
        parsed = messages.parse_message_id(last_event_id)
        if parsed is None or parsed[0] != self.epoch:
            yield
            return
        offset = parsed[1]
        if offset > self._appender.offset:
            await read_back.reached(offset)
            yield
            return
        self._lent = await self._read_older(read_back, offset)
        try:
            yield
        finally:
            self._lent = ()

    async def _read_older(self, read_back: ReadBack, offset: int) -> list[Entry]:
        """The entries after ``offset`` older than the ring, all of them or none. The ring moves on
        while they are read (appends trim it): read until they meet it as it is then."""
        lent: list[Entry] = []
        if self.ring.first_offset - 1 - offset > MAX_READ_BACK:
            return lent
        while offset + len(lent) < self.ring.first_offset - 1:
            wanted = offset + len(lent) + 1
            more = await read_back.records(wanted, self.ring.first_offset - 1)
            if not more or more[0][0] != wanted:  # expired from the stream: not recovered
                return []
            lent.extend(make_entry(self.epoch, at, record) for at, record in more)
        return lent


class _Held(AbstractAsyncContextManager[None]):
    """A log that holds everything it serves: entering waits for nothing (and allocates nothing)."""

    async def __aexit__(self, *exc_info: object) -> None:
        return None


HELD: Final = _Held()
