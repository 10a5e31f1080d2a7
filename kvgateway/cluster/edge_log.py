"""The log as an edge holds it (a :class:`~kvgateway.log.ordered.Log`): JetStream's stream
sequences as offsets, the stream's identity as the epoch, the recent part in a ring. An older part
a client resumes from is fetched from JetStream and lent to the log for one synchronous subscribe
(:meth:`EdgeLog.holding`), so the hub has one resume path whatever the log."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from itertools import chain

from kvgateway.log import messages
from kvgateway.log.filters import EventFilterKey
from kvgateway.log.messages import OutMessage
from kvgateway.log.ordered import Follower, Record, hand_over, make_entry
from kvgateway.log.ring import Entry, Ring

AHEAD_WAIT_SECONDS = 5.0
"""A client whose id is ahead of this edge (it read a faster edge) waits this long for it."""

MAX_STREAM_RESUME = 200_000
"""A resume further back than this many messages before the ring is not recovered: the backlog is
held in memory for the client (exempt from its queue bound, as a ring backlog is)."""

Load = Callable[[], Awaitable[tuple[str, int, bytes] | None]]
"""The latest checkpoint in the stream's store: (epoch, offset, bytes), or None."""

Fetch = Callable[[int, int], Awaitable[list[Entry]]]
"""Entries ``first..last`` (or fewer: an empty list when ``first`` has expired) read back from the stream."""


class OffsetGap(Exception):
    """A record did not come at the next offset (the stream lost messages under this edge)."""


class EdgeLog:
    def __init__(
        self, max_messages: int, max_bytes: int, *, retained: Callable[[int, int], None] | None = None
    ) -> None:
        self.epoch = "unknown"
        self._bounds = (max_messages, max_bytes)
        self.ring = Ring(max_messages, max_bytes)
        self._offset = 0
        self._followers_fed = False  # a checkpoint loads only into followers that applied nothing
        self._followers: list[Follower] = []
        self._retained = retained  # reports (messages, bytes) held after each append
        self._lent: Sequence[Entry] = ()
        self._scratch = Ring(0, 0)  # filtered variants of lent entries: cached on them, not counted
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.fetch: Fetch | None = None
        """How older entries are read back from JetStream (the edge sets it once connected)."""
        self.load: Load | None = None
        """How the latest checkpoint is read (the edge sets it when checkpoints are on)."""

    def report_to(self, retained: Callable[[int, int], None]) -> None:
        """Where the ring's size goes after each append (the hub's gauges, made after this log)."""
        self._retained = retained

    def start_at(self, epoch: str, first_offset: int) -> None:
        """Before any record: the stream's epoch and the offset of the first record to come."""
        self.epoch = epoch
        self.ring = Ring(*self._bounds, first_offset=first_offset)
        self._offset = first_offset - 1

    @property
    def last_offset(self) -> int:
        return self._offset

    @property
    def fed(self) -> bool:
        """Whether a record has been appended since the log started."""
        return self._followers_fed

    @property
    def first_offset(self) -> int:
        if self._lent:
            return self._lent[0].offset
        return self.ring.first_offset

    def follow(self, follower: Follower) -> None:
        self._followers.append(follower)

    def append(self, record: Record) -> int:
        """The next offset's record (an edge appends with :meth:`append_at`)."""
        offset = self._offset + 1
        self._followers_fed = True
        entry = make_entry(self.epoch, offset, record)
        self._offset = offset
        hand_over(entry, self.ring, self._followers, self._retained)
        return offset

    def append_at(self, offset: int, record: Record) -> None:
        """Append the record JetStream stored at ``offset``; raises :class:`OffsetGap`."""
        if offset <= self._offset:
            return  # delivered again after a consumer reset: already applied
        if offset != self._offset + 1:
            raise OffsetGap(f"expected offset {self._offset + 1}, the stream delivered {offset}")
        self.append(record)
        if self._waiters:
            ready = [w for w in self._waiters if w[0] <= offset]
            self._waiters = [w for w in self._waiters if w[0] > offset]
            for _, future in ready:
                if not future.done():
                    future.set_result(None)

    async def reached(self, offset: int, within: float) -> bool:
        """Wait until the log holds ``offset``; False after ``within`` seconds."""
        if offset <= self._offset:
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((offset, future))
        try:
            await asyncio.wait_for(future, within)
        except TimeoutError:
            return False
        return True

    # --- reading back -----------------------------------------------------------------------

    def read(self, after: int) -> Iterator[Entry]:
        if not self._lent:
            return self.ring.since(after)
        ring_first = self.ring.first_offset
        lent = (entry for entry in self._lent if after < entry.offset < ring_first)
        return chain(lent, self.ring.since(max(after, ring_first - 1)))

    def message_for(self, entry: Entry, key: EventFilterKey | None) -> OutMessage | None:
        ring = self.ring if entry.offset >= self.ring.first_offset else self._scratch
        held = ring.bytes
        message = ring.message_for(entry, key)
        if ring is self.ring and ring.bytes != held and self._retained is not None:
            self._retained(len(ring), ring.bytes)  # a new variant counts towards the bound
        return message

    def holding(self, last_event_id: str | None) -> AbstractAsyncContextManager[None]:
        return self._holding(last_event_id)

    async def checkpoint(self) -> bytes | None:
        """After :meth:`start_at`, before any record: the latest checkpoint of this stream (its
        epoch) whose offset the stream still holds everything after; the log then starts right
        after it."""
        if self.load is None or self._followers_fed:
            return None
        found = await self.load()
        if found is None:
            return None
        epoch, offset, data = found
        if epoch != self.epoch or offset < self.ring.first_offset - 1:
            return None  # another stream's, or older than what the stream still holds after it
        self.start_at(epoch, offset + 1)
        return data

    @contextlib.asynccontextmanager
    async def _holding(self, last_event_id: str | None) -> AsyncIterator[None]:
        """An id ahead of this edge waits for the edge to reach it; an id older than the ring has
        its range fetched from JetStream and lent to the log for the block (no await inside it:
        nothing is appended between the fetch and the subscribe)."""
        parsed = None if last_event_id is None else messages.parse_message_id(last_event_id)
        if parsed is None or parsed[0] != self.epoch:
            yield
            return
        offset = parsed[1]
        if offset > self._offset:
            await self.reached(offset, AHEAD_WAIT_SECONDS)
            yield
            return
        lent: list[Entry] = []
        if self.fetch is not None and self.ring.first_offset - 1 - offset <= MAX_STREAM_RESUME:
            while offset + len(lent) < self.ring.first_offset - 1:
                wanted = offset + len(lent) + 1
                more = await self.fetch(wanted, self.ring.first_offset - 1)
                if not more or more[0].offset != wanted:  # expired from the stream: not recovered
                    lent = []
                    break
                lent.extend(more)
        self._lent = lent
        try:
            yield
        finally:
            self._lent = ()
