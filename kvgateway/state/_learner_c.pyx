# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled chain learner: :class:`kvgateway.state._learner_py.ChainLearner`'s table in C arrays.

The same ring of entries in announcement order, the same linear-hashing index over it, the same
growth, eviction (second chances for resident blocks), shrinking and rebuilding, step for step: the
answers, evictions, entry order and slot counts are the pure-Python module's (checked by
tests/unit/test_core_differential.py). What changes is the cost: the arrays are C arrays (22 bytes
an entry and 4 a bucket, as there, and a byte an entry saying what its hash word holds), and the
per-block loop, the parents' mixes and the common digests run in C.

Two things differ inside, never in an answer, for a table larger than the cache, where each bucket
and chain entry read is a miss: an event's keys are computed first and their lines asked for
together (``_ahead``: the misses overlap instead of queueing), and a bucket's chain runs oldest
first (appended at its end, where the pure module pushes at its head), so the ring's front, the
entry evicted next, is nearly always first in its chain: unlinked without walking it. Keys are
unique in the index, so a chain's order decides nothing. Where ``held`` is the compiled index's
:class:`~kvgateway.state._apply_c.BlockSet` (the gateway's fleet holders), an eviction asks it in C
(``state/_apply_c.pxd``: the answer ``in`` gives, without the type's ``__contains__`` wrapper) and asks
for the next front entry's line of it ahead, one eviction before it is read.

The arrays come from Python's raw allocator (malloc underneath, but seen by tracemalloc, so
bench/learner.py counts their bytes as it counts the pure module's arrays).

Keys, links and mixes are unsigned 64- and 32-bit C integers on purpose: the pure module masks its
arithmetic to 64 bits (``& _M64``), which is what C's unsigned wrap-around does. A block hash is any
Python object (int of any sign and size, or bytes): it is only hashed (the value Python's ``hash()``
gives: a u64 int's worked out in line from its digits where the interpreter hashes so, else
``PyObject_Hash``) and kept. An int of 0 to 2**64-1 (vLLM's default) is kept as its value in the
slot's word, with a byte a slot saying so (23 bytes an entry), and a bytes hash of 32 (vLLM's raw
sha256) as its bytes, in an array of 32 a slot made with the first such hash. Neither keeps a
reference: the int (32 bytes and the allocator's share) or the bytes (65) die with their batch,
as the compiled index keeps no hash object either, and an eviction reads the hash from the ring
rather than an object from the heap, and asks the fleet by the key ``_key_of`` would read. An
answer is an object made of the value or the bytes: equal, and of the type announced. Any other
hash is kept by reference, as the pure module keeps them all. The last stream's tuple, id, root and
block sizes are remembered while its source and dp_rank are the same objects (the dicts' answers
for them).
"""

import sys

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject, PyObject_Hash
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from cpython.mem cimport PyMem_RawFree as free
from cpython.mem cimport PyMem_RawMalloc as malloc
from cpython.mem cimport PyMem_RawRealloc as realloc
from libc.string cimport memcpy, memset

from kvgateway._pylong cimport HASH_MODULUS, int_hash, negative_long, u64_long, u64_of  # an int read from its digits, made, hashed
from kvgateway.engine._slots cimport Fields, field, fields_of  # a Struct's field read from its slot
from kvgateway.engine._tokens_c cimport Tokens, slot_offset, slot_value  # token ids as the wire sent them
from kvgateway.state._apply_c cimport BlockSet, holds, holds_ahead, holds_key, holds_key_ahead  # the fleet's holders, asked in C
from kvgateway.state._hashtable cimport _BYTES, _INT, _NEG, CONTENT, Key, _fingerprint, _key_of, _prefetch
from kvgateway.state._hashtable cimport hash_count, hash_hashed, hash_key, hash_other, key_hash  # an event's hashes, a list or a Hashes
from kvgateway.state._hashtable cimport _mix as _spread  # a 32-byte parent's fingerprint spread over 64 bits  # a hash's key; a line asked for

from kvgateway.engine.wire import Batch, BlockStored
from kvgateway.runtime.memory import release_free_heap
from kvgateway.state._learner_py import (
    DEFAULT_MAX_LEARNED_BLOCKS,
    LEARNED_FLOOR,
    LEARNED_PER_RESIDENT,
    block_digests,
    note_block_size,
    stream_root,
)

cdef uint64_t _K64 = 0x9E3779B97F4A7C15ULL
cdef Py_ssize_t _RING_MIN = 1024
cdef int _GROWTH_SHIFT = 5
cdef Py_ssize_t _TRIM_FROM = 65536
cdef Py_ssize_t _LOAD = 2
cdef int _SECOND_CHANCES = 4
cdef int _SHRINK_STEP = 4
cdef uint16_t _NO_STREAM = 0xFFFF
cdef enum:
    # what a ring slot's word in _vals holds (_kinds)
    _NO_HASH = 0  # nothing (a free slot)
    _OBJECT = 1  # a PyObject* whose reference the slot holds: a hash of any other kind
    _VALUE = 2  # an int hash of 0 to 2**64-1, as its value: no object kept for it
    _BLOB = 3  # a bytes hash of CONTENT bytes (a sha256), copied into _blobs: no object kept for it
    _NEGATIVE = 4  # an int hash of -2**63 to -1, as its magnitude: no object kept for it
cdef enum:
    _AHEAD = 16  # blocks whose lines are asked for together, before they are taught
    _ON_STACK = 64  # an event's digests held on the stack (beyond, allocated and freed after it)


cdef bint _HASH_IN_LINE = sys.hash_info.modulus == HASH_MODULUS  # a 64-bit CPython's int hash


cdef inline uint64_t _mix(object parent) except? 0:
    """A parent hash spread over 64 bits, as the pure module's ``_mix``: its ``hash()``, an int64
    or u64 int's worked out in line from its digits (CPython's ``long_hash`` is a call and a loop
    of modular steps, about 150 instructions a block with ``PyObject_Hash`` around it). A 32-byte
    hash (vLLM's raw sha256) is mixed from the index's fingerprint of its bytes instead, spread
    (splitmix64's finaliser: a fingerprint of few set bytes is a small number, as an int hash's
    hash() may be, and the two must not meet): ``hash()`` of a bytes object just decoded (or made
    of the ring's bytes for a lookup) is a SipHash over them, about 230 instructions. The
    learner's keys are its own, compared with nothing outside the ring: the reference's answers,
    slots and counts are the same."""
    cdef Key k
    _key_of(parent, &k)
    return _mix_of(&k, parent)


cdef inline uint64_t _mix_of(Key* k, object h) except? 0:
    """:func:`_mix` of the hash whose key is ``k`` (``h`` as ``hash_hashed`` gives it): from the key
    where it says it all (a Hashes makes no object)."""
    if k.kind == _BYTES:
        return (<uint64_t>_spread(k.key)) * _K64
    return (<uint64_t>key_hash(k, h, _HASH_IN_LINE)) * _K64


# CPython's tuple hash (Objects/tupleobject.c, xxHash's mixing, the same from 3.8 on), so that a
# block's digest can be had without building its tuples: two tuple allocations, a reference
# taken and dropped per token and a deallocation were most of the learner's cost per block.
# _TUPLE_HASH_OK is checked at import against hash() itself; where it differs, the tuples are built.
cdef uint64_t _XXPRIME_1 = 11400714785074694791ULL
cdef uint64_t _XXPRIME_2 = 14029467366897019727ULL
cdef uint64_t _XXPRIME_5 = 2870177450012600261ULL


cdef inline uint64_t _xx_lane(uint64_t acc, uint64_t lane) noexcept:
    acc += lane * _XXPRIME_2
    acc = (acc << 31) | (acc >> 33)
    return acc * _XXPRIME_1


cdef inline uint64_t _xx_end(uint64_t acc, uint64_t length) noexcept:
    acc += length ^ (_XXPRIME_5 ^ 3527539ULL)
    if acc == <uint64_t>-1:
        return 1546275796
    return acc


cdef uint64_t _NONE_LANE = <uint64_t>PyObject_Hash(None)


cdef inline uint64_t _block_end(uint64_t acc, Py_ssize_t size) noexcept:
    """The digest of a block whose tokens' lanes ``acc`` holds: the hash of ``(tokens, None, None)``."""
    acc = _xx_end(acc, <uint64_t>size)
    return _xx_end(_xx_lane(_xx_lane(_xx_lane(_XXPRIME_5, acc), _NONE_LANE), _NONE_LANE), 3)


cdef int _tuple_digest(list tokens, Py_ssize_t first, Py_ssize_t size, uint64_t* out) except -1:
    """``hash((tuple(tokens[first:first + size]), None, None))`` without the tuples; 0 (and
    nothing written) when a token is no exact int, whose hash could run Python code."""
    cdef uint64_t acc = _XXPRIME_5
    cdef Py_ssize_t j
    cdef object token
    for j in range(size):
        token = <object>PyList_GET_ITEM(tokens, first + j)
        if type(token) is not int:
            return 0
        acc = _xx_lane(acc, <uint64_t>int_hash(token, _HASH_IN_LINE))
    out[0] = _block_end(acc, size)
    return 1


cdef int _packed_digests(Tokens tokens, Py_ssize_t size, Py_ssize_t blocks, uint64_t* out) except -1:
    """:func:`_plain_digests` of token ids held as the wire sent them (a ``Tokens`` of ``blocks *
    size``): each is below the modulus, so its lane is its value (``_TUPLE_HASH_OK`` only).

    Four blocks at a time (then two, then one), their lanes side by side: a block's lanes are one
    chain of dependent steps (an add, a rotation and a multiplication each, five cycles), so the
    chains run together, and the loop's own test is paid once for four tokens."""
    cdef const uint32_t* ids = tokens.ids
    cdef const uint32_t* ids1
    cdef const uint32_t* ids2
    cdef const uint32_t* ids3
    cdef uint64_t acc, acc1, acc2, acc3
    cdef Py_ssize_t i = 0, j
    while blocks - i >= 4:
        ids1 = ids + size
        ids2 = ids1 + size
        ids3 = ids2 + size
        acc = acc1 = acc2 = acc3 = _XXPRIME_5
        for j in range(size):
            acc = _xx_lane(acc, ids[j])
            acc1 = _xx_lane(acc1, ids1[j])
            acc2 = _xx_lane(acc2, ids2[j])
            acc3 = _xx_lane(acc3, ids3[j])
        out[i] = _block_end(acc, size)
        out[i + 1] = _block_end(acc1, size)
        out[i + 2] = _block_end(acc2, size)
        out[i + 3] = _block_end(acc3, size)
        ids = ids3 + size
        i += 4
    if blocks - i >= 2:
        ids1 = ids + size
        acc = acc1 = _XXPRIME_5
        for j in range(size):
            acc = _xx_lane(acc, ids[j])
            acc1 = _xx_lane(acc1, ids1[j])
        out[i] = _block_end(acc, size)
        out[i + 1] = _block_end(acc1, size)
        ids = ids1 + size
        i += 2
    if i < blocks:
        acc = _XXPRIME_5
        for j in range(size):
            acc = _xx_lane(acc, ids[j])
        out[i] = _block_end(acc, size)
    return 0


cdef int _plain_digests(list tokens, Py_ssize_t size, Py_ssize_t blocks, uint64_t* out) except -1:
    """:func:`block_digests` of the common case (no LoRA, no extra keys) into ``out``: Python's hash
    of ``(tuple(the block's tokens), None, None)``, computed as CPython does (``_tuple_digest``)
    or with the tuples built in C."""
    cdef Py_ssize_t i, j
    cdef object token
    cdef tuple block
    cdef tuple key
    for i in range(blocks):
        if _TUPLE_HASH_OK and _tuple_digest(tokens, i * size, size, &out[i]):
            continue
        block = PyTuple_New(size)
        for j in range(size):
            token = <object>PyList_GET_ITEM(tokens, i * size + j)
            Py_INCREF(token)
            PyTuple_SET_ITEM(block, j, token)
        key = (block, None, None)
        out[i] = <uint64_t>PyObject_Hash(key)
    return 0


def _tuple_hash_agrees():
    """Whether ``_tuple_digest`` gives what ``hash()`` gives on this interpreter (checked once)."""
    cdef uint64_t got = 0
    samples = (
        [], [0], [1, 2, 3], [-1, -2, 2**61 - 2, 2**61 - 1, 2**61, 2**64 - 1, 2**64 + 5, -(2**70)], list(range(16)), [151_643] * 16
    )
    for tokens in samples:
        if not _tuple_digest(tokens, 0, len(tokens), &got):
            return False
        if got != <uint64_t>(hash((tuple(tokens), None, None)) & 0xFFFFFFFFFFFFFFFF):
            return False
    return True


cdef bint _TUPLE_HASH_OK = _tuple_hash_agrees()
cdef Py_ssize_t _TOKENS_AT = slot_offset(BlockStored)
# The fields the learner reads, per event and per batch, from their slots (``field``)
cdef object _BlockStored = BlockStored
cdef object _Batch = Batch
cdef Fields _STORED = fields_of(BlockStored)
cdef Fields _BATCH = fields_of(Batch)


cdef object _extra_keys_of(object event, Py_ssize_t blocks):
    """The event's per-block ``extra_keys`` (one entry per block), else None: ``extra_keys_of``."""
    cdef object extra = field(event, _BlockStored, _STORED.extra, "extra")
    if not extra:
        return None
    if type(extra) is dict:  # as the decoder makes it: asked in C, without the method call
        extra_keys = (<dict>extra).get("extra_keys")
    else:
        extra_keys = extra.get("extra_keys")
    if not isinstance(extra_keys, list) or len(<list>extra_keys) != blocks:
        return None
    return extra_keys


cdef bint _all_none(list values):
    cdef Py_ssize_t i
    for i in range(PyList_GET_SIZE(values)):
        if <object>PyList_GET_ITEM(values, i) is not None:
            return False
    return True


cdef class ChainLearner:
    """What the streams announced: "(parent hash, the block's content digest) -> block hash".

    The compiled twin of :class:`kvgateway.state._learner_py.ChainLearner`: the same API and
    behaviour (see there), its ring and index in C arrays."""

    cdef public Py_ssize_t max_blocks
    cdef public Py_ssize_t floor
    cdef public double per_resident
    cdef public Py_ssize_t cap
    cdef public object resident
    cdef public object held
    cdef public long long learned
    cdef public long long evicted
    cdef public long long second_chances
    cdef public long long rebuilds
    cdef public long long placeholders
    cdef public long long inconsistent
    cdef dict _roots
    cdef dict _sizes
    cdef list _streams
    cdef dict _stream_ids
    # the stream of the last event learned (its source and dp_rank, the same objects: the router
    # passes its record's), with what the dicts above answered for it: a tuple key built and
    # hashed three times an event (its str's and int's hashes, and compared on a hit) otherwise
    cdef object _at_source
    cdef object _at_dp
    cdef tuple _at_stream
    cdef object _at_known  # _sizes[_at_stream] (a list changed in place), or None: not read
    cdef int _at_sid  # _stream_ids[_at_stream], or -1: not read
    cdef bint _at_rooted
    cdef uint64_t _at_root  # _roots[_at_stream], where _at_rooted
    # the ring: _size physical slots, the oldest at _head, _count in use from there (key 0: free)
    cdef uint64_t* _keys
    # each entry's block hash, one word a slot: a u64 int hash's value (vLLM's default: its int is
    # not kept alive, 32 bytes and more, nor read again at eviction), a negative int64 hash's
    # magnitude (signed hashes, SGLang's: the same), 0 where the hash is in _blobs, else a reference
    cdef uint64_t* _vals
    cdef uint8_t* _kinds  # what each word of _vals is (_NO_HASH, _OBJECT, _VALUE, _NEGATIVE, _BLOB)
    # each slot's CONTENT bytes for a _BLOB hash: NULL until the first one, then sized as the ring
    cdef unsigned char* _blobs
    cdef uint16_t* _sids
    cdef uint32_t* _nexts
    cdef Py_ssize_t _size
    cdef Py_ssize_t _head
    cdef Py_ssize_t _count
    cdef Py_ssize_t _live
    cdef Py_ssize_t _trimmed_at
    # the index (linear hashing): 2**_level + _split buckets, each a ring position + 1 (0: empty)
    cdef uint32_t* _buckets
    cdef Py_ssize_t _nbuckets
    cdef Py_ssize_t _bucket_room
    cdef int _level
    cdef Py_ssize_t _split

    # (C fields start zeroed, pointers NULL: the type's allocation clears the object)

    def __init__(
        self,
        max_blocks=DEFAULT_MAX_LEARNED_BLOCKS,
        resident=None,
        *,
        floor=LEARNED_FLOOR,
        per_resident=LEARNED_PER_RESIDENT,
        held=None,
    ):
        if max_blocks < 0:
            raise ValueError(f"max_blocks must be >= 0, got {max_blocks}")
        if floor < 1 or per_resident <= 0:
            raise ValueError("floor must be at least 1 and per_resident positive")
        self.max_blocks = max_blocks
        self.floor = floor
        self.per_resident = per_resident
        self.cap = min(max_blocks, floor)
        self.resident = resident
        self.held = held
        self._roots = {}
        self._sizes = {}
        self._streams = []
        self._stream_ids = {}
        self._at_source = self._at_dp = self._at_stream = self._at_known = None
        self._at_sid = -1
        self._at_rooted = False
        self.learned = self.evicted = self.second_chances = self.rebuilds = 0
        self.placeholders = self.inconsistent = 0
        self._release()
        self._trimmed_at = _TRIM_FROM
        self._buckets_reset(0)

    def __dealloc__(self):
        self._release()

    cdef void _release(self):
        cdef Py_ssize_t i
        if self._vals != NULL:
            for i in range(self._size):
                self._drop_hash(i)
        free(self._keys)
        free(self._vals)
        free(self._kinds)
        free(self._blobs)
        free(self._sids)
        free(self._nexts)
        free(self._buckets)
        self._keys = NULL
        self._vals = NULL
        self._kinds = NULL
        self._blobs = NULL
        self._sids = NULL
        self._nexts = NULL
        self._buckets = NULL
        self._size = self._head = self._count = self._live = 0
        self._nbuckets = self._bucket_room = 0

    cdef int _buckets_reset(self, int level) except -1:
        """``2**level`` empty buckets, split 0."""
        cdef Py_ssize_t n = (<Py_ssize_t>1) << level
        free(self._buckets)
        self._buckets = <uint32_t*>realloc(NULL, n * sizeof(uint32_t))
        if self._buckets == NULL:
            raise MemoryError()
        memset(self._buckets, 0, n * sizeof(uint32_t))
        self._nbuckets = self._bucket_room = n
        self._level = level
        self._split = 0
        return 0

    cdef int _bucket_append(self) except -1:
        cdef Py_ssize_t room
        cdef uint32_t* grown
        if self._nbuckets == self._bucket_room:
            room = self._bucket_room * 2 if self._bucket_room else 16
            grown = <uint32_t*>realloc(self._buckets, room * sizeof(uint32_t))
            if grown == NULL:
                raise MemoryError()
            self._buckets = grown
            self._bucket_room = room
        self._buckets[self._nbuckets] = 0
        self._nbuckets += 1
        return 0

    def __len__(self):
        return self._live

    # --- size ----------------------------------------------------------------------------------

    def follow_fleet(self, resident_blocks):
        """The fleet now holds ``resident_blocks``: the cap follows it (see the pure module)."""
        self.cap = min(self.max_blocks, max(self.floor, int(resident_blocks * self.per_resident)))

    cdef inline Py_ssize_t _bucket(self, uint64_t key) noexcept:
        cdef uint64_t b = key & (((<uint64_t>1) << self._level) - 1)
        if <Py_ssize_t>b < self._split:
            b = key & (((<uint64_t>2) << self._level) - 1)
        return <Py_ssize_t>b

    cdef inline void _link(self, Py_ssize_t at, uint64_t key) noexcept:
        """Ring position ``at`` at the end of its bucket's chain: a chain runs oldest first, so the
        ring's front (the next entry evicted) is nearly always its chain's first, unlinked without a
        walk; the walk here is over the lines the lookup before it just read."""
        cdef Py_ssize_t b = self._bucket(key)
        cdef uint32_t* nexts = self._nexts
        cdef uint32_t p = self._buckets[b]
        nexts[at] = 0
        if not p:
            self._buckets[b] = <uint32_t>(at + 1)
            return
        while nexts[p - 1]:
            p = nexts[p - 1]
        nexts[p - 1] = <uint32_t>(at + 1)

    cdef void _unlink(self, Py_ssize_t at) noexcept:
        cdef Py_ssize_t b = self._bucket(self._keys[at])
        cdef uint32_t* nexts = self._nexts
        cdef uint32_t p = self._buckets[b]
        if p == at + 1:
            self._buckets[b] = nexts[at]
            return
        while nexts[p - 1] != at + 1:
            p = nexts[p - 1]
        nexts[p - 1] = nexts[at]

    cdef inline Py_ssize_t _find(self, uint64_t key) noexcept:
        cdef uint32_t p = self._buckets[self._bucket(key)]
        while p:
            if self._keys[p - 1] == key:
                return p - 1
            p = self._nexts[p - 1]
        return -1

    cdef int _grow_index(self, int splits=16) except -1:
        cdef Py_ssize_t low, old
        cdef uint32_t p, following
        cdef uint32_t tails[2]  # each half's last entry so far (0: none): the chains keep their order
        cdef int n, half
        for n in range(splits):
            low = (<Py_ssize_t>1) << self._level
            old = self._split
            self._bucket_append()
            p = self._buckets[old]
            self._buckets[old] = 0
            tails[0] = tails[1] = 0
            while p:
                following = self._nexts[p - 1]
                half = 1 if self._keys[p - 1] & <uint64_t>low else 0
                self._nexts[p - 1] = 0
                if tails[half]:
                    self._nexts[tails[half] - 1] = p
                else:
                    self._buckets[old + low * half] = p
                tails[half] = p
                p = following
            self._split += 1
            if self._split == low:
                self._level += 1
                self._split = 0
        return 0

    cdef int _resize(self, Py_ssize_t slots) except -1:
        """The ring's arrays at ``slots`` slots (new slots zeroed, free)."""
        cdef Py_ssize_t old = self._size
        cdef void* p
        p = realloc(self._keys, slots * sizeof(uint64_t) if slots else 1)
        if p == NULL:
            raise MemoryError()
        self._keys = <uint64_t*>p
        p = realloc(self._vals, slots * sizeof(uint64_t) if slots else 1)
        if p == NULL:
            raise MemoryError()
        self._vals = <uint64_t*>p
        p = realloc(self._kinds, slots * sizeof(uint8_t) if slots else 1)
        if p == NULL:
            raise MemoryError()
        self._kinds = <uint8_t*>p
        if self._blobs != NULL:  # a slot's bytes are read only where its kind is _BLOB: not zeroed
            p = realloc(self._blobs, slots * CONTENT if slots else 1)
            if p == NULL:
                raise MemoryError()
            self._blobs = <unsigned char*>p
        p = realloc(self._sids, slots * sizeof(uint16_t) if slots else 1)
        if p == NULL:
            raise MemoryError()
        self._sids = <uint16_t*>p
        p = realloc(self._nexts, slots * sizeof(uint32_t) if slots else 1)
        if p == NULL:
            raise MemoryError()
        self._nexts = <uint32_t*>p
        if slots > old:
            memset(self._keys + old, 0, (slots - old) * sizeof(uint64_t))
            memset(self._vals + old, 0, (slots - old) * sizeof(uint64_t))
            memset(self._kinds + old, 0, (slots - old) * sizeof(uint8_t))
            memset(self._sids + old, 0, (slots - old) * sizeof(uint16_t))
            memset(self._nexts + old, 0, (slots - old) * sizeof(uint32_t))
        self._size = slots
        return 0

    cdef int _rebuild(self) except -1:
        """Arrays just large enough for the live entries, copied in order: O(entries)."""
        cdef Py_ssize_t n, at, size = self._size, kept = 0
        cdef uint64_t* keys = <uint64_t*>realloc(NULL, (self._live or 1) * sizeof(uint64_t))
        cdef uint64_t* vals = <uint64_t*>realloc(NULL, (self._live or 1) * sizeof(uint64_t))
        cdef uint8_t* kinds = <uint8_t*>realloc(NULL, (self._live or 1) * sizeof(uint8_t))
        cdef unsigned char* blobs = NULL
        if self._blobs != NULL:
            blobs = <unsigned char*>realloc(NULL, (self._live or 1) * CONTENT)
        cdef uint16_t* sids = <uint16_t*>realloc(NULL, (self._live or 1) * sizeof(uint16_t))
        cdef uint32_t* nexts = <uint32_t*>realloc(NULL, (self._live or 1) * sizeof(uint32_t))
        if (
            keys == NULL or vals == NULL or kinds == NULL or sids == NULL or nexts == NULL
            or (self._blobs != NULL and blobs == NULL)
        ):
            free(keys)
            free(vals)
            free(kinds)
            free(blobs)
            free(sids)
            free(nexts)
            raise MemoryError()
        for n in range(self._count):
            at = (self._head + n) % size
            if self._keys[at]:
                keys[kept] = self._keys[at]
                vals[kept] = self._vals[at]  # a reference moves with its word
                kinds[kept] = self._kinds[at]
                if kinds[kept] == _BLOB:
                    memcpy(blobs + kept * CONTENT, self._blobs + at * CONTENT, CONTENT)
                sids[kept] = self._sids[at]
                self._kinds[at] = _NO_HASH
                kept += 1
        for at in range(size):  # freed slots hold no reference; nothing else is left
            self._drop_hash(at)
        free(self._keys)
        free(self._vals)
        free(self._kinds)
        free(self._blobs)
        free(self._sids)
        free(self._nexts)
        self._keys, self._vals, self._kinds, self._sids, self._nexts = keys, vals, kinds, sids, nexts
        self._blobs = blobs
        memset(self._nexts, 0, (kept or 1) * sizeof(uint32_t))
        self._size = kept
        self._head, self._count = 0, kept
        self._buckets_reset((kept // _LOAD).bit_length())
        for at in range(kept):
            self._link(at, self._keys[at])
        self.rebuilds += 1
        return 0

    # --- the ring ------------------------------------------------------------------------------

    cdef int _extend(self, Py_ssize_t slots) except -1:
        self._resize(self._size + slots)
        if self._size >= self._trimmed_at:  # the arrays' old copies back to the system
            release_free_heap()
            self._trimmed_at = self._size + (self._size >> 2)
        return 0

    cdef inline Py_ssize_t _growth(self) noexcept:
        cdef Py_ssize_t step = self._size >> _GROWTH_SHIFT
        if step < _RING_MIN:
            step = _RING_MIN
        if self.cap - self._size < step:
            step = self.cap - self._size
        return step

    cdef Py_ssize_t _slot(self) except -1:
        """A free ring position at the back: appended while the ring may grow, else the front freed."""
        while self._count == self._size:
            if self._head == 0 and self._size < self.cap:
                self._extend(self._growth())
            else:
                self._pop()
        cdef Py_ssize_t at = (self._head + self._count) % self._size
        self._count += 1
        return at

    cdef int _pop(self) except -1:
        """Free the front: a freed slot, or the oldest entry (after at most _SECOND_CHANCES
        resident ones moved to the back)."""
        cdef Py_ssize_t at, back, size = self._size
        cdef int chances = 0
        cdef uint64_t key
        cdef uint16_t sid
        resident = self.resident
        held = self.held
        # the index's holders (the gateway's case) asked in C: the answer ``in`` gives, without the
        # type's __contains__ wrapper; and the next front's probe of them asked for ahead
        cdef BlockSet fleet = <BlockSet>held if type(held) is BlockSet else None
        while True:
            at = self._head
            self._head = (at + 1) % size
            self._count -= 1
            if fleet is not None and resident is not None and self._count:
                # the holders' line is had by the next eviction (a kept hash object's asked for
                # by _ahead; a value or 32 bytes are in the ring)
                self._held_ahead(fleet, self._head)
            key = self._keys[at]
            if not key:
                return 0
            sid = self._sids[at]
            if (
                resident is not None
                and chances < _SECOND_CHANCES
                and sid != _NO_STREAM
                and self._kinds[at] != _NO_HASH
                and (held is None or self._held(fleet, held, at))
                and resident(self._streams[sid], self._hash_at(at))
            ):
                chances += 1
                self.second_chances += 1
                back = (self._head + self._count) % size
                self._count += 1
                if back != at:  # the ring was not full: the entry moves, and its link with it
                    self._unlink(at)
                    self._keys[back] = key
                    self._vals[back] = self._vals[at]  # a reference moves with its word
                    self._kinds[back] = self._kinds[at]
                    if self._kinds[at] == _BLOB:
                        memcpy(self._blobs + back * CONTENT, self._blobs + at * CONTENT, CONTENT)
                    self._sids[back] = sid
                    self._keys[at] = 0
                    self._kinds[at] = _NO_HASH
                    self._link(back, key)
                continue
            self._unlink(at)
            self._keys[at] = 0
            self._drop_hash(at)
            self._live -= 1
            self.evicted += 1
            return 0

    # --- a slot's block hash -------------------------------------------------------------------

    cdef inline void _drop_hash(self, Py_ssize_t at) noexcept:
        """The slot's hash gone (its reference dropped, if it holds one)."""
        cdef uint8_t kind = self._kinds[at]
        self._kinds[at] = _NO_HASH
        if kind == _OBJECT:
            Py_DECREF(<object><PyObject*><size_t>self._vals[at])

    cdef inline object _hash_at(self, Py_ssize_t at):
        """The slot's block hash (a live slot's): the object kept, or one made of the value or the
        bytes (equal to the one announced, which was an int or bytes exactly)."""
        cdef uint8_t kind = self._kinds[at]
        if kind == _VALUE:
            return u64_long(self._vals[at])
        if kind == _NEGATIVE:
            return negative_long(self._vals[at])
        if kind == _BLOB:
            return PyBytes_FromStringAndSize(<char*>(self._blobs + at * CONTENT), CONTENT)
        return <object><PyObject*><size_t>self._vals[at]

    cdef inline bint _key_at(self, Py_ssize_t at, Key* k) noexcept:
        """The fleet's key of the slot's hash where it is kept as a value or bytes (what
        ``_key_of`` reads of the hash), else False."""
        cdef uint8_t kind = self._kinds[at]
        if kind == _VALUE:
            k.kind, k.key, k.data = _INT, self._vals[at], NULL
            return True
        if kind == _NEGATIVE:
            k.kind, k.key, k.data = _NEG, self._vals[at], NULL
            return True
        if kind == _BLOB:
            k.kind, k.data = _BYTES, self._blobs + at * CONTENT
            k.key = _fingerprint(k.data)
            return True
        return False

    cdef inline bint _held(self, BlockSet fleet, object held, Py_ssize_t at) except -1:
        """Whether the holders hold the slot's block hash: the fleet asked in C (a value or 32
        bytes kept in the ring by their key), any other container by ``in``."""
        cdef Key k
        if fleet is None:
            return self._hash_at(at) in held
        if self._key_at(at, &k):
            return holds_key(fleet, &k)
        return holds(fleet, <object><PyObject*><size_t>self._vals[at])

    cdef inline int _held_ahead(self, BlockSet fleet, Py_ssize_t at) except -1:
        """The fleet's line :meth:`_held` will read for the slot asked for (a hint)."""
        cdef Key k
        if self._key_at(at, &k):
            holds_key_ahead(fleet, &k)
        elif self._kinds[at] == _OBJECT:
            holds_ahead(fleet, <object><PyObject*><size_t>self._vals[at])
        return 0

    cdef int _free_entry(self, Py_ssize_t at) except -1:
        self._unlink(at)
        self._keys[at] = 0
        self._drop_hash(at)
        self._live -= 1
        return 0

    cdef int _store(self, Py_ssize_t at, uint64_t key, Key* hk, object block_hash, uint16_t sid) except -1:
        """Entry ``at`` made the block's: its hash by its key ``hk`` (the kind the fleet's tables
        read: the ring keeps the same ones), ``block_hash`` itself kept only for a hash of no
        table's kind."""
        cdef Key k = hk[0]
        self._drop_hash(at)
        if k.kind == _INT:  # kept as its value: equal ints made of it answer
            self._vals[at] = k.key
            self._kinds[at] = _VALUE
        elif k.kind == _BYTES:  # kept as its bytes
            if self._blobs == NULL:
                self._blobs = <unsigned char*>realloc(NULL, (self._size or 1) * CONTENT)
                if self._blobs == NULL:
                    raise MemoryError()
            memcpy(self._blobs + at * CONTENT, k.data, CONTENT)
            self._vals[at] = 0
            self._kinds[at] = _BLOB
        elif k.kind == _NEG:  # a signed hash's other half: kept as its magnitude
            self._vals[at] = k.key
            self._kinds[at] = _NEGATIVE
        else:
            Py_INCREF(block_hash)
            self._vals[at] = <uint64_t><size_t><PyObject*>block_hash
            self._kinds[at] = _OBJECT
        self._keys[at] = key
        self._sids[at] = sid
        self._live += 1
        return 0

    cdef int _insert(self, uint64_t key, Key* hk, object block_hash, uint16_t sid) except -1:
        """One entry at the back; a re-announced key leaves its old place."""
        cdef Py_ssize_t old = self._find(key)
        if old >= 0:
            self._free_entry(old)
        cdef Py_ssize_t at = self._slot()
        self._store(at, key, hk, block_hash, sid)
        self._link(at, key)
        self._after_insert()
        return 0

    cdef int _after_insert(self) except -1:
        if self._live > _LOAD * self._nbuckets:
            self._grow_index()
        if self._live > self.cap:
            self._shrink()
        return 0

    cdef int _shrink(self) except -1:
        cdef int n
        for n in range(_SHRINK_STEP):
            if self._live <= self.cap:
                break
            self._pop()
        if self._live <= self.cap and self._size >= 2 * max(self.cap, _RING_MIN):
            self._rebuild()
        return 0

    cdef int _append(self, uint64_t key, Key* hk, object block_hash, uint16_t sid) except -1:
        """A new key at the back: the ring grows (below the cap) or its front is evicted (at the
        cap) when full."""
        cdef Py_ssize_t at
        if self._count < self._size:
            at = (self._head + self._count) % self._size
        elif self._head == 0 and self._size < self.cap:
            at = self._size
            self._extend(self._growth())
        else:
            self._pop()  # at the cap: one slot freed at the front (no bucket split: b holds)
            at = (self._head + self._count) % self._size
        self._count += 1
        self._store(at, key, hk, block_hash, sid)
        self._link(at, key)
        self._after_insert()
        return 0

    # --- learning ------------------------------------------------------------------------------

    cdef uint64_t _root(self, tuple stream) except? 0:
        if stream is self._at_stream and self._at_rooted:
            return self._at_root
        root = self._roots.get(stream)
        if root is None:
            root = self._roots[stream] = stream_root(stream)
        if stream is self._at_stream:
            self._at_root, self._at_rooted = <uint64_t>root, True
        return <uint64_t>root

    cdef uint16_t _stream_id(self, tuple stream) except? 0xFFFE:
        if stream is self._at_stream and self._at_sid >= 0:
            return <uint16_t>self._at_sid
        sid = self._stream_ids.get(stream)
        if sid is None:
            sid = len(self._streams) if len(self._streams) < _NO_STREAM else _NO_STREAM
            if sid != _NO_STREAM:
                self._streams.append(stream)
            self._stream_ids[stream] = sid
        if stream is self._at_stream:
            self._at_sid = <uint16_t>sid
        return <uint16_t>sid

    cdef tuple _stream_of(self, object source, object dp_rank):
        """``(source, dp_rank)``: the last event's tuple where they are the same objects (the
        dicts answer it as they answered it then), else a new one, remembered."""
        if source is self._at_source and dp_rank is self._at_dp and self._at_stream is not None:
            return self._at_stream
        self._at_stream = (source, dp_rank)
        self._at_source, self._at_dp = source, dp_rank
        self._at_known = None
        self._at_sid = -1
        self._at_rooted = False
        return self._at_stream

    cdef int _note_size(self, tuple stream, object size_of) except -1:
        """The stream's block sizes learn ``size_of`` (``note_block_size``) where it is not the most
        recent already."""
        known = self._at_known if stream is self._at_stream else None
        if known is None:
            known = self._sizes.get(stream)
        if known is None or known[0] != size_of:  # the same size again (nearly always): no Python call
            note_block_size(self._sizes, stream, size_of)
            known = None
        if stream is self._at_stream:
            self._at_known = known  # the list itself, changed in place by note_block_size
        return 0

    def block_sizes(self, source, dp_rank):
        """The block sizes the stream taught with, most recent first (at most 4 kept)."""
        return list(self._sizes.get((source, dp_rank), ()))

    def learn_batch(self, source, dp_rank, batch):
        """Learn from every BlockStored of a delivered batch; returns the entries taught."""
        if not self.max_blocks:
            return 0
        cdef Py_ssize_t taught = 0
        for event in field(batch, _Batch, _BATCH.events, "events"):
            if type(event) is _BlockStored:
                taught += self._learn(source, dp_rank, event)
        return taught

    def learn(self, source, dp_rank, event):
        """Learn one BlockStored's blocks; returns the entries taught (0 for a placeholder)."""
        return self._learn(source, dp_rank, event)

    cdef Py_ssize_t _learn(self, object source, object dp_rank, object event) except -1:
        cdef object hashes = field(event, _BlockStored, _STORED.block_hashes, "block_hashes")
        # a Tokens (never empty) is not made a list
        cdef object tokens = slot_value(event, _TOKENS_AT if type(event) is _BlockStored else -1)
        cdef object size_of = field(event, _BlockStored, _STORED.block_size, "block_size")
        cdef uint64_t size_u = 0
        # an int below 2**30 (any engine's block size): the tests below in C, else Python's arithmetic
        cdef bint small = u64_of(size_of, &size_u) and size_u < (<uint64_t>1 << 30)
        if not self.max_blocks or not hashes:
            return 0
        if not tokens or (size_u == 0 if small else size_of <= 0):
            self.placeholders += 1
            return 0
        cdef Py_ssize_t blocks = hash_count(hashes)
        if blocks < 0:
            hashes = list(hashes)
            blocks = PyList_GET_SIZE(hashes)
        if (len(tokens) != blocks * <Py_ssize_t>size_u) if small else (len(tokens) != blocks * size_of):
            self.inconsistent += 1  # (any block size the wire sent: Python's arithmetic beyond 2**30)
            return 0
        cdef Py_ssize_t size
        if small:
            size = <Py_ssize_t>size_u
        else:
            size = size_of
        cdef tuple stream = self._stream_of(source, dp_rank)
        self._note_size(stream, size_of)
        cdef uint64_t on_stack[_ON_STACK]  # an event's digests, then its keys: most events' fit here
        cdef uint64_t* digests = on_stack
        if blocks > _ON_STACK:
            digests = <uint64_t*>malloc(blocks * sizeof(uint64_t))
            if digests == NULL:
                raise MemoryError()
        try:
            self._digests(event, tokens, size, blocks, digests)
            parent = field(event, _BlockStored, _STORED.parent_block_hash, "parent_block_hash")
            self._teach(stream, parent, hashes, blocks, digests)
        finally:
            if digests != on_stack:
                free(digests)
        self.learned += blocks
        return blocks

    cdef int _digests(self, object event, object tokens, Py_ssize_t size, Py_ssize_t blocks, uint64_t* out) except -1:
        lora_name = field(event, _BlockStored, _STORED.lora_name, "lora_name")
        extra_keys = _extra_keys_of(event, blocks)
        cdef Py_ssize_t i
        if lora_name is None and (extra_keys is None or _all_none(extra_keys)):
            if type(tokens) is Tokens and _TUPLE_HASH_OK:
                return _packed_digests(<Tokens>tokens, size, blocks, out)
            if type(tokens) is list:
                return _plain_digests(tokens, size, blocks, out)
        if type(tokens) is Tokens:
            tokens = event.token_ids  # the list they read as, for the reference's digests
        for i, digest in enumerate(block_digests(tokens, size, lora_name, extra_keys)):
            out[i] = <uint64_t>digest
        return 0

    cdef int _teach(self, tuple stream, object parent, object hashes, Py_ssize_t blocks, uint64_t* digests) except -1:
        """One entry per block, each keyed by its digest XOR its parent's mix (``digests`` become
        the keys). The keys come first, so that each run of blocks' lines (their buckets, their
        chains' first entries, the front entries they evict) are asked for together: on a table
        larger than the cache each is a miss, and they overlap rather than wait one after another.
        A block hash whose ``hash()`` raises stops the blocks there, as block by block."""
        cdef uint64_t mix = self._root(stream) if parent is None else _mix(parent)
        cdef uint16_t sid = self._stream_id(stream)
        cdef Py_ssize_t i, ready = 0
        cdef uint64_t key
        cdef Key k
        try:
            for i in range(blocks):
                key = digests[i] ^ mix
                digests[i] = key if key else 1
                hash_key(hashes, i, &k)
                mix = _mix_of(&k, hash_hashed(hashes, i, &k, _HASH_IN_LINE))  # the next block's parent
                ready = i + 1  # taught only once its hash's mix is had, as block by block
        finally:
            self._teach_keys(hashes, ready, digests, sid)
        return 0

    cdef int _teach_keys(self, object hashes, Py_ssize_t blocks, const uint64_t* keys, uint16_t sid) except -1:
        """The first ``blocks`` blocks taught, their keys given, in runs of _AHEAD asked for first."""
        cdef Py_ssize_t i, start = 0, end
        cdef Key k
        while start < blocks:
            end = start + _AHEAD if blocks - start > _AHEAD else blocks
            self._ahead(keys + start, end - start)
            for i in range(start, end):
                hash_key(hashes, i, &k)
                self._teach_one(keys[i], &k, hash_other(hashes, i), sid)
            start = end
        return 0

    cdef inline int _teach_one(self, uint64_t key, Key* hk, object block_hash, uint16_t sid) except -1:
        if self._find(key) >= 0:  # re-announced (rare): to the back of the eviction order
            return self._insert(key, hk, block_hash, sid)
        return self._append(key, hk, block_hash, sid)

    cdef void _ahead(self, const uint64_t* keys, Py_ssize_t n) noexcept:
        """Ask for the lines teaching ``n`` keys (at most _AHEAD) reads: their buckets, and, the ring
        full at its cap, its front entries' buckets and hash objects (each key evicts one); then the
        first entry of each chain (its key and link), then the second. Hints only: nothing is
        changed."""
        cdef Py_ssize_t i, at
        cdef Py_ssize_t buckets[_AHEAD]
        cdef uint32_t p
        cdef uint64_t front
        for i in range(n):
            buckets[i] = self._bucket(keys[i])
            _prefetch(&self._buckets[buckets[i]])
        if self._count == self._size and self._size >= self.cap:
            for i in range(min(n, self._count)):
                at = (self._head + i) % self._size
                front = self._keys[at]
                if front:
                    _prefetch(&self._buckets[self._bucket(front)])
                    if self._kinds[at] == _OBJECT:  # its hash, read if the fleet is asked whether it holds it
                        _prefetch(<PyObject*><size_t>self._vals[at])
                    elif self._kinds[at] == _BLOB:
                        _prefetch(self._blobs + at * CONTENT)
        for i in range(n):
            p = self._buckets[buckets[i]]
            buckets[i] = p  # from here, each chain's first entry (0: none)
            if p:
                _prefetch(&self._keys[p - 1])
                _prefetch(&self._nexts[p - 1])
        for i in range(n):  # and its second (a lookup of a new key walks the whole chain)
            p = <uint32_t>buckets[i]
            if p:
                p = self._nexts[p - 1]
                if p:
                    _prefetch(&self._keys[p - 1])
                    _prefetch(&self._nexts[p - 1])

    # --- lookups -------------------------------------------------------------------------------

    def chain(self, source, dp_rank, digests):
        """The hashes the stream announced for these blocks (block_digests), as far as learned."""
        cdef uint64_t mix = self._root((source, dp_rank))
        cdef uint64_t key
        cdef Py_ssize_t at
        cdef list out = []
        for digest in digests:
            key = (<uint64_t>(digest & 0xFFFFFFFFFFFFFFFF)) ^ mix
            if not key:
                key = 1
            at = self._find(key)
            if at < 0:
                break
            block_hash = self._hash_at(at)
            out.append(block_hash)
            mix = _mix(block_hash)
        return out

    def entries(self):
        """Every live entry as (announcing stream, block hash), oldest announcement first."""
        cdef list out = []
        cdef Py_ssize_t n, at
        cdef uint16_t sid
        for n in range(self._count):
            at = (self._head + n) % self._size
            if self._keys[at] and self._kinds[at] != _NO_HASH:
                sid = self._sids[at]
                out.append((self._streams[sid] if sid != _NO_STREAM else ("", -1), self._hash_at(at)))
        return out

    @property
    def slots(self):
        """Ring slots allocated (live entries, freed slots and room to grow into)."""
        return self._size

    def nbytes(self):
        """Bytes of the ring and its index, allocated (the hash objects held excluded), counted as
        the pure module counts its arrays, with what the pure module has no need of: the kind byte a
        slot, and the 32 bytes a slot once a 32-byte hash is kept."""
        return self._size * (8 + 1 + 2 + 4 + 8 + (CONTENT if self._blobs != NULL else 0)) + 4 * self._nbuckets
