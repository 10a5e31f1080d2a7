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

Most of the membership tests miss (a removed block was sampled once in :data:`SAMPLE`, a stored
one was seldom evicted lately), and a miss in a table of 20,000 blocks costs the dict's probes in
half a megabyte. So each stats' ``stored_at`` and ``evicted_at`` has a :c:type:`Filter` in front
(state/_hashtable.pxd's, as the index's groups have before their extra references),
a bitmap of the keys (a bit a key, one bit in 8 set at most, 16 bits a key once rebuilt):
a clear bit says the key is absent and the dict is not asked; a set bit asks the dict, which
answers as before. The filter is the pass's, kept beside each stats (:class:`_Tables`) and
updated at each key the pass adds (a key taken out leaves its bit set until the next rebuild, from
the dict's keys, once more keys were added than the bitmap allows): the tables are the pass's to
write, read by everyone else. A filter's key is the block hash's ``hash()`` for an int (an int64
or u64 one's worked out in line from its digits, as CPython does it), and for a 32-byte hash
(vLLM's raw sha256) the index's fingerprint of its bytes (``_fingerprint`` in
state/_hashtable.pxd: a few multiplications, where ``hash()`` of a new bytes object is a SipHash
over them, and a filter that says no never needs it). The sampling decision is the reference's
(``sample_key``: an int's ``hash()``, bytes' first eight bytes). An event's fields are read from its slots (``field`` in engine/_slots.pxd).

Times and counts stay Python objects (an engine's timestamp is whatever the wire held), so every
sum, difference and comparison is Python's own.
"""

import sys
from bisect import bisect_left
from collections import OrderedDict

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next
from cpython.object cimport PyObject
from libc.stdint cimport uint64_t

from kvgateway._pylong cimport HASH_MODULUS  # a 64-bit CPython's int hash, which keys are hashed as in line
from kvgateway.engine._slots cimport Fields, field, field_offset, fields_of  # a Struct's field read from its slot
from kvgateway.state._hashtable cimport Filter, _filter_free, _filter_may, _filter_note, _filter_size  # negative filters
from kvgateway.state._hashtable cimport CONTENT, _BYTES, Key, _key_of, key_hash  # a hash's key, its hash()
from kvgateway.state._hashtable cimport hash_count, hash_hashed, hash_key, hash_object  # an event's hashes

from kvgateway.engine.mediums import medium_tier, normalise_medium
from kvgateway.engine.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored
from kvgateway.log.records import BatchRecord, NoticeRecord
from kvgateway.runtime.metrics import LIFETIME_BUCKETS
from kvgateway.state._analytics_py import MAX_ROOTS, MAX_ROUTES, MAX_TRACKED, REFETCH_WINDOW_SECONDS, SAMPLE, TierStats

cdef object _BlockStored = BlockStored
cdef object _BlockRemoved = BlockRemoved
cdef object _AllBlocksCleared = AllBlocksCleared
cdef object _BatchRecord = BatchRecord
cdef object _Batch = Batch
cdef object _NoticeRecord = NoticeRecord
cdef object _OrderedDict = OrderedDict
cdef object _TierStats = TierStats
cdef object _bisect_left = bisect_left
cdef object _BUCKETS = LIFETIME_BUCKETS
cdef Py_hash_t _SAMPLE = SAMPLE
cdef object _UNSEEN = object()  # no event's medium yet in this batch


cdef enum:
    _MAX_BOUNDS = 32


cdef double _BOUNDS[_MAX_BOUNDS]  # the lifetime buckets' bounds as C doubles, where they are floats
cdef Py_ssize_t _NBOUNDS = -1  # -1: they are not (too many, another type, out of order): bisect_left


def _bounds_in_c():
    """The bounds copied into ``_BOUNDS`` where a C comparison answers as Python's (floats, in
    order, no NaN); the number copied, or -1."""
    cdef Py_ssize_t i
    bounds = tuple(_BUCKETS)
    if len(bounds) > _MAX_BOUNDS or any(type(b) is not float for b in bounds) or list(bounds) != sorted(bounds):
        return -1
    if any(b != b for b in bounds):
        return -1
    for i in range(len(bounds)):
        _BOUNDS[i] = bounds[i]
    return len(bounds)


_NBOUNDS = _bounds_in_c()


cdef inline object _bucket_of(object seconds):
    """``bisect_left(LIFETIME_BUCKETS, seconds)``: a float's worked out in C (the first bound not
    below it, as the bisection finds it in sorted bounds), without the call."""
    cdef Py_ssize_t i
    cdef double x
    if _NBOUNDS < 0 or type(seconds) is not float:
        return _bisect_left(_BUCKETS, seconds)
    x = <double>seconds
    for i in range(_NBOUNDS):
        if not _BOUNDS[i] < x:
            return i
    return _NBOUNDS


# The fields the pass reads, per event (msgspec keeps a Struct's fields in slots at fixed offsets)
cdef Fields _STORED = fields_of(BlockStored)
cdef Fields _REMOVED = fields_of(BlockRemoved)
cdef Fields _BATCH = fields_of(Batch)
cdef Py_ssize_t _RECORD_BATCH = field_offset(BatchRecord, "batch")
cdef Py_ssize_t _RECORD_STREAM = field_offset(BatchRecord, "stream")


# --- the negative filters ----------------------------------------------------------------------

cdef enum:
    _MIN_LOG2 = 10  # a new or emptied filter's bits: 1024 (128 bytes)


cdef bint _HASH_IN_LINE = sys.hash_info.modulus == HASH_MODULUS  # a 64-bit CPython's int hash


cdef inline uint64_t _first_eight(const unsigned char* data, Py_ssize_t n) noexcept:
    """Bytes' first eight (or fewer) read as a little-endian number."""
    cdef uint64_t key = 0
    cdef Py_ssize_t i
    for i in range(min(n, 8)):
        key |= (<uint64_t>data[i]) << (8 * i)
    return key


cdef inline bint _followed_of(Key* k, object h) except -1:
    """Whether a chain whose first block is ``h`` (its key ``k``; ``h`` as :func:`hash_hashed` gives
    it) is followed: the reference's ``sample_key(h) % SAMPLE == 0``, bytes' first eight bytes read
    as a little-endian number, an int's ``hash()`` with Python's modulo."""
    if k.kind == _BYTES:
        return _first_eight(k.data, CONTENT) % <uint64_t>_SAMPLE == 0
    if type(h) is bytes:  # of another length than 32
        return _first_eight(<const unsigned char*>PyBytes_AS_STRING(h), PyBytes_GET_SIZE(h)) % <uint64_t>_SAMPLE == 0
    return key_hash(k, h, _HASH_IN_LINE) % _SAMPLE == 0


cdef inline bint _followed(object h) except -1:
    cdef Key k
    _key_of(h, &k)
    return _followed_of(&k, h)


cdef inline bint _followed_at(object hashes, Py_ssize_t i) except -1:
    """:func:`_followed` of hash ``i`` of a list or a Hashes (a Hashes makes no object)."""
    cdef Key k
    hash_key(hashes, i, &k)
    return _followed_of(&k, hash_hashed(hashes, i, &k, _HASH_IN_LINE))


cdef inline uint64_t _filter_key_of(Key* k, object h) except? 0:
    """A block hash's key in the filters, the same wherever it is worked out (a filter rebuilt from
    a table's keys finds the bits the pass set): a 32-byte hash's fingerprint (``k``'s key), any
    other's ``hash()``. A fingerprint is never 0; a hash() may be, and a 0 key is a key like another."""
    if k.kind == _BYTES:
        return k.key
    return <uint64_t>key_hash(k, h, _HASH_IN_LINE)


cdef inline uint64_t _filter_key(object h) except? 0:
    cdef Key k
    _key_of(h, &k)
    return _filter_key_of(&k, h)


cdef inline uint64_t _filter_key_at(object hashes, Py_ssize_t i) except? 0:
    """:func:`_filter_key` of hash ``i`` of a list or a Hashes (a Hashes makes no object)."""
    cdef Key k
    hash_key(hashes, i, &k)
    return _filter_key_of(&k, hash_hashed(hashes, i, &k, _HASH_IN_LINE))


# The filters are _hashtable.pxd's, keyed by _filter_key: ints' hashes are their values, which its
# Fibonacci hashing spreads alike
cdef inline bint _may_hold(Filter* f, uint64_t key) noexcept nogil:
    """False: no key ``key`` is in the filter's table."""
    return _filter_may(f, key)


cdef int _rebuild(Filter* f, object table) except -1:
    """``f`` from ``table``'s keys, sized for them (the bits of keys taken out cleared); the keys
    read as the dict holds them (their order does not matter here)."""
    cdef Py_ssize_t pos = 0
    cdef PyObject* key
    cdef PyObject* value
    _filter_size(f, len(table), _MIN_LOG2)
    while PyDict_Next(table, &pos, &key, &value):
        _filter_note(f, _filter_key(<object>key))
    return 0


cdef inline int _added(Filter* f, object table, uint64_t key) except -1:
    """A block of filter key ``key`` was added to ``table``: its bit set, the filter rebuilt if too full."""
    _filter_note(f, key)
    if f.added > f.limit:
        _rebuild(f, table)
    return 0


cdef class _Tables:
    """One stats (a stream's tier) and the filters in front of its two tables."""

    cdef object stats, stored_at, evicted_at
    cdef Filter stored, evicted

    def __cinit__(self, stats):
        self.stats = stats
        self.stored_at = stats.stored_at
        self.evicted_at = stats.evicted_at
        _rebuild(&self.stored, self.stored_at)
        _rebuild(&self.evicted, self.evicted_at)

    def __dealloc__(self):
        _filter_free(&self.stored)
        _filter_free(&self.evicted)


cdef class _Route:
    """A cached route (the public ``routes`` entry's normalised medium and tier) with its tables."""

    cdef object medium, tier
    cdef _Tables tables

    def __cinit__(self, medium, tier, _Tables tables):
        self.medium = medium
        self.tier = tier
        self.tables = tables


cdef inline bint _meets(Filter* f, object table, object hashes) except -1:
    """``not table.keys().isdisjoint(hashes)``: the same answer, the table asked only for the
    hashes its filter may hold (in the same order; a Hashes' made only for those)."""
    cdef Py_ssize_t i, n = hash_count(hashes)
    if n < 0:
        for h in hashes:
            if _may_hold(f, _filter_key(h)) and h in table:
                return True
        return False
    for i in range(n):
        if _may_hold(f, _filter_key_at(hashes, i)) and hash_object(hashes, i) in table:
            return True
    return False


# --- the pass ----------------------------------------------------------------------------------

cdef class AnalyticsPass:
    """The analytics' state and the pass over each batch: see the reference's docstring."""

    cdef public object refetch_window
    cdef public Py_ssize_t max_tracked, max_roots, max_routes
    cdef public dict tiers, counted, roots, routes
    cdef dict _tables  # (stream, tier): its stats' _Tables, beside ``tiers``
    cdef dict _routes  # (stream, raw medium): a _Route, beside each of ``routes``
    # the last route ``_routes`` gave, and its key's two objects: a batch's stream and medium are
    # nearly always the previous batch's (the same objects), and ``_routes`` is only added to
    cdef object _last_stream, _last_medium
    cdef _Route _last_routed

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
        self._tables = {}
        self._routes = {}
        self._last_stream = self._last_medium = self._last_routed = None

    def tier(self, stream, tier):
        return self._tier(stream, tier)

    cdef object _tier(self, object stream, object tier):
        stats = self.tiers.get((stream, tier))
        if stats is None:
            stats = self.tiers[(stream, tier)] = _TierStats()
        return stats

    cdef _Tables _tables_of(self, object stream, object tier):
        """The tier's stats (made as :meth:`tier` does) with its filters (made from its tables)."""
        stats = self._tier(stream, tier)
        cdef _Tables tables = self._tables.get((stream, tier))
        if tables is None or tables.stats is not stats:
            tables = self._tables[(stream, tier)] = _Tables(stats)
        return tables

    def follow(self, entry):
        record = entry.record
        if type(record) is _BatchRecord:
            batch = field(record, _BatchRecord, _RECORD_BATCH, "batch")
            self._apply(
                field(record, _BatchRecord, _RECORD_STREAM, "stream"),
                field(batch, _Batch, _BATCH.events, "events"),
                field(batch, _Batch, _BATCH.ts, "ts"),
            )
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

    cdef _Route _routed(self, object stream, object medium):
        """:meth:`route`'s answer with the tier's tables, cached beside ``routes`` (as it is)."""
        if self._last_routed is not None and stream is self._last_stream and medium is self._last_medium:
            return self._last_routed  # what ``_routes`` answers the same two objects
        key = (stream, medium)
        cdef _Route routed = self._routes.get(key)
        if routed is None:
            route = self._route(stream, medium)
            routed = _Route(route[0], route[1], self._tables_of(stream, route[1]))
            if key in self.routes:
                self._routes[key] = routed
            else:
                return routed  # not kept: made again next time, as the reference does
        self._last_stream, self._last_medium, self._last_routed = stream, medium, routed
        return routed

    def apply(self, stream, events, ts):
        self._apply(stream, events, ts)

    cdef int _apply(self, object stream, object events, object ts) except -1:
        cdef object seen = _UNSEEN  # the previous event's raw medium, whose route is ``routed``
        cdef _Route routed = None
        cdef _Tables tables
        for event in events:
            kind = type(event)
            if kind is _BlockStored:
                hashes = field(event, _BlockStored, _STORED.block_hashes, "block_hashes")
                if not hashes:
                    continue
                medium = field(event, _BlockStored, _STORED.medium, "medium")
            elif kind is _BlockRemoved:
                hashes = field(event, _BlockRemoved, _REMOVED.block_hashes, "block_hashes")
                medium = field(event, _BlockRemoved, _REMOVED.medium, "medium")
            else:
                if kind is _AllBlocksCleared:
                    self._forget(stream)
                continue
            if not (medium is seen or medium == seen):
                routed = self._routed(stream, medium)
                seen = medium
            tables = routed.tables
            if kind is _BlockRemoved:
                if tables.stored_at and _meets(&tables.stored, tables.stored_at, hashes):
                    self._removed(stream, routed.tier, tables, hashes, ts)
                continue
            if tables.evicted_at and _meets(&tables.evicted, tables.evicted_at, hashes):
                self._refetched(tables, hashes, ts)
            if _followed_at(hashes, 0) if hash_count(hashes) > 0 else _followed(hashes[0]):
                self._sampled(tables, hashes, ts)
            if field(event, _BlockStored, _STORED.parent_block_hash, "parent_block_hash") is None:
                self._root(stream, routed.medium, hash_object(hashes, 0) if hash_count(hashes) > 0 else hashes[0])
        return 0

    cdef int _sampled(self, _Tables tables, object hashes, object ts) except -1:
        cdef Py_ssize_t bound = self.max_tracked
        cdef uint64_t key
        stored_at = tables.stored_at
        for h in hashes:
            key = _filter_key(h)
            if not (_may_hold(&tables.stored, key) and h in stored_at):  # a second copy keeps the first one's time
                stored_at[h] = ts  # a new key is the newest already
                if len(stored_at) > bound:
                    stored_at.popitem(False)
                _added(&tables.stored, stored_at, key)
        return 0

    cdef int _refetched(self, _Tables tables, object hashes, object ts) except -1:
        stats = tables.stats
        for h in hashes:
            if not _may_hold(&tables.evicted, _filter_key(h)):
                continue  # not evicted lately: the pop finds nothing
            evicted = tables.evicted_at.pop(h, None)
            if evicted is not None and ts - evicted <= self.refetch_window:
                stats.refetches += 1
        return 0

    cdef int _removed(self, object stream, object tier, _Tables tables, object hashes, object ts) except -1:
        """Each followed block's eviction counted and its lifetime bucketed; the stats' counts and
        sum read once and written back once a call (at its end, or where it stops), each added to
        in the reference's order: an attribute read and written per eviction cost about 600
        instructions a batch."""
        cdef uint64_t key
        cdef bint new
        cdef Py_ssize_t evictions = 0, lifetimes = 0
        stats = tables.stats
        stored_at = tables.stored_at
        evicted_at = tables.evicted_at
        lifetime_sum = buckets = None
        try:
            for h in hashes:
                key = _filter_key(h)
                if not _may_hold(&tables.stored, key):
                    continue  # not followed: the pop finds nothing
                stored = stored_at.pop(h, None)
                if stored is None:
                    continue  # not followed (or stored before the gateway watched)
                evictions += 1
                new = not _may_hold(&tables.evicted, key)
                evicted_at[h] = ts
                if not new:  # a new key is the newest already
                    evicted_at.move_to_end(h)
                if len(evicted_at) > self.max_tracked:
                    evicted_at.popitem(False)
                _added(&tables.evicted, evicted_at, key)
                seconds = ts - stored
                if not seconds > 0.0:  # max(0.0, seconds): the first of the largest
                    seconds = 0.0
                if not lifetimes:
                    lifetime_sum, buckets = stats.lifetime_sum, stats.buckets
                lifetimes += 1
                lifetime_sum += seconds
                buckets[_bucket_of(seconds)] += 1  # the first bound >= seconds
        finally:
            if evictions:
                stats.evictions += evictions
            if lifetimes:
                stats.lifetimes += lifetimes
                stats.lifetime_sum = lifetime_sum
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
        cdef _Tables tables
        for (key, tier), stats in self.tiers.items():
            if key == stream:
                stats.stored_at.clear()
                tables = self._tables.get((key, tier))
                if tables is not None:
                    _filter_size(&tables.stored, 0, _MIN_LOG2)
        return 0
