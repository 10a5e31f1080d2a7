# cython: language_level=3
"""An insertion-ordered C table of block hashes with a double beside each: what an ``OrderedDict``
of hashes to times does for the cache analytics (``in``, ``pop``, appending at the end, taking the
oldest, ``move_to_end`` as a take and an append, ``clear``), in C arrays the compiled analytics'
thread works on without the interpreter (``cimport``-ed: compiled into its one user; nothing of it
exists at run time).

Entries lie in their order in columns (a word, a kind, a time; 32 bytes for a sha256 hash) between
``head`` and ``tail``; an entry taken out is marked dead where it lies and skipped, and the columns
are compacted (or doubled, when more than half are alive) once the tail reaches their end, so
each operation is O(1) amortised. An index (open addressing, linear probing, at most half full)
maps a key to its entry's position; a taken entry leaves it by backward shifting (no tombstones).
In front of the index, ``_hashtable.pxd``'s negative filter (made without the GIL): most
questions the analytics ask are of hashes absent from the table (a stored hash was seldom evicted
lately; a removed one was seldom sampled), and a clear bit answers them without the index's and
the columns' lines, which for a table of 20,000 entries lie outside the caches. A key taken out
keeps its bit until the filter is made again (from the live keys, once more keys were added than
it allows).

A key is ``_hashtable.pxd``'s :c:type:`Key`: a hash's kind (``_INT``, ``_NEG``, ``_BYTES``, or
``_OTHER`` for a hash the caller has numbered) and its word (the int's value, the negative's
magnitude, the 32-byte hash's fingerprint with its bytes beside, the number): two keys are one hash
exactly where kind, word and bytes are equal, which is where Python's ``==`` says so for the hashes
the kinds hold.

Every function here runs without the GIL: allocation is Python's raw allocator (malloc underneath,
seen by tracemalloc), and a failed allocation returns -1 with the table unchanged.
"""

from libc.stdint cimport int32_t, uint8_t, uint64_t
from libc.string cimport memcmp, memcpy, memset
from cpython.mem cimport PyMem_RawFree, PyMem_RawMalloc

from kvgateway.state._hashtable cimport CONTENT, _BYTES, Filter, Key, _filter_free, _filter_may, _filter_note, _filter_sized, _mix


cdef enum:
    ORDERED_DEAD = 0xFF  # an entry's kind once taken out
    _ORDERED_MIN = 16  # a new table's entries
    _ORDERED_FILTER_LOG2 = 10  # a filter's bits at the least: 1024


cdef struct Ordered:
    uint64_t* words
    uint8_t* kinds
    double* values
    unsigned char* blobs  # CONTENT bytes an entry, made with the first 32-byte hash (NULL before)
    int32_t* slots  # the index: an entry's position, or -1
    size_t head  # the first entry that may be alive
    size_t tail  # the next entry's position
    size_t cap  # entries the columns hold
    size_t n  # entries alive
    size_t smask  # the index's slots - 1
    Filter filter  # no words: none (no memory), every question goes to the index


cdef inline uint64_t _ordered_word(int kind, uint64_t word) noexcept nogil:
    """What a key is placed and filtered by: its word, told apart by its kind."""
    return word ^ (<uint64_t>kind * 0x9E3779B97F4A7C15ULL)


cdef inline size_t _ordered_home(Ordered* o, int kind, uint64_t word) noexcept nogil:
    return _mix(_ordered_word(kind, word)) & o.smask


cdef inline void _ordered_filter(Ordered* o) noexcept nogil:
    """The filter made again for the live keys (none where there is no memory: the index answers)."""
    cdef size_t i
    if _filter_sized(&o.filter, o.n, _ORDERED_FILTER_LOG2) < 0:
        return
    for i in range(o.head, o.tail):
        if o.kinds[i] != ORDERED_DEAD:
            _filter_note(&o.filter, _ordered_word(o.kinds[i], o.words[i]))


cdef inline Py_ssize_t ordered_find(Ordered* o, const Key* k) noexcept nogil:
    """The position of the entry of key ``k``, or -1."""
    cdef size_t i
    cdef int32_t p
    if o.n == 0 or (o.filter.words is not NULL and not _filter_may(&o.filter, _ordered_word(k.kind, k.key))):
        return -1
    i = _ordered_home(o, k.kind, k.key)
    while True:
        p = o.slots[i]
        if p < 0:
            return -1
        if o.words[p] == k.key and o.kinds[p] == k.kind and (
            k.kind != _BYTES or memcmp(o.blobs + p * CONTENT, k.data, CONTENT) == 0
        ):
            return p
        i = (i + 1) & o.smask


cdef inline void ordered_free(Ordered* o) noexcept nogil:
    PyMem_RawFree(o.words)
    PyMem_RawFree(o.kinds)
    PyMem_RawFree(o.values)
    PyMem_RawFree(o.blobs)
    PyMem_RawFree(o.slots)
    _filter_free(&o.filter)
    memset(o, 0, sizeof(Ordered))


cdef inline void _ordered_slot(Ordered* o, size_t pos) noexcept nogil:
    """Entry ``pos`` into the index (it has room: at most half full)."""
    cdef size_t i = _ordered_home(o, o.kinds[pos], o.words[pos])
    while o.slots[i] >= 0:
        i = (i + 1) & o.smask
    o.slots[i] = <int32_t>pos


cdef inline int _ordered_resize(Ordered* o, bint blobs) noexcept nogil:
    """The live entries moved to the front of new columns, in their order: as large where at most
    half are alive (the dead ones' room taken back), else twice as large; the index made again.
    ``blobs``: the new columns keep 32 bytes an entry (already, or from now on). -1: no memory."""
    cdef size_t cap = o.cap if o.n * 2 <= o.cap else o.cap * 2
    cdef size_t slots, i, at = 0
    if cap < _ORDERED_MIN:
        cap = _ORDERED_MIN
    if cap > 0x3FFFFFFF:  # positions are int32s in the index
        return -1
    slots = cap * 2
    cdef uint64_t* words = <uint64_t*>PyMem_RawMalloc(cap * sizeof(uint64_t))
    cdef uint8_t* kinds = <uint8_t*>PyMem_RawMalloc(cap * sizeof(uint8_t))
    cdef double* values = <double*>PyMem_RawMalloc(cap * sizeof(double))
    cdef unsigned char* content = <unsigned char*>PyMem_RawMalloc(cap * CONTENT) if blobs else NULL
    cdef int32_t* index = <int32_t*>PyMem_RawMalloc(slots * sizeof(int32_t))
    if words is NULL or kinds is NULL or values is NULL or index is NULL or (blobs and content is NULL):
        PyMem_RawFree(words)
        PyMem_RawFree(kinds)
        PyMem_RawFree(values)
        PyMem_RawFree(content)
        PyMem_RawFree(index)
        return -1
    for i in range(o.head, o.tail):
        if o.kinds[i] == ORDERED_DEAD:
            continue
        words[at] = o.words[i]
        kinds[at] = o.kinds[i]
        values[at] = o.values[i]
        if o.blobs is not NULL:
            memcpy(content + at * CONTENT, o.blobs + i * CONTENT, CONTENT)
        at += 1
    PyMem_RawFree(o.words)
    PyMem_RawFree(o.kinds)
    PyMem_RawFree(o.values)
    PyMem_RawFree(o.blobs)
    PyMem_RawFree(o.slots)
    o.words, o.kinds, o.values, o.blobs, o.slots = words, kinds, values, content, index
    o.head, o.tail, o.cap, o.smask = 0, at, cap, slots - 1
    memset(index, 0xFF, slots * sizeof(int32_t))  # every slot -1
    for i in range(at):
        _ordered_slot(o, i)
    return 0


cdef inline int ordered_append(Ordered* o, const Key* k, double value) noexcept nogil:
    """A new entry (its key ``k`` not in the table) at the end. -1: no memory (the table unchanged)."""
    cdef size_t pos
    cdef bint blobs = o.blobs is not NULL or k.kind == _BYTES
    if o.tail == o.cap or (blobs and o.blobs is NULL):
        if _ordered_resize(o, blobs) < 0:
            return -1
    pos = o.tail
    o.tail += 1
    o.words[pos] = k.key
    o.kinds[pos] = <uint8_t>k.kind
    o.values[pos] = value
    if k.kind == _BYTES:
        memcpy(o.blobs + pos * CONTENT, k.data, CONTENT)
    _ordered_slot(o, pos)
    o.n += 1
    if o.filter.words is NULL or o.filter.added >= o.filter.limit:
        _ordered_filter(o)  # with this key among the live ones
    else:
        _filter_note(&o.filter, _ordered_word(k.kind, k.key))
    return 0


cdef inline void ordered_take(Ordered* o, size_t pos) noexcept nogil:
    """Entry ``pos`` (alive) out: out of the index by backward shifting, marked dead where it lies."""
    cdef size_t i = _ordered_home(o, o.kinds[pos], o.words[pos])
    cdef size_t j, home
    cdef int32_t p
    while o.slots[i] != <int32_t>pos:
        i = (i + 1) & o.smask
    j = i
    while True:
        j = (j + 1) & o.smask
        p = o.slots[j]
        if p < 0:
            break
        home = _ordered_home(o, o.kinds[p], o.words[p])
        # p stays where its home lies cyclically in (i, j]; else it moves back into the hole
        if (i < j and (home <= i or home > j)) or (j < i and home <= i and home > j):
            o.slots[i] = p
            i = j
    o.slots[i] = -1
    o.kinds[pos] = ORDERED_DEAD
    o.n -= 1
    while o.head < o.tail and o.kinds[o.head] == ORDERED_DEAD:
        o.head += 1
    if o.n == 0:
        o.head = o.tail = 0  # from the front again (the index is empty already)
