"""Cache analytics that answer an operator's two questions. Sans-I/O; follows the ordered log.

*Is this engine thrashing?* For a deterministic sample of blocks (the blocks of 1 store event in
:data:`SAMPLE`, chosen by the hash of its first block, so every stream samples alike) the
analytics remember when each was stored and evicted, by the engine's own batch timestamps (a
replayed batch keeps its time):

- **block lifetime**: stored to removed, as a histogram per stream and tier. Short lifetimes on a
  full cache mean the working set does not fit.
- **refetches**: a sampled block stored again within :data:`REFETCH_WINDOW_SECONDS` of its
  eviction, over the sampled evictions: the share of evictions the engine paid for again soon
  after (prefill recomputed). Near 0 is healthy; a high share is thrashing.

*Is routing spreading the same prefixes everywhere?* The first block of every stored chain (no
parent: a system prompt or a conversation's start) is remembered per stream (bounded);
:meth:`CacheAnalytics.prefix_spread` counts, over those first blocks still resident, how many
engines hold each: 1.0 on average is perfect affinity, the number of engines is every prefix
everywhere. (Blocks held by more than one engine overall are the lookup module's fleet facts.)

Memory: at most :data:`MAX_TRACKED` stored and as many evicted sampled blocks per stream and tier
(a time and a hash each: about 100 bytes in the reference's ``OrderedDict`` s, 25 to 50 in the
compiled pass's C tables), and :data:`MAX_ROOTS` first blocks per stream.
Cost on the ingest path: per event, a ``sample_key() % 16`` of its first block (an int's
``hash()``, bytes' first eight bytes: the same in every process, so that a cluster's edges follow
the same blocks) and a membership test of its blocks, in the per-batch pass
(:mod:`kvgateway.state._analytics_py`, the reference). Its compiled twin ``_analytics_c.pyx``,
where it was built, only queues each event's hashes on the ingest path and applies them on a C
thread of its own; a reader of the figures waits until the thread has caught up, so it reads what
the reference would (docs/performance.md, "1b. Ingest against the floor, round twenty-three").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from kvgateway.engine.wire import Hash, Stream
from kvgateway.log.entry import Entry
from kvgateway.protocol.render import hash_text
from kvgateway.runtime.extensions import load
from kvgateway.state import _analytics_py
from kvgateway.state._analytics_py import MAX_ROOTS, MAX_TRACKED, REFETCH_WINDOW_SECONDS, SAMPLE, TierStats
from kvgateway.state.occupancy import StreamIndex

if TYPE_CHECKING:  # one API: the reference's
    from kvgateway.state._analytics_py import AnalyticsPass
else:
    AnalyticsPass = (load("kvgateway.state._analytics_c") or _analytics_py).AnalyticsPass

__all__ = [
    "MAX_ROOTS",
    "MAX_ROOTS_COUNTED",
    "MAX_TRACKED",
    "REFETCH_WINDOW_SECONDS",
    "SAMPLE",
    "CacheAnalytics",
    "Stream",
    "TierStats",
]

MAX_ROOTS_COUNTED: Final = 2_048
"""Distinct first blocks :meth:`CacheAnalytics.prefix_spread` looks up (each in every stream)."""


class CacheAnalytics:
    """Follows the log (:attr:`follow`) and keeps the per-stream figures above.

    The per-batch pass and its tables are :class:`~kvgateway.state._analytics_py.AnalyticsPass`'s
    (the compiled one where it was built): :attr:`follow` and :attr:`apply` are its own methods, so
    the log calls into it with no Python frame of this class between."""

    def __init__(self, refetch_window: float = REFETCH_WINDOW_SECONDS, *, core: AnalyticsPass | None = None) -> None:
        self.core = AnalyticsPass(refetch_window) if core is None else core
        """The pass and its tables (given: its own window and bounds, as the tests make them small)."""
        self.follow: Callable[[Entry], None] = self.core.follow
        """A log entry: a batch applied, a restart's notice forgets the stream's stored blocks."""
        self.apply: Callable[[Stream, Iterable[object], float], None] = self.core.apply
        """One batch's events (``stream``, its events, the engine's timestamp)."""
        self.tier: Callable[[Stream, str], TierStats] = self.core.tier
        """A stream's tier's stats (made empty on first ask)."""

    def tracked(self) -> tuple[int, int]:
        """(entries held, their bound): sampled blocks stored and evicted per stream and tier (at most
        :data:`MAX_TRACKED` each), first blocks per stream (at most :data:`MAX_ROOTS`). O(streams)."""
        core = self.core
        held = sum(len(s.stored_at) + len(s.evicted_at) for s in core.tiers.values())
        held += sum(len(roots) for roots in core.roots.values())
        bound = 2 * core.max_tracked * len(core.tiers) + core.max_roots * len(core.roots)
        return held, bound

    def streams(self) -> list[tuple[Stream, str, TierStats]]:
        return [(stream, tier, stats) for (stream, tier), stats in sorted(self.core.tiers.items())]

    def counted(self) -> list[tuple[Stream, str, TierStats]]:
        """The streams' tiers that saw a sampled eviction, in the order of their first (refetches
        come after an eviction): those the lifetime, eviction and refetch figures are exported for
        (kvgateway/serve/analytics_sink.py, at scrape time: a sink that observed each eviction as it
        came cost 3 us a batch)."""
        return [(stream, tier, stats) for (stream, tier), stats in self.core.counted.items()]

    def prefix_spread(self, indexes: Iterable[StreamIndex], top: int = 5) -> dict[str, Any]:
        """How many engines hold each remembered first block that is still resident somewhere.

        ``engines``: how many streams were asked (those given); ``mean_engines``: the average over
        those blocks (1.0: each prefix lives on one engine);
        ``top``: the most widely held, as ``{"medium", "hash", "engines"}`` (hash as a string).
        At most :data:`MAX_ROOTS_COUNTED` x streams refcount lookups (a stream's newest first):
        call it per request or every few seconds, not per batch.
        """
        indexes = list(indexes)
        holders: dict[tuple[str, Hash], int] = {}
        for index in indexes:
            for medium, h in reversed(self.core.roots.get((index.source, index.dp_rank), {})):
                if len(holders) >= MAX_ROOTS_COUNTED:
                    break
                holders.setdefault((medium, h), 0)
        for key in holders:
            medium, h = key
            holders[key] = sum(1 for index in indexes if index.refcount(h, medium) > 0)
        held = {key: n for key, n in holders.items() if n > 0}
        ranked = sorted(held.items(), key=lambda item: (-item[1], hash_text(item[0][1])))[:top]
        return {
            "engines": len(indexes),
            "first_blocks": len(held),
            "mean_engines": round(sum(held.values()) / len(held), 3) if held else None,
            "top": [{"medium": m, "hash": hash_text(h), "engines": n} for (m, h), n in ranked],
        }

    def to_json(self, indexes: Iterable[StreamIndex], up: Iterable[StreamIndex] | None = None) -> dict[str, Any]:
        """The /v1/analytics document (without its epoch); ``prefixes`` over ``up``, the streams
        whose engine is connected (None: every stream of ``indexes``)."""
        indexes = list(indexes)
        streams: dict[Stream, dict[str, Any]] = {}
        for index in indexes:
            tiers: dict[str, int] = {}
            total = 0
            for med in index.medium_stats(0.0).values():
                tiers[med.tier] = tiers.get(med.tier, 0) + med.blocks
                total += med.blocks
            cpu = tiers.get("CPU", 0)
            streams[(index.source, index.dp_rank)] = {
                "source": index.source,
                "dp_rank": index.dp_rank,
                "offloaded_share": round(cpu / total, 4) if total else None,
                "tiers": {},
            }
        for stream, tier, stats in self.streams():
            if stream in streams:
                streams[stream]["tiers"][tier] = stats.to_json()
        return {
            "sample": SAMPLE,
            "refetch_window_seconds": self.core.refetch_window,
            "streams": [streams[key] for key in sorted(streams)],
            "prefixes": self.prefix_spread(indexes if up is None else up),
        }
