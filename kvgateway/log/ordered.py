"""The ordered log: the seam between ingest and everything downstream.

Ingest appends records (a delivered batch, or a notice about a stream); the log assigns each its
offset in one sequence for the whole gateway, under an epoch it owns, and renders its message at
that offset. Downstream reads only from the log: the occupancy index and the hub follow it (called
for every entry, in offset order, as it is appended), and a resuming client reads from an offset.
Nothing downstream reaches back into ingest.

:class:`MemoryLog` is the log of one process: offsets count from 1, the epoch is random per
process, and what it can still be read from is bounded (the resume :class:`~kvgateway.log.ring.Ring`).
A log shared between processes (NATS JetStream: its stream sequence is the offset) implements the
same :class:`Log` interface; records carry no offset and their events are already encoded, so
they can be sent as they are.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeAlias

from kvgateway.engine import wire
from kvgateway.engine.wire import Stream
from kvgateway.log import messages, render
from kvgateway.log.filters import EventFilterKey, EventKey, event_key
from kvgateway.log.messages import EncodedEvents, OutMessage
from kvgateway.log.ring import Entry, Ring
from kvgateway.log.status import StreamStatus


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A batch delivered by a stream's sequencer: encoded for clients once, and as the index needs it."""

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
    ``fields`` are the kind's own (:func:`kvgateway.log.messages.encode_stream_notice`).

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
    """The record of a delivered batch: its events rendered and encoded here, once."""
    events = batch.events
    return BatchRecord(
        stream,
        seq,
        batch,
        received,
        replayed,
        messages.encode_events(render.render_events(events)),
        tuple(event_key(event) for event in events),
    )


def hand_over(entry: Entry, ring: Ring, followers: list[Follower], retained: Callable[[int, int], None] | None) -> None:
    """The one way a log that keeps a ring adds an entry: into the ring, to every follower, then
    the ring trimmed to its bounds."""
    ring.append(entry)
    for follower in followers:
        follower(entry)
    # Followers have applied the record; the ring keeps the messages only (the decoded batch
    # would hold memory and give the garbage collector thousands of lists to walk).
    entry.record = None
    ring.trim()  # after the followers: a message larger than the bound is still delivered live
    if retained is not None:
        retained(len(ring), ring.bytes)


def make_entry(epoch: str, offset: int, record: Record) -> Entry:
    """``record``'s entry at ``offset`` of ``epoch``: its message rendered as every log renders it.

    Raises :class:`kvgateway.log.messages.NoticeError` for a wrong notice."""
    source, dp_rank = record.stream
    if type(record) is BatchRecord:
        encoded = messages.encode_batch(
            epoch=epoch,
            offset=offset,
            source=source,
            dp_rank=dp_rank,
            seq=record.seq,
            ts=record.batch.ts,
            events=record.events,
        )
        message = encoded.message
        return Entry(offset, record.stream, message, encoded, record.keys, len(message.data), record)
    assert type(record) is NoticeRecord
    fields = record.fields
    if record.kind == STATUS:  # the client's form: the stream's /v1/sources entry at that moment
        status = StreamStatus.from_report(source, dp_rank, fields)
        stale_reason = fields["stale_reason"]
        fields = {"status": status.to_json(fields["at"], stale_reason is not None, stale_reason)}
    message = messages.encode_stream_notice(
        record.kind, epoch=epoch, offset=offset, source=source, dp_rank=dp_rank, fields=fields
    )
    return Entry(offset, record.stream, message, None, (), len(message.data), record)


class Log(Protocol):
    """What ingest appends to and downstream reads from."""

    @property
    def epoch(self) -> str:
        """Names this log's offsets: an id from another epoch cannot be resumed."""

    @property
    def last_offset(self) -> int:
        """The offset of the last record (0 before any)."""

    @property
    def first_offset(self) -> int:
        """The oldest offset still readable (``last_offset + 1`` when none is)."""

    def append(self, record: Record) -> int:
        """Add a record; its offset. Followers have seen it when this returns."""

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


class MemoryLog:
    """The log of one process, readable back as far as its ring holds (bounded by count and bytes)."""

    def __init__(
        self,
        max_messages: int = 10_000,
        max_bytes: int = 64 * 2**20,
        *,
        retained: Callable[[int, int], None] | None = None,
    ) -> None:
        self.epoch = secrets.token_hex(8)
        """Random per process: ids from another process (or before a restart) are not recovered."""
        self.ring = Ring(max_messages, max_bytes)
        self._followers: list[Follower] = []
        self._retained = retained  # reports (messages, bytes) held after each append
        self._offset = 0

    @property
    def last_offset(self) -> int:
        return self._offset

    @property
    def first_offset(self) -> int:
        return self.ring.first_offset

    def follow(self, follower: Follower) -> None:
        self._followers.append(follower)

    def append(self, record: Record) -> int:
        """Raises :class:`kvgateway.log.messages.NoticeError` (and assigns nothing) for a wrong notice."""
        offset = self._offset + 1
        entry = make_entry(self.epoch, offset, record)
        self._offset = offset
        hand_over(entry, self.ring, self._followers, self._retained)
        return offset

    def read(self, after: int) -> Iterator[Entry]:
        return self.ring.since(after)

    def holding(self, last_event_id: str | None) -> AbstractAsyncContextManager[None]:
        return HELD  # everything this log can serve is in its ring already

    async def checkpoint(self) -> bytes | None:
        return None  # a process's own log starts with the process

    def message_for(self, entry: Entry, key: EventFilterKey | None) -> OutMessage | None:
        ring = self.ring
        held = ring.bytes
        message = ring.message_for(entry, key)
        if ring.bytes != held and self._retained is not None:
            self._retained(len(ring), ring.bytes)  # a new variant counts towards the bound
        return message


class _Held(AbstractAsyncContextManager[None]):
    """A log that holds everything it serves: entering waits for nothing (and allocates nothing)."""

    async def __aexit__(self, *exc_info: object) -> None:
        return None


HELD: Final = _Held()
