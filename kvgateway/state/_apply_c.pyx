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
floats (and int64 hashes' negative half in a table of their own): no object per eviction, an
evicted hash's int or bytes freed with its block, and a lookup one probe into one array (other
hashes, rare, in a dict beside them). And a removal asks a
group's ``extra`` references (a dict keyed by the hashes, each asked costing its ``hash()`` and a
probe) only for the hashes a negative filter beside it may hold (:meth:`Group._none_extra`); an
event whose (medium, group_idx) is the previous event's takes its group without the route
cache's tuple key. A group's state digest, once tracked, is a C sum kept by the loops that put
the hashes in and take them out: the element of each hash that enters or leaves, from the key
the pass read (FNV-1a over the hash's text, never built: ``_fnv_decimal`` in _hashtable.pxd), where
the reference builds the sets of the hashes that entered and left and sums them.

Counts are Python objects where a value comes from the wire or a clock unbounded (a block size, a
second), so no value a Python int holds can overflow here.
"""

from collections import Counter
from collections.abc import Set as AbstractSet
import math

cimport cython
from cpython.list cimport PyList_CheckExact, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject_RichCompare
from cpython.dict cimport PyDict_Contains
from cpython.set cimport PySet_Discard
from libc.math cimport floor, isfinite
from libc.stdint cimport uint64_t

from kvgateway.state._hashtable cimport (  # the C tables of hashes: the evictions' and the groups'
    CONTENT,
    Key,
    Table,
    _BYTES,
    _INT,
    _MIN_SLOTS,
    _NEG,
    _OTHER,
    _key_of,
    _key_prefetch,
    hash_count,
    hash_key,
    hash_object,
    hash_other,
    _table_add,
    _table_clear,
    _table_copy,
    _table_empty,
    _table_free,
    _table_has,
    _table_init,
    _table_pop,
    _table_set,
    Filter,
    _filter_free,
    _filter_may,
    _filter_note,
    _filter_size,
    _ints_discard,
    _ints_put,
    _fnv_decimal,
    _fnv_hex,
    _key_element,
    _negative_element,
)
from kvgateway._pylong cimport negative_long  # a negative hash made back of its magnitude

from kvgateway.engine._slots cimport Fields, field, fields_of  # a Struct's field read from its slot

from kvgateway.engine.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored
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

# The fields the pass reads, per event and per batch, from their slots (``field``)
cdef object _BlockStored = BlockStored
cdef object _BlockRemoved = BlockRemoved
cdef object _Batch = Batch
cdef Fields _STORED = fields_of(BlockStored)
cdef Fields _REMOVED = fields_of(BlockRemoved)
cdef Fields _BATCH = fields_of(Batch)


@cython.final
cdef class _Generation:
    """One generation of :class:`Evictions`: the engines' kinds of hash in C tables (u64 ints,
    negative int64 ones, 32-byte hashes), any other hash in a dict, each with its engine time."""

    cdef Table ints
    cdef Table negs
    cdef Table blobs
    cdef dict other

    def __cinit__(self):
        _table_init(&self.ints, _MIN_SLOTS, False, True)
        _table_init(&self.negs, _MIN_SLOTS, False, True)
        _table_init(&self.blobs, _MIN_SLOTS, True, True)
        self.other = {}

    def __dealloc__(self):
        _table_free(&self.ints)
        _table_free(&self.negs)
        _table_free(&self.blobs)

    cdef inline Py_ssize_t size(self):
        return <Py_ssize_t>(self.ints.n + self.negs.n + self.blobs.n) + len(self.other)

    # Each kind's table named in its own branch, NULL given for the ints' bytes: choosing the table
    # in one helper cost 350 instructions a batch (cachegrind), the int path no longer compiled
    # knowing it compares no bytes.
    cdef inline int set(self, Key* k, object h, double at, object ts) except -1:
        if k.kind == _INT:
            _ints_put(&self.ints, k.key, at)
        elif k.kind == _BYTES:
            _table_set(&self.blobs, k.key, k.data, at)
        elif k.kind == _NEG:
            _ints_put(&self.negs, k.key, at)
        else:
            self.other[h] = ts
        return 0

    cdef inline bint has(self, Key* k, object h) except -1:
        if k.kind == _INT:
            return _table_has(&self.ints, k.key, NULL)
        if k.kind == _BYTES:
            return _table_has(&self.blobs, k.key, k.data)
        if k.kind == _NEG:
            return _table_has(&self.negs, k.key, NULL)
        return bool(self.other) and h in self.other  # most streams' dict is empty: no lookup

    cdef object pop(self, Key* k, object h):
        cdef double at = 0
        if k.kind == _OTHER:
            return self.other.pop(h, None)
        if _table_pop(&self.ints if k.kind == _INT else &self.negs if k.kind == _NEG else &self.blobs, k.key, k.data, &at):
            return at
        return None

    cdef dict shown(self):
        cdef size_t i
        cdef const char* content = <const char*>self.blobs.content
        out = {0: self.ints.zero} if self.ints.has_zero else {}
        for i in range(self.ints.mask + 1):
            if self.ints.keys[i]:
                out[self.ints.keys[i]] = self.ints.times[i]
        for i in range(self.negs.mask + 1):
            if self.negs.keys[i]:
                out[negative_long(self.negs.keys[i])] = self.negs.times[i]
        for i in range(self.blobs.mask + 1):
            if self.blobs.keys[i]:
                out[content[i * CONTENT : (i + 1) * CONTENT]] = self.blobs.times[i]
        out.update(self.other)
        return out

    cdef int clear(self) except -1:
        _table_clear(&self.ints)
        _table_clear(&self.negs)
        _table_clear(&self.blobs)
        self.other = {}
        return 0

    cdef int empty(self, Py_ssize_t bound) except -1:
        _table_empty(&self.ints, bound)
        _table_empty(&self.negs, bound)
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
        self._add(hashes, ts, NULL)

    cdef int _add(self, hashes, ts, Key* keys) except -1:
        """:meth:`add`; ``keys``, where not NULL, each hash's of ``hashes`` (a list or a Hashes), read
        already."""
        cdef Key k
        cdef _Generation spare
        cdef double at = 0
        cdef Py_ssize_t i, bound = self.bound
        if ts - self.since > self.window:  # the generations move on: the previous one is forgotten
            spare = self._previous
            spare.clear()  # its memory back: the new generation grows as it fills
            self._previous, self._current = self._current, spare
            self.since = ts
        at = ts
        if keys is not NULL:
            for i in range(hash_count(hashes)):
                self._current.set(&keys[i], hash_other(hashes, i), at, ts)
        else:
            for h in hashes:
                _key_of(h, &k)
                self._current.set(&k, h, at, ts)
        if self._current.size() + self._previous.size() > bound:
            self.dropped += self._previous.size()
            self._previous.clear()  # not filled again before the window turns
            if self._current.size() > bound:
                self.dropped += self._current.size()
                self._current.empty(bound)  # it fills again at the same rate: its slots kept
        return 0

    cdef bint _holds_any(self, hashes) except -1:
        cdef Key k
        for h in hashes:
            _key_of(h, &k)
            if self._current.has(&k, h) or self._previous.has(&k, h):
                return True
        return False

    cdef bint _holds_any_key(self, object hashes, Key* keys) except -1:
        """:meth:`_holds_any` of a list or a Hashes whose hashes' keys are read already."""
        cdef Py_ssize_t i
        for i in range(hash_count(hashes)):
            h = hash_other(hashes, i)
            if self._current.has(&keys[i], h) or self._previous.has(&keys[i], h):
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


@cython.final
cdef class BlockSet:
    """A group's resident hashes (and the fleet's holders), in C tables: the set the reference
    keeps, read through the same ``collections.abc.Set`` interface (registered as one).

    u64 hashes live in one table, negative int64 ones (by their magnitude) in a second, 32-byte
    hashes in a third, any other hash (a wider int, bytes of another length) in a Python set beside
    them: no int object is kept per resident block, and a lookup is one probe into one array (a
    Python set's reads its entry and then the int the entry points to: two cache misses each on an
    index larger than the cache, where the gateway spent a fifth of a batch in ``set_lookkey``).
    The pass changes it through C methods. Its iteration order is the tables', not a Python set's:
    nothing depends on it (a group's blocks are listed in no order). Changing it while iterating
    raises RuntimeError, as a set does (the tables may have moved). Hashes are the decoder's, exact
    ints and bytes: an int's subclass (a bool) or a float equal to an int is another hash here,
    where a set would take it for the int (the evictions' tables are the same)."""

    # its tables, the set of other hashes and the count of changes: declared in _apply_c.pxd, which
    # the compiled learner cimports to ask the fleet's holders directly

    __hash__ = None  # mutable, as a set

    def __cinit__(self, hashes=()):
        _table_init(&self.ints, _MIN_SLOTS, False, False)
        _table_init(&self.negs, _MIN_SLOTS, False, False)
        _table_init(&self.blobs, _MIN_SLOTS, True, False)
        self.other = set()
        self.changes = 0
        for h in hashes:
            self.enter(h)

    def __dealloc__(self):
        _table_free(&self.ints)
        _table_free(&self.negs)
        _table_free(&self.blobs)

    cdef inline bint has_key(self, Key* k, object h) except -1:
        if k.kind == _INT:
            return _table_has(&self.ints, k.key, NULL)
        if k.kind == _BYTES:
            return _table_has(&self.blobs, k.key, k.data)
        if k.kind == _NEG:
            return _table_has(&self.negs, k.key, NULL)
        return h in self.other

    cdef inline bint has(self, object h) except -1:
        cdef Key k
        _key_of(h, &k)
        return self.has_key(&k, h)

    cdef inline bint add_key(self, Key* k, object h) except -1:
        """Put ``h`` in; whether it was not there."""
        cdef Py_ssize_t before
        self.changes += 1
        if k.kind == _INT:
            return _ints_put(&self.ints, k.key, 0.0)
        if k.kind == _BYTES:
            return _table_add(&self.blobs, k.key, k.data)
        if k.kind == _NEG:
            return _ints_put(&self.negs, k.key, 0.0)
        before = len(self.other)
        self.other.add(h)
        return len(self.other) != before

    cpdef bint enter(self, object h) except -1:
        """Put ``h`` in; whether it was not there (the pass's ``add``, public for the tests)."""
        cdef Key k
        _key_of(h, &k)
        return self.add_key(&k, h)

    cdef inline bint discard_key(self, Key* k, object h) except -1:
        """Take ``h`` out; whether it was there."""
        cdef double at
        self.changes += 1
        if k.kind == _INT:
            return _ints_discard(&self.ints, k.key)
        if k.kind == _BYTES:
            return _table_pop(&self.blobs, k.key, k.data, &at)
        if k.kind == _NEG:
            return _ints_discard(&self.negs, k.key)
        return PySet_Discard(self.other, h) == 1

    cpdef bint leave(self, object h) except -1:
        """Take ``h`` out; whether it was there (the pass's ``discard``, public for the tests)."""
        cdef Key k
        _key_of(h, &k)
        return self.discard_key(&k, h)

    cdef inline bint none_of(self, hashes) except -1:
        for h in hashes:
            if self.has(h):
                return False
        return True

    cdef BlockSet copied(self):
        cdef BlockSet out = BlockSet.__new__(BlockSet)
        _table_free(&out.ints)
        _table_free(&out.negs)
        _table_free(&out.blobs)
        _table_copy(&out.ints, &self.ints)
        _table_copy(&out.negs, &self.negs)
        _table_copy(&out.blobs, &self.blobs)
        out.other = set(self.other)
        return out

    cdef inline Py_ssize_t size(self):
        return <Py_ssize_t>(self.ints.n + self.negs.n + self.blobs.n) + len(self.other)

    # --- the read-only set interface (collections.abc.Set), for everything outside the pass ---

    def __len__(self):
        return self.size()

    def __contains__(self, h):
        return self.has(h)

    def __iter__(self):
        return _BlockSetIterator(self)

    def __reduce__(self):
        return BlockSet, (list(self),)

    def __repr__(self):
        return f"BlockSet({set(self)!r})"

    def copy(self):
        return self.copied()

    def isdisjoint(self, other):
        return self.none_of(other)

    def __richcmp__(self, other, int op):
        if not isinstance(other, (BlockSet, set, frozenset)):
            return NotImplemented
        return PyObject_RichCompare(set(self), other, op)  # the set's own comparison, whichever op

    def __and__(self, other):
        return set(self) & set(other)

    def __or__(self, other):
        return set(self) | set(other)

    def __sub__(self, other):
        return set(self) - set(other)

    def __xor__(self, other):
        return set(self) ^ set(other)

    def __rand__(self, other):
        return set(other) & set(self)

    def __ror__(self, other):
        return set(other) | set(self)

    def __rsub__(self, other):
        return set(other) - set(self)

    def __rxor__(self, other):
        return set(other) ^ set(self)


@cython.final
cdef class _BlockSetIterator:
    """A :class:`BlockSet`'s hashes: the u64 table (its zero first), the negatives' table, the
    32-byte table, the rest."""

    cdef BlockSet owner
    cdef size_t changes
    cdef size_t at  # the next slot of the table being read
    cdef int stage  # 0: the u64 zero, 1: the u64 slots, 2: the negatives, 3: the 32-byte slots, 4: the rest
    cdef object rest

    def __cinit__(self, BlockSet owner):
        self.owner = owner
        self.changes = owner.changes
        self.at = 0
        self.stage = 0
        self.rest = None

    def __iter__(self):
        return self

    def __next__(self):
        cdef BlockSet owner = self.owner
        cdef Table* table
        if owner.changes != self.changes:
            raise RuntimeError("BlockSet changed size during iteration")
        if self.stage == 0:
            self.stage = 1
            if owner.ints.has_zero:
                return 0
        if self.stage == 1:
            table = &owner.ints
            while self.at <= table.mask:
                self.at += 1
                if table.keys[self.at - 1]:
                    return table.keys[self.at - 1]
            self.stage, self.at = 2, 0
        if self.stage == 2:
            table = &owner.negs
            while self.at <= table.mask:
                self.at += 1
                if table.keys[self.at - 1]:
                    return negative_long(table.keys[self.at - 1])
            self.stage, self.at = 3, 0
        if self.stage == 3:
            table = &owner.blobs
            while self.at <= table.mask:
                self.at += 1
                if table.keys[self.at - 1]:
                    return (<const char*>table.content)[(self.at - 1) * CONTENT : self.at * CONTENT]
            self.stage = 4
            self.rest = iter(owner.other)
        return next(self.rest)


cdef inline uint64_t _element(uint64_t prefix, Key* k, object h) except? 0:
    """The digest element of ``h`` (its key ``k``) in the group whose FNV state after its prefix is
    ``prefix``: from the key in C, or the digest module's for a hash of no table's kind."""
    if k.kind == _OTHER:
        return _other_element(prefix, h)
    return _key_element(prefix, k)


cdef uint64_t _other_element(uint64_t prefix, object h) except? 0:
    return <uint64_t>(elements_sum(prefix, (h,)) & MASK)


cdef uint64_t _blocks_sum(BlockSet blocks, uint64_t prefix) except? 0:
    """The digest's sum of ``blocks``' elements (a group's first sum): the tables' slots read in C,
    the rest by the digest module's ``elements_sum``."""
    cdef uint64_t total = _fnv_decimal(prefix, 0) if blocks.ints.has_zero else 0
    cdef size_t i
    for i in range(blocks.ints.mask + 1):
        if blocks.ints.keys[i]:
            total += _fnv_decimal(prefix, blocks.ints.keys[i])
    for i in range(blocks.negs.mask + 1):
        if blocks.negs.keys[i]:
            total += _negative_element(prefix, blocks.negs.keys[i])
    for i in range(blocks.blobs.mask + 1):
        if blocks.blobs.keys[i]:
            total += _fnv_hex(prefix, blocks.blobs.content + i * CONTENT, CONTENT)
    if blocks.other:
        total += <uint64_t>(elements_sum(prefix, blocks.other) & MASK)
    return total


cdef inline bint _none_held(BlockSet blocks, object hashes, Key* keys) except -1:
    """``blocks.none_of(hashes)`` of a list or a Hashes whose hashes' keys are read already."""
    cdef Py_ssize_t i
    for i in range(hash_count(hashes)):
        if blocks.has_key(&keys[i], hash_other(hashes, i)):
            return False
    return True


cdef bint _fresh(BlockSet fleet, object evicted, object hashes, Key* keys) except -1:
    """No hash held anywhere in the fleet nor evicted lately (the reference's two tests, one loop);
    ``keys``, where not NULL, each hash's of ``hashes`` (a list or a Hashes), read already."""
    if type(evicted) is not Evictions:
        return fleet.none_of(hashes) and evicted.none_of(hashes)
    if keys is not NULL:
        return _none_held(fleet, hashes, keys) and not (<Evictions>evicted)._holds_any_key(hashes, keys)
    if not fleet.none_of(hashes):
        return False
    return not (<Evictions>evicted)._holds_any(hashes)


cdef bint _none_in(dict extra, hashes) except -1:
    """``extra.keys().isdisjoint(hashes)`` without the view and the generic dispatch: a removal's
    hashes asked of the group's extra references one by one (most groups of a churning stream
    hold a few, so the answer is nearly always yes)."""
    cdef Py_ssize_t i
    if PyList_CheckExact(hashes):
        for i in range(PyList_GET_SIZE(hashes)):
            if PyDict_Contains(extra, <object>PyList_GET_ITEM(hashes, i)):
                return False
        return True
    return extra.keys().isdisjoint(hashes)


cdef class Group:
    """The compiled twin of :class:`kvgateway.state._apply_py.Group` (see there), its hashes in a
    :class:`BlockSet`. Its stores and removes go hash by hash, in order, each hash's kind read once
    for both the group's set and the fleet's: the reference's set operations, one loop. Its
    ``extra`` dict is its own methods' to change (read by everyone else, as the reference's)."""

    cdef public BlockSet blocks
    cdef public dict extra
    cdef public Medium medium
    cdef public bint shared
    cdef public Group fleet
    # the digest (``digest``, ``prefix``: properties, the reference's attributes): tracked or not,
    # the sum of the resident hashes' elements and the group's FNV state after its prefix, in C,
    # kept by the loops that enter and take out the hashes (each element from the hash's key)
    cdef bint _tracked
    cdef uint64_t _sum
    cdef uint64_t _prefix
    # A negative filter of ``extra``'s keys (u64 hashes, negative ones' magnitudes, 32-byte hashes'
    # fingerprints; a key of one kind equal to another's is a "maybe", the dict asked): a removal
    # asks the dict only for the hashes it may hold. It describes the dict ``_filtered`` (None:
    # none; a new dict, a copy or a restore, is filtered again when next asked), whose keys the
    # group's own methods add (noted here) and take out (their bits left until a rebuild);
    # ``_filter_all``: a key of another kind is there, every hash is asked of the dict.
    cdef Filter _filter
    cdef object _filtered
    cdef bint _filter_all

    def __dealloc__(self):
        _filter_free(&self._filter)

    def __init__(self, medium, fleet=None):
        self.blocks = BlockSet()
        self.extra = {}
        self.medium = medium
        self.shared = False
        self.fleet = fleet
        self._tracked = False
        self._sum = 0
        self._prefix = 0

    @property
    def digest(self):
        """None, or (once :meth:`track` was called) the sum of the resident hashes' elements."""
        return self._sum if self._tracked else None

    @digest.setter
    def digest(self, value):
        self._tracked = value is not None
        self._sum = <uint64_t>(value & MASK) if value is not None else 0

    @property
    def prefix(self):
        return self._prefix

    @prefix.setter
    def prefix(self, value):
        self._prefix = <uint64_t>(value & MASK)

    def track(self, medium, group_idx):
        self._prefix = <uint64_t>(prefix_state(medium, group_idx) & MASK)
        self._sum = _blocks_sum(self.blocks, self._prefix)
        self._tracked = True

    def restore(self, blocks, extra):
        self.blocks = BlockSet(blocks)
        self.extra = dict(extra)
        self.shared = False

    cdef void _own(self):
        self.blocks = self.blocks.copied()
        self.extra = dict(self.extra)
        self.shared = False

    cpdef store(self, hashes):
        self._store(hashes, NULL)

    cdef int _store(self, hashes, Key* keys) except -1:
        """:meth:`store`; ``keys``, where not NULL, each hash's of ``hashes`` (a list or a Hashes),
        read already."""
        cdef Group fleet = self.fleet
        cdef BlockSet blocks
        cdef dict extra
        cdef list entered
        cdef Key k
        if fleet is not None and (
            _none_held(fleet.blocks, hashes, keys) if keys is not NULL else fleet.blocks.none_of(hashes)
        ):
            self._store_new(hashes, keys)  # the common case: held nowhere in the fleet
            return 0
        if self.shared:
            self._own()
        blocks = self.blocks
        # the reference's two cases (all new here, or some held) in one loop: a hash held, or named
        # again, takes an extra reference; the others enter, in their first mention's order (and
        # into the digest: refs 0 -> 1, counted once)
        extra = self.extra
        entered = []
        for h in hashes:
            _key_of(h, &k)
            if blocks.add_key(&k, h):
                entered.append(h)
                if self._tracked:
                    self._sum += _element(self._prefix, &k, h)
            else:
                extra[h] = extra.get(h, 0) + 1
                self._filter_add(extra, h)
        if fleet is not None:
            fleet.store(entered)
        return 0

    cdef void _repeats(self, hashes) except *:
        cdef dict extra = self.extra
        for h, n in Counter(hashes).items():
            if n > 1:
                extra[h] = extra.get(h, 0) + n - 1
                self._filter_add(extra, h)

    cdef int _filter_add(self, dict extra, object h) except -1:
        """``h`` a key of ``extra`` now: its bit set, where the filter describes that dict (one too
        full is made again when next asked)."""
        cdef Key k
        if self._filtered is not extra:
            return 0
        _key_of(h, &k)
        if k.kind == _OTHER:
            self._filter_all = True
        else:
            _filter_note(&self._filter, k.key)
            if self._filter.added > self._filter.limit:
                self._filtered = None
        return 0

    cdef int _filter_make(self, dict extra) except -1:
        """The filter made from ``extra``'s keys, sized for them."""
        cdef Key k
        _filter_size(&self._filter, len(extra), 8)  # 256 bits (32 bytes) at the least
        self._filter_all = False
        for h in extra:
            _key_of(h, &k)
            if k.kind == _OTHER:
                self._filter_all = True
            else:
                _filter_note(&self._filter, k.key)
        self._filtered = extra
        return 0

    cdef bint _none_extra(self, dict extra, object hashes, Key* keys) except -1:
        """:func:`_none_in`, the same answer: ``extra`` asked, in order, only for the hashes its
        filter may hold (``keys``, where not NULL, each hash's of ``hashes``, read already)."""
        cdef Key k
        cdef Key* at = &k
        cdef Py_ssize_t i, n = hash_count(hashes)
        if n < 0:
            return _none_in(extra, hashes)
        if self._filtered is not extra:
            self._filter_make(extra)
        if self._filter_all:
            return _none_in(extra, hashes)
        for i in range(n):
            if keys is NULL:
                hash_key(hashes, i, &k)
            else:
                at = &keys[i]
            # the hash itself asked of the dict (made, for a Hashes) only where the filter may hold it
            if (at.kind == _OTHER or _filter_may(&self._filter, at.key)) and PyDict_Contains(extra, hash_object(hashes, i)):
                return False
        return True

    cpdef store_new(self, hashes):
        self._store_new(hashes, NULL)

    cdef int _store_new(self, hashes, Key* keys) except -1:
        """:meth:`store_new`; ``keys``, where not NULL, each hash's of ``hashes`` (a list or a
        Hashes), read already (the pass reads them once for its loops)."""
        cdef BlockSet blocks
        cdef BlockSet held = self.fleet.blocks if self.fleet is not None else None
        cdef Key k
        cdef Py_ssize_t i, before
        cdef bint tracked = self._tracked
        if self.shared:
            self._own()
        blocks = self.blocks
        before = blocks.size()
        # both sets in one loop, each hash's kind read once (a repeat adds nothing to either), and
        # the digest given each hash that enters (none was resident: each distinct hash once)
        if keys is not NULL:
            for i in range(hash_count(hashes)):
                h = hash_other(hashes, i)
                if blocks.add_key(&keys[i], h) and tracked:
                    self._sum += _element(self._prefix, &keys[i], h)
                if held is not None:
                    held.add_key(&keys[i], h)
        else:
            for h in hashes:
                _key_of(h, &k)
                if blocks.add_key(&k, h) and tracked:
                    self._sum += _element(self._prefix, &k, h)
                if held is not None:
                    held.add_key(&k, h)
        if blocks.size() - before != len(hashes):
            self._repeats(hashes)
        return 0

    cpdef Py_ssize_t remove(self, hashes) except -1:
        return self._remove(hashes, NULL)

    cdef Py_ssize_t _remove(self, hashes, Key* keys) except -1:
        """:meth:`remove`; ``keys``, where not NULL, each hash's of ``hashes`` (a list or a Hashes),
        read already.
        Each hash that leaves (refs 1 -> 0) leaves the digest too, where the group keeps one."""
        cdef BlockSet blocks, held
        cdef dict extra
        cdef Group fleet
        cdef Py_ssize_t i, before
        cdef Py_ssize_t n = hash_count(hashes) if keys is not NULL else 0
        cdef Key k
        cdef bint tracked = self._tracked
        cdef list left
        if self.shared:
            self._own()
        blocks = self.blocks
        extra = self.extra
        if extra and not self._none_extra(extra, hashes, keys):
            return self._take_extra(hashes)
        # no extra references involved: each hash held leaves (a repeated hash's second mention is
        # unknown), and leaves the fleet's holders too when no other group holds it
        before = blocks.size()
        fleet = self.fleet
        held = fleet.blocks if fleet is not None and not fleet.extra else None
        left = [] if fleet is not None and held is None else None  # told to the fleet in one call
        if held is not None and not tracked:  # the common case, its loop as short as it can be
            for i in range(n):
                h = hash_other(hashes, i)
                if blocks.discard_key(&keys[i], h):
                    held.discard_key(&keys[i], h)
            n = 0
        for i in range(n):  # each hash's key read already
            if blocks.discard_key(&keys[i], hash_other(hashes, i)):
                _left(self, &keys[i], hash_object(hashes, i), held, left, tracked)
        if keys is NULL:
            for h in hashes:
                _key_of(h, &k)
                if blocks.discard_key(&k, h):
                    _left(self, &k, h, held, left, tracked)
        if left is not None:
            fleet.remove(left)
        return len(hashes) - (before - blocks.size())

    cdef Py_ssize_t _take_extra(self, hashes) except -1:
        """:meth:`_remove` where extra references are involved: hash by hash."""
        cdef BlockSet blocks = self.blocks
        cdef dict extra = self.extra
        cdef Py_ssize_t unknown = 0
        cdef list left = []
        cdef Key k
        for h in hashes:
            n = extra.get(h)
            if n is not None:
                if n == 1:
                    del extra[h]
                else:
                    extra[h] = n - 1
                continue
            _key_of(h, &k)
            if blocks.discard_key(&k, h):
                left.append(h)
                if self._tracked:
                    self._sum -= _element(self._prefix, &k, h)
            else:
                unknown += 1
        if self.fleet is not None:
            self.fleet.remove(left)
        return unknown

    def refcount(self, h):
        return 1 + self.extra.get(h, 0) if self.blocks.has(h) else 0

    def clear(self):
        if self.fleet is not None and self.blocks.size():
            self.fleet.remove(list(self.blocks))
        self.blocks = BlockSet()
        self.extra = {}
        self.shared = False
        self._sum = 0  # tracked or not


cdef inline int _left(Group grp, Key* k, object h, BlockSet held, list left, bint tracked) except -1:
    """``h`` (its key ``k``) left the group: out of the fleet's holders (``held``, where no
    other group holds any hash) or onto ``left``, and out of the digest."""
    if held is not None:
        held.discard_key(k, h)
    elif left is not None:
        left.append(h)
    if tracked:
        grp._sum -= _element(grp._prefix, k, h)
    return 0


cdef class Medium:
    """The compiled twin of :class:`kvgateway.state._apply_py.Medium` (see there)."""

    cdef public Group fleet
    cdef public bint gpu
    cdef public dict groups
    cdef public object block_size
    cdef public long long stores  # C ints: a Python int's add makes a new int (an allocation) per event
    cdef public long long removes
    cdef public list bucket_sec
    cdef public list bucket_stores
    cdef public list bucket_removes
    cdef public long long cur_sec
    cdef public long long cur_stores
    cdef public long long cur_removes

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

    @cython.boundscheck(True)  # the lists are public: whatever a caller put there, no unchecked index
    @cython.wraparound(True)
    cpdef roll(self, long long sec):
        if sec < self.cur_sec:
            return
        i = _slot(self.cur_sec)
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


cdef int _ahead(Group grp, object evicted, object hashes, Key* keys, bint stored, bint evicting, bint ask) except -1:
    """Ask for the table lines an event's pass is about to read, every hash's at once: the group's
    set, the fleet's holders, and (a GPU event, the attribution on) the evictions' generations, both
    looked up for a store, the current one set for a remove. On an index larger than the cache each
    probe is a miss; asked for together they overlap, where the pass's loops met them one by one,
    the fleet's for every hash, then the evictions', then the group's. A hint: nothing changes.
    Each hash's key is read here into ``keys``, once for the pass's loops (the lines asked for only
    with ``ask``: more than one hash)."""
    cdef Key* k
    cdef Py_ssize_t i
    cdef BlockSet blocks = grp.blocks
    cdef BlockSet held = grp.fleet.blocks if grp.fleet is not None else None
    cdef _Generation current = None
    cdef _Generation previous = None
    if evicting and type(evicted) is Evictions:
        current = (<Evictions>evicted)._current
        previous = (<Evictions>evicted)._previous if stored else None
    for i in range(hash_count(hashes)):
        k = &keys[i]
        hash_key(hashes, i, k)
        if k.kind == _OTHER or not ask:
            continue
        if held is not None:
            _key_prefetch(k, &held.ints, &held.negs, &held.blobs, not stored)
        if current is not None:
            _key_prefetch(k, &current.ints, &current.negs, &current.blobs, not stored)
        if previous is not None:
            _key_prefetch(k, &previous.ints, &previous.negs, &previous.blobs, False)
        _key_prefetch(k, &blocks.ints, &blocks.negs, &blocks.blobs, True)
    return 0


cdef bint _new_store(bint stale, event, hashes, Key* keys, size, Account account, int compare, Group fleet) except -1:
    """:func:`kvgateway.state._apply_py._new_store`, the sets tested in one C loop (``hashes`` the
    event's, read already)."""
    if size > 0:
        account.block_size = size
    return (
        not stale
        and not (
            compare
            and event.token_ids  # the attribute: a list where the slot keeps the wire's ids
            and (
                compare == _COMPARE_ALL
                or field(event, _BlockStored, _STORED.parent_block_hash, "parent_block_hash") is None
            )
        )
        and _fresh(fleet.blocks, account.evicted, hashes, keys)
    )


cdef enum:
    _LOCAL_KEYS = 64  # an event's keys read into the pass's own array up to this many hashes


cdef Key* _keys_for(object hashes, Py_ssize_t n, Key* local) except? NULL:
    """Room for the keys of an event's ``hashes``: ``local`` up to _LOCAL_KEYS, else allocated (the
    caller frees it); NULL where they are not read once (not a list or a Hashes, or none)."""
    cdef Key* keys
    if hash_count(hashes) < 0 or not n:
        return NULL
    if n <= _LOCAL_KEYS:
        return local
    keys = <Key*>PyMem_Malloc(n * sizeof(Key))
    if keys is NULL:
        raise MemoryError()
    return keys


cdef inline object _group_idx_of(object extra):
    """``extra.get("group_idx") if extra else None``, None where it is no int: a dict (as the
    decoder makes it) asked in C, without the method call (about 500 instructions an event)."""
    if type(extra) is dict:
        group_idx = (<dict>extra).get("group_idx")
    else:
        group_idx = extra.get("group_idx") if extra else None
    return group_idx if type(group_idx) is int else None


cdef inline bint _same_route(object medium, object group_idx, object route_medium, object route_group) except -1:
    """Whether ``routes`` answers ``(medium, group_idx)`` as it answered the previous event's key:
    the two keys equal, a tuple's equality (each item the same object, or equal), for the kinds
    the decoder gives (a str or None, an int or None), whose equality agrees with their hash."""
    if not (medium is route_medium or (type(medium) is str and type(route_medium) is str and medium == route_medium)):
        return False
    return group_idx is route_group or (group_idx is not None and route_group is not None and group_idx == route_group)


cdef inline Py_ssize_t _slot(long long sec) noexcept:
    """``sec % _WINDOW`` as Python takes it (never negative: ``_NEVER`` is), a rate bucket's index."""
    cdef long long i = sec % _WINDOW
    return i + _WINDOW if i < 0 else i


cdef inline long long _second(object now) except? -1:
    """``math.floor(now)`` as a C int (a Medium keeps its seconds so): a finite float's in C, anything
    else by math.floor (an OverflowError past 2**63 seconds, where no clock reads)."""
    if type(now) is float and isfinite(<double>now) and -4e18 < <double>now < 4e18:
        return <long long>floor(<double>now)
    return math.floor(now)


cdef inline Py_ssize_t _count_unknown(object index, Py_ssize_t unknown) except -1:
    """``index.unknown_removes += unknown`` (the pass's count so far, added before any Python runs
    and at the batch's end: an attribute read and written once, not at each removal); 0."""
    if unknown:
        index.unknown_removes += unknown
    return 0


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
    cdef Key local[_LOCAL_KEYS]  # an event's keys, read once for the pass's loops (more: allocated)
    cdef Key* keys
    cdef Group route = None  # the group ``routes`` gave the previous event, for its medium and group_idx
    cdef Py_ssize_t unknown = 0  # removes of unknown blocks not yet added to index.unknown_removes
    route_medium = route_group = None
    cdef long long sec = _second(now)
    observer = index.observer
    account = index.account
    if account is None and observer is not None:
        account = index.account = observer.account((index.source, index.dp_rank))
    compare = COMPARE_NONE if observer is None else observer.compare
    stale = index.staleness.reason is not None
    tokens = 0
    try:
        for event in field(batch, _Batch, _BATCH.events, "events"):
            kind = type(event)
            if kind is _BlockStored or kind is _BlockRemoved:
                if kind is _BlockStored:
                    extra = field(event, _BlockStored, _STORED.extra, "extra")
                    medium = field(event, _BlockStored, _STORED.medium, "medium")
                    hashes = field(event, _BlockStored, _STORED.block_hashes, "block_hashes")
                else:
                    extra = field(event, _BlockRemoved, _REMOVED.extra, "extra")
                    medium = field(event, _BlockRemoved, _REMOVED.medium, "medium")
                    hashes = field(event, _BlockRemoved, _REMOVED.block_hashes, "block_hashes")
                group_idx = _group_idx_of(extra)
                if route is not None and _same_route(medium, group_idx, route_medium, route_group):
                    grp = route  # the previous event's (medium, group_idx): what ``routes`` answered it
                else:
                    grp = routes.get((medium, group_idx))
                    if grp is None:
                        unknown = _count_unknown(index, unknown)  # before Python runs
                        grp = index.route(medium, group_idx)
                        route = None  # a route made: the next event asks ``routes``, as the reference
                    else:
                        route, route_medium, route_group = grp, medium, group_idx
                n = hash_count(hashes)
                if n < 0:
                    n = len(hashes)
                med = grp.medium
                if live and sec != med.cur_sec:
                    med.roll(sec)
                keys = _keys_for(hashes, n, local)
                try:
                    if keys is not NULL:
                        _ahead(grp, account.evicted if account is not None else None, hashes, keys, kind is _BlockStored, med.gpu, n > 1)
                    if kind is _BlockStored:
                        # read once: the account and the medium both learn it
                        size = field(event, _BlockStored, _STORED.block_size, "block_size")
                        if account is None or not med.gpu or not n:
                            grp._store(hashes, keys)
                        elif _new_store(stale, event, hashes, keys, size, account, compare, fleet):
                            fresh += n
                            tokens += n * account.block_size
                            grp._store_new(hashes, keys)
                        else:
                            if observer is not None:
                                unknown = _count_unknown(index, unknown)
                                observer.stored(index, event, field(batch, _Batch, _BATCH.ts, "ts"), now)
                                compare = observer.compare
                                route = None  # its Python ran: the routes asked again
                            grp.store(hashes)  # the observer's Python ran: the keys read again
                        if size > 0:
                            med.block_size = size
                        med.stores += n
                        if live:
                            med.cur_stores += n
                    else:
                        unknown += grp._remove(hashes, keys)
                        if account is not None and med.gpu and n:
                            evicted = account.evicted
                            if type(evicted) is Evictions:
                                (<Evictions>evicted)._add(hashes, field(batch, _Batch, _BATCH.ts, "ts"), keys)
                            else:
                                unknown = _count_unknown(index, unknown)
                                evicted.add(hashes, field(batch, _Batch, _BATCH.ts, "ts"))
                                route = None  # another class's Python ran
                        med.removes += n
                        if live:
                            med.cur_removes += n
                finally:
                    if keys is not local:
                        PyMem_Free(keys)
            elif kind is AllBlocksCleared:
                route = None
                unknown = _count_unknown(index, unknown)
                index.clear_blocks()
                index.staleness.cleared()
                stale = index.staleness.reason is not None
    finally:  # the removes of unknown blocks counted once, where the reference counted each event's
        _count_unknown(index, unknown)
    if fresh and account is not None:
        account.add(_NEW, fresh, tokens, now)


AbstractSet.register(BlockSet)  # read as the reference's sets are: isinstance(blocks, collections.abc.Set)
