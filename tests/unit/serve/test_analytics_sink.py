"""kvgateway.serve.analytics_sink: the cache analytics' figures land in their Prometheus families when
scraped, labelled by stream and tier, a tier listed from its first sampled eviction on."""

from __future__ import annotations

from kvgateway.runtime.metrics import Metrics
from kvgateway.serve.analytics_sink import AnalyticsSink
from kvgateway.state.analytics import SAMPLE, CacheAnalytics
from tests.support.events import removed, stored

SAMPLED = [SAMPLE * i for i in range(1, 10)]  # hash(int) == int: a store starting with one is followed


def test_lifetimes_evictions_and_refetches_by_stream_and_tier() -> None:
    metrics = Metrics()
    analytics = CacheAnalytics()
    AnalyticsSink(metrics, analytics)

    def value(name: str, source: str, dp_rank: str, tier: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"source": source, "dp_rank": dp_rank, "tier": tier})

    analytics.apply(("b", 1), [stored(SAMPLED[2], medium="cpu")], ts=0.0)
    analytics.apply(("a", 0), [stored(SAMPLED[0]), stored(SAMPLED[1])], ts=0.0)
    assert value("kvgateway_sampled_evictions_total", "a", "0", "GPU") is None  # stored, nothing evicted yet
    analytics.apply(("b", 1), [removed(SAMPLED[2], medium="cpu")], ts=100.0)
    analytics.apply(("a", 0), [removed(SAMPLED[0], SAMPLED[1])], ts=1.5)
    analytics.apply(("a", 0), [stored(SAMPLED[0])], ts=10.0)  # within 60 s of its eviction: a refetch
    assert value("kvgateway_block_lifetime_seconds_count", "a", "0", "GPU") == 2
    assert value("kvgateway_block_lifetime_seconds_sum", "a", "0", "GPU") == 3.0
    assert (
        metrics.registry.get_sample_value(
            "kvgateway_block_lifetime_seconds_bucket", {"source": "a", "dp_rank": "0", "tier": "GPU", "le": "1.0"}
        )
        == 0
    )
    assert (
        metrics.registry.get_sample_value(
            "kvgateway_block_lifetime_seconds_bucket", {"source": "b", "dp_rank": "1", "tier": "CPU", "le": "120.0"}
        )
        == 1
    )
    assert value("kvgateway_sampled_evictions_total", "a", "0", "GPU") == 2
    assert value("kvgateway_block_refetches_total", "a", "0", "GPU") == 1
    assert value("kvgateway_block_refetches_total", "b", "1", "CPU") == 0
    assert value("kvgateway_sampled_evictions_total", "b", "1", "CPU") == 1
    assert value("kvgateway_sampled_evictions_total", "c", "0", "GPU") is None  # a stream never seen
    # listed in the order of each tier's first sampled eviction, as the Counter's children were made
    family = next(m for m in metrics.registry.collect() if m.name == "kvgateway_sampled_evictions")
    assert [(s.labels["source"], s.labels["tier"]) for s in family.samples] == [("b", "CPU"), ("a", "GPU")]


def test_the_families_are_there_empty_before_any_analytics() -> None:
    text = Metrics().exposition()[0].decode()
    for name in ("kvgateway_block_lifetime_seconds", "kvgateway_sampled_evictions_total"):
        assert f"# TYPE {name} " in text
        assert not any(line.startswith(name) for line in text.splitlines())  # no sample yet
