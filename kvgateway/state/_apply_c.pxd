# cython: language_level=3
"""What the compiled learner reads of the compiled index (``cimport``-ed by
``state/_learner_c.pyx``): the fleet's holders, a :class:`BlockSet` of C tables, asked directly
(:func:`holds`) rather than through ``in`` (the type's ``__contains__`` wrapper), and its table
lines asked for ahead (:func:`holds_ahead`); and a hash the learner keeps as its int64 or u64 value or
its 32 bytes, by its key (:func:`holds_key`, :func:`holds_key_ahead`: no object made to ask)."""

cimport cython

from kvgateway.state._hashtable cimport Key, Table, _key_of, _key_prefetch


@cython.final
cdef class BlockSet:
    """A group's resident hashes (and the fleet's holders) in C tables (see _apply_c.pyx)."""
    cdef Table ints
    cdef Table negs
    cdef Table blobs
    cdef set other
    cdef size_t changes  # every insertion and removal: what an iterator checks

    cdef inline bint has_key(self, Key* k, object h) except -1
    cdef inline bint has(self, object h) except -1
    cdef inline bint add_key(self, Key* k, object h) except -1
    cpdef bint enter(self, object h) except -1
    cdef inline bint discard_key(self, Key* k, object h) except -1
    cpdef bint leave(self, object h) except -1
    cdef inline bint none_of(self, hashes) except -1
    cdef BlockSet copied(self)
    cdef inline Py_ssize_t size(self)


cdef inline bint holds(BlockSet blocks, object h) except -1:
    """``h in blocks``, its answer exactly, without the type's ``__contains__`` wrapper: the key
    read here, the test :meth:`BlockSet.has_key`'s (a C call through the type's method table)."""
    cdef Key k
    _key_of(h, &k)
    return blocks.has_key(&k, h)


cdef inline int holds_ahead(BlockSet blocks, object h) except -1:
    """Ask for the line :func:`holds` will read for ``h`` (a hint: nothing changes)."""
    cdef Key k
    _key_of(h, &k)
    _key_prefetch(&k, &blocks.ints, &blocks.negs, &blocks.blobs, False)
    return 0


cdef inline bint holds_key(BlockSet blocks, Key* k) except -1:
    """:func:`holds` of a hash of kind _INT, _NEG or _BYTES given by its key alone (no hash object:
    the learner keeps such hashes as their value or their 32 bytes)."""
    return blocks.has_key(k, None)  # the hash object is read for a hash of another kind only


cdef inline int holds_key_ahead(BlockSet blocks, Key* k) except -1:
    """:func:`holds_ahead` of such a key."""
    _key_prefetch(k, &blocks.ints, &blocks.negs, &blocks.blobs, False)
    return 0
