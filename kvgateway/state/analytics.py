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
(a float and a hash each, about 100 bytes), and :data:`MAX_ROOTS` first blocks per stream.
Cost on the ingest path: per event, a ``hash() % 16`` of its first block and a set-disjointness
test in C; Python loops only over the blocks followed.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from kvgateway.engine.mediums import medium_tier, normalise_medium
from kvgateway.engine.wire import AllBlocksCleared, BlockRemoved, BlockStored, Hash, Stream
from kvgateway.log.ordered import BatchRecord, NoticeRecord
from kvgateway.log.ring import Entry
from kvgateway.protocol.render import hash_text
from kvgateway.runtime.metrics import LIFETIME_BUCKETS
from kvgateway.state.occupancy import StreamIndex

SAMPLE: Final = 16
"""One block in this many is followed (by ``hash(block) % SAMPLE == 0``)."""
REFETCH_WINDOW_SECONDS: Final = 60.0
MAX_TRACKED: Final = 20_000
MAX_ROOTS: Final = 256
MAX_ROOTS_COUNTED: Final = 2_048
"""Distinct first blocks :meth:`CacheAnalytics.prefix_spread` looks up (each in every stream)."""


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


def _bounded_put(table: OrderedDict[Hash, float], h: Hash, t: float) -> None:
    table[h] = t
    table.move_to_end(h)
    if len(table) > MAX_TRACKED:
        table.popitem(last=False)


class CacheAnalytics:
    """Follows the log (:meth:`follow`) and keeps the per-stream figures above."""

    def __init__(self, refetch_window: float = REFETCH_WINDOW_SECONDS) -> None:
        self.refetch_window = refetch_window
        self._tiers: dict[tuple[Stream, str], TierStats] = {}
        # The tiers with a sampled eviction, in the order of their first: what the Prometheus
        # families list (kvgateway/serve/analytics_sink.py, at scrape time: a sink that observed
        # each eviction as it came cost 3 us a batch).
        self._counted: dict[tuple[Stream, str], TierStats] = {}
        self._roots: dict[Stream, OrderedDict[tuple[str, Hash], None]] = {}
        self._routes: dict[tuple[Stream, str | None], tuple[str, str, TierStats]] = {}

    def tracked(self) -> tuple[int, int]:
        """(entries held, their bound): sampled blocks stored and evicted per stream and tier (at most
        :data:`MAX_TRACKED` each), first blocks per stream (at most :data:`MAX_ROOTS`). O(streams)."""
        held = sum(len(s.stored_at) + len(s.evicted_at) for s in self._tiers.values())
        held += sum(len(roots) for roots in self._roots.values())
        bound = 2 * MAX_TRACKED * len(self._tiers) + MAX_ROOTS * len(self._roots)
        return held, bound

    def tier(self, stream: Stream, tier: str) -> TierStats:
        stats = self._tiers.get((stream, tier))
        if stats is None:
            stats = self._tiers[(stream, tier)] = TierStats()
        return stats

    def follow(self, entry: Entry) -> None:
        record = entry.record
        if type(record) is BatchRecord:
            self.apply(record.stream, record.batch.events, record.batch.ts)
        elif type(record) is NoticeRecord and record.kind == "restart":
            self._forget(record.stream)

    def _route(self, stream: Stream, medium: str | None) -> tuple[str, str, TierStats]:
        """(normalised medium, tier, stats) of a raw medium name, cached (bounded: names are not trusted)."""
        route = self._routes.get((stream, medium))
        if route is None:
            tier = medium_tier(medium)
            route = (normalise_medium(medium), tier, self.tier(stream, tier))
            if len(self._routes) < 4096:
                self._routes[(stream, medium)] = route
        return route

    def apply(self, stream: Stream, events: Iterable[object], ts: float) -> None:
        # On the ingest path: per event a cached route, a hash of its first block and C-level
        # disjointness tests; Python loops only over the blocks followed. The route's cache is read
        # here, :meth:`_route` called only when it misses (a call per event was 0.4 us a batch).
        routes = self._routes
        for event in events:
            if type(event) is BlockStored:
                hashes = event.block_hashes
                if not hashes:
                    continue
                medium, tier, stats = routes.get((stream, event.medium)) or self._route(stream, event.medium)
                if stats.evicted_at and not stats.evicted_at.keys().isdisjoint(hashes):
                    self._refetched(stats, hashes, ts)
                if hash(hashes[0]) % SAMPLE == 0:
                    stored_at = stats.stored_at
                    for h in hashes:
                        if h not in stored_at:  # a second copy keeps the first one's time
                            # _bounded_put inline (a new key is the newest already): a call per block
                            stored_at[h] = ts
                            if len(stored_at) > MAX_TRACKED:
                                stored_at.popitem(last=False)
                if event.parent_block_hash is None:
                    self._root(stream, medium, hashes[0])
            elif type(event) is BlockRemoved:
                _medium, tier, stats = routes.get((stream, event.medium)) or self._route(stream, event.medium)
                if stats.stored_at and not stats.stored_at.keys().isdisjoint(event.block_hashes):
                    self._removed(stream, tier, stats, event.block_hashes, ts)
            elif type(event) is AllBlocksCleared:
                self._forget(stream)

    def _refetched(self, stats: TierStats, hashes: list[Hash], ts: float) -> None:
        for h in hashes:
            evicted = stats.evicted_at.pop(h, None)
            if evicted is not None and ts - evicted <= self.refetch_window:
                stats.refetches += 1

    def _removed(self, stream: Stream, tier: str, stats: TierStats, hashes: list[Hash], ts: float) -> None:
        for h in hashes:
            stored = stats.stored_at.pop(h, None)
            if stored is None:
                continue  # not followed (or stored before the gateway watched)
            stats.evictions += 1
            _bounded_put(stats.evicted_at, h, ts)
            seconds = max(0.0, ts - stored)
            stats.lifetimes += 1
            stats.lifetime_sum += seconds
            stats.buckets[bisect_left(LIFETIME_BUCKETS, seconds)] += 1  # the first bound >= seconds
        if stats.evictions and (stream, tier) not in self._counted:
            self._counted[(stream, tier)] = stats

    def _root(self, stream: Stream, medium: str, h: Hash) -> None:
        roots = self._roots.get(stream)
        if roots is None:
            roots = self._roots[stream] = OrderedDict()
        roots[(medium, h)] = None
        roots.move_to_end((medium, h))
        if len(roots) > MAX_ROOTS:
            roots.popitem(last=False)

    def _forget(self, stream: Stream) -> None:
        """The engine's cache is gone (restart, AllBlocksCleared): its blocks died unobserved."""
        for (key, _tier), stats in self._tiers.items():
            if key == stream:
                stats.stored_at.clear()

    def streams(self) -> list[tuple[Stream, str, TierStats]]:
        return [(stream, tier, stats) for (stream, tier), stats in sorted(self._tiers.items())]

    def counted(self) -> list[tuple[Stream, str, TierStats]]:
        """The streams' tiers that saw a sampled eviction, in the order of their first (refetches
        come after an eviction): those the lifetime, eviction and refetch figures are exported for."""
        return [(stream, tier, stats) for (stream, tier), stats in self._counted.items()]

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
            for medium, h in reversed(self._roots.get((index.source, index.dp_rank), {})):
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
            "refetch_window_seconds": self.refetch_window,
            "streams": [streams[key] for key in sorted(streams)],
            "prefixes": self.prefix_spread(indexes if up is None else up),
        }
