# cython: language_level=3, boundscheck=False, wraparound=False, annotation_typing=False
"""The compiled pass of the index: :mod:`kvgateway.state._apply_py`'s ``Group``, ``Medium`` and
``apply_batch``, step for step, as extension types.

The same sets and dicts (a group's ``blocks`` and ``extra``, the fleet's holders), the same
operations on them in the same order, the same calls to the observer: the index's state, snapshots,
digests and the attribution's counts are the reference's (checked by
tests/unit/state/test_apply_differential.py). What changes is the cost around the set operations:
the groups' and mediums' fields are C struct members, their methods C calls, and the per-event loop
runs without the interpreter. One structure differs inside, not in what it shows: a stream's GPU
evictions (:class:`Evictions`) keep each generation in flat C tables of (hash, engine time), 16
bytes a slot for u64 hashes and 48 for 32-byte ones, rather than a dict of Python hashes and
floats: no object per eviction, an evicted hash's int or bytes freed with its block, and a lookup
one probe into one array (other hashes, rare, in a dict beside them).

Counts are Python objects where a value comes from the wire or a clock unbounded (a block size, a
second), so no value a Python int holds can overflow here.
"""

from collections import Counter
import math

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.set cimport PySet_Discard
from libc.stdint cimport uint64_t
from libc.string cimport memcmp, memcpy, memset

from kvgateway._pylong cimport u64_of  # a hash's int read from its digits

from kvgateway.engine.wire import AllBlocksCleared, BlockRemoved, BlockStored
from kvgateway.state._apply_py import (
    BUCKET_SECONDS,
    COMPARE_ALL,
    COMPARE_NONE,
    DEFAULT_REFETCH_WINDOW_SECONDS,
    MAX_EVICTED,
    NEW,
    ORIGIN_COUNT,
    RATE_WINDOW_SECONDS,
    RECENT_SECONDS,
)
from kvgateway.state.digest import MASK, elements_sum, prefix_state

_NEVER = -(2**62)
cdef Py_ssize_t _WINDOW = RATE_WINDOW_SECONDS
cdef int _COMPARE_ALL = COMPARE_ALL
cdef int _NEW = NEW
_BUCKETS = RECENT_SECONDS // BUCKET_SECONDS


cdef struct Slot:
    uint64_t key  # 0: the slot is empty (hash 0 is kept in its table's ``zero``)
    double ts


cdef enum:
    CONTENT = 32  # the bytes of a content-keyed slot: a sha256 block hash (vLLM's raw-bytes hashes)


cdef struct Table:
    # Open addressing, linear probing, at most 3/4 full: one probe (one cache line) answers most
    # lookups. Deletion shifts the entries after a freed slot back (no tombstones).
    # Two kinds share the code: keyed by a u64 hash itself (``content`` NULL), or by 32-byte hashes
    # (``content`` holds each slot's bytes; ``key`` a non-zero fingerprint of them, compared first,
    # so a lookup of an absent hash touches the slots alone).
    Slot* slots
    unsigned char* content
    size_t mask
    size_t n  # entries, hash 0 included
    bint has_zero
    double zero


cdef size_t _MIN_SLOTS = 16


cdef inline size_t _mix(uint64_t key) noexcept nogil:
    # splitmix64's finaliser: engines' hashes are good, but a test's 0, 1, 2, ... must spread too
    key ^= key >> 30
    key *= 0xbf58476d1ce4e5b9ULL
    key ^= key >> 27
    key *= 0x94d049bb133111ebULL
    key ^= key >> 31
    return <size_t>key


cdef inline uint64_t _fingerprint(const unsigned char* data) noexcept nogil:
    """A non-zero 64-bit fingerprint of 32 bytes: the four words weighed by odd constants, so that
    hashes alike in all but one word, or of four equal words, still differ (the table mixes it again
    for the slot); equal fingerprints are told apart by the bytes."""
    cdef uint64_t w0, w1, w2, w3
    memcpy(&w0, data, 8)
    memcpy(&w1, data + 8, 8)
    memcpy(&w2, data + 16, 8)
    memcpy(&w3, data + 24, 8)
    cdef uint64_t fp = w0 + w1 * 0x9e3779b97f4a7c15ULL + w2 * 0xc2b2ae3d27d4eb4fULL + w3 * 0x165667b19e3779f9ULL
    return fp if fp else 1


cdef int _table_init(Table* table, size_t slots, bint content) except -1:
    table.slots = <Slot*>PyMem_Malloc(slots * sizeof(Slot))  # traced by tracemalloc, as a dict's table is
    if table.slots is NULL:
        raise MemoryError()
    memset(table.slots, 0, slots * sizeof(Slot))
    table.content = NULL
    if content:
        table.content = <unsigned char*>PyMem_Malloc(slots * CONTENT)
        if table.content is NULL:
            PyMem_Free(table.slots)
            table.slots = NULL
            raise MemoryError()
    table.mask = slots - 1
    table.n = 0
    table.has_zero = False
    return 0


cdef inline bint _slot_is(Table* table, size_t i, uint64_t key, const unsigned char* data) noexcept nogil:
    """Whether slot ``i`` holds ``key`` (and, in a content table, ``data``, its bytes)."""
    return table.slots[i].key == key and (
        table.content is NULL or memcmp(table.content + i * CONTENT, data, CONTENT) == 0
    )


cdef inline Py_ssize_t _table_find(Table* table, uint64_t key, const unsigned char* data) noexcept nogil:
    """The slot of a non-zero ``key`` (with ``data``, its bytes, in a content table), or -1."""
    cdef size_t i = _mix(key) & table.mask
    while table.slots[i].key:
        if _slot_is(table, i, key, data):
            return <Py_ssize_t>i
        i = (i + 1) & table.mask
    return -1


cdef inline bint _table_has(Table* table, uint64_t key, const unsigned char* data) noexcept nogil:
    return table.has_zero if key == 0 else _table_find(table, key, data) >= 0


cdef inline void _table_move(Table* table, size_t to, size_t frm) noexcept nogil:
    table.slots[to] = table.slots[frm]
    if table.content is not NULL:
        memcpy(table.content + to * CONTENT, table.content + frm * CONTENT, CONTENT)


cdef int _table_grow(Table* table) except -1:
    cdef Slot* old = table.slots
    cdef unsigned char* old_content = table.content
    cdef size_t count = table.mask + 1
    cdef size_t i, j
    cdef size_t n = table.n
    cdef bint has_zero = table.has_zero
    cdef double zero = table.zero
    _table_init(table, count * 2, old_content is not NULL)
    table.n = n
    table.has_zero, table.zero = has_zero, zero
    for i in range(count):
        if old[i].key:
            j = _mix(old[i].key) & table.mask
            while table.slots[j].key:
                j = (j + 1) & table.mask
            table.slots[j] = old[i]
            if old_content is not NULL:
                memcpy(table.content + j * CONTENT, old_content + i * CONTENT, CONTENT)
    PyMem_Free(old)
    PyMem_Free(old_content)
    return 0


cdef inline int _table_set(Table* table, uint64_t key, const unsigned char* data, double ts) except -1:
    cdef size_t i
    if key == 0:
        table.n += not table.has_zero
        table.has_zero, table.zero = True, ts
        return 0
    if (table.n + 1) * 4 > (table.mask + 1) * 3:
        _table_grow(table)
    i = _mix(key) & table.mask
    while table.slots[i].key:
        if _slot_is(table, i, key, data):
            table.slots[i].ts = ts
            return 0
        i = (i + 1) & table.mask
    table.slots[i].key = key
    table.slots[i].ts = ts
    if table.content is not NULL:
        memcpy(table.content + i * CONTENT, data, CONTENT)
    table.n += 1
    return 0


cdef void _table_delete(Table* table, size_t i) noexcept nogil:
    """Free slot ``i``, moving back every later entry of the run that would no longer be found."""
    cdef size_t j = i
    cdef size_t home
    while True:
        j = (j + 1) & table.mask
        if not table.slots[j].key:
            break
        home = _mix(table.slots[j].key) & table.mask
        # the entry at j stays where it is if its home lies cyclically in (i, j]
        if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
            continue
        _table_move(table, i, j)
        i = j
    table.slots[i].key = 0
    table.n -= 1


cdef inline bint _table_pop(Table* table, uint64_t key, const unsigned char* data, double* ts) noexcept nogil:
    """Forget ``key``; whether it was there (its time in ``ts``)."""
    cdef Py_ssize_t i
    if key == 0:
        if not table.has_zero:
            return False
        ts[0] = table.zero
        table.has_zero = False
        table.n -= 1
        return True
    i = _table_find(table, key, data)
    if i < 0:
        return False
    ts[0] = table.slots[i].ts
    _table_delete(table, <size_t>i)
    return True


cdef void _table_free(Table* table) noexcept:
    PyMem_Free(table.slots)
    PyMem_Free(table.content)
    table.slots = NULL
    table.content = NULL


cdef int _table_clear(Table* table) except -1:
    """Empty, back to its smallest size (a generation the window leaves behind gives its memory back)."""
    cdef bint content = table.content is not NULL
    _table_free(table)
    return _table_init(table, _MIN_SLOTS, content)


cdef int _table_empty(Table* table, Py_ssize_t bound) except -1:
    """Empty, keeping its slots if ``bound`` entries need as many: a generation dropped at the bound
    fills again at the same rate, and growing back from 16 slots rehashed each entry about once
    more (and zeroed twice the memory). A table grown past the bound's size (by the one ``add`` that
    crossed it) goes back to the smallest size, so the bound's memory holds."""
    cdef Py_ssize_t slots = <Py_ssize_t>(table.mask + 1)
    if bound * 4 <= (slots // 2) * 3:  # the bound fits in half of it: more slots than it needs
        return _table_clear(table)
    memset(table.slots, 0, <size_t>slots * sizeof(Slot))
    table.n = 0
    table.has_zero = False
    return 0


cdef enum:
    _INT = 0  # an int of 0 to 2**64-1: the u64 table, keyed by itself
    _BYTES = 1  # bytes of CONTENT length: the content table, keyed by its fingerprint and bytes
    _OTHER = 2  # any other hash: the dict


cdef struct Key:
    int kind
    uint64_t key
    const unsigned char* data  # a _BYTES hash's own buffer (alive while the hash is), else NULL


cdef inline int _key_of(object h, Key* k) except -1:
    k.data = NULL
    if u64_of(h, &k.key):
        k.kind = _INT
    elif type(h) is bytes and PyBytes_GET_SIZE(h) == CONTENT:
        k.kind = _BYTES
        k.data = <const unsigned char*>PyBytes_AS_STRING(h)
        k.key = _fingerprint(k.data)
    else:
        k.kind = _OTHER
    return 0


@cython.final
cdef class _Generation:
    """One generation of :class:`Evictions`: the engines' two kinds of hash in C tables (u64 ints,
    32-byte hashes), any other hash in a dict, each with its engine time."""

    cdef Table ints
    cdef Table blobs
    cdef dict other

    def __cinit__(self):
        _table_init(&self.ints, _MIN_SLOTS, False)
        _table_init(&self.blobs, _MIN_SLOTS, True)
        self.other = {}

    def __dealloc__(self):
        _table_free(&self.ints)
        _table_free(&self.blobs)

    cdef inline Py_ssize_t size(self):
        return <Py_ssize_t>(self.ints.n + self.blobs.n) + len(self.other)

    # Each kind's table named in its own branch, NULL given for the ints' bytes: choosing the table
    # in one helper cost 350 instructions a batch (cachegrind), the int path no longer compiled
    # knowing it compares no bytes.
    cdef inline int set(self, Key* k, object h, double at, object ts) except -1:
        if k.kind == _INT:
            _table_set(&self.ints, k.key, NULL, at)
        elif k.kind == _BYTES:
            _table_set(&self.blobs, k.key, k.data, at)
        else:
            self.other[h] = ts
        return 0

    cdef inline bint has(self, Key* k, object h) except -1:
        if k.kind == _INT:
            return _table_has(&self.ints, k.key, NULL)
        if k.kind == _BYTES:
            return _table_has(&self.blobs, k.key, k.data)
        return bool(self.other) and h in self.other  # most streams' dict is empty: no lookup

    cdef object pop(self, Key* k, object h):
        cdef double at = 0
        if k.kind == _OTHER:
            return self.other.pop(h, None)
        if _table_pop(&self.ints if k.kind == _INT else &self.blobs, k.key, k.data, &at):
            return at
        return None

    cdef dict shown(self):
        cdef size_t i
        cdef const char* content = <const char*>self.blobs.content
        out = {0: self.ints.zero} if self.ints.has_zero else {}
        for i in range(self.ints.mask + 1):
            if self.ints.slots[i].key:
                out[self.ints.slots[i].key] = self.ints.slots[i].ts
        for i in range(self.blobs.mask + 1):
            if self.blobs.slots[i].key:
                out[content[i * CONTENT : (i + 1) * CONTENT]] = self.blobs.slots[i].ts
        out.update(self.other)
        return out

    cdef int clear(self) except -1:
        _table_clear(&self.ints)
        _table_clear(&self.blobs)
        self.other = {}
        return 0

    cdef int empty(self, Py_ssize_t bound) except -1:
        _table_empty(&self.ints, bound)
        _table_empty(&self.blobs, bound)
        self.other = {}
        return 0


cdef class Evictions:
    """The compiled twin of :class:`kvgateway.state._apply_py.Evictions` (see there): the same two
    generations, each holding the engines' hashes in flat C tables of (hash, engine time) with no
    Python object per eviction: a u64 hash's int and a 32-byte hash's bytes are freed with their
    block, as without the attribution (the 32 bytes copied into the table). Any other hash is kept
    in a dict beside them. Each generation shows as the reference's dict (``current``,
    ``previous``; built on demand, for tests and inspection)."""

    cdef _Generation _current
    cdef _Generation _previous
    cdef public object window
    cdef public Py_ssize_t bound
    cdef public object since
    cdef public object dropped

    def __cinit__(self):
        self._current = _Generation()
        self._previous = _Generation()

    def __init__(self, window=DEFAULT_REFETCH_WINDOW_SECONDS, bound=MAX_EVICTED):
        self.window = window
        self.bound = bound
        self.since = -math.inf
        self.dropped = 0

    @property
    def current(self):
        return self._current.shown()

    @property
    def previous(self):
        return self._previous.shown()

    @property
    def size(self):
        return self._current.size() + self._previous.size()

    cpdef add(self, hashes, ts):
        cdef Key k
        cdef _Generation spare
        cdef double at = 0
        cdef Py_ssize_t bound = self.bound
        if ts - self.since > self.window:  # the generations move on: the previous one is forgotten
            spare = self._previous
            spare.clear()  # its memory back: the new generation grows as it fills
            self._previous, self._current = self._current, spare
            self.since = ts
        at = ts
        for h in hashes:
            _key_of(h, &k)
            self._current.set(&k, h, at, ts)
        if self._current.size() + self._previous.size() > bound:
            self.dropped += self._previous.size()
            self._previous.clear()  # not filled again before the window turns
            if self._current.size() > bound:
                self.dropped += self._current.size()
                self._current.empty(bound)  # it fills again at the same rate: its slots kept

    cdef bint _holds_any(self, hashes) except -1:
        cdef Key k
        for h in hashes:
            _key_of(h, &k)
            if self._current.has(&k, h) or self._previous.has(&k, h):
                return True
        return False

    cpdef bint none_of(self, hashes) except -1:
        return not self._holds_any(hashes)

    def take(self, h):
        cdef Key k
        _key_of(h, &k)
        evicted_at = self._current.pop(&k, h)
        previous = self._previous.pop(&k, h)
        return previous if evicted_at is None else evicted_at


cdef bint _fresh(set fleet, object evicted, object hashes) except -1:
    """No hash held anywhere in the fleet nor evicted lately (the reference's two tests, one loop)."""
    if type(evicted) is not Evictions:
        return fleet.isdisjoint(hashes) and evicted.none_of(hashes)
    for h in hashes:
        if h in fleet:
            return False
    return not (<Evictions>evicted)._holds_any(hashes)


cdef class Group:
    """The compiled twin of :class:`kvgateway.state._apply_py.Group` (see there)."""

    cdef public set blocks
    cdef public dict extra
    cdef public Medium medium
    cdef public bint shared
    cdef public Group fleet
    cdef public object digest
    cdef public object prefix

    def __init__(self, medium, fleet=None):
        self.blocks = set()
        self.extra = {}
        self.medium = medium
        self.shared = False
        self.fleet = fleet
        self.digest = None
        self.prefix = 0

    def track(self, medium, group_idx):
        self.prefix = prefix_state(medium, group_idx)
        self.digest = elements_sum(self.prefix, self.blocks)

    cdef void _own(self):
        self.blocks = set(self.blocks)
        self.extra = dict(self.extra)
        self.shared = False

    cpdef store(self, hashes):
        cdef Group fleet = self.fleet
        cdef set blocks
        cdef dict extra
        cdef list entered
        cdef Py_ssize_t before
        if fleet is not None and fleet.blocks.isdisjoint(hashes):
            self.store_new(hashes)  # the common case: held nowhere in the fleet
            return
        if self.shared:
            self._own()
        blocks = self.blocks
        if self.digest is not None:
            self.digest = (self.digest + elements_sum(self.prefix, set(hashes).difference(blocks))) & MASK
        if blocks.isdisjoint(hashes):
            before = len(blocks)
            blocks.update(hashes)
            if len(blocks) - before != len(hashes):
                self._repeats(hashes)
                hashes = list(dict.fromkeys(hashes))
            if fleet is not None:
                fleet.store(hashes)
            return
        extra = self.extra
        entered = []
        for h in hashes:
            if h in blocks:
                extra[h] = extra.get(h, 0) + 1
            else:
                blocks.add(h)
                entered.append(h)
        if fleet is not None:
            fleet.store(entered)

    cdef void _repeats(self, hashes) except *:
        cdef dict extra = self.extra
        for h, n in Counter(hashes).items():
            if n > 1:
                extra[h] = extra.get(h, 0) + n - 1

    cpdef store_new(self, hashes):
        cdef set blocks
        cdef set held
        cdef Py_ssize_t before
        if self.shared:
            self._own()
        blocks = self.blocks
        if self.digest is not None:
            self.digest = (self.digest + elements_sum(self.prefix, set(hashes))) & MASK
        before = len(blocks)
        if self.fleet is None:
            blocks.update(hashes)
        else:  # both sets in one loop (a repeat adds nothing to either, as the reference's update)
            held = self.fleet.blocks
            for h in hashes:
                blocks.add(h)
                held.add(h)
        if len(blocks) - before != len(hashes):
            self._repeats(hashes)

    cpdef Py_ssize_t remove(self, hashes) except -1:
        cdef set was
        cdef Py_ssize_t unknown
        if self.digest is None:
            return self._take(hashes)
        was = self.blocks.intersection(hashes)
        unknown = self._take(hashes)
        self.digest = (self.digest - elements_sum(self.prefix, was.difference(self.blocks))) & MASK
        return unknown

    cdef Py_ssize_t _take(self, hashes) except -1:
        cdef set blocks, gone, held
        cdef dict extra
        cdef Group fleet
        cdef Py_ssize_t before, unknown
        cdef list left
        if self.shared:
            self._own()
        blocks = self.blocks
        extra = self.extra
        if not extra or extra.keys().isdisjoint(hashes):
            before = len(blocks)
            fleet = self.fleet
            if fleet is None:
                blocks.difference_update(hashes)
            elif not fleet.extra:
                # every hash this group held leaves the fleet too (no other group holds any): one
                # loop, the reference's set differences hash by hash
                held = fleet.blocks
                for h in hashes:
                    # discard's answer says whether it was there: two set lookups a hash, not three
                    if PySet_Discard(blocks, h):
                        PySet_Discard(held, h)
            else:
                gone = blocks.intersection(hashes)
                blocks.difference_update(gone)
                fleet.remove(list(gone))
            return len(hashes) - (before - len(blocks))
        unknown = 0
        left = []
        for h in hashes:
            n = extra.get(h)
            if n is not None:
                if n == 1:
                    del extra[h]
                else:
                    extra[h] = n - 1
            elif h in blocks:
                blocks.remove(h)
                left.append(h)
            else:
                unknown += 1
        if self.fleet is not None:
            self.fleet.remove(left)
        return unknown

    def refcount(self, h):
        return 1 + self.extra.get(h, 0) if h in self.blocks else 0

    def clear(self):
        if self.fleet is not None and self.blocks:
            self.fleet.remove(list(self.blocks))
        self.blocks = set()
        self.extra = {}
        self.shared = False
        if self.digest is not None:
            self.digest = 0


cdef class Medium:
    """The compiled twin of :class:`kvgateway.state._apply_py.Medium` (see there)."""

    cdef public Group fleet
    cdef public bint gpu
    cdef public dict groups
    cdef public object block_size
    cdef public object stores
    cdef public object removes
    cdef public list bucket_sec
    cdef public list bucket_stores
    cdef public list bucket_removes
    cdef public object cur_sec
    cdef public object cur_stores
    cdef public object cur_removes

    def __init__(self, fleet=None, gpu=False):
        self.fleet = fleet
        self.gpu = gpu
        self.groups = {}
        self.block_size = 0
        self.stores = 0
        self.removes = 0
        self.bucket_sec = [_NEVER] * _WINDOW
        self.bucket_stores = [0] * _WINDOW
        self.bucket_removes = [0] * _WINDOW
        self.cur_sec = _NEVER
        self.cur_stores = 0
        self.cur_removes = 0

    cpdef Group group(self, group_idx):
        cdef Group grp = self.groups.get(group_idx)
        if grp is None:
            grp = self.groups[group_idx] = Group(self, self.fleet)
        return grp

    cpdef roll(self, sec):
        if sec < self.cur_sec:
            return
        i = self.cur_sec % _WINDOW
        self.bucket_sec[i] = self.cur_sec
        self.bucket_stores[i] = self.cur_stores
        self.bucket_removes[i] = self.cur_removes
        self.cur_sec = sec
        self.cur_stores = self.cur_removes = 0

    def rates(self, now, started=None):
        covered = RATE_WINDOW_SECONDS
        if started is not None:
            covered = min(float(RATE_WINDOW_SECONDS), max(1.0, now - started))
        now_sec = math.floor(now)
        oldest = now_sec - RATE_WINDOW_SECONDS
        stores = removes = 0
        if oldest < self.cur_sec <= now_sec:
            stores, removes = self.cur_stores, self.cur_removes
        for sec, s, r in zip(self.bucket_sec, self.bucket_stores, self.bucket_removes, strict=True):
            if oldest < sec <= now_sec:
                stores += s
                removes += r
        return stores / covered, removes / covered

    def resident(self):
        return sum(len((<Group>grp).blocks) for grp in self.groups.values())


cdef class Account:
    """The compiled twin of :class:`kvgateway.state._apply_py.Account` (see there): the same lists
    and Python ints, so that the pass reads the block size and the evictions and counts a batch's
    new stores with C calls rather than attribute lookups and two Python frames."""

    cdef public list tokens
    cdef public list blocks
    cdef public object unattributed_tokens
    cdef public object unattributed_blocks
    cdef public object block_size
    cdef public object evicted
    cdef public list bucket_at
    cdef public list buckets

    def __init__(self, window=DEFAULT_REFETCH_WINDOW_SECONDS, bound=MAX_EVICTED):
        self.tokens = [0] * ORIGIN_COUNT
        self.blocks = [0] * ORIGIN_COUNT
        self.unattributed_tokens = 0
        self.unattributed_blocks = 0
        self.block_size = 0
        self.evicted = Evictions(window, bound)
        self.bucket_at = [-1] * _BUCKETS
        self.buckets = [[0] * ORIGIN_COUNT for _ in range(_BUCKETS)]

    @cython.boundscheck(True)  # the lists are public: whatever a caller put there, no unchecked index
    @cython.wraparound(True)
    cpdef add(self, int origin, blocks, tokens, now):
        self.tokens[origin] += tokens
        self.blocks[origin] += blocks
        at = int(now // BUCKET_SECONDS)
        slot = at % _BUCKETS
        if self.bucket_at[slot] != at:
            self.bucket_at[slot] = at
            self.buckets[slot] = [0] * ORIGIN_COUNT
        self.buckets[slot][origin] += tokens

    def add_new(self, blocks, tokens, now):
        self.add(_NEW, blocks, tokens, now)

    def recent(self, now):
        at = int(now // BUCKET_SECONDS)
        out = [0] * ORIGIN_COUNT
        for bucket_at, counts in zip(self.bucket_at, self.buckets, strict=True):
            if at - _BUCKETS < bucket_at <= at:
                for i, n in enumerate(counts):
                    out[i] += n
        return out


cdef bint _new_store(bint stale, event, size, Account account, int compare, Group fleet) except -1:
    """:func:`kvgateway.state._apply_py._new_store`, the sets tested in one C loop."""
    if size > 0:
        account.block_size = size
    return (
        not stale
        and not (compare and event.token_ids and (compare == _COMPARE_ALL or event.parent_block_hash is None))
        and _fresh(fleet.blocks, account.evicted, event.block_hashes)
    )


def apply_batch(index, batch, now, bint replayed, *, dict routes, Group fleet):
    """:func:`kvgateway.state._apply_py.apply_batch`, step for step."""
    cdef Group grp
    cdef Medium med
    cdef Py_ssize_t n
    cdef long long fresh = 0
    cdef int compare
    cdef bint stale
    cdef bint live = not replayed
    cdef Account account  # a pure-Python Account here is a TypeError: the cores are chosen together
    sec = math.floor(now)
    observer = index.observer
    account = index.account
    if account is None and observer is not None:
        account = index.account = observer.account((index.source, index.dp_rank))
    compare = COMPARE_NONE if observer is None else observer.compare
    stale = index.staleness.reason is not None
    tokens = 0
    for event in batch.events:
        kind = type(event)
        if kind is BlockStored or kind is BlockRemoved:
            extra = event.extra
            group_idx = extra.get("group_idx") if extra else None
            if type(group_idx) is not int:
                group_idx = None
            grp = routes.get((event.medium, group_idx))
            if grp is None:
                grp = index.route(event.medium, group_idx)
            hashes = event.block_hashes
            n = len(hashes)
            med = grp.medium
            if live and sec != med.cur_sec:
                med.roll(sec)
            if kind is BlockStored:
                size = event.block_size  # read once: the account and the medium both learn it
                if account is None or not med.gpu or not n:
                    grp.store(hashes)
                elif _new_store(stale, event, size, account, compare, fleet):
                    fresh += n
                    tokens += n * account.block_size
                    grp.store_new(hashes)
                else:
                    if observer is not None:
                        observer.stored(index, event, batch.ts, now)
                        compare = observer.compare
                    grp.store(hashes)
                if size > 0:
                    med.block_size = size
                med.stores += n
                if live:
                    med.cur_stores += n
            else:
                index.unknown_removes += grp.remove(hashes)
                if account is not None and med.gpu and n:
                    evicted = account.evicted
                    if type(evicted) is Evictions:
                        (<Evictions>evicted).add(hashes, batch.ts)
                    else:
                        evicted.add(hashes, batch.ts)
                med.removes += n
                if live:
                    med.cur_removes += n
        elif kind is AllBlocksCleared:
            index.clear_blocks()
            index.staleness.cleared()
            stale = index.staleness.reason is not None
    if fresh and account is not None:
        account.add(_NEW, fresh, tokens, now)
