# cython: language_level=3
"""Open-addressed C tables of block hashes, for the compiled index (``cimport``-ed, like
:mod:`kvgateway._pylong`: compiled into each module that uses them; nothing of it exists at run time).

Two kinds of table share the code: keyed by a 64-bit word itself, or by a 32-byte hash (vLLM's raw
sha256 bytes: the table keeps the bytes beside a 64-bit fingerprint of them, compared first). A
timed table keeps a double beside each key (an eviction's engine time); a set of resident hashes
keeps the keys alone, 8 bytes a slot. A holder keeps three: the u64 hashes by their value, the
negative int64 ones (SGLang's, LMCache's, vLLM's before 0.10.2: half of a signed hash's values) by
their magnitude in a table of their own (one table for both would make -5 and 5 one hash), and the
32-byte ones. A hash of any other kind (a wider int, bytes of another length) is the caller's to
keep in a Python container beside the tables: :func:`_key_of` says which kind a hash is.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_RawFree, PyMem_RawMalloc
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from cpython.object cimport PyObject_Hash

from kvgateway._pylong cimport negative_hash, negative_of, u64_hash, u64_of  # a hash's int read from its digits, hashed
from kvgateway.engine._tokens_c cimport (  # an event's hashes as the wire sent them
    HASH_BLOB_SIZE, HASHES_BLOB, HASHES_I64, Hashes, hash_item,
)

cimport cython


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define KVG_PREFETCH(p) __builtin_prefetch((const void*)(p))
    #else
    #define KVG_PREFETCH(p) ((void)(p))
    #endif
    """
    # a hint that the line holding ``p`` will be read soon: its miss starts now, beside the others
    # a loop asks for, rather than when the loop reaches it (no answer depends on it)
    void _prefetch "KVG_PREFETCH"(const void* p) noexcept nogil


cdef enum:
    CONTENT = 32  # the bytes of a content-keyed slot: a sha256 block hash (vLLM's raw-bytes hashes)


cdef struct Table:
    # Open addressing, linear probing, at most 3/4 full: one probe (one cache line) answers most
    # lookups. Deletion shifts the entries after a freed slot back (no tombstones).
    # Two kinds share the code: keyed by a u64 hash itself (``content`` NULL), or by 32-byte hashes
    # (``content`` holds each slot's bytes; ``keys`` a non-zero fingerprint of them, compared first,
    # so a lookup of an absent hash touches the keys alone). Columns, not slots of a struct: a set
    # keeps no times (NULL), and a lookup reads the keys alone either way.
    uint64_t* keys  # 0: the slot is empty (hash 0 is kept in ``has_zero`` and ``zero``)
    double* times  # each slot's time, or NULL: the table keeps none
    unsigned char* content
    size_t mask
    size_t n  # entries, hash 0 included
    bint has_zero
    double zero


cdef enum:
    _MIN_SLOTS = 16  # a new or emptied table's slots


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


cdef inline void _table_free(Table* table) noexcept:
    PyMem_Free(table.keys)
    PyMem_Free(table.times)
    PyMem_Free(table.content)
    table.keys = NULL
    table.times = NULL
    table.content = NULL


cdef inline int _table_init(Table* table, size_t slots, bint content, bint timed) except -1:
    # PyMem: traced by tracemalloc, as a dict's table is
    table.keys = <uint64_t*>PyMem_Malloc(slots * sizeof(uint64_t))
    table.times = <double*>PyMem_Malloc(slots * sizeof(double)) if timed else NULL
    table.content = <unsigned char*>PyMem_Malloc(slots * CONTENT) if content else NULL
    if table.keys is NULL or (timed and table.times is NULL) or (content and table.content is NULL):
        _table_free(table)
        raise MemoryError()
    memset(table.keys, 0, slots * sizeof(uint64_t))
    table.mask = slots - 1
    table.n = 0
    table.has_zero = False
    table.zero = 0
    return 0


cdef inline bint _slot_is(Table* table, size_t i, uint64_t key, const unsigned char* data) noexcept nogil:
    """Whether slot ``i`` holds ``key`` (and, in a content table, ``data``, its bytes)."""
    return table.keys[i] == key and (
        table.content is NULL or memcmp(table.content + i * CONTENT, data, CONTENT) == 0
    )


cdef inline Py_ssize_t _table_find(Table* table, uint64_t key, const unsigned char* data) noexcept nogil:
    """The slot of a non-zero ``key`` (with ``data``, its bytes, in a content table), or -1."""
    cdef size_t i = _mix(key) & table.mask
    while table.keys[i]:
        if _slot_is(table, i, key, data):
            return <Py_ssize_t>i
        i = (i + 1) & table.mask
    return -1


cdef inline bint _table_has(Table* table, uint64_t key, const unsigned char* data) noexcept nogil:
    return table.has_zero if key == 0 else _table_find(table, key, data) >= 0


cdef inline void _slot_copy(Table* table, size_t to, Table* source, size_t frm) noexcept nogil:
    """Slot ``frm`` of ``source`` (of the same kind) into slot ``to`` of ``table``."""
    table.keys[to] = source.keys[frm]
    if table.times is not NULL:
        table.times[to] = source.times[frm]
    if table.content is not NULL:
        memcpy(table.content + to * CONTENT, source.content + frm * CONTENT, CONTENT)


cdef inline int _table_grow(Table* table) except -1:
    cdef Table old = table[0]
    cdef size_t i, j
    _table_init(table, (old.mask + 1) * 2, old.content is not NULL, old.times is not NULL)
    table.n, table.has_zero, table.zero = old.n, old.has_zero, old.zero
    for i in range(old.mask + 1):
        if old.keys[i]:
            j = _mix(old.keys[i]) & table.mask
            while table.keys[j]:
                j = (j + 1) & table.mask
            _slot_copy(table, j, &old, i)
    _table_free(&old)
    return 0


cdef inline int _table_set(Table* table, uint64_t key, const unsigned char* data, double ts) except -1:
    """Put ``key`` (with ``data``, its bytes, in a content table) in, at time ``ts`` (in a timed table)."""
    cdef size_t i
    if key == 0:
        table.n += not table.has_zero
        table.has_zero, table.zero = True, ts
        return 0
    if (table.n + 1) * 4 > (table.mask + 1) * 3:
        _table_grow(table)
    i = _mix(key) & table.mask
    while table.keys[i]:
        if _slot_is(table, i, key, data):
            if table.times is not NULL:
                table.times[i] = ts
            return 0
        i = (i + 1) & table.mask
    table.keys[i] = key
    if table.times is not NULL:
        table.times[i] = ts
    if table.content is not NULL:
        memcpy(table.content + i * CONTENT, data, CONTENT)
    table.n += 1
    return 0


cdef inline void _table_delete(Table* table, size_t i) noexcept nogil:
    """Free slot ``i``, moving back every later entry of the run that would no longer be found."""
    cdef size_t j = i
    cdef size_t home
    while True:
        j = (j + 1) & table.mask
        if not table.keys[j]:
            break
        home = _mix(table.keys[j]) & table.mask
        # the entry at j stays where it is if its home lies cyclically in (i, j]
        if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
            continue
        _slot_copy(table, i, table, j)
        i = j
    table.keys[i] = 0
    table.n -= 1


cdef inline bint _table_pop(Table* table, uint64_t key, const unsigned char* data, double* ts) noexcept nogil:
    """Forget ``key``; whether it was there (its time in ``ts``, in a timed table)."""
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
    if table.times is not NULL:
        ts[0] = table.times[i]
    _table_delete(table, <size_t>i)
    return True


cdef inline int _table_clear(Table* table) except -1:
    """Empty, back to its smallest size (a generation the window leaves behind gives its memory back)."""
    cdef bint content = table.content is not NULL
    cdef bint timed = table.times is not NULL
    _table_free(table)
    return _table_init(table, _MIN_SLOTS, content, timed)


cdef inline int _table_empty(Table* table, Py_ssize_t bound) except -1:
    """Empty, keeping its slots if ``bound`` entries need as many: a generation dropped at the bound
    fills again at the same rate, and growing back from 16 slots rehashed each entry about once
    more (and zeroed twice the memory). A table grown past the bound's size (by the one ``add`` that
    crossed it) goes back to the smallest size, so the bound's memory holds."""
    cdef Py_ssize_t slots = <Py_ssize_t>(table.mask + 1)
    if bound * 4 <= (slots // 2) * 3:  # the bound fits in half of it: more slots than it needs
        return _table_clear(table)
    memset(table.keys, 0, <size_t>slots * sizeof(uint64_t))
    table.n = 0
    table.has_zero = False
    return 0


cdef enum:
    _INT = 0  # an int of 0 to 2**64-1: the u64 table, keyed by itself
    _BYTES = 1  # bytes of CONTENT length: the content table, keyed by its fingerprint and bytes
    _OTHER = 2  # any other hash: the dict
    _NEG = 3  # an int of -2**63 to -1: the negatives' table, keyed by its magnitude (1 to 2**63)


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
    elif negative_of(h, &k.key):
        k.kind = _NEG
    else:
        k.kind = _OTHER
    return 0


cdef inline void _key_in(int form, const unsigned char* data, Py_ssize_t i, Key* k) noexcept nogil:
    """:func:`_key_of` of hash ``i`` of an array of hashes of one :class:`Hashes` form (``form``,
    its bytes ``data``): a Hashes' own, or a copy of it (the analytics' thread reads one)."""
    cdef uint64_t bits
    if form == HASHES_BLOB:
        k.kind = _BYTES
        k.data = data + i * HASH_BLOB_SIZE
        k.key = _fingerprint(k.data)
        return
    k.data = NULL
    bits = (<const uint64_t*>data)[i]
    if form == HASHES_I64 and <int64_t>bits < 0:
        k.kind = _NEG
        k.key = 0 - bits  # the magnitude, 2**63 for -2**63 (negative_of's)
    else:
        k.kind = _INT
        k.key = bits


cdef inline void _key_at(Hashes hashes, Py_ssize_t i, Key* k) noexcept:
    """:func:`_key_of` of hash ``i`` of a :class:`Hashes`, read from its array (never ``_OTHER``)."""
    _key_in(hashes.form, hashes.data, i, k)


# An event's block hashes, as the pass reads them: a list (the reference decoder's, or the field
# read from Python), or a Hashes (the compiled parser's). A Hashes holds no hash of kind _OTHER, the
# only kind the tables' callers hand the object itself to: where the key says more is not needed,
# :func:`hash_other` gives None for it rather than making the int or bytes.

cdef inline Py_ssize_t hash_count(object hashes) noexcept:
    """How many hashes a list or a Hashes holds; -1 for anything else."""
    if type(hashes) is list:
        return PyList_GET_SIZE(hashes)
    if type(hashes) is Hashes:
        return (<Hashes>hashes).count
    return -1


cdef inline int hash_key(object hashes, Py_ssize_t i, Key* k) except -1:
    """The key of hash ``i`` (below :func:`hash_count`) of a list or a Hashes."""
    if type(hashes) is list:
        return _key_of(<object>PyList_GET_ITEM(hashes, i), k)
    if type(hashes) is not Hashes:  # a caller's mistake, not the wire's: never read as a Hashes
        raise TypeError(f"block hashes: a list or a Hashes, not {type(hashes).__name__}")
    _key_at(<Hashes>hashes, i, k)
    return 0


cdef inline object hash_object(object hashes, Py_ssize_t i):
    """Hash ``i`` (below :func:`hash_count`) of a list or a Hashes, as the list holds it (made, for
    a Hashes)."""
    if type(hashes) is list:
        return <object>PyList_GET_ITEM(hashes, i)
    if type(hashes) is not Hashes:
        raise TypeError(f"block hashes: a list or a Hashes, not {type(hashes).__name__}")
    return hash_item(<Hashes>hashes, i)


cdef inline object hash_other(object hashes, Py_ssize_t i):
    """Hash ``i`` of a list or a Hashes where only a hash of kind _OTHER is needed as an object: the
    list's item, or None (a Hashes holds none of that kind)."""
    if type(hashes) is list:
        return <object>PyList_GET_ITEM(hashes, i)
    return None


cdef inline Py_hash_t key_hash(Key* k, object h, bint in_line) except? -1:
    """``hash()`` of the block hash ``h`` whose key is ``k`` (not a 32-byte one): an int64 or u64
    one's worked out from its key where ``in_line`` (the caller's check that
    ``sys.hash_info.modulus`` is ``HASH_MODULUS``), as ``_pylong.int_hash`` works it out from the
    int; any other asked of ``h`` (see :func:`hash_hashed`)."""
    if in_line and k.kind == _INT:
        return <Py_hash_t>u64_hash(k.key)
    if in_line and k.kind == _NEG:
        return negative_hash(k.key)
    return PyObject_Hash(h)


cdef inline object hash_hashed(object hashes, Py_ssize_t i, Key* k, bint in_line):
    """Hash ``i`` of a list or a Hashes, its key ``k``, as :func:`key_hash` needs it: the object
    where its ``hash()`` is asked of it (a hash of no table's kind, or any where ints are not hashed
    in line: never one of a Hashes' in line), else None."""
    if k.kind == _OTHER or not in_line:
        return hash_object(hashes, i)
    return None


cdef inline bint _table_add(Table* table, uint64_t key, const unsigned char* data) except -1:
    """:func:`_table_set` in a table that keeps no times; whether ``key`` was not there."""
    cdef size_t before = table.n
    _table_set(table, key, data, 0.0)
    return table.n != before


cdef inline bint _ints_put(Table* table, uint64_t key, double ts) except -1:
    """:func:`_table_set` in a table of u64 keys (no bytes: a set's ``ints``, an eviction
    generation's), its probe comparing the keys alone: small enough to be compiled into its callers,
    where the general one is a call. Whether ``key`` was not there."""
    cdef size_t i
    cdef bint new
    if key == 0:
        new = not table.has_zero
        table.n += new
        table.has_zero, table.zero = True, ts
        return new
    if (table.n + 1) * 4 > (table.mask + 1) * 3:
        _table_grow(table)
    i = _mix(key) & table.mask
    while table.keys[i] and table.keys[i] != key:
        i = (i + 1) & table.mask
    new = not table.keys[i]
    if new:
        table.keys[i] = key
        table.n += 1
    if table.times is not NULL:
        table.times[i] = ts
    return new


cdef inline bint _ints_discard(Table* table, uint64_t key) noexcept nogil:
    """:func:`_table_pop` in a table of u64 keys alone: the find and the backward shift moving the
    keys only (no times, no bytes); whether ``key`` was there."""
    cdef uint64_t* keys = table.keys
    cdef size_t mask = table.mask
    cdef size_t i, j, home
    if key == 0:
        if not table.has_zero:
            return False
        table.has_zero = False
        table.n -= 1
        return True
    i = _mix(key) & mask
    while keys[i] != key:
        if not keys[i]:
            return False
        i = (i + 1) & mask
    j = i
    while True:  # :func:`_table_delete`'s shift
        j = (j + 1) & mask
        if not keys[j]:
            break
        home = _mix(keys[j]) & mask
        if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
            continue
        keys[i] = keys[j]
        i = j
    keys[i] = 0
    table.n -= 1
    return True


cdef inline int _table_copy(Table* table, Table* source) except -1:
    """``table`` (uninitialised or freed) made an equal copy of ``source``, the same size."""
    cdef size_t slots = source.mask + 1
    _table_init(table, slots, source.content is not NULL, source.times is not NULL)
    memcpy(table.keys, source.keys, slots * sizeof(uint64_t))
    if source.times is not NULL:
        memcpy(table.times, source.times, slots * sizeof(double))
    if source.content is not NULL:
        memcpy(table.content, source.content, slots * CONTENT)
    table.n, table.has_zero, table.zero = source.n, source.has_zero, source.zero
    return 0


cdef inline void _table_prefetch(Table* table, uint64_t key, bint whole) noexcept nogil:
    """Ask for the line of ``key``'s home slot (a hint: nothing changes): its key, and with
    ``whole`` its time and bytes too (what a set or a pop reads or writes; a lookup of an absent
    hash reads the keys alone). A run of probes asked for first overlaps its misses."""
    cdef size_t i
    if key == 0:
        return
    i = _mix(key) & table.mask
    _prefetch(&table.keys[i])
    if whole:
        if table.times is not NULL:
            _prefetch(&table.times[i])
        if table.content is not NULL:
            _prefetch(table.content + i * CONTENT)


cdef inline void _key_prefetch(Key* k, Table* ints, Table* negs, Table* blobs, bint whole) noexcept nogil:
    """:func:`_table_prefetch` in the table of ``k``'s kind (none for a hash of another kind)."""
    if k.kind == _INT:
        _table_prefetch(ints, k.key, whole)
    elif k.kind == _BYTES:
        _table_prefetch(blobs, k.key, whole)
    elif k.kind == _NEG:
        _table_prefetch(negs, k.key, whole)


cdef struct Filter:
    # A negative filter of u64 keys (a u64 hash, a 32-byte hash's fingerprint): one bit a key, the
    # top bits of its Fibonacci product. A clear bit says no key of that value was noted; a set one
    # says maybe (the caller asks its exact table). Keys taken out leave their bits until a rebuild.
    uint64_t* words  # NULL: not made yet
    int shift  # 64 - log2(bits)
    Py_ssize_t added  # keys noted since it was sized (the bits set, at most)
    Py_ssize_t limit  # the bits / _FILTER_SPARSE: past it, the owner rebuilds it


cdef enum:
    _FILTER_BITS_A_KEY = 16  # bits a key at a rebuild
    _FILTER_SPARSE = 8  # at most one bit in this many set


cdef inline int _filter_sized(Filter* f, Py_ssize_t keys, int min_log2) noexcept nogil:
    """``f`` empty, with bits for ``keys`` keys, at least ``2**min_log2`` (its words kept when their
    number stays); without the GIL (the analytics' thread makes its filters). -1: no memory, and
    ``f`` has no words (its owner asks its table)."""
    cdef Py_ssize_t bits = (<Py_ssize_t>1) << min_log2
    cdef int log2 = min_log2
    while bits < _FILTER_BITS_A_KEY * keys:
        bits <<= 1
        log2 += 1
    if f.words is NULL or 64 - log2 != f.shift:
        PyMem_RawFree(f.words)
        f.words = <uint64_t*>PyMem_RawMalloc((bits >> 6) * sizeof(uint64_t))  # traced, as a dict's
        if f.words is NULL:
            return -1
        f.shift = 64 - log2
    memset(f.words, 0, (bits >> 6) * sizeof(uint64_t))
    f.added = 0
    f.limit = bits // _FILTER_SPARSE
    return 0


cdef inline int _filter_size(Filter* f, Py_ssize_t keys, int min_log2) except -1:
    """:func:`_filter_sized`, a MemoryError where there is no memory."""
    if _filter_sized(f, keys, min_log2) < 0:
        raise MemoryError()
    return 0


cdef inline void _filter_free(Filter* f) noexcept nogil:
    PyMem_RawFree(f.words)
    f.words = NULL


cdef inline bint _filter_may(Filter* f, uint64_t key) noexcept nogil:
    """False: no key ``key`` was noted since ``f`` was sized."""
    cdef uint64_t i = (key * 0x9e3779b97f4a7c15ULL) >> f.shift
    return (f.words[i >> 6] >> (i & 63)) & 1


cdef inline void _filter_note(Filter* f, uint64_t key) noexcept nogil:
    cdef uint64_t i = (key * 0x9e3779b97f4a7c15ULL) >> f.shift
    f.words[i >> 6] |= (<uint64_t>1) << (i & 63)
    f.added += 1


# --- The state digest's element of a key (kvgateway/state/_digest_py.py): FNV-1a over the hash's
# protocol text, the text never built. Compiled into the digest's module (every hash's element, a
# group's first sum) and into the index's pass (the sums kept as blocks enter and leave, from the
# keys the pass reads once).

cdef extern from *:
    """
    /* two decimal digits a step, 00 to 99; the sixteen hex digits */
    static const unsigned char KVG_DIGIT_PAIRS[201] =
        "0001020304050607080910111213141516171819202122232425262728293031323334353637383940414243444546474849"
        "5051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899";
    static const unsigned char KVG_HEX_DIGITS[17] = "0123456789abcdef";
    """
    const unsigned char* KVG_DIGIT_PAIRS
    const unsigned char* KVG_HEX_DIGITS


cdef inline uint64_t _fnv(uint64_t state, const unsigned char* data, Py_ssize_t size) noexcept nogil:
    """FNV-1a's state after ``data`` from ``state`` (64-bit: C's unsigned wrap-around is the
    reference's ``& MASK``)."""
    cdef Py_ssize_t i
    for i in range(size):
        state = (state ^ data[i]) * 0x100000001B3ULL
    return state


cdef inline uint64_t _fnv_pair(uint64_t state, uint32_t pair) noexcept nogil:
    """:func:`_fnv` over the two digits of ``pair`` (0 to 99, a zero in front below 10)."""
    cdef const unsigned char* digits = &KVG_DIGIT_PAIRS[2 * pair]
    state = (state ^ digits[0]) * 0x100000001B3ULL
    return (state ^ digits[1]) * 0x100000001B3ULL


@cython.cdivision(True)
cdef inline uint64_t _fnv_four(uint64_t state, uint32_t value) noexcept nogil:
    """:func:`_fnv` over the four digits of ``value`` (below 10**4, zeros in front)."""
    cdef uint32_t high = value // 100
    return _fnv_pair(_fnv_pair(state, high), value - high * 100)


@cython.cdivision(True)
cdef inline uint64_t _fnv_up_to_four(uint64_t state, uint32_t value) noexcept nogil:
    """:func:`_fnv` over ``str(value)`` for ``value`` below 10**4."""
    if value < 10:
        return (state ^ (48 + value)) * 0x100000001B3ULL  # "0" + value
    if value < 100:
        return _fnv_pair(state, value)
    if value < 1000:
        return _fnv_pair((state ^ (48 + value // 100)) * 0x100000001B3ULL, value % 100)
    return _fnv_four(state, value)


@cython.cdivision(True)
cdef inline uint64_t _fnv_eight(uint64_t state, uint32_t value) noexcept nogil:
    """:func:`_fnv` over the eight digits of ``value`` (below 10**8, zeros in front)."""
    cdef uint32_t high = value // 10000
    return _fnv_four(_fnv_four(state, high), value - high * 10000)


@cython.cdivision(True)
cdef inline uint64_t _fnv_up_to_eight(uint64_t state, uint32_t value) noexcept nogil:
    """:func:`_fnv` over ``str(value)`` for ``value`` below 10**8."""
    cdef uint32_t high
    if value < 10000:
        return _fnv_up_to_four(state, value)
    high = value // 10000
    return _fnv_four(_fnv_up_to_four(state, high), value - high * 10000)


@cython.cdivision(True)
cdef inline uint64_t _fnv_decimal(uint64_t state, uint64_t value) noexcept nogil:
    """:func:`_fnv` over ``str(value)`` (0 to 2**64-1), the text never written: the value in parts
    of eight digits (the leading one without its zeros, at most four above 10**16), each part's
    digits two at a time from a table, hashed as they come (a u64 hash's 19 or 20 digits: two
    divisions of 64 bits, the rest of 32, all multiplications)."""
    cdef uint64_t high, middle
    if value < 100000000ULL:
        return _fnv_up_to_eight(state, <uint32_t>value)
    if value < 10000000000000000ULL:
        high = value // 100000000ULL
        return _fnv_eight(_fnv_up_to_eight(state, <uint32_t>high), <uint32_t>(value - high * 100000000ULL))
    high = value // 10000000000000000ULL  # at most 1844
    value -= high * 10000000000000000ULL
    middle = value // 100000000ULL
    state = _fnv_eight(_fnv_up_to_four(state, <uint32_t>high), <uint32_t>middle)
    return _fnv_eight(state, <uint32_t>(value - middle * 100000000ULL))


cdef inline uint64_t _fnv_hex(uint64_t state, const unsigned char* data, Py_ssize_t size) noexcept nogil:
    """:func:`_fnv` over ``data.hex()``: two lowercase hex digits a byte, high nibble first."""
    cdef Py_ssize_t i
    cdef unsigned char byte
    for i in range(size):
        byte = data[i]
        state = (state ^ KVG_HEX_DIGITS[byte >> 4]) * 0x100000001B3ULL
        state = (state ^ KVG_HEX_DIGITS[byte & 15]) * 0x100000001B3ULL
    return state


cdef inline uint64_t _negative_element(uint64_t prefix, uint64_t magnitude) noexcept nogil:
    """:func:`_fnv` over ``str(-magnitude)``: the minus sign, then the magnitude's digits."""
    return _fnv_decimal((prefix ^ 45) * 0x100000001B3ULL, magnitude)  # 45: "-"


cdef inline uint64_t _key_element(uint64_t prefix, Key* k) noexcept nogil:
    """The digest element of a hash of kind _INT, _NEG or _BYTES from its key (its group's
    ``prefix`` state): the decimal text of the int, the hex of the 32 bytes. A hash of another kind
    is the caller's (the digest module's ``elements_sum``)."""
    if k.kind == _INT:
        return _fnv_decimal(prefix, k.key)
    if k.kind == _NEG:
        return _negative_element(prefix, k.key)
    return _fnv_hex(prefix, k.data, CONTENT)
