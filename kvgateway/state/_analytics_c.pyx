# cython: language_level=3, boundscheck=False, wraparound=False, annotation_typing=False
"""The compiled pass of the cache analytics: :mod:`kvgateway.state._analytics_py`'s
``AnalyticsPass``, step for step, as an extension type.

The same tables (the reference's :class:`TierStats` with its ``OrderedDict`` s, the ``tiers``,
``counted``, ``roots`` and ``routes`` dicts), the same operations on them in the same order: the
sampling decision, every bound's eviction order, the counts and the order of ``counted`` are the
reference's (checked by tests/unit/state/test_analytics_differential.py), and the analytics read
them as before. What changes is the cost around them: the per-event loop, the membership tests
and the followed blocks run without the interpreter, and an event whose raw medium equals the
previous event's reuses its route without building the cache's key (a route is a function of the
stream and the raw medium: the cache hands out the same one).

Times and counts stay Python objects (an engine's timestamp is whatever the wire held), so every
sum, difference and comparison is Python's own.
"""

from bisect import bisect_left
from collections import OrderedDict

from kvgateway.engine.mediums import medium_tier, normalise_medium
from kvgateway.engine.wire import AllBlocksCleared, BlockRemoved, BlockStored
from kvgateway.log.ordered import BatchRecord, NoticeRecord
from kvgateway.runtime.metrics import LIFETIME_BUCKETS
from kvgateway.state._analytics_py import MAX_ROOTS, MAX_ROUTES, MAX_TRACKED, REFETCH_WINDOW_SECONDS, SAMPLE, TierStats

cdef object _BlockStored = BlockStored
cdef object _BlockRemoved = BlockRemoved
cdef object _AllBlocksCleared = AllBlocksCleared
cdef object _BatchRecord = BatchRecord
cdef object _NoticeRecord = NoticeRecord
cdef object _OrderedDict = OrderedDict
cdef object _TierStats = TierStats
cdef object _bisect_left = bisect_left
cdef object _BUCKETS = LIFETIME_BUCKETS
cdef Py_hash_t _SAMPLE = SAMPLE
cdef object _UNSEEN = object()  # no event's medium yet in this batch


cdef inline bint _meets(object table, object hashes) except -1:
    """``not table.keys().isdisjoint(hashes)``: the same membership tests in the same order."""
    for h in hashes:
        if h in table:
            return True
    return False


cdef class AnalyticsPass:
    """The analytics' state and the pass over each batch: see the reference's docstring."""

    cdef public object refetch_window
    cdef public Py_ssize_t max_tracked, max_roots, max_routes
    cdef public dict tiers, counted, roots, routes

    def __init__(
        self,
        refetch_window=REFETCH_WINDOW_SECONDS,
        Py_ssize_t max_tracked=MAX_TRACKED,
        Py_ssize_t max_roots=MAX_ROOTS,
        Py_ssize_t max_routes=MAX_ROUTES,
    ):
        self.refetch_window = refetch_window
        self.max_tracked = max_tracked
        self.max_roots = max_roots
        self.max_routes = max_routes
        self.tiers = {}
        self.counted = {}
        self.roots = {}
        self.routes = {}

    def tier(self, stream, tier):
        return self._tier(stream, tier)

    cdef object _tier(self, object stream, object tier):
        stats = self.tiers.get((stream, tier))
        if stats is None:
            stats = self.tiers[(stream, tier)] = _TierStats()
        return stats

    def follow(self, entry):
        record = entry.record
        if type(record) is _BatchRecord:
            batch = record.batch
            self._apply(record.stream, batch.events, batch.ts)
        elif type(record) is _NoticeRecord and record.kind == "restart":
            self._forget(record.stream)

    def route(self, stream, medium):
        return self._route(stream, medium)

    cdef tuple _route(self, object stream, object medium):
        route = self.routes.get((stream, medium))
        if route is None:
            tier = medium_tier(medium)
            route = (normalise_medium(medium), tier, self._tier(stream, tier))
            if len(self.routes) < self.max_routes:
                self.routes[(stream, medium)] = route
        return route

    def apply(self, stream, events, ts):
        self._apply(stream, events, ts)

    cdef int _apply(self, object stream, object events, object ts) except -1:
        cdef object seen = _UNSEEN  # the previous event's raw medium, whose route is ``route``
        cdef tuple route = None
        for event in events:
            kind = type(event)
            if kind is _BlockStored:
                hashes = event.block_hashes
                if not hashes:
                    continue
            elif kind is _BlockRemoved:
                hashes = event.block_hashes
            else:
                if kind is _AllBlocksCleared:
                    self._forget(stream)
                continue
            medium = event.medium
            if not (medium is seen or medium == seen):
                route = self.routes.get((stream, medium)) or self._route(stream, medium)
                seen = medium
            stats = route[2]
            if kind is _BlockRemoved:
                stored_at = stats.stored_at
                if stored_at and _meets(stored_at, hashes):
                    self._removed(stream, route[1], stats, hashes, ts)
                continue
            evicted_at = stats.evicted_at
            if evicted_at and _meets(evicted_at, hashes):
                self._refetched(stats, hashes, ts)
            if hash(hashes[0]) % _SAMPLE == 0:
                self._sampled(stats.stored_at, hashes, ts)
            if event.parent_block_hash is None:
                self._root(stream, route[0], hashes[0])
        return 0

    cdef int _sampled(self, object stored_at, object hashes, object ts) except -1:
        cdef Py_ssize_t bound = self.max_tracked
        for h in hashes:
            if h not in stored_at:  # a second copy keeps the first one's time
                stored_at[h] = ts  # a new key is the newest already
                if len(stored_at) > bound:
                    stored_at.popitem(False)
        return 0

    cdef int _refetched(self, object stats, object hashes, object ts) except -1:
        for h in hashes:
            evicted = stats.evicted_at.pop(h, None)
            if evicted is not None and ts - evicted <= self.refetch_window:
                stats.refetches += 1
        return 0

    cdef int _removed(self, object stream, object tier, object stats, object hashes, object ts) except -1:
        evicted_at = stats.evicted_at
        for h in hashes:
            stored = stats.stored_at.pop(h, None)
            if stored is None:
                continue  # not followed (or stored before the gateway watched)
            stats.evictions += 1
            evicted_at[h] = ts
            evicted_at.move_to_end(h)
            if len(evicted_at) > self.max_tracked:
                evicted_at.popitem(False)
            seconds = ts - stored
            if not seconds > 0.0:  # max(0.0, seconds): the first of the largest
                seconds = 0.0
            stats.lifetimes += 1
            stats.lifetime_sum += seconds
            stats.buckets[_bisect_left(_BUCKETS, seconds)] += 1  # the first bound >= seconds
        if stats.evictions and (stream, tier) not in self.counted:
            self.counted[(stream, tier)] = stats
        return 0

    cdef int _root(self, object stream, object medium, object h) except -1:
        roots = self.roots.get(stream)
        if roots is None:
            roots = self.roots[stream] = _OrderedDict()
        key = (medium, h)
        roots[key] = None
        roots.move_to_end(key)
        if len(roots) > self.max_roots:
            roots.popitem(False)
        return 0

    def forget(self, stream):
        """The engine's cache is gone (restart, AllBlocksCleared): its blocks died unobserved."""
        self._forget(stream)

    cdef int _forget(self, object stream) except -1:
        for (key, _tier), stats in self.tiers.items():
            if key == stream:
                stats.stored_at.clear()
        return 0
