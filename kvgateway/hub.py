"""The gateway's ordered stream to web clients: epoch + offset, resume ring, filters, client queues.

Every message that concerns a stream (a batch or a stream notice) gets the next offset, is encoded
once, kept in a ring bounded by count and bytes, and appended to the queue of every subscribed
client whose filter matches. Publishing never awaits a client: each client has its own queue,
bounded by bytes, and a client that lets it overflow is cut ("slow_consumer").

The parts are plain code (``parse_query``, ``ClientFilter``, ``resume_after``, ``Ring``); the
only asyncio in here is the future a :class:`Subscription` waits on.

Ordering contract for callers: apply a batch to the occupancy index and publish it to the hub in
one synchronous step (no ``await`` in between), so that ``snapshot(offset)`` called by
:meth:`Hub.subscribe` describes exactly the state after message ``offset``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from time import perf_counter
from typing import Any, Final, Literal, Protocol, TypeAlias, runtime_checkable

from kvgateway import messages, wire
from kvgateway.mediums import medium_tier, normalise_medium
from kvgateway.messages import EncodedBatch, OutMessage
from kvgateway.metrics import Metrics

log = logging.getLogger("kvgateway.hub")

Transport: TypeAlias = Literal["ws", "sse"]
CloseReason: TypeAlias = Literal["closed", "slow_consumer", "error", "shutdown"]
Stream: TypeAlias = tuple[str, int]
EventFilterKey: TypeAlias = tuple[frozenset[str] | None, frozenset[str] | None]
"""(types, mediums) of a filter that looks inside batches; the cache key of a filtered variant."""

CHUNK_BYTES: Final = 256 * 1024
"""At most this much per ``next_chunk`` (one frame / one write), unless a single message is larger."""

WS_CLOSE: Final[dict[str, tuple[int, str]]] = {
    "slow_consumer": (1013, "slow consumer"),
    "too_many_clients": (1013, "too many clients"),
    "shutdown": (1012, "gateway shutting down"),
}
"""WebSocket close code and reason for each way the gateway ends a connection (docs/protocol.md)."""

_ANY_MEDIUM: Final = "*"  # AllBlocksCleared clears every medium: it passes any medium filter


class BadRequest(ValueError):
    """Invalid query parameters; ``message`` is one line naming the parameter (HTTP 400)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TooManyClients(Exception):
    """No room for another client (HTTP 503 before the upgrade, or close 1013 after)."""


# --- filters and query parameters ---------------------------------------------------------

EventKey: TypeAlias = tuple[str, str | None, str | None]
"""(type, medium, tier) of one event as filters see it. The medium is normalised as the occupancy
index does it (:func:`kvgateway.mediums.normalise_medium`: upper case, "GPU" for None or empty)
and the tier is its :func:`kvgateway.mediums.medium_tier`; both are "*" for AllBlocksCleared and
None for an unknown event without a string ``medium`` (it passes no medium filter)."""

_interned: dict[EventKey, EventKey] = {}


def event_key(event: wire.Event) -> EventKey:
    if type(event) is wire.BlockStored or type(event) is wire.BlockRemoved:
        raw: str | None = event.medium
        key: EventKey = (event.type, normalise_medium(raw), medium_tier(raw))
    elif type(event) is wire.AllBlocksCleared:
        key = (wire.CLEARED, _ANY_MEDIUM, _ANY_MEDIUM)
    else:
        assert type(event) is wire.UnknownEvent
        found = event.body.get("medium") if isinstance(event.body, dict) else None
        if isinstance(found, str):
            key = (event.type, normalise_medium(found), medium_tier(found))
        else:
            key = (event.type, None, None)
    # a ring holds many events but few distinct keys: share the tuples
    if len(_interned) < 4096:
        return _interned.setdefault(key, key)
    return _interned.get(key, key)


def _select(keys: Sequence[EventKey], types: frozenset[str] | None, names: frozenset[str] | None) -> list[int]:
    """Indices of the keys that pass. A ``medium=`` value matches an event's medium name or its tier:
    ``CPU`` (a tier name) passes CPU and CPU_PINNED, ``CPU_PINNED`` only CPU_PINNED."""
    return [
        i
        for i, (kind, medium, tier) in enumerate(keys)
        if (types is None or kind in types)
        and (names is None or medium == _ANY_MEDIUM or (medium is not None and (medium in names or tier in names)))
    ]


@dataclass(frozen=True, slots=True)
class ClientFilter:
    """What a client asked for; None means "everything". Values are ORed, parameters ANDed."""

    sources: frozenset[str] | None = None
    dp_ranks: frozenset[int] | None = None
    types: frozenset[str] | None = None
    mediums: frozenset[str] | None = None  # upper-cased medium or tier names (a tier name matches its tier)

    def matches_stream(self, source: str, dp_rank: int) -> bool:
        return (self.sources is None or source in self.sources) and (self.dp_ranks is None or dp_rank in self.dp_ranks)

    @property
    def event_key(self) -> EventFilterKey | None:
        """None when the filter does not look inside batches (the unfiltered message fits)."""
        if self.types is None and self.mediums is None:
            return None
        return (self.types, self.mediums)

    def matches_event(self, event: wire.Event) -> bool:
        return bool(_select((event_key(event),), self.types, self.mediums))

    def select_events(self, events: Sequence[wire.Event]) -> list[wire.Event]:
        """The events of a batch this filter passes, in order (stream notices are never filtered)."""
        chosen = _select([event_key(event) for event in events], self.types, self.mediums)
        return [events[i] for i in chosen]


@dataclass(frozen=True, slots=True)
class ClientRequest:
    filter: ClientFilter
    last_event_id: str | None = None


@runtime_checkable
class MultiItems(Protocol):
    """Starlette's ``QueryParams`` (every value of a repeated parameter, in order)."""

    def multi_items(self) -> list[tuple[str, str]]: ...


QueryInput: TypeAlias = Mapping[str, Sequence[str]] | MultiItems

PARAMETERS: Final = ("source", "dp_rank", "type", "medium", "last_event_id", "token")
"""Every query parameter a stream endpoint accepts; any other name is a 400 (catches typos).
``token`` is the auth layer's and ignored here."""
MAX_VALUES: Final = 64
"""Distinct values per repeatable parameter."""

_RANK_RE: Final = re.compile(r"[0-9]{1,9}")
_TYPE_RE: Final = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_MEDIUM_RE: Final = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def _show(value: str) -> str:
    """A client-supplied value for an error message: quoted, escaped to one line, shortened."""
    return repr(value[:64]) + ("..." if len(value) > 64 else "")


def _query_items(params: QueryInput) -> Iterator[tuple[str, str]]:
    # QueryParams is a Mapping too, but its items() keeps only the last value of each name
    if isinstance(params, MultiItems):
        yield from params.multi_items()
        return
    for name, values in params.items():
        if isinstance(values, str):
            yield name, values
        else:
            for value in values:
                yield name, value


def parse_query(
    params: QueryInput, *, sources: Iterable[str] | None = None, last_event_id: str | None = None
) -> ClientRequest:
    """The filter and resume point of a stream request; raises :class:`BadRequest`.

    ``sources``: the configured source names (None: any name). ``last_event_id``: the SSE
    ``Last-Event-ID`` header, which wins over the query parameter (EventSource sends it on
    reconnect, the query parameter serves the first connection). A malformed id is not an error:
    it just cannot be recovered.
    """
    known = None if sources is None else frozenset(sources)
    chosen_sources: set[str] = set()
    ranks: set[int] = set()
    types: set[str] = set()
    mediums: set[str] = set()
    resume_ids: list[str] = []
    for name, value in _query_items(params):
        if name == "source":
            if known is not None and value not in known:
                raise BadRequest(f"source: unknown source {_show(value)}")
            chosen_sources.add(value)
            _check_count(name, chosen_sources)
        elif name == "dp_rank":
            if _RANK_RE.fullmatch(value) is None:
                raise BadRequest(f"dp_rank: expected a non-negative integer, got {_show(value)}")
            ranks.add(int(value))
            _check_count(name, ranks)
        elif name == "type":
            if _TYPE_RE.fullmatch(value) is None:
                raise BadRequest(f"type: expected an event type name (letters, digits, _.:-), got {_show(value)}")
            types.add(value)
            _check_count(name, types)
        elif name == "medium":
            if _MEDIUM_RE.fullmatch(value) is None:
                raise BadRequest(f"medium: expected a medium name (letters, digits, _.:-), got {_show(value)}")
            mediums.add(value.upper())
            _check_count(name, mediums)
        elif name == "last_event_id":
            resume_ids.append(value)
            if len(resume_ids) > 1:
                raise BadRequest("last_event_id: given more than once")
        elif name != "token":
            raise BadRequest(f"unknown query parameter {_show(name)} (accepted: {', '.join(PARAMETERS)})")
    resume = last_event_id or (resume_ids[0] if resume_ids else None)
    client_filter = ClientFilter(
        sources=frozenset(chosen_sources) or None,
        dp_ranks=frozenset(ranks) or None,
        types=frozenset(types) or None,
        mediums=frozenset(mediums) or None,
    )
    return ClientRequest(filter=client_filter, last_event_id=resume or None)


def _check_count(name: str, values: set[Any]) -> None:
    if len(values) > MAX_VALUES:
        raise BadRequest(f"{name}: more than {MAX_VALUES} distinct values")


# --- resume -------------------------------------------------------------------------------


def resume_after(last_event_id: str, *, epoch: str, first_offset: int, last_offset: int) -> int | None:
    """The offset to replay after, or None when the client cannot be recovered.

    Recovered only when the id names this epoch and every message after it is still held
    (``first_offset - 1 <= offset <= last_offset``): all or nothing, never a partial replay.
    """
    parsed = messages.parse_message_id(last_event_id)
    if parsed is None or parsed[0] != epoch:
        return None
    offset = parsed[1]
    return offset if first_offset - 1 <= offset <= last_offset else None


class _Entry:
    """One ring message: the unfiltered encoding, and for a batch what filtering needs."""

    __slots__ = ("batch", "keys", "message", "offset", "size", "stream", "variants")

    def __init__(
        self, offset: int, stream: Stream, message: OutMessage, batch: EncodedBatch | None, keys: tuple[EventKey, ...]
    ) -> None:
        self.offset = offset
        self.stream = stream
        self.message = message
        self.batch = batch  # None for a notice: event filters do not apply to notices
        self.keys = keys
        self.variants: dict[EventFilterKey, OutMessage | None] | None = None
        self.size = len(message.data)


class Ring:
    """The recent messages, offsets contiguous, bounded by count and by encoded bytes.

    Filtered variants are cached on their entry and count towards the byte bound too (it is a
    memory bound). A message larger than the whole byte bound is still delivered live but is not
    kept.
    """

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        if max_messages < 0 or max_bytes < 0:
            raise ValueError("ring bounds must be >= 0")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._entries: deque[_Entry] = deque()
        self._next = 1  # offset 0 is "before any message"
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

    def append(self, entry: _Entry) -> None:
        """Add the next message; call :meth:`trim` once its fan-out is done."""
        if entry.offset != self._next:
            raise ValueError(f"ring expected offset {self._next}, got {entry.offset}")
        self._entries.append(entry)
        self._next += 1
        self.bytes += entry.size

    def trim(self) -> None:
        entries = self._entries
        while entries and (len(entries) > self.max_messages or self.bytes > self.max_bytes):
            self.bytes -= entries.popleft().size

    def since(self, offset: int) -> Iterator[_Entry]:
        """Every entry after ``offset`` (which must satisfy ``first_offset - 1 <= offset``)."""
        start = offset + 1 - self.first_offset
        if start < 0:
            raise ValueError(f"offset {offset} is no longer in the ring")
        return islice(self._entries, start, None)

    def message_for(self, entry: _Entry, key: EventFilterKey | None) -> OutMessage | None:
        """What a client with this event filter gets for ``entry``; None when no event passes."""
        if key is None or entry.batch is None:
            return entry.message
        variants = entry.variants
        if variants is None:
            variants = entry.variants = {}
        elif key in variants:
            return variants[key]
        chosen = _select(entry.keys, key[0], key[1])
        variant = entry.batch.select(chosen) if chosen else None
        variants[key] = variant
        if variant is not None and variant is not entry.message:
            entry.size += len(variant.data)
            self.bytes += len(variant.data)
        return variant


# --- clients ------------------------------------------------------------------------------


class Subscription:
    """One connected client: its filter, its bounded queue, and what ended it.

    The route sends ``hello`` (or ``hello_message``) first, loops on :meth:`next_chunk` until it
    returns None, then looks at ``closed_reason`` (:meth:`farewell` for SSE, ``WS_CLOSE`` for
    WebSocket) and finally calls :meth:`close`.
    """

    __slots__ = (
        "_credit",
        "_event_key",
        "_hub",
        "_limit",
        "_queue",
        "_queued",
        "_sent",
        "_waiter",
        "closed_reason",
        "filter",
        "hello",
        "hello_message",
        "offset",
        "recovered",
        "transport",
        "writing",
    )

    def __init__(
        self,
        hub: Hub,
        *,
        client_filter: ClientFilter,
        transport: Transport,
        hello: OutMessage,
        offset: int,
        recovered: bool,
    ) -> None:
        self._hub = hub
        self.filter = client_filter
        self._event_key = client_filter.event_key
        self.transport: Transport = transport
        self.hello_message = hello  # with its id (for the SSE id: line) and cached text / SSE forms
        self.hello = hello.data
        self.offset = offset  # the hello's offset: where the client stands before its first chunk
        self.recovered = recovered
        self.closed_reason: CloseReason | None = None
        self._queue: deque[OutMessage] = deque()
        self._queued = 0
        self._credit = 0  # resume backlog bytes still queued: not held against the bound
        self._limit = hub.client_queue_bytes
        self._sent = hub.metrics.messages_sent.labels(transport)
        self._waiter: asyncio.Future[None] | None = None
        # Set by the route while it awaits a write to the client's socket. Only then is a full
        # queue the client's fault: a writer that is merely waiting for its turn on a busy loop
        # drains its queue at that turn.
        self.writing = False

    @property
    def queued_bytes(self) -> int:
        return self._queued

    def _prime(self, backlog: Iterable[OutMessage]) -> None:
        for message in backlog:
            self._queue.append(message)
            self._queued += len(message.data)
        self._credit = self._queued

    def _push(self, message: OutMessage) -> bool:
        """Queue a live message; False when the client is too slow for it (never blocks)."""
        size = len(message.data)
        live = self._queued - self._credit
        # a single message larger than the bound still goes into an empty queue
        if live > 0 and live + size > self._limit and self.writing:
            return False
        self._queue.append(message)
        self._queued += size
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
        return True

    async def next_chunk(self, max_bytes: int = CHUNK_BYTES, idle: float | None = None) -> list[OutMessage] | None:
        """Wait for at least one message, then return every queued one up to ``max_bytes``.

        None once the subscription is closed (by the route, the hub's shutdown, or for
        slowness); a closed subscription's queue is dropped, not flushed. With ``idle``: an empty
        list when nothing came for that many seconds (the SSE keepalive).
        """
        queue = self._queue
        while not queue:
            if self.closed_reason is not None:
                return None
            if self._waiter is not None:
                raise RuntimeError("next_chunk() is already being awaited")
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiter = waiter
            timer = None if idle is None else loop.call_later(idle, _wake_idle, waiter)
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
                if timer is not None:
                    timer.cancel()
            if idle is not None and not queue and self.closed_reason is None:
                return []
        self._hub.metrics.client_queue_bytes.observe(self._queued)
        first = queue.popleft()
        chunk = [first]
        size = len(first.data)
        while queue and size + len(queue[0].data) <= max_bytes:
            message = queue.popleft()
            chunk.append(message)
            size += len(message.data)
        self._queued -= size
        self._credit = max(0, self._credit - size)  # the exempt messages are at the front
        self._sent.inc(len(chunk))  # counted when handed to the route
        return chunk

    def farewell(self) -> OutMessage | None:
        """The slow_consumer notice an SSE route writes last; None unless cut for slowness."""
        return self._hub.slow_consumer_notice if self.closed_reason == messages.SLOW_CONSUMER else None

    def close(self, reason: CloseReason = "closed") -> None:
        """Unregister (idempotent: the first reason is the one counted)."""
        if self.closed_reason is not None:
            return
        self.closed_reason = reason
        self._queue.clear()
        self._queued = self._credit = 0
        self._hub._forget(self, reason)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)


def _wake_idle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


# --- the hub ------------------------------------------------------------------------------


class Hub:
    """The ordered stream of one gateway process, and its clients (use from the event loop's thread)."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        sources: Sequence[Stream],
        snapshot: Callable[[int], dict[str, Any]],
        statuses: Callable[[], list[dict[str, Any]]],
        ring_messages: int = 10_000,
        ring_bytes: int = 64 * 2**20,
        client_queue_bytes: int = 2**20,
        max_clients: int = 1000,
    ) -> None:
        if client_queue_bytes <= 0 or max_clients < 0:
            raise ValueError("client_queue_bytes must be > 0 and max_clients >= 0")
        self.metrics = metrics
        self.epoch = secrets.token_hex(8)
        """Random per process: ids from another process (or before a restart) are not recovered."""
        self.ring = Ring(ring_messages, ring_bytes)
        self.client_queue_bytes = client_queue_bytes
        self.max_clients = max_clients
        self.source_names = frozenset(name for name, _ in sources)
        self.slow_consumer_notice = messages.encode_slow_consumer(client_queue_bytes)
        self._snapshot = snapshot
        self._statuses = statuses
        self._offset = 0
        self._closed = False
        self._clients: dict[Subscription, None] = {}
        # subscribers per stream, so a publish visits only the clients that want it
        self._by_stream: dict[Stream, dict[Subscription, None]] = {stream: {} for stream in sources}
        self._broadcast = metrics.broadcast_seconds
        metrics.ring_messages.set(0)
        metrics.ring_bytes.set(0)

    @property
    def offset(self) -> int:
        """The last offset assigned (0 before any message)."""
        return self._offset

    @property
    def client_count(self) -> int:
        return len(self._clients)

    def can_accept(self) -> bool:
        return not self._closed and len(self._clients) < self.max_clients

    def parse_query(self, params: QueryInput, *, last_event_id: str | None = None) -> ClientRequest:
        """:func:`parse_query` against this hub's configured source names."""
        return parse_query(params, sources=self.source_names, last_event_id=last_event_id)

    # publishing

    def publish_batch(self, source: str, dp_rank: int, seq: int, batch: wire.Batch) -> int:
        """Encode a delivered batch once, keep it, queue it for every matching client; its offset."""
        offset = self._offset + 1
        encoded = messages.encode_batch(
            epoch=self.epoch,
            offset=offset,
            source=source,
            dp_rank=dp_rank,
            seq=seq,
            ts=batch.ts,
            events=wire.render_events(batch.events),
        )
        keys = tuple(event_key(event) for event in batch.events)
        self._offset = offset
        self._fan_out(_Entry(offset, (source, dp_rank), encoded.message, encoded, keys))
        return offset

    def publish_notice(self, kind: str, source: str, dp_rank: int, **fields: Any) -> int:
        """A stream notice (restart, unrecovered_gap, degraded, up, down); its offset.

        Raises :class:`messages.NoticeError` for an unknown kind or wrong fields.
        """
        offset = self._offset + 1
        message = messages.encode_stream_notice(
            kind, epoch=self.epoch, offset=offset, source=source, dp_rank=dp_rank, fields=fields
        )
        self._offset = offset
        self._fan_out(_Entry(offset, (source, dp_rank), message, None, ()))
        return offset

    def _fan_out(self, entry: _Entry) -> None:
        started = perf_counter()
        ring = self.ring
        ring.append(entry)
        subscribers = self._by_stream.get(entry.stream)
        if subscribers is None:  # a stream outside the configuration: index it on first use
            subscribers = self._by_stream[entry.stream] = {
                sub: None for sub in self._clients if sub.filter.matches_stream(*entry.stream)
            }
        slow: list[Subscription] | None = None
        for sub in subscribers:
            key = sub._event_key
            message = entry.message if key is None else ring.message_for(entry, key)
            if message is not None and not sub._push(message):
                if slow is None:
                    slow = []
                slow.append(sub)
        if slow is not None:  # not inside the loop: closing edits the dict being iterated
            for sub in slow:
                log.warning(
                    "%s client cut off as a slow consumer: %d bytes queued, limit %d",
                    sub.transport,
                    sub.queued_bytes,
                    self.client_queue_bytes,
                )
                sub.close("slow_consumer")
        ring.trim()
        self._broadcast.observe(perf_counter() - started)
        self._update_ring_gauges()

    def _update_ring_gauges(self) -> None:
        self.metrics.ring_messages.set(len(self.ring))
        self.metrics.ring_bytes.set(self.ring.bytes)

    # clients

    def subscribe(self, request: ClientRequest, transport: Transport) -> Subscription:
        """Register a client. Its ``hello`` is ready to send; when recovered, the missed messages
        that match its filter are already queued for :meth:`Subscription.next_chunk`.

        Synchronous on purpose: deciding the resume point, taking the snapshot, copying the backlog
        and registering for live messages happen with no publish in between, so the hand-over has
        no gap and no duplicate. Raises :class:`TooManyClients` (the route counts the rejection).
        """
        if self._closed:
            raise TooManyClients("the gateway is shutting down")
        if len(self._clients) >= self.max_clients:
            raise TooManyClients(f"the gateway already serves {self.max_clients} clients")
        ring = self.ring
        after: int | None = None
        if request.last_event_id is not None:
            after = resume_after(
                request.last_event_id, epoch=self.epoch, first_offset=ring.first_offset, last_offset=self._offset
            )
            self.metrics.resumes.labels(transport, "true" if after is not None else "false").inc()
        recovered = after is not None
        offset = self._offset if after is None else after
        hello = messages.encode_hello(
            epoch=self.epoch,
            offset=offset,
            recovered=recovered,
            sources=self._statuses(),
            occupancy=None if recovered else self._snapshot(offset),
        )
        client_filter = request.filter
        sub = Subscription(
            self, client_filter=client_filter, transport=transport, hello=hello, offset=offset, recovered=recovered
        )
        backlog: list[OutMessage] = []
        if after is not None:
            key = sub._event_key
            for entry in ring.since(after):
                if client_filter.matches_stream(*entry.stream):
                    message = ring.message_for(entry, key)
                    if message is not None:
                        backlog.append(message)
            self._update_ring_gauges()
        sub._prime(backlog)
        self._clients[sub] = None
        for stream, subscribers in self._by_stream.items():
            if client_filter.matches_stream(*stream):
                subscribers[sub] = None
        self.metrics.clients.labels(transport).inc()
        return sub

    def _forget(self, sub: Subscription, reason: CloseReason) -> None:
        if sub in self._clients:
            del self._clients[sub]
            for subscribers in self._by_stream.values():
                subscribers.pop(sub, None)
            self.metrics.clients.labels(sub.transport).dec()
            self.metrics.client_disconnects.labels(sub.transport, reason).inc()

    def close(self) -> None:
        """Refuse new clients and close every subscription with reason "shutdown"."""
        self._closed = True
        for sub in list(self._clients):
            sub.close("shutdown")
