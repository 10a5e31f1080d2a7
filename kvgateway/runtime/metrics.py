"""Every Prometheus metric of the gateway, defined once.

Each gateway owns its own registry, so several can live in one process (tests, the demo).
Label values come from configuration only (source names, ranks, fixed enumerations), never
from clients or payloads, so cardinality is bounded by the config.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import reduce
from math import isnan
from operator import add
from typing import Any, Final, Literal, Protocol, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kvgateway import __version__
from kvgateway.engine.sequencer import LossReason, Outcome, Purpose
from kvgateway.runtime.exposition import family_text, number_text
from kvgateway.runtime.extensions import core

# The *_created series double the exposition and no dashboard or alert here reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

STREAM = ("source", "dp_rank")

# The sequencer's own vocabulary, label values as they are.
REPLAY_OUTCOMES: Final[tuple[Outcome, ...]] = get_args(Outcome)
REPLAY_PURPOSES: Final[tuple[Purpose, ...]] = get_args(Purpose)
LOSS_REASONS: Final[tuple[LossReason, ...]] = get_args(LossReason)
TRANSPORTS = ("ws", "sse")
DISCONNECT_REASONS = ("closed", "slow_consumer", "error", "shutdown")
REJECTION_REASONS = (
    "unauthorized",
    "forbidden_origin",
    "forbidden_host",
    "too_many_clients",
    "bad_request",
    "too_many_snapshots",
    "rate_limited",
    "shutdown",
)
REJECTION_TRANSPORTS = ("ws", "sse", "http")

LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BROADCAST_BUCKETS = (0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05)
LIFETIME_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
GC_PAUSE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
QUEUE_BYTES_BUCKETS = (0, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)


@dataclass(frozen=True, slots=True)
class StreamMetric:
    """One per-stream family: its kind, name, help and labels after (source, dp_rank)."""

    kind: Literal["counter", "gauge", "histogram"]
    name: str
    documentation: str
    labels: tuple[str, ...] = ()


STREAM_METRICS: Final[dict[str, StreamMetric]] = {
    # ingest
    "batches_received": StreamMetric(
        "counter", "kvgateway_batches_received", "Batches received from engines, live and replayed."
    ),
    "stored_tokens": StreamMetric(
        "counter",
        "kvgateway_stored_tokens",
        "Tokens stored into a GPU tier, by origin: hit, offloaded, refetch, elsewhere (a routing miss), new.",
        ("origin",),
    ),
    "events_received": StreamMetric(
        "counter", "kvgateway_events_received", "Events in delivered batches, by event type.", ("type",)
    ),
    "sequence_gaps": StreamMetric(
        "counter", "kvgateway_sequence_gaps", "Jumps in a stream's sequence numbers (each a missing range)."
    ),
    "missed_batches": StreamMetric(
        "counter", "kvgateway_missed_batches", "Batches missing from the live stream when a gap was seen."
    ),
    "replay_requests": StreamMetric(
        "counter",
        "kvgateway_replay_requests",
        "Recoveries from a replay socket (each one or more attempts), by outcome (recovered, partial, "
        "failed: nothing came back, unavailable: no replay endpoint).",
        ("outcome",),
    ),
    "replay_attempts": StreamMetric(
        "counter",
        "kvgateway_replay_attempts",
        "Requests sent to replay sockets, by purpose (catch_up, gap, verify); a recovery asks again "
        "while its attempts make progress.",
        ("purpose",),
    ),
    "history_truncations": StreamMetric(
        "counter",
        "kvgateway_history_truncations",
        "Catch-ups that found the start of the engine's history gone (the index lacks it: stale).",
    ),
    "index_stale": StreamMetric(
        "gauge",
        "kvgateway_index_stale",
        "1 while the stream's index is known to be incomplete (until an AllBlocksCleared or restart).",
    ),
    "replayed_batches": StreamMetric(
        "counter", "kvgateway_replayed_batches", "Batches delivered from an engine's replay socket."
    ),
    "unrecovered_batches": StreamMetric(
        "counter",
        "kvgateway_unrecovered_batches",
        "Batches lost for good: neither live nor replayed, by reason (not_sent, evicted, transit, no_answer, "
        "no_replay, restart, overflow).",
        ("reason",),
    ),
    "publisher_restarts": StreamMetric(
        "counter", "kvgateway_publisher_restarts", "Engine publisher restarts detected."
    ),
    "duplicate_batches": StreamMetric(
        "counter", "kvgateway_duplicate_batches", "Batches dropped as already delivered."
    ),
    "decode_errors": StreamMetric(
        "counter", "kvgateway_decode_errors", "Messages that could not be decoded (counted and skipped)."
    ),
    "rank_mismatches": StreamMetric(
        "counter",
        "kvgateway_rank_mismatches",
        "Batches whose data_parallel_rank differs from the stream's configured rank.",
    ),
    "ingest_queue_depth": StreamMetric(
        "gauge",
        "kvgateway_ingest_queue_depth",
        "Batches received but not yet delivered (held while a replay fills a gap).",
    ),
    "source_up": StreamMetric("gauge", "kvgateway_source_up", "1 while the stream's subscription socket is connected."),
    "source_last_seq": StreamMetric(
        "gauge", "kvgateway_source_last_seq", "The last sequence number delivered on the stream."
    ),
    "event_lag": StreamMetric(
        "histogram",
        "kvgateway_event_lag_seconds",
        "Receive time minus the batch's own timestamp (clock skew included).",
    ),
    # occupancy
    "cache_blocks": StreamMetric(
        "gauge", "kvgateway_cache_blocks", "Resident blocks per stream and medium.", ("medium",)
    ),
    "cache_tokens": StreamMetric(
        "gauge", "kvgateway_cache_tokens", "Resident tokens per stream and medium.", ("medium",)
    ),
    "unknown_removes": StreamMetric(
        "counter",
        "kvgateway_unknown_removes",
        "BlockRemoved of a hash the index does not hold (expected for copies).",
    ),
}
"""Every per-stream family. Each stream keeps these as plain numbers (no lock, no label lookup on
the ingest hot path); :class:`StreamCollector` turns them into families when Prometheus scrapes."""


def le_labels(bounds: Sequence[float]) -> tuple[str, ...]:
    """Bucket bounds as prometheus_client's own Histogram writes them (``le``), ``+Inf`` last."""
    return (*(floatToGoString(bound) for bound in bounds), "+Inf")  # type: ignore[no-untyped-call]


_LAG_BOUNDS: Final = le_labels(LAG_BUCKETS)


class LagHistogram:
    """A histogram as plain numbers, event lag's buckets unless ``bounds`` says otherwise (the hub's
    broadcast times, the clients' queue sizes: :class:`Metrics`).

    An observation is appended to :attr:`values` as it is (a list's append: a path that observes
    every batch makes no Python call for it) and bucketed later, in order, by :meth:`fold`: when
    :attr:`counts`, :attr:`total` or :meth:`cumulative` is read (a scrape), and by whoever appends
    once :data:`FOLD_AT` values wait. A scrape sees exactly what bucketing each value at once would
    show, the sum added up in the same order."""

    __slots__ = ("_bounds", "_counts", "_les", "_total", "values")

    def __init__(self, bounds: tuple[float, ...] = LAG_BUCKETS) -> None:
        self._bounds = bounds
        self._les = _LAG_BOUNDS if bounds is LAG_BUCKETS else le_labels(bounds)
        self._counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self._total = 0.0
        self.values: list[float] = []
        """Observed and not bucketed yet (append here; call :meth:`fold` at :data:`FOLD_AT`)."""

    def observe(self, value: float) -> None:
        values = self.values
        values.append(value)
        if len(values) >= FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Bucket the values waiting: sorted, each bucket's share found by a search of them (bucket
        i holds value <= bounds[i]), the sum added up in the order they came."""
        values = self.values
        if not values:
            return
        total = reduce(add, values, self._total)
        counts = self._counts
        if isnan(total):  # a NaN among them (lags are never negative): bucketed one by one, as ever
            for value in values:
                counts[bisect_left(self._bounds, value)] += 1  # a NaN in the first bucket, as it always was
        else:
            values.sort()
            count, done = len(values), 0
            for i, bound in enumerate(self._bounds):
                if values[done] <= bound:
                    upto = bisect_right(values, bound, done)
                    counts[i] += upto - done
                    done = upto
                    if done == count:
                        break
            counts[-1] += count - done
        self._total = total
        values.clear()

    @property
    def counts(self) -> list[int]:
        """Per bucket, not cumulative; the last is +Inf."""
        self.fold()
        return self._counts

    @property
    def total(self) -> float:
        self.fold()
        return self._total

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip(self._les, self.counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out


FOLD_AT: Final = 256
"""Values a :class:`LagHistogram` holds unbucketed at most (about 8 KB; a scrape folds them sooner)."""


class Tally:
    """A counter as a plain number (``count += n``), made into a family when scraped."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class StreamFamilies:
    """The per-stream samples of one scrape, which each stream fills with its own; written as
    Prometheus text by :func:`kvgateway.runtime.exposition.stream_text`, or as families (``iter``)."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[Sequence[str], Any]]] = {key: [] for key in STREAM_METRICS}
        """Per family: (labels: source, dp_rank and the family's own; the value, or for a histogram
        its cumulative buckets and sum)."""

    def add(self, key: str, labels: Sequence[str], value: float) -> None:
        """A counter or gauge sample (``labels``: source, dp_rank and the family's own)."""
        self.rows[key].append((labels, value))

    def add_histogram(self, key: str, labels: Sequence[str], histogram: LagHistogram) -> None:
        self.rows[key].append((labels, (histogram.cumulative(), histogram.total)))

    def __iter__(self) -> Iterator[Metric]:
        for key, spec in STREAM_METRICS.items():
            family = _family(spec)
            for labels, value in self.rows[key]:
                if isinstance(family, HistogramMetricFamily):
                    family.add_metric(labels, value[0], value[1])
                else:
                    assert isinstance(family, CounterMetricFamily | GaugeMetricFamily)
                    family.add_metric(labels, value)
            yield family


def _family(spec: StreamMetric) -> Metric:
    labels = [*STREAM, *spec.labels]
    if spec.kind == "counter":
        return CounterMetricFamily(spec.name, spec.documentation, labels=labels)
    if spec.kind == "gauge":
        return GaugeMetricFamily(spec.name, spec.documentation, labels=labels)
    return HistogramMetricFamily(spec.name, spec.documentation, labels=labels)


class StreamExporter(Protocol):
    """A stream's downstream, which holds its figures (:class:`kvgateway.ingest.outlet.StreamOutlet`)."""

    def export(self, families: StreamFamilies) -> None: ...


class StreamCollector(Collector):
    """Collects every registered stream's figures at scrape time."""

    def __init__(self) -> None:
        self._streams: list[StreamExporter] = []
        self._local = threading.local()

    def add(self, stream: StreamExporter) -> None:
        self._streams.append(stream)

    def remove(self, stream: StreamExporter) -> None:
        self._streams.remove(stream)

    def describe(self) -> Iterable[Metric]:
        return list(StreamFamilies())

    def families(self) -> StreamFamilies:
        families = StreamFamilies()
        for stream in self._streams:
            stream.export(families)
        return families

    def collect(self) -> Iterable[Metric]:
        if getattr(self._local, "muted", False):
            return []  # Metrics.exposition writes these itself
        return list(self.families())

    def text(self) -> bytes:
        """Every stream's families in the text format (:mod:`kvgateway.runtime.exposition`)."""
        rows = self.families().rows
        number = number_text()
        pieces = itertools.chain.from_iterable(
            family_text(s.kind, s.name, s.documentation, (*STREAM, *s.labels), rows=rows[key], number=number)
            for key, s in STREAM_METRICS.items()
        )
        return "".join(pieces).encode()

    @contextlib.contextmanager
    def muted(self) -> Iterator[None]:
        """The registry without this collector's families, in this thread, for the block."""
        self._local.muted = True
        try:
            yield
        finally:
            self._local.muted = False


LIFETIME_BOUNDS: Final = le_labels(LIFETIME_BUCKETS)
"""The lifetime buckets' ``le`` labels."""


ANALYTICS_LABELS: Final = (*STREAM, "tier")


def analytics_families() -> tuple[HistogramMetricFamily, CounterMetricFamily, CounterMetricFamily]:
    """The cache analytics' families, empty: block lifetimes, sampled evictions, refetches (labels
    :data:`ANALYTICS_LABELS`)."""
    labels = list(ANALYTICS_LABELS)
    return (
        HistogramMetricFamily(
            "kvgateway_block_lifetime_seconds",
            "Sampled blocks' lifetime in the cache, stored to removed, by the engine's timestamps.",
            labels=labels,
        ),
        CounterMetricFamily("kvgateway_sampled_evictions", "Removals of sampled blocks.", labels=labels),
        CounterMetricFamily(
            "kvgateway_block_refetches",
            "Sampled blocks stored again within refetch_window (60 s by default) of their removal "
            "(the engine paid for them again).",
            labels=labels,
        ),
    )


class ScrapedFamilies(Collector):
    """Families made when scraped from figures kept as plain numbers, at this collector's place in
    the exposition: by ``families``, or once it is set by ``source`` (a part that exists after
    the catalogue: the cache analytics). ``labels``: the families' label names."""

    def __init__(self, families: Callable[[], Sequence[Metric]], labels: tuple[str, ...]) -> None:
        self._families = families
        self.labels = labels
        self.source: Callable[[], Sequence[Metric]] | None = None

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        return list(self._families() if self.source is None else self.source())


class Metrics:
    """The catalogue. docs/metrics.md describes each one; keep the two in step."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        # ingest and occupancy: plain numbers on each stream's outlet, exported at scrape time
        self.streams = StreamCollector()
        r.register(self.streams)
        self.build_info = Gauge(
            "kvgateway_build_info",
            "Always 1: the version and which core runs (core: compiled, or pure-Python).",
            ("version", "core"),
            registry=r,
        )
        self.build_info.labels(__version__, core()).set(1)
        # web clients
        self.clients = Gauge("kvgateway_clients", "Connected web clients.", ("transport",), registry=r)
        # Counted at each chunk a client's writer takes (every client's, at every turn), as plain
        # numbers, a family when scraped at its place: a Counter.inc there cost about 0.7 us.
        self.sent_counts = {transport: Tally() for transport in TRANSPORTS}
        self.messages_sent = ScrapedFamilies(self._sent_family, ("transport",))
        r.register(self.messages_sent)
        self.client_disconnects = Counter(
            "kvgateway_client_disconnects",
            "Client disconnections by reason (closed, slow_consumer, error, shutdown).",
            ("transport", "reason"),
            registry=r,
        )
        self.client_rejections = Counter(
            "kvgateway_client_rejections",
            "Requests refused before streaming (unauthorized, forbidden_origin, forbidden_host, too_many_clients, "
            "bad_request, too_many_snapshots, rate_limited, shutdown).",
            ("transport", "reason"),
            registry=r,
        )
        self.resumes = Counter(
            "kvgateway_resumes",
            "Reconnections that asked to resume, by whether they were recovered.",
            ("transport", "recovered"),
            registry=r,
        )
        # Observed at each chunk a client's writer takes, as plain numbers, a family when scraped
        # (as the broadcast times below): a Histogram.observe cost 1.5 us a chunk, for each client.
        self.client_queue_sizes = LagHistogram(QUEUE_BYTES_BUCKETS)
        self.client_queue_bytes = ScrapedFamilies(self._queue_family, ())
        r.register(self.client_queue_bytes)
        # Observed at every broadcast (each log entry) as plain numbers, a family when scraped: a
        # Histogram.observe there cost about 0.9 us a batch.
        self.broadcast_times = LagHistogram(BROADCAST_BUCKETS)
        self.broadcast_seconds = ScrapedFamilies(self._broadcast_family, ())
        r.register(self.broadcast_seconds)
        self.asyncio_tasks = Gauge(
            "kvgateway_asyncio_tasks", "Asyncio tasks alive in the gateway process (a leak shows here).", registry=r
        )
        self.gc_pause = Histogram(
            "kvgateway_gc_pause_seconds",
            "Garbage collections by generation and how long each held the event loop.",
            ("generation",),
            buckets=GC_PAUSE_BUCKETS,
            registry=r,
        )
        self._gc_pauses = tuple(self.gc_pause.labels(str(generation)) for generation in range(3))
        self.ring_messages = Gauge("kvgateway_ring_messages", "Messages held in the resume ring.", registry=r)
        self.ring_bytes = Gauge("kvgateway_ring_bytes", "Encoded bytes held in the resume ring.", registry=r)
        # Read from the log's ring when scraped (HubMetrics.watch_ring): nothing a batch.
        self.ring_held: list[Callable[[], tuple[int, int]]] = [lambda: (0, 0)]
        self.ring_messages.set_function(lambda: self.ring_held[0]()[0])
        self.ring_bytes.set_function(lambda: self.ring_held[0]()[1])
        # cache analytics (kvgateway/state/analytics.py: the blocks of 1 store event in 16): the
        # analytics count them as plain numbers, made into families here when scraped
        # (kvgateway/serve/analytics_sink.py): an observe and an inc per sampled eviction cost
        # about 3 us a batch on the ingest path
        self.cache_analytics = ScrapedFamilies(analytics_families, ANALYTICS_LABELS)
        r.register(self.cache_analytics)
        self.prefix_engines_mean = Gauge(
            "kvgateway_prefix_engines_mean",
            "Engines holding a chain's first block, averaged over the first blocks resident somewhere.",
            registry=r,
        )
        self.analytics_tracked = Gauge(
            "kvgateway_analytics_tracked_blocks",
            "Sampled blocks (stored, evicted) and first blocks the cache analytics hold; sampled every 5 s.",
            registry=r,
        )
        self.analytics_tracked_bound = Gauge(
            "kvgateway_analytics_tracked_blocks_bound",
            "The bound of kvgateway_analytics_tracked_blocks for the streams and tiers seen so far.",
            registry=r,
        )
        self.history_bytes = Gauge(
            "kvgateway_history_bytes", "Bytes held by the /v1/history series (preallocated rings).", registry=r
        )
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
        self.jetstream_writes = Counter(
            "kvgateway_jetstream_writes",
            "Writes of queued records to NATS (ingest): published over writes is records a write.",
            registry=r,
        )
        self.jetstream_pending = Gauge(
            "kvgateway_jetstream_pending", "Records queued or unacknowledged by the stream (ingest).", registry=r
        )
        self.jetstream_applied_offset = Gauge(
            "kvgateway_jetstream_applied_offset", "The last stream sequence applied (edge).", registry=r
        )
        self.checkpoints_written = Counter(
            "kvgateway_checkpoints_written",
            "Index checkpoints this edge wrote (it held the writer's lease).",
            registry=r,
        )
        self.checkpoint_bytes = Gauge(
            "kvgateway_checkpoint_bytes", "The size of the last index checkpoint this edge wrote.", registry=r
        )
        self.checkpoint_loaded_offset = Gauge(
            "kvgateway_checkpoint_loaded_offset",
            "The stream sequence of the checkpoint this edge started from (0: none).",
            registry=r,
        )
        # routers (kvgateway/serve/router_state.py)
        self.learned_blocks = Gauge(
            "kvgateway_learned_blocks", "Learned token-chain entries held for lookups by token_ids.", registry=r
        )
        self.learned_blocks_cap = Gauge(
            "kvgateway_learned_blocks_cap",
            "The learner's cap now: 1.25 per resident block, at least 65,536, at most max_learned_blocks.",
            registry=r,
        )
        self.learned_evictions = Counter(
            "kvgateway_learned_evictions", "Learned token-chain entries dropped at the cap.", registry=r
        )
        self.fleet_distinct_blocks = Gauge(
            "kvgateway_fleet_distinct_blocks",
            "Distinct resident blocks across every stream, by medium (all: any medium); refreshed every 15 s.",
            ("medium",),
            registry=r,
        )
        self.fleet_shared_blocks = Gauge(
            "kvgateway_fleet_shared_blocks",
            "Resident blocks held by more than one stream, by medium (all: any medium); refreshed every 15 s.",
            ("medium",),
            registry=r,
        )
        self.lookups = Counter(
            "kvgateway_lookups", "POST /v1/lookup answers, by kind (hashes, tokens).", ("kind",), registry=r
        )
        self.block_snapshots = Counter(
            "kvgateway_block_snapshots",
            "Block snapshots served, by route (ws, sse, blocks: GET /v1/blocks).",
            ("route",),
            registry=r,
        )
        for kind in ("hashes", "tokens"):
            self.lookups.labels(kind)
        for route in ("ws", "sse", "blocks"):
            self.block_snapshots.labels(route)
        # Every client series exists from the start, so increase() sees the first event too.
        for transport in TRANSPORTS:
            self.clients.labels(transport).set(0)
            for recovered in ("true", "false"):
                self.resumes.labels(transport, recovered)
            for reason in DISCONNECT_REASONS:
                self.client_disconnects.labels(transport, reason)
        for transport in REJECTION_TRANSPORTS:
            for reason in REJECTION_REASONS:
                self.client_rejections.labels(transport, reason)

    def _sent_family(self) -> list[Metric]:
        family = CounterMetricFamily(
            "kvgateway_messages_sent", "Messages written to web clients.", labels=["transport"]
        )
        for transport, tally in self.sent_counts.items():
            family.add_metric([transport], float(tally.count))
        return [family]

    def _queue_family(self) -> list[Metric]:
        documentation = "Bytes queued for a client, observed at each write."
        return _unlabelled_histogram("kvgateway_client_queue_bytes", documentation, self.client_queue_sizes)

    def _broadcast_family(self) -> list[Metric]:
        return _unlabelled_histogram(
            "kvgateway_broadcast_seconds", "Time to hand one message to every client's queue.", self.broadcast_times
        )

    def observe_gc_pause(self, generation: int, seconds: float) -> None:
        """One garbage collection (kvgateway.runtime.memory.CollectionTimer): generation 0, 1 or 2."""
        self._gc_pauses[generation].observe(seconds)

    def hub(self) -> HubMetrics:
        """The narrow view the hub, the log and the client subscriptions report through."""
        return HubMetrics(self)

    def exposition(self) -> tuple[bytes, str]:
        # The per-stream families (most of the samples) by the cheaper writer, the rest as usual.
        streams = self.streams.text()
        with self.streams.muted():
            return streams + generate_latest(self.registry), CONTENT_TYPE_LATEST


def _unlabelled_histogram(name: str, documentation: str, histogram: LagHistogram) -> list[Metric]:
    """A histogram kept as plain numbers, as the family prometheus_client's Histogram would show."""
    family = HistogramMetricFamily(name, documentation, labels=[])
    family.add_metric([], histogram.cumulative(), histogram.total)
    return [family]


class HubMetrics:
    """What the hub, the log and the subscriptions report: their children, resolved once."""

    __slots__ = (
        "_clients",
        "_disconnects",
        "_held",
        "_resumes",
        "broadcasts",
        "queued",
        "sent",
    )

    def __init__(self, metrics: Metrics) -> None:
        self._clients = {t: metrics.clients.labels(t) for t in TRANSPORTS}
        self._disconnects = metrics.client_disconnects
        self._resumes = metrics.resumes
        self.queued: Callable[[float], None] = metrics.client_queue_sizes.observe
        """Told the bytes queued for a client when its writer takes a chunk (plain numbers:
        :meth:`Metrics._queue_family`)."""
        self.broadcasts = metrics.broadcast_times
        """How long each broadcast took: appended to its ``values``, folded at :data:`FOLD_AT`
        (plain numbers: :meth:`Metrics._broadcast_family`)."""
        self._held = metrics.ring_held  # shared by every view of these metrics
        self.sent = metrics.sent_counts
        """Messages handed to a client's writer, by transport (a subscription keeps its own tally:
        plain numbers, :meth:`Metrics._sent_family`)."""

    def watch_ring(self, held: Callable[[], tuple[int, int]]) -> None:
        """The ring gauges read ``held`` (the log's messages and bytes, :meth:`MemoryLog.held`) when
        scraped."""
        self._held[0] = held

    def resumed(self, transport: str, recovered: bool) -> None:
        self._resumes.labels(transport, "true" if recovered else "false").inc()

    def joined(self, transport: str) -> None:
        self._clients[transport].inc()

    def left(self, transport: str, reason: str) -> None:
        self._clients[transport].dec()
        self._disconnects.labels(transport, reason).inc()
