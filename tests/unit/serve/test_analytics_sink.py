"""kvgateway.serve.analytics_sink: the cache analytics' observations land in their Prometheus families,
labelled by stream and tier."""

from __future__ import annotations

from kvgateway.runtime.metrics import Metrics
from kvgateway.serve.analytics_sink import AnalyticsSink


def test_lifetimes_evictions_and_refetches_by_stream_and_tier() -> None:
    metrics = Metrics()
    sink = AnalyticsSink(metrics)
    sink.lifetime(("a", 0), "GPU", 2.5)
    sink.lifetime(("a", 0), "GPU", 0.5)
    sink.eviction(("a", 0), "GPU", refetched=False)
    sink.eviction(("a", 0), "GPU", refetched=True)
    sink.eviction(("b", 1), "CPU", refetched=True)

    def value(name: str, source: str, dp_rank: str, tier: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"source": source, "dp_rank": dp_rank, "tier": tier})

    assert value("kvgateway_block_lifetime_seconds_count", "a", "0", "GPU") == 2
    assert value("kvgateway_block_lifetime_seconds_sum", "a", "0", "GPU") == 3.0
    assert value("kvgateway_sampled_evictions_total", "a", "0", "GPU") == 1
    assert value("kvgateway_block_refetches_total", "a", "0", "GPU") == 1
    assert value("kvgateway_block_refetches_total", "b", "1", "CPU") == 1
    assert value("kvgateway_sampled_evictions_total", "b", "1", "CPU") == 0
    assert value("kvgateway_block_lifetime_seconds_count", "b", "1", "CPU") == 0
    assert value("kvgateway_sampled_evictions_total", "c", "0", "GPU") is None  # a stream never seen
