"""The gateway's bounded structures, as its metrics show them: each fills up to a bound once and
then stays, so a run that judges memory (bench/soak.py, bench/memory.py) waits until they are full
and reports their sizes beside the memory, telling a bounded fill from a leak."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class Bounded:
    """A structure of the gateway that fills up to a bound and then stays: its size metric, and its
    bound's (a metric, or a number when the bound is a setting)."""

    name: str
    size: str
    bound: str | float


BOUNDED: Final = (
    Bounded("resume ring (messages)", "kvgateway_ring_messages", 10_000),  # ring_messages' default
    Bounded("learned token-chain entries", "kvgateway_learned_blocks", "kvgateway_learned_blocks_cap"),
    Bounded(
        "cache analytics entries", "kvgateway_analytics_tracked_blocks", "kvgateway_analytics_tracked_blocks_bound"
    ),
    Bounded("history bytes", "kvgateway_history_bytes", "kvgateway_history_bytes"),  # allocated whole
)
FULL_SHARE: Final = 0.95
"""A structure at this share of its bound is full."""
SETTLE_SECONDS: Final = 120.0
SETTLE_GROWTH: Final = 0.02
"""...or settled: grown by at most 2% over the last 120 s (a table whose bound the workload never
reaches, such as the analytics' sampled resident blocks, fills to the workload's size instead)."""


def size_of(sample: dict[str, Any], metric: str | float) -> float | None:
    if isinstance(metric, int | float):
        return float(metric)
    value = sample.get("metrics", {}).get(metric)
    return None if value is None else float(value)


def filled_at(samples: list[dict[str, Any]], structure: Bounded) -> float | None:
    """When ``structure`` was first full or settled (None: never, or the gateway does not report it)."""
    for i, sample in enumerate(samples):
        size, bound = size_of(sample, structure.size), size_of(sample, structure.bound)
        if size is None or bound is None:
            continue
        if size >= FULL_SHARE * bound:
            return float(sample["t"])
        earlier = [s for s in samples[:i] if s["t"] <= sample["t"] - SETTLE_SECONDS]
        before = size_of(earlier[-1], structure.size) if earlier else None
        if before is not None and size <= before * (1 + SETTLE_GROWTH):
            return float(sample["t"])
    return None


def bounded_report(steady: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each bounded structure at the start and the end of the steady part, with its bound there."""
    rows = []
    for structure in BOUNDED:
        first, last = size_of(steady[0], structure.size), size_of(steady[-1], structure.size)
        if first is None or last is None:
            continue
        rows.append(
            {
                "name": structure.name,
                "start": first,
                "end": last,
                "bound_end": size_of(steady[-1], structure.bound),
                "grew": round(last / first - 1, 4) if first else None,
            }
        )
    return rows
