"""The ordered log: the seam between ingest and everything downstream.

Ingest appends records (a delivered batch, or a notice about a stream) to an :class:`Appender`;
the log assigns each its offset in one sequence for the whole gateway, under an epoch it owns, and
renders its message at that offset. Downstream reads only from the :class:`Log`: the occupancy
index, the status board, the routers' state and the hub follow it (called for every entry, in
offset order, as it is appended), and a resuming client reads from an offset. Nothing downstream
reaches back into ingest.

:class:`MemoryLog` is the one log the serving half follows, in one process and on an edge alike:
what it can be read back from is bounded (the resume :class:`~kvgateway.log.ring.Ring`); an edge
gives it a :class:`ReadBack` (its JetStream stream) for what is older than the ring. In a cluster
the ingest half appends to a publisher instead; records carry no offset and their events are
already encoded, so they are sent as they are.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from itertools import chain
from typing import Any, Final, Protocol, TypeAlias

import msgspec

from kvgateway.engine import wire
from kvgateway.engine.wire import Stream
from kvgateway.log.ring import Entry, Ring
from kvgateway.log.status import StreamStatus
from kvgateway.protocol import messages, render
from kvgateway.protocol.filters import EventFilterKey, EventKey
from kvgateway.protocol.messages import EncodedEvents, OutMessage


class BatchRecord(msgspec.Struct, frozen=True, gc=False):
    """A batch delivered by a stream's sequencer: encoded for clients once, and as the index needs it.

    A Struct (built in C: a frozen dataclass's ``__init__`` cost 2 us a batch), untracked by the
    garbage collector like the batch it holds: nothing in it leads back to it."""

    stream: Stream
    seq: int
    batch: wire.Batch  # what the index applies
    received: float  # when the gateway received it (the index's rates)
    replayed: bool  # replayed history stays out of the index's rates
    events: EncodedEvents  # the events' JSON, encoded once
    keys: tuple[EventKey, ...]  # each event's filter key


@dataclass(frozen=True, slots=True)
class NoticeRecord:
    """Something happened to a stream (restart, unrecovered_gap, stale, degraded, up, down);
    ``fields`` are the kind's own (:func:`kvgateway.protocol.messages.encode_stream_notice`).

    One kind carries the ingest's whole view of the stream: ``status``
    (:meth:`kvgateway.log.status.StreamStatus.report`), appended whenever that view changes in a
    way batches and other notices do not say (a connection, a diagnosis, a counter). The serving
    half's status board takes it as it is; a client gets the stream's /v1/sources entry at that
    moment (a ``status`` notice)."""

    stream: Stream
    kind: str
    fields: dict[str, Any]


STATUS: Final = "status"
"""The notice kind that carries a stream's status through the log."""


Record: TypeAlias = BatchRecord | NoticeRecord
Follower: TypeAlias = Callable[[Entry], None]


def batch_record(stream: Stream, seq: int, batch: wire.Batch, *, received: float, replayed: bool) -> BatchRecord:
    """The record of a delivered batch: its events' JSON and filter keys written here, once, in
    one pass (:func:`kvgateway.protocol.render.events_json`)."""
    events, keys = render.events_json(batch.events)
    return BatchRecord(stream, seq, batch, received, replayed, events, keys)


def make_entry(epoch: str, offset: int, record: Record) -> Entry:
    """``record``'s entry at ``offset`` of ``epoch``: its message rendered as every log renders it.

    Raises :class:`kvgateway.protocol.messages.NoticeError` for a wrong notice."""
    if type(record) is BatchRecord:
        encoded = render.batch_message(
            epoch, offset, record.stream, seq=record.seq, ts=record.batch.ts, events=record.events
        )
        message = encoded.message
        return Entry(offset, record.stream, message, encoded, record.keys, len(message.data), record)
    assert type(record) is NoticeRecord
    source, dp_rank = record.stream
    fields = record.fields
    if record.kind == STATUS:  # the client's form: the stream's /v1/sources entry at that moment
        status = StreamStatus.from_report(source, dp_rank, fields)
        stale_reason = fields["stale_reason"]
        fields = {"status": status.to_json(fields["at"], stale_reason is not None, stale_reason)}
    message = messages.encode_stream_notice(
        record.kind, epoch=epoch, offset=offset, source=source, dp_rank=dp_rank, fields=fields
    )
    return Entry(offset, record.stream, message, None, (), len(message.data), record)


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
        self.epoch = secrets.token_hex(8)
        """Random per process: ids from another process (or before a restart) are not recovered."""
        self._bounds = (max_messages, max_bytes)
        self.ring = Ring(max_messages, max_bytes)
        self._followers: list[Follower] = []
        self._read_back = read_back
        self._offset = 0
        self._fed = False  # a checkpoint loads only into followers that applied nothing
        self._lent: Sequence[Entry] = ()
        self._scratch = Ring(0, 0)  # filtered variants of lent entries: cached on them, not counted

    def start_at(self, epoch: str, first_offset: int) -> None:
        """Before any record (an edge): the stream's epoch and the offset of the first record to come."""
        self.epoch = epoch
        self.ring = Ring(*self._bounds, first_offset=first_offset)
        self._offset = first_offset - 1

    @property
    def last_offset(self) -> int:
        return self._offset

    @property
    def first_offset(self) -> int:
        if self._lent:
            return self._lent[0].offset
        return self.ring.first_offset

    @property
    def fed(self) -> bool:
        """Whether a record has been appended since the log started."""
        return self._fed

    def follow(self, follower: Follower) -> None:
        self._followers.append(follower)

    def append(self, record: Record) -> int:
        """Add ``record`` at the next offset: into the ring, to every follower, then the ring
        trimmed to its bounds; returns the offset. Raises
        :class:`kvgateway.protocol.messages.NoticeError` (and assigns nothing) for a wrong notice."""
        offset = self._offset + 1
        if type(record) is BatchRecord:  # make_entry's batch case in line: a Python call fewer a batch
            stream = record.stream
            batch = render.batch_message(
                self.epoch, offset, stream, seq=record.seq, ts=record.batch.ts, events=record.events
            )
            message = batch.message
            entry = Entry(offset, stream, message, batch, record.keys, len(message.data), record)
        else:
            entry = make_entry(self.epoch, offset, record)
        self._offset = offset
        self._fed = True
        ring = self.ring
        held = ring.append(entry)  # the oldest dropped already if the count bound has no room for it
        for follower in self._followers:
            follower(entry)
        # Followers have applied the record; the ring keeps the messages only (the decoded batch
        # would hold memory and give the garbage collector thousands of lists to walk).
        entry.record = None
        if held > ring.max_messages or ring.bytes > ring.max_bytes:
            ring.trim()  # after the followers: a message larger than the bound is still delivered live
        if self._read_back is not None:
            self._read_back.appended(offset)
        return offset

    def append_at(self, offset: int, record: Record) -> None:
        """Append the record stored elsewhere at ``offset`` (an edge); one already applied (a
        repeat after a consumer reset) is ignored. Raises :class:`OffsetGap`."""
        if offset <= self._offset:
            return
        if offset != self._offset + 1:
            raise OffsetGap(f"expected offset {self._offset + 1}, the stream delivered {offset}")
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
        if self._read_back is None or self._fed:
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
        if offset > self._offset:
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
