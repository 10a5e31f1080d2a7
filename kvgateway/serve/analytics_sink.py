"""The cache analytics' observations into the Prometheus catalogue."""

from __future__ import annotations

from typing import Any

from kvgateway.engine.wire import Stream
from kvgateway.runtime.metrics import Metrics


class AnalyticsSink:
    """The analytics' observations into the Prometheus catalogue (children resolved once)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._children: dict[tuple[Stream, str], tuple[Any, Any, Any]] = {}

    def _of(self, stream: Stream, tier: str) -> tuple[Any, Any, Any]:
        children = self._children.get((stream, tier))
        if children is None:
            labels = (stream[0], str(stream[1]), tier)
            m = self._metrics
            children = (
                m.block_lifetime.labels(*labels),
                m.sampled_evictions.labels(*labels),
                m.block_refetches.labels(*labels),
            )
            self._children[(stream, tier)] = children
        return children

    def lifetime(self, stream: Stream, tier: str, seconds: float) -> None:
        self._of(stream, tier)[0].observe(seconds)

    def eviction(self, stream: Stream, tier: str, refetched: bool) -> None:
        children = self._of(stream, tier)
        (children[2] if refetched else children[1]).inc()
