"""The cache analytics' per-batch pass, pure Python: the reference its compiled twin
(``_analytics_c.pyx``, which applies the same steps on a C thread of its own and lets a reader in
once it has caught up) keeps to, table for table (tests/unit/state/test_analytics_differential.py,
tests/unit/state/test_analytics_thread.py).

:class:`AnalyticsPass` follows the log and keeps what :mod:`kvgateway.state.analytics` reads and
shows: per stream and tier a :class:`TierStats` (the sampled blocks stored and evicted, bounded
:class:`~collections.OrderedDict` s oldest first, and the lifetime, eviction and refetch counts),
the tiers with a sampled eviction in the order of their first (``counted``), and each stream's
first blocks of chains (``roots``, bounded, oldest first). The sampling decision, the bounds and
the order of every table are the module's documented behaviour (see the analytics' docstring).

Sans-I/O; :mod:`kvgateway.state.analytics` builds :class:`~kvgateway.state.analytics.CacheAnalytics`
around it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from kvgateway.engine.mediums import medium_tier, normalise_medium
from kvgateway.engine.wire import AllBlocksCleared, BlockRemoved, BlockStored, Hash, Stream
from kvgateway.log.entry import Entry
from kvgateway.log.records import BatchRecord, NoticeRecord
from kvgateway.runtime.metrics import LIFETIME_BUCKETS

__all__ = [
    "MAX_ROOTS",
    "MAX_ROUTES",
    "MAX_TRACKED",
    "REFETCH_WINDOW_SECONDS",
    "SAMPLE",
    "AnalyticsPass",
    "Route",
    "TierStats",
    "sample_key",
]

SAMPLE: Final = 16
"""One block in this many is followed (by ``sample_key(block) % SAMPLE == 0``)."""
REFETCH_WINDOW_SECONDS: Final = 60.0
MAX_TRACKED: Final = 20_000
MAX_ROOTS: Final = 256
MAX_ROUTES: Final = 4_096
"""Raw (stream, medium) routes cached: the wire's medium names are not trusted."""


def sample_key(block_hash: Hash) -> int:
    """What decides whether a chain whose first block is ``block_hash`` is followed: an int hash's
    ``hash()`` (an engine's hash is uniform already), and bytes' first eight bytes as a little-endian
    number. Not bytes' ``hash()``: it is seeded per process (PYTHONHASHSEED), so two processes
    reading one log (a cluster's edges, a gateway after a restart) would follow different blocks of
    vLLM's sha256 hashes, and their sampled figures would differ."""
    if type(block_hash) is bytes:
        return int.from_bytes(block_hash[:8], "little")
    return hash(block_hash)


@dataclass(slots=True)
class TierStats:
    """One stream's tier: the sampled blocks in the cache and recently evicted, and the counts."""

    stored_at: OrderedDict[Hash, float] = field(default_factory=OrderedDict)
    evicted_at: OrderedDict[Hash, float] = field(default_factory=OrderedDict)
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LIFETIME_BUCKETS) + 1))
    lifetimes: int = 0
    lifetime_sum: float = 0.0
    evictions: int = 0
    refetches: int = 0

    def lifetime_quantile(self, q: float) -> float | None:
        """The bucket bound below which ``q`` of the lifetimes fall (None: none yet; inf: above all)."""
        if not self.lifetimes:
            return None
        target = q * self.lifetimes
        seen = 0
        for bound, count in zip((*LIFETIME_BUCKETS, float("inf")), self.buckets, strict=True):
            seen += count
            if seen >= target:
                return bound
        return float("inf")

    def to_json(self) -> dict[str, Any]:
        p50 = self.lifetime_quantile(0.5)
        return {
            "sampled_lifetimes": self.lifetimes,
            "lifetime_mean_seconds": round(self.lifetime_sum / self.lifetimes, 3) if self.lifetimes else None,
            "lifetime_p50_le_seconds": None if p50 is None or p50 == float("inf") else p50,
            "lifetime_buckets": dict(zip([str(b) for b in LIFETIME_BUCKETS] + ["+Inf"], self.buckets, strict=True)),
            "sampled_evictions": self.evictions,
            "refetches": self.refetches,
            "refetch_ratio": round(self.refetches / self.evictions, 4) if self.evictions else None,
        }


Route = tuple[str, str, TierStats]
"""(normalised medium, tier, the stream's stats of that tier) of a raw medium name."""


class AnalyticsPass:
    """The analytics' state and the pass over each batch (:meth:`follow`, :meth:`apply`).

    ``tiers``: every (stream, tier) seen, its :class:`TierStats`; ``counted``: those with a sampled
    eviction, in the order of their first; ``roots``: per stream the first blocks of stored chains
    as ``(normalised medium, hash)``, oldest first; ``routes``: the raw mediums' routes, cached.
    ``max_tracked`` bounds each stats' ``stored_at`` and ``evicted_at``, ``max_roots`` each stream's
    roots (the oldest go first), ``max_routes`` the routes cached (past it a route is worked out
    again at each event)."""

    def __init__(
        self,
        refetch_window: float = REFETCH_WINDOW_SECONDS,
        max_tracked: int = MAX_TRACKED,
        max_roots: int = MAX_ROOTS,
        max_routes: int = MAX_ROUTES,
    ) -> None:
        self.refetch_window = refetch_window
        self.max_tracked = max_tracked
        self.max_roots = max_roots
        self.max_routes = max_routes
        self.tiers: dict[tuple[Stream, str], TierStats] = {}
        self.counted: dict[tuple[Stream, str], TierStats] = {}
        self.roots: dict[Stream, OrderedDict[tuple[str, Hash], None]] = {}
        self.routes: dict[tuple[Stream, str | None], Route] = {}

    def tier(self, stream: Stream, tier: str) -> TierStats:
        stats = self.tiers.get((stream, tier))
        if stats is None:
            stats = self.tiers[(stream, tier)] = TierStats()
        return stats

    def follow(self, entry: Entry) -> None:
        record = entry.record
        if type(record) is BatchRecord:
            self.apply(record.stream, record.batch.events, record.batch.ts)
        elif type(record) is NoticeRecord and record.kind == "restart":
            self.forget(record.stream)

    def route(self, stream: Stream, medium: str | None) -> Route:
        """(normalised medium, tier, stats) of a raw medium name, cached (bounded: names are not trusted)."""
        route = self.routes.get((stream, medium))
        if route is None:
            tier = medium_tier(medium)
            route = (normalise_medium(medium), tier, self.tier(stream, tier))
            if len(self.routes) < self.max_routes:
                self.routes[(stream, medium)] = route
        return route

    def apply(self, stream: Stream, events: Iterable[object], ts: float) -> None:
        # On the ingest path: per event a cached route, a hash of its first block and C-level
        # disjointness tests; Python loops only over the blocks followed. The route's cache is read
        # here, :meth:`route` called only when it misses (a call per event was 0.4 us a batch).
        # The engine's time read as a float (the wire's ``ts`` is one; the compiled pass's thread
        # keeps C doubles), so an int given here is kept as the float it equals.
        ts = float(ts)
        routes = self.routes
        for event in events:
            if type(event) is BlockStored:
                hashes = event.block_hashes
                if not hashes:
                    continue
                medium, tier, stats = routes.get((stream, event.medium)) or self.route(stream, event.medium)
                if stats.evicted_at and not stats.evicted_at.keys().isdisjoint(hashes):
                    self._refetched(stats, hashes, ts)
                if sample_key(hashes[0]) % SAMPLE == 0:
                    stored_at = stats.stored_at
                    for h in hashes:
                        if h not in stored_at:  # a second copy keeps the first one's time
                            stored_at[h] = ts  # a new key is the newest already
                            if len(stored_at) > self.max_tracked:
                                stored_at.popitem(last=False)
                if event.parent_block_hash is None:
                    self._root(stream, medium, hashes[0])
            elif type(event) is BlockRemoved:
                _medium, tier, stats = routes.get((stream, event.medium)) or self.route(stream, event.medium)
                if stats.stored_at and not stats.stored_at.keys().isdisjoint(event.block_hashes):
                    self._removed(stream, tier, stats, event.block_hashes, ts)
            elif type(event) is AllBlocksCleared:
                self.forget(stream)

    def _refetched(self, stats: TierStats, hashes: list[Hash], ts: float) -> None:
        for h in hashes:
            evicted = stats.evicted_at.pop(h, None)
            if evicted is not None and ts - evicted <= self.refetch_window:
                stats.refetches += 1

    def _removed(self, stream: Stream, tier: str, stats: TierStats, hashes: list[Hash], ts: float) -> None:
        evicted_at = stats.evicted_at
        for h in hashes:
            stored = stats.stored_at.pop(h, None)
            if stored is None:
                continue  # not followed (or stored before the gateway watched)
            stats.evictions += 1
            evicted_at[h] = ts
            evicted_at.move_to_end(h)
            if len(evicted_at) > self.max_tracked:
                evicted_at.popitem(last=False)
            seconds = max(0.0, ts - stored)
            stats.lifetimes += 1
            stats.lifetime_sum += seconds
            stats.buckets[bisect_left(LIFETIME_BUCKETS, seconds)] += 1  # the first bound >= seconds
        if stats.evictions and (stream, tier) not in self.counted:
            self.counted[(stream, tier)] = stats

    def _root(self, stream: Stream, medium: str, h: Hash) -> None:
        roots = self.roots.get(stream)
        if roots is None:
            roots = self.roots[stream] = OrderedDict()
        roots[(medium, h)] = None
        roots.move_to_end((medium, h))
        if len(roots) > self.max_roots:
            roots.popitem(last=False)

    def forget(self, stream: Stream) -> None:
        """The engine's cache is gone (restart, AllBlocksCleared): its blocks died unobserved."""
        for (key, _tier), stats in self.tiers.items():
            if key == stream:
                stats.stored_at.clear()
