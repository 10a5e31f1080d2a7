"""The hub: follows the ordered log and hands each entry to the queue of every client that wants it.

Publishing never awaits a client: each client has its own queue (:class:`~kvgateway.serve.subscription.
Subscription`), bounded by bytes, and a client that lets it overflow is cut ("slow_consumer"). The
hub does no I/O and knows no transport: the web layer writes what the subscriptions hand out.

Subscribing is two synchronous steps with no append in between: :meth:`Hub.resume_point` decides
where the client starts (recovered from the log, or fresh at the last offset), the caller builds
the hello for that point (the index's snapshot is exact at the log's last offset: an append runs
every follower, the index and the hub among them, in one synchronous step of its own), and
:meth:`Hub.subscribe` queues the backlog and registers the client for what comes next: no gap, no
duplicate.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter

from kvgateway.engine.wire import Stream
from kvgateway.log.entry import Entry
from kvgateway.log.ordered import Log
from kvgateway.log.resume import resume_after
from kvgateway.protocol import messages
from kvgateway.protocol.messages import OutMessage
from kvgateway.runtime.metrics import FOLD_AT, HubMetrics
from kvgateway.serve.query import GAP_LAST, INT_SEQS, ClientRequest
from kvgateway.serve.subscription import CloseReason, PendingState, Subscription, Transport

logger = logging.getLogger("kvgateway.hub")


class TooManyClients(Exception):
    """No room for another client (HTTP 503 before the upgrade, or close 1013 after)."""


class ShuttingDown(Exception):
    """The gateway is stopping: no new client (HTTP 503 before the upgrade, or close 1012 after,
    as the clients it had are told)."""


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a new client starts: after ``offset``; ``recovered`` when it resumes its own position."""

    offset: int
    recovered: bool


class Hub:
    """The clients of one gateway process (use from the event loop's thread)."""

    def __init__(
        self,
        log: Log,
        *,
        metrics: HubMetrics,
        sources: Sequence[Stream],
        client_queue_bytes: int = 2**20,
        max_clients: int = 1000,
    ) -> None:
        if client_queue_bytes <= 0 or max_clients < 0:
            raise ValueError("client_queue_bytes must be > 0 and max_clients >= 0")
        self.log = log
        self._message_for = log.message_for  # bound once: not a new bound method per entry
        self.metrics = metrics
        self._broadcasts = metrics.broadcasts.values  # the broadcast times not yet bucketed
        self.client_queue_bytes = client_queue_bytes
        self.max_clients = max_clients
        self.source_names = frozenset(name for name, _ in sources)
        self.configured = tuple(sources)
        """The configured streams: a query's ``dp_rank`` must be one of their ranks."""
        self.slow_consumer_notice = messages.encode_slow_consumer(client_queue_bytes)
        self._closed = False
        self._clients: dict[Subscription, None] = {}
        self._digest_clients: dict[Subscription, None] = {}  # those that asked digest=SECONDS
        # subscribers per stream, so an entry visits only the clients that want it
        self._by_stream: dict[Stream, dict[Subscription, None]] = {stream: {} for stream in sources}
        # The last entry's stream (the object) and its subscribers: a stream's entries carry one
        # tuple, its outlet's, which is equal to this dict's key but not the same object, so a
        # lookup hashes and compares it; a run of one stream's entries skips that. The dicts are
        # edited in place and never replaced, so what is kept stays the stream's.
        self._last: tuple[Stream | None, dict[Subscription, None]] = (None, {})

    @property
    def epoch(self) -> str:
        return self.log.epoch

    @property
    def offset(self) -> int:
        """The last offset of the log (0 before any message)."""
        return self.log.last_offset

    # following the log

    def follow(self, entry: Entry) -> None:
        started = perf_counter()
        stream = entry.stream
        last, subscribers = self._last
        if stream is not last:
            found = self._by_stream.get(stream)
            if found is None:  # a stream outside the configuration: index it on first use
                found = self._by_stream[stream] = {
                    sub: None for sub in self._clients if sub.filter.matches_stream(*stream)
                }
            subscribers = found
            self._last = (stream, found)
        message_for = self._message_for
        slow: list[Subscription] | None = None
        for sub in subscribers:
            key = sub.event_key
            message = entry.message if key is None else message_for(entry, key)
            if message is not None and not sub.push(message):
                if slow is None:
                    slow = []
                slow.append(sub)
        if slow is not None:  # not inside the loop: closing edits the dict being iterated
            for sub in slow:
                self._cut(sub)
        times = self._broadcasts  # observed as the histogram's plain list: no Python call a batch
        times.append(perf_counter() - started)
        if len(times) >= FOLD_AT:
            self.metrics.broadcasts.fold()

    def _cut(self, sub: Subscription) -> None:
        logger.warning(
            "%s client cut off as a slow consumer: %d bytes queued, limit %d",
            sub.transport,
            sub.queued_bytes,
            self.client_queue_bytes,
        )
        sub.close("slow_consumer")

    @property
    def digest_clients(self) -> list[Subscription]:
        """The clients that asked for ``digest`` messages (a copy: sending may close one)."""
        return list(self._digest_clients)

    def deliver(self, sub: Subscription, message: OutMessage) -> bool:
        """Queue a message for one client between two log entries (a ``digest``); False when it
        was too slow for it (then it is cut, as for a log entry)."""
        if sub.closed_reason is not None:
            return False
        if not sub.push(message):
            self._cut(sub)
            return False
        return True

    # clients

    def resume_point(self, request: ClientRequest, transport: Transport) -> ResumePoint:
        """Where a client asking ``request`` starts; raises :class:`ShuttingDown` or
        :class:`TooManyClients` (the route counts the rejection). Call :meth:`subscribe` before
        anything is appended to the log."""
        if self._closed:
            raise ShuttingDown("the gateway is shutting down")
        if len(self._clients) >= self.max_clients:
            raise TooManyClients(f"the gateway already serves {self.max_clients} clients")
        last = self.log.last_offset
        if request.last_event_id is None:
            return ResumePoint(last, False)
        after = resume_after(
            request.last_event_id, epoch=self.log.epoch, first_offset=self.log.first_offset, last_offset=last
        )
        self.metrics.resumed(transport, after is not None)
        return ResumePoint(last, False) if after is None else ResumePoint(after, True)

    def subscribe(
        self,
        request: ClientRequest,
        transport: Transport,
        hello: OutMessage,
        point: ResumePoint,
        snapshot: PendingState | None = None,
    ) -> Subscription:
        """Register a client whose ``hello`` is for ``point`` (and ``snapshot``, its state at that
        offset, for a ``snapshot=blocks`` client). When recovered, the messages it missed that
        match its filter are queued already."""
        client_filter = request.filter
        sub = Subscription(
            self,
            client_filter=client_filter,
            transport=transport,
            hello=hello,
            offset=point.offset,
            recovered=point.recovered,
            limit=self.client_queue_bytes,
            metrics=self.metrics,
            gap_last=GAP_LAST in request.compat,
            int_seqs=INT_SEQS in request.compat,
            digest_every=request.digest,
            snapshot=snapshot,
        )
        if request.digest is not None:
            self._digest_clients[sub] = None
        if point.recovered:
            key = sub.event_key
            message_for = self.log.message_for
            backlog: list[OutMessage] = []
            for entry in self.log.read(point.offset):
                if client_filter.matches_stream(*entry.stream):
                    message = message_for(entry, key)
                    if message is not None:
                        backlog.append(message)
            sub.prime(backlog)
        self._clients[sub] = None
        for stream, subscribers in self._by_stream.items():
            if client_filter.matches_stream(*stream):
                subscribers[sub] = None
        self.metrics.joined(transport)
        return sub

    def forget(self, sub: Subscription, reason: CloseReason) -> None:
        """Unregister ``sub`` (its :meth:`~Subscription.close` calls this)."""
        if sub in self._clients:
            del self._clients[sub]
            self._digest_clients.pop(sub, None)
            for subscribers in self._by_stream.values():
                subscribers.pop(sub, None)
            self.metrics.left(sub.transport, reason)

    def close(self) -> None:
        """Refuse new clients and close every subscription with reason "shutdown"."""
        self._closed = True
        for sub in list(self._clients):
            sub.close("shutdown")
