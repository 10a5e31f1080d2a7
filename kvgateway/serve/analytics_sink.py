"""The cache analytics' figures as Prometheus families, made when /metrics is scraped."""

from __future__ import annotations

from itertools import accumulate

from prometheus_client.core import Metric

from kvgateway.runtime.metrics import LIFETIME_BOUNDS, Metrics, analytics_families
from kvgateway.state.analytics import CacheAnalytics


class AnalyticsSink:
    """Exports ``analytics``' sampled lifetimes, evictions and refetches per stream and tier
    (``kvgateway_block_lifetime_seconds``, ``kvgateway_sampled_evictions_total``,
    ``kvgateway_block_refetches_total``) from the numbers it keeps: nothing on the ingest path.
    The same samples, in the same order, as a Histogram and two Counters observed at each sampled
    eviction gave: a tier is listed from its first sampled eviction on."""

    def __init__(self, metrics: Metrics, analytics: CacheAnalytics) -> None:
        self._analytics = analytics
        metrics.cache_analytics.source = self.families

    def families(self) -> list[Metric]:
        lifetime, evictions, refetches = analytics_families()
        for (source, dp_rank), tier, stats in self._analytics.counted():
            labels = [source, str(dp_rank), tier]
            cumulative = (float(count) for count in accumulate(stats.buckets))
            lifetime.add_metric(labels, list(zip(LIFETIME_BOUNDS, cumulative, strict=True)), stats.lifetime_sum)
            evictions.add_metric(labels, stats.evictions)
            refetches.add_metric(labels, stats.refetches)
        return [lifetime, evictions, refetches]
