"""One client's subscription, without I/O: its filter, its queue bounded by bytes, and what ended it.

The hub pushes messages; the client's writer (the web layer, which owns the socket, the waiting
and the timers) takes them in chunks and says when a chunk is written. A client is too slow when
a message would take its queue past the bound while the chunk it took last is still being
written: a writer that is merely waiting for its turn on a busy event loop drains its queue at
that turn, one that is stuck in a write does not.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Final, Literal, Protocol, TypeAlias

from kvgateway.protocol import messages
from kvgateway.protocol.filters import ClientFilter
from kvgateway.protocol.messages import OutMessage
from kvgateway.runtime.metrics import HubMetrics

Transport: TypeAlias = Literal["ws", "sse"]
CloseReason: TypeAlias = Literal["closed", "slow_consumer", "error", "shutdown"]


class Owner(Protocol):
    """What a subscription needs of the hub that holds it (the hub imports this module, not the
    other way round)."""

    @property
    def slow_consumer_notice(self) -> OutMessage: ...

    def forget(self, sub: Subscription, reason: CloseReason) -> None: ...


class PendingState(Protocol):
    """A ``snapshot=blocks`` client's state, sent after its hello (kvgateway.serve.router_state.BlockSnapshot)."""

    @property
    def queue_bytes(self) -> int:
        """How much live data may queue behind the state while it is written."""

    def messages(self) -> Iterator[OutMessage]: ...

    def release(self) -> None: ...


CHUNK_BYTES: Final = 256 * 1024
"""At most this much per :meth:`Subscription.take` (one frame / one write), unless a single message is larger."""


class Subscription:
    """One connected client.

    The writer sends ``hello_message`` first; then, whenever :attr:`pending` (it sets
    :attr:`wakeup` to hear of it), it takes a chunk with :meth:`take`, writes it and calls
    :meth:`written`; once ``closed_reason`` is set it writes :meth:`farewell` (SSE) or closes with
    its reason, and finally calls :meth:`close`.
    """

    __slots__ = (
        "_base_limit",
        "_compat",
        "_credit",
        "_gap_last",
        "_hub",
        "_in_flight",
        "_int_seqs",
        "_limit",
        "_metrics",
        "_queue",
        "_queued",
        "_sent",
        "closed_reason",
        "digest_due",
        "digest_every",
        "event_key",
        "filter",
        "hello",
        "hello_message",
        "offset",
        "recovered",
        "snapshot",
        "transport",
        "wakeup",
    )

    def __init__(
        self,
        hub: Owner,
        *,
        client_filter: ClientFilter,
        transport: Transport,
        hello: OutMessage,
        offset: int,
        recovered: bool,
        limit: int,
        metrics: HubMetrics,
        gap_last: bool = False,
        int_seqs: bool = False,
        digest_every: int | None = None,
        snapshot: PendingState | None = None,
    ) -> None:
        self._hub = hub
        # compat=gap_last, compat=int_seqs: each chunk taken has the deprecated forms
        # (messages.with_compat), whether the messages came live or from the resume ring; the
        # queue's byte accounting counts the shared messages, a few bytes off for such a client
        self._gap_last = gap_last
        self._int_seqs = int_seqs
        self._compat = gap_last or int_seqs
        if int_seqs:
            hello = messages.with_int_seqs(hello)
        self.filter = client_filter
        self.event_key = client_filter.event_key
        self.transport: Transport = transport
        self.hello_message = hello  # with its id (for the SSE id: line) and cached text / SSE forms
        self.hello = hello.data
        self.offset = offset  # the hello's offset: where the client stands before its first chunk
        self.recovered = recovered
        self.digest_every = digest_every
        """``digest=SECONDS``: the hub's digest ticker (kvgateway/serve/digests.py) sends this client a
        ``digest`` message per stream every that many seconds, from ``digest_due`` on."""
        self.digest_due = 0.0
        self.snapshot = snapshot
        """``snapshot=blocks``: the state the writer sends after the hello, before any queued message
        (None once sent)."""
        self.closed_reason: CloseReason | None = None
        self.wakeup: Callable[[], None] | None = None
        """Called when a message arrives in an empty queue, and when the subscription closes."""
        self._queue: deque[OutMessage] = deque()
        self._queued = 0
        self._credit = 0  # resume backlog bytes still queued: not held against the bound
        self._limit = limit
        self._base_limit = limit  # the bound again once a hold (the block snapshot) ends
        self._in_flight = False  # a chunk was taken and is not written yet
        self._metrics = metrics
        self._sent = metrics.sent[transport]
        if snapshot is not None:  # live messages queue behind the state until it is written
            self.hold(snapshot.queue_bytes)

    @property
    def queued_bytes(self) -> int:
        return self._queued

    @property
    def pending(self) -> bool:
        """Whether :meth:`take` has something to hand out."""
        return bool(self._queue)

    def prime(self, backlog: Iterable[OutMessage]) -> None:
        """Queue a resume backlog (before any live message); it is exempt from the bound."""
        for message in backlog:
            self._queue.append(message)
            self._queued += len(message.data)
        self._credit = self._queued

    def push(self, message: OutMessage) -> bool:
        """Queue a live message; False when the client is too slow for it (never blocks)."""
        size = len(message.data)
        live = self._queued - self._credit
        # a single message larger than the bound still goes into an empty queue
        if live > 0 and live + size > self._limit and self._in_flight:
            return False
        queue = self._queue
        queue.append(message)
        self._queued += size
        if len(queue) == 1 and self.wakeup is not None:
            self.wakeup()
        return True

    def take(self, max_bytes: int = CHUNK_BYTES) -> list[OutMessage]:
        """Every queued message up to ``max_bytes`` (at least one when any is queued); the chunk is
        in flight until :meth:`written`. Empty when nothing is queued."""
        queue = self._queue
        if not queue:
            return []
        size = self._queued  # the bytes of every message queued
        self._metrics.queued(size)
        if size <= max_bytes:  # all of them fit (nearly every take): the queue as it is, not message by message
            chunk = list(queue)
            queue.clear()
        else:
            first = queue.popleft()
            chunk = [first]
            size = len(first.data)
            while queue and size + len(queue[0].data) <= max_bytes:
                message = queue.popleft()
                chunk.append(message)
                size += len(message.data)
        self._queued -= size
        self._credit = max(0, self._credit - size)  # the exempt messages are at the front
        self._sent.count += len(chunk)  # counted when handed to the writer
        self._in_flight = True
        if self._compat:  # one test per chunk: other clients' messages go as they are
            gap_last, int_seqs = self._gap_last, self._int_seqs
            return [messages.with_compat(message, gap_last=gap_last, int_seqs=int_seqs) for message in chunk]
        return chunk

    def written(self) -> None:
        """The chunk taken last is written to the client's socket."""
        self._in_flight = False

    def hold(self, limit: int) -> None:
        """The writer is busy with something else (the block snapshot): live messages queue
        behind it, bounded by ``limit`` (at least the usual bound) until :meth:`unhold`."""
        self._in_flight = True
        self._limit = max(limit, self._limit)

    def unhold(self) -> None:
        self._in_flight = False
        self._limit = self._base_limit

    def farewell(self) -> OutMessage | None:
        """The slow_consumer notice an SSE writer writes last; None unless cut for slowness."""
        return self._hub.slow_consumer_notice if self.closed_reason == messages.SLOW_CONSUMER else None

    def close(self, reason: CloseReason = "closed") -> None:
        """Unregister (idempotent: the first reason is the one counted); the queue is dropped."""
        if self.closed_reason is not None:
            return
        self.closed_reason = reason
        self._queue.clear()
        self._queued = self._credit = 0
        self._hub.forget(self, reason)
        if self.wakeup is not None:
            self.wakeup()
