"""Every Prometheus metric of the gateway, defined once.

Each gateway owns its own registry, so several can live in one process (tests, the demo).
Label values come from configuration only (source names, ranks, fixed enumerations), never
from clients or payloads, so cardinality is bounded by the config.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

# The *_created series double the exposition and no dashboard or alert here reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

STREAM = ("source", "dp_rank")

REPLAY_OUTCOMES = ("recovered", "partial", "failed", "unavailable")
REPLAY_PURPOSES = ("catch_up", "gap", "verify", "tail")
LOSS_REASONS = ("not_sent", "evicted", "transit", "no_answer", "no_replay", "restart", "overflow")
TRANSPORTS = ("ws", "sse")
DISCONNECT_REASONS = ("closed", "slow_consumer", "error", "shutdown")
REJECTION_REASONS = ("unauthorized", "forbidden_origin", "forbidden_host", "too_many_clients", "bad_request")
REJECTION_TRANSPORTS = ("ws", "sse", "http")

LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BROADCAST_BUCKETS = (0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05)
QUEUE_BYTES_BUCKETS = (0, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)


class StreamMetrics:
    """One stream's labelled children, looked up once: ``labels()`` costs microseconds per call,
    which adds up on the ingest hot path."""

    def __init__(self, metrics: Metrics, source: str, dp_rank: int) -> None:
        labels = (source, str(dp_rank))
        self._metrics = metrics
        self._labels = labels
        self.batches_received = metrics.batches_received.labels(*labels)
        self.sequence_gaps = metrics.sequence_gaps.labels(*labels)
        self.missed_batches = metrics.missed_batches.labels(*labels)
        self.replayed_batches = metrics.replayed_batches.labels(*labels)
        self._unrecovered = {reason: metrics.unrecovered_batches.labels(*labels, reason) for reason in LOSS_REASONS}
        self._attempts = {purpose: metrics.replay_attempts.labels(*labels, purpose) for purpose in REPLAY_PURPOSES}
        self.history_truncations = metrics.history_truncations.labels(*labels)
        self.index_stale = metrics.index_stale.labels(*labels)
        self.publisher_restarts = metrics.publisher_restarts.labels(*labels)
        self.duplicate_batches = metrics.duplicate_batches.labels(*labels)
        self.decode_errors = metrics.decode_errors.labels(*labels)
        self.rank_mismatches = metrics.rank_mismatches.labels(*labels)
        self.unknown_removes = metrics.unknown_removes.labels(*labels)
        self.ingest_queue_depth = metrics.ingest_queue_depth.labels(*labels)
        self.source_up = metrics.source_up.labels(*labels)
        self.source_last_seq = metrics.source_last_seq.labels(*labels)
        self.event_lag = metrics.event_lag.labels(*labels)
        self._events: dict[str, Counter] = {}
        for outcome in REPLAY_OUTCOMES:
            metrics.replay_requests.labels(*labels, outcome)
        self.ingest_queue_depth.set(0)
        self.index_stale.set(0)
        self.source_up.set(0)
        self.source_last_seq.set(-1)

    def events_received(self, event_type: str) -> Counter:
        child = self._events.get(event_type)
        if child is None:
            child = self._events[event_type] = self._metrics.events_received.labels(*self._labels, event_type)
        return child

    def replay_requests(self, outcome: str) -> Counter:
        return self._metrics.replay_requests.labels(*self._labels, outcome)

    def unrecovered_batches(self, reason: str) -> Counter:
        return self._unrecovered[reason]

    def replay_attempts(self, purpose: str) -> Counter:
        return self._attempts[purpose]

    def cache(self, medium: str) -> tuple[Gauge, Gauge]:
        return (
            self._metrics.cache_blocks.labels(*self._labels, medium),
            self._metrics.cache_tokens.labels(*self._labels, medium),
        )


class Metrics:
    """The catalogue. docs/metrics.md describes each one; keep the two in step."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        # ingest
        self.batches_received = Counter(
            "kvgateway_batches_received", "Batches received from engines, live and replayed.", STREAM, registry=r
        )
        self.events_received = Counter(
            "kvgateway_events_received", "Events in delivered batches, by event type.", (*STREAM, "type"), registry=r
        )
        self.sequence_gaps = Counter(
            "kvgateway_sequence_gaps",
            "Jumps in a stream's sequence numbers (each a missing range).",
            STREAM,
            registry=r,
        )
        self.missed_batches = Counter(
            "kvgateway_missed_batches", "Batches missing from the live stream when a gap was seen.", STREAM, registry=r
        )
        self.replay_requests = Counter(
            "kvgateway_replay_requests",
            "Recoveries from a replay socket (each one or more attempts), by outcome (recovered, partial, "
            "failed: nothing came back, unavailable: no replay endpoint).",
            (*STREAM, "outcome"),
            registry=r,
        )
        self.replay_attempts = Counter(
            "kvgateway_replay_attempts",
            "Requests sent to replay sockets, by purpose (catch_up, gap, verify); a recovery asks again "
            "while its attempts make progress.",
            (*STREAM, "purpose"),
            registry=r,
        )
        self.history_truncations = Counter(
            "kvgateway_history_truncations",
            "Catch-ups that found the start of the engine's history gone (the index lacks it: stale).",
            STREAM,
            registry=r,
        )
        self.index_stale = Gauge(
            "kvgateway_index_stale",
            "1 while the stream's index is known to be incomplete (until an AllBlocksCleared or restart).",
            STREAM,
            registry=r,
        )
        self.replayed_batches = Counter(
            "kvgateway_replayed_batches", "Batches delivered from an engine's replay socket.", STREAM, registry=r
        )
        self.unrecovered_batches = Counter(
            "kvgateway_unrecovered_batches",
            "Batches lost for good: neither live nor replayed, by reason (not_sent, evicted, transit, no_answer, "
            "no_replay, restart, overflow).",
            (*STREAM, "reason"),
            registry=r,
        )
        self.publisher_restarts = Counter(
            "kvgateway_publisher_restarts", "Engine publisher restarts detected.", STREAM, registry=r
        )
        self.duplicate_batches = Counter(
            "kvgateway_duplicate_batches", "Batches dropped as already delivered.", STREAM, registry=r
        )
        self.decode_errors = Counter(
            "kvgateway_decode_errors", "Messages that could not be decoded (counted and skipped).", STREAM, registry=r
        )
        self.rank_mismatches = Counter(
            "kvgateway_rank_mismatches",
            "Batches whose data_parallel_rank differs from the stream's configured rank.",
            STREAM,
            registry=r,
        )
        self.ingest_queue_depth = Gauge(
            "kvgateway_ingest_queue_depth",
            "Batches received but not yet delivered (held while a replay fills a gap).",
            STREAM,
            registry=r,
        )
        self.source_up = Gauge(
            "kvgateway_source_up", "1 while the stream's subscription socket is connected.", STREAM, registry=r
        )
        self.source_last_seq = Gauge(
            "kvgateway_source_last_seq", "The last sequence number delivered on the stream.", STREAM, registry=r
        )
        self.event_lag = Histogram(
            "kvgateway_event_lag_seconds",
            "Receive time minus the batch's own timestamp (clock skew included).",
            STREAM,
            buckets=LAG_BUCKETS,
            registry=r,
        )
        # occupancy
        self.cache_blocks = Gauge(
            "kvgateway_cache_blocks", "Resident blocks per stream and medium.", (*STREAM, "medium"), registry=r
        )
        self.cache_tokens = Gauge(
            "kvgateway_cache_tokens", "Resident tokens per stream and medium.", (*STREAM, "medium"), registry=r
        )
        self.unknown_removes = Counter(
            "kvgateway_unknown_removes",
            "BlockRemoved of a hash the index does not hold (expected for copies).",
            STREAM,
            registry=r,
        )
        # web clients
        self.clients = Gauge("kvgateway_clients", "Connected web clients.", ("transport",), registry=r)
        self.messages_sent = Counter(
            "kvgateway_messages_sent", "Messages written to web clients.", ("transport",), registry=r
        )
        self.client_disconnects = Counter(
            "kvgateway_client_disconnects",
            "Client disconnections by reason (closed, slow_consumer, error, shutdown).",
            ("transport", "reason"),
            registry=r,
        )
        self.client_rejections = Counter(
            "kvgateway_client_rejections",
            "Requests refused before streaming (unauthorized, forbidden_origin, forbidden_host, too_many_clients, "
            "bad_request).",
            ("transport", "reason"),
            registry=r,
        )
        self.resumes = Counter(
            "kvgateway_resumes",
            "Reconnections that asked to resume, by whether they were recovered.",
            ("transport", "recovered"),
            registry=r,
        )
        self.client_queue_bytes = Histogram(
            "kvgateway_client_queue_bytes",
            "Bytes queued for a client, observed at each write.",
            buckets=QUEUE_BYTES_BUCKETS,
            registry=r,
        )
        self.broadcast_seconds = Histogram(
            "kvgateway_broadcast_seconds",
            "Time to hand one message to every client's queue.",
            buckets=BROADCAST_BUCKETS,
            registry=r,
        )
        self.asyncio_tasks = Gauge(
            "kvgateway_asyncio_tasks", "Asyncio tasks alive in the gateway process (a leak shows here).", registry=r
        )
        self.ring_messages = Gauge("kvgateway_ring_messages", "Messages held in the resume ring.", registry=r)
        self.ring_bytes = Gauge("kvgateway_ring_bytes", "Encoded bytes held in the resume ring.", registry=r)
        self.cache_capacity_blocks = Gauge(
            "kvgateway_cache_capacity_blocks",
            "Configured capacity per stream and medium (only where capacity_blocks is set).",
            (*STREAM, "medium"),
            registry=r,
        )
        # cluster roles (kvgateway ingest / edge, docs/scaling.md); 0 in a single process
        self.jetstream_published = Counter(
            "kvgateway_jetstream_published", "Records the JetStream stream stored (ingest).", registry=r
        )
        self.jetstream_duplicates = Counter(
            "kvgateway_jetstream_duplicates", "Records the stream dropped as already stored (ingest).", registry=r
        )
        self.jetstream_retries = Counter(
            "kvgateway_jetstream_retries", "Records sent to the stream again after a failure (ingest).", registry=r
        )
        self.jetstream_pending = Gauge(
            "kvgateway_jetstream_pending", "Records queued or unacknowledged by the stream (ingest).", registry=r
        )
        self.jetstream_applied_offset = Gauge(
            "kvgateway_jetstream_applied_offset", "The last stream sequence applied (edge).", registry=r
        )
        # Every client series exists from the start, so increase() sees the first event too.
        for transport in TRANSPORTS:
            self.clients.labels(transport).set(0)
            self.messages_sent.labels(transport)
            for recovered in ("true", "false"):
                self.resumes.labels(transport, recovered)
            for reason in DISCONNECT_REASONS:
                self.client_disconnects.labels(transport, reason)
        for transport in REJECTION_TRANSPORTS:
            for reason in REJECTION_REASONS:
                self.client_rejections.labels(transport, reason)

    def hub(self) -> HubMetrics:
        """The narrow view the hub, the log and the client subscriptions report through."""
        return HubMetrics(self)

    def init_stream(self, source: str, dp_rank: int) -> StreamMetrics:
        """Every per-stream series, created at zero so rates and alerts work from the first scrape."""
        return StreamMetrics(self, source, dp_rank)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class HubMetrics:
    """What the hub, the log and the subscriptions report: their children, resolved once."""

    __slots__ = (
        "_broadcast",
        "_clients",
        "_disconnects",
        "_queue_bytes",
        "_resumes",
        "_ring_bytes",
        "_ring_messages",
        "sent",
    )

    def __init__(self, metrics: Metrics) -> None:
        self._clients = {t: metrics.clients.labels(t) for t in TRANSPORTS}
        self._disconnects = metrics.client_disconnects
        self._resumes = metrics.resumes
        self._queue_bytes = metrics.client_queue_bytes
        self._broadcast = metrics.broadcast_seconds
        self._ring_messages = metrics.ring_messages
        self._ring_bytes = metrics.ring_bytes
        self.sent = {t: metrics.messages_sent.labels(t) for t in TRANSPORTS}
        """Messages handed to a client's writer, by transport (a subscription keeps its own child)."""

    def queued(self, nbytes: int) -> None:
        """Bytes queued for a client when its writer takes a chunk."""
        self._queue_bytes.observe(nbytes)

    def broadcast(self, seconds: float) -> None:
        self._broadcast.observe(seconds)

    def retained(self, messages: int, nbytes: int) -> None:
        """What the resume ring holds now."""
        self._ring_messages.set(messages)
        self._ring_bytes.set(nbytes)

    def resumed(self, transport: str, recovered: bool) -> None:
        self._resumes.labels(transport, "true" if recovered else "false").inc()

    def joined(self, transport: str) -> None:
        self._clients[transport].inc()

    def left(self, transport: str, reason: str) -> None:
        self._clients[transport].dec()
        self._disconnects.labels(transport, reason).inc()
