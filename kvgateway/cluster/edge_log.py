"""The log as an edge holds it: JetStream's stream sequences as offsets, the stream's identity as
the epoch, the recent part in a ring; older parts are fetched from JetStream on demand and lent to
the log for one synchronous subscribe (:meth:`EdgeLog.extended`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from itertools import chain

from kvgateway.log.filters import EventFilterKey
from kvgateway.log.messages import OutMessage
from kvgateway.log.ordered import MemoryLog, Record
from kvgateway.log.ring import Entry, Ring


class OffsetGap(Exception):
    """A record did not come at the next offset (the stream lost messages under this edge)."""


class EdgeLog(MemoryLog):
    def __init__(
        self, max_messages: int, max_bytes: int, *, retained: Callable[[int, int], None] | None = None
    ) -> None:
        super().__init__(max_messages, max_bytes, retained=retained)
        self.epoch = "unknown"
        self._bounds = (max_messages, max_bytes)
        self._lent: Sequence[Entry] = ()
        self._scratch = Ring(0, 0)  # filtered variants of lent entries: cached on them, not counted
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def report_to(self, retained: Callable[[int, int], None]) -> None:
        """Where the ring's size goes after each append (the hub's gauges, made after this log)."""
        self._retained = retained

    def start_at(self, epoch: str, first_offset: int) -> None:
        """Before any record: the stream's epoch and the offset of the first record to come."""
        self.epoch = epoch
        self.ring = Ring(*self._bounds, first_offset=first_offset)
        self._offset = first_offset - 1

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

    # --- entries lent from JetStream ----------------------------------------------------------

    @contextlib.contextmanager
    def extended(self, entries: Sequence[Entry]) -> Iterator[None]:
        """Within the block, the log also holds ``entries`` (contiguous, ending where the ring
        begins or inside it): a client subscribed here gets its backlog from them and the ring."""
        self._lent = entries
        try:
            yield
        finally:
            self._lent = ()

    @property
    def first_offset(self) -> int:
        if self._lent:
            return self._lent[0].offset
        return self.ring.first_offset

    def read(self, after: int) -> Iterator[Entry]:
        if not self._lent:
            return self.ring.since(after)
        ring_first = self.ring.first_offset
        lent = (entry for entry in self._lent if after < entry.offset < ring_first)
        return chain(lent, self.ring.since(max(after, ring_first - 1)))

    def message_for(self, entry: Entry, key: EventFilterKey | None) -> OutMessage | None:
        if entry.offset < self.ring.first_offset:
            return self._scratch.message_for(entry, key)
        return super().message_for(entry, key)
