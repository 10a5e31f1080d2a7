"""Simulated workloads through the gateway's own prefill attribution, on simulated time: what a
gateway following those engines would count per origin, without sockets and in a fraction of the
wall time (each engine's batches at its rate, merged in time order, stamped with that time)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvgateway.engine.wire import Stream
from kvgateway.simulator import Workload
from kvgateway.state.attribution import Attribution
from kvgateway.state.history import ORIGINS
from kvgateway.state.occupancy import OccupancyIndex

__all__ = ["ORIGINS", "Feed", "attribute", "fleet_tokens", "shares"]

START = 1_700_000_000.0


def _always(_t: float) -> bool:
    return True


@dataclass(frozen=True)
class Feed:
    """One engine rank: its stream key, its workload, its batches per second, and when it publishes
    (``talking(t)``, ``t`` in seconds from the start; a quiet engine makes no batch)."""

    stream: Stream
    workload: Workload
    rate: float
    talking: Callable[[float], bool] = _always


def attribute(feeds: Iterable[Feed], seconds: float) -> dict[Stream, list[int]]:
    """Tokens per origin (in :data:`ORIGINS` order) of each stream after ``seconds``."""
    attribution = Attribution()
    index = OccupancyIndex(observer=attribution)
    feeds = list(feeds)
    due = [(0.0, n) for n in range(len(feeds))]
    while due:
        t, n = heapq.heappop(due)
        if t > seconds:
            break
        feed = feeds[n]
        if feed.talking(t):
            source, rank = feed.stream
            index.apply(source, rank, feed.workload.next_batch(START + t, rank), START + t)
        heapq.heappush(due, (t + 1.0 / feed.rate, n))
    return {feed.stream: list(attribution.account(feed.stream).tokens) for feed in feeds}


def fleet_tokens(tokens: dict[Stream, list[int]]) -> list[int]:
    """Every stream's tokens per origin, summed."""
    return [sum(counts[i] for counts in tokens.values()) for i in range(len(ORIGINS))]


def shares(tokens: list[int]) -> dict[str, float]:
    """Each origin's share of ``tokens`` (0 each when there are none)."""
    total = sum(tokens)
    return {origin: (n / total if total else 0.0) for origin, n in zip(ORIGINS, tokens, strict=True)}
