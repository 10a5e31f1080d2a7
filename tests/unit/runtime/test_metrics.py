"""kvgateway.runtime.metrics: the catalogue's pieces on their own: the lag histogram's buckets, the
per-stream collector (registered streams exported at scrape time, a removed one gone), the hub's
narrow view and the rejections declared at zero. (Their text, byte for byte against
prometheus_client's, is tests/unit/runtime/test_exposition.py.)"""

from __future__ import annotations

import bisect
import math
import random

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from kvgateway.runtime.metrics import (
    FOLD_AT,
    LAG_BUCKETS,
    QUEUE_BYTES_BUCKETS,
    REJECTION_REASONS,
    LagHistogram,
    Metrics,
    StreamFamilies,
)


def test_the_lag_histogram_counts_a_value_in_the_first_bucket_that_holds_it() -> None:
    histogram = LagHistogram()
    for value in (0.0, LAG_BUCKETS[0], LAG_BUCKETS[0] * 1.5, LAG_BUCKETS[-1], LAG_BUCKETS[-1] + 1):
        histogram.observe(value)
    cumulative = histogram.cumulative()
    assert [bound for bound, _ in cumulative][-1] == "+Inf" and len(cumulative) == len(LAG_BUCKETS) + 1
    assert cumulative[0] == (str(LAG_BUCKETS[0]), 2.0)  # 0 and the bound itself
    assert cumulative[1][1] == 3.0
    assert cumulative[-2][1] == 4.0 and cumulative[-1][1] == 5.0
    assert histogram.total == sum((0.0, LAG_BUCKETS[0], LAG_BUCKETS[0] * 1.5, LAG_BUCKETS[-1], LAG_BUCKETS[-1] + 1))


def test_the_lag_histogram_folds_what_waits_as_if_each_value_were_bucketed_at_once() -> None:
    """Values wait in a list and are bucketed when read or when FOLD_AT wait: the same buckets and
    the same sum (added in the order the values came) as bucketing each at once, a NaN included."""
    rng = random.Random(7)
    values = [rng.choice((*LAG_BUCKETS, 0.0, -0.0, math.inf, rng.uniform(0.0, 100.0))) for _ in range(FOLD_AT * 3)]
    values[FOLD_AT + 10] = math.nan
    histogram, counts, total = LagHistogram(), [0] * (len(LAG_BUCKETS) + 1), 0.0
    for n, value in enumerate(values):
        histogram.observe(value)
        counts[bisect.bisect_left(LAG_BUCKETS, value)] += 1  # the reference: bucket i holds value <= bound i
        total += value
        assert len(histogram.values) < FOLD_AT, "folded once FOLD_AT wait"
        if n in (5, FOLD_AT + 5, FOLD_AT + 20, 3 * FOLD_AT - 1):  # read between folds, before and after the NaN
            assert histogram.counts == counts
            assert histogram.total == total or (math.isnan(histogram.total) and math.isnan(total))
            assert histogram.values == []
    # Finite lags under a second: a fold's values all below the last bounds, a sum whose order counts.
    small = [rng.uniform(0.0, 10.0) ** 3 / 1000 for _ in range(FOLD_AT + 100)]
    waiting = LagHistogram()
    for value in small:
        waiting.observe(value)
    assert len(waiting.values) == 100, "not bucketed before FOLD_AT wait"
    in_order = 0.0
    for value in small:
        in_order += value
    assert in_order != sum(sorted(small)), "a sum whose order counts"
    assert waiting.total == in_order and waiting.values == []
    assert waiting.counts == [sum(1 for v in small if bisect.bisect_left(LAG_BUCKETS, v) == i) for i in range(16)]


class _Stream:
    def __init__(self, source: str, batches: int) -> None:
        self.source, self.batches = source, batches

    def export(self, families: StreamFamilies) -> None:
        families.add("batches_received", (self.source, "0"), self.batches)


def test_registered_streams_are_read_at_each_scrape_and_a_removed_one_is_gone() -> None:
    metrics = Metrics()
    a, b = _Stream("a", 3), _Stream("b", 5)
    metrics.streams.add(a)
    metrics.streams.add(b)

    def batches(source: str) -> float | None:
        return metrics.registry.get_sample_value("kvgateway_batches_received_total", {"source": source, "dp_rank": "0"})

    assert (batches("a"), batches("b")) == (3, 5)
    a.batches = 4  # read at the scrape, not when it changed
    assert batches("a") == 4
    metrics.streams.remove(b)
    assert batches("b") is None
    text, _ = metrics.exposition()
    assert b'kvgateway_batches_received_total{dp_rank="0",source="a"} 4.0' in text
    assert b'source="b"' not in text


def test_the_hubs_view_counts_clients_resumes_and_the_ring() -> None:
    metrics = Metrics()
    hub = metrics.hub()
    hub.joined("ws")
    hub.joined("sse")
    hub.left("sse", "slow_consumer")
    hub.resumed("ws", recovered=True)
    held = [(7, 700)]
    hub.watch_ring(lambda: held[-1])
    value = metrics.registry.get_sample_value
    assert (value("kvgateway_clients", {"transport": "ws"}), value("kvgateway_clients", {"transport": "sse"})) == (1, 0)
    assert value("kvgateway_client_disconnects_total", {"transport": "sse", "reason": "slow_consumer"}) == 1
    assert value("kvgateway_resumes_total", {"transport": "ws", "recovered": "true"}) == 1
    assert (value("kvgateway_ring_messages"), value("kvgateway_ring_bytes")) == (7, 700)
    held.append((8, 900))  # read when scraped, not when told
    assert (value("kvgateway_ring_messages"), value("kvgateway_ring_bytes")) == (8, 900)
    assert metrics.hub().sent["ws"] is hub.sent["ws"]  # every view shares the children


def test_every_rejection_is_exported_at_zero_before_it_happens() -> None:
    metrics = Metrics()
    for transport in ("ws", "sse", "http"):
        for reason in REJECTION_REASONS:
            labels = {"transport": transport, "reason": reason}
            assert metrics.registry.get_sample_value("kvgateway_client_rejections_total", labels) == 0


def test_the_messages_sent_scraped_are_what_a_prometheus_counter_shows() -> None:
    """Counted as plain numbers per transport, made into a family when scraped: the same text as
    prometheus_client's own Counter with the same increments, at the Counter's place."""
    metrics = Metrics()
    registry = CollectorRegistry()
    reference = Counter(
        "kvgateway_messages_sent", "Messages written to web clients.", ("transport",), registry=registry
    )
    for transport in ("ws", "sse"):
        reference.labels(transport)

    def lines() -> list[str]:
        return [line for line in generate_latest(metrics.registry).decode().splitlines() if "messages_sent" in line]

    assert lines() == generate_latest(registry).decode().splitlines()  # both series at 0 before any client
    hub = metrics.hub()
    for transport, count in [("ws", 3), ("sse", 1), ("ws", 64), ("ws", 1), ("sse", 250)]:
        hub.sent[transport].count += count
        reference.labels(transport).inc(count)
    assert lines() == generate_latest(registry).decode().splitlines()
    assert 'kvgateway_messages_sent_total{transport="ws"} 68.0' in lines()
    text = generate_latest(metrics.registry).decode()
    names = ("clients", "messages_sent_total", "client_disconnects_total")
    places = [text.index(f"# HELP kvgateway_{name} ") for name in names]
    assert places == sorted(places)


def test_the_client_queue_bytes_scraped_are_what_a_prometheus_histogram_shows() -> None:
    """Observed as plain numbers, made into a family when scraped: the same text as
    prometheus_client's own Histogram with these buckets, edges and sizes past the last included."""
    sizes = [0, 1, 1023, 1024, 1025, 4096, 262_144, 262_145, 16_777_216, 2**25, *range(0, 2**25, 2**25 // 997)]
    metrics = Metrics()
    queued = metrics.hub().queued
    registry = CollectorRegistry()
    reference = Histogram(
        "kvgateway_client_queue_bytes",
        "Bytes queued for a client, observed at each write.",
        buckets=QUEUE_BYTES_BUCKETS,
        registry=registry,
    )
    for size in sizes:
        queued(size)
        reference.observe(size)
    ours = [line for line in generate_latest(metrics.registry).decode().splitlines() if "client_queue_bytes" in line]
    assert ours == generate_latest(registry).decode().splitlines()
    assert f"kvgateway_client_queue_bytes_count {float(len(sizes))}" in ours
