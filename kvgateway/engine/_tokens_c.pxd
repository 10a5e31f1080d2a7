# cython: language_level=3
"""What the compiled core reads of an event's ``token_ids`` and ``block_hashes`` without turning
them into lists: the compact arrays (:class:`Tokens`, :class:`Hashes`) and the fields' slots
(:func:`slot_value`)."""

from cpython.object cimport PyObject
from libc.stdint cimport uint32_t, uint64_t


cdef class Listed:
    """A compact array, to Python the list it stands for."""


cdef class Tokens(Listed):
    """Token ids that all fit 32 bits, as the wire sent them, in a C array (in the object itself,
    after these fields, for those :func:`tokens_at` makes)."""
    cdef uint32_t* ids
    cdef Py_ssize_t count


cdef object tokens_at(const unsigned char* data, Py_ssize_t size, Py_ssize_t* start)


cdef enum:
    HASHES_U64 = 0  # ints of 0 to 2**64-1 (vLLM's hashes, TensorRT-LLM's)
    HASHES_I64 = 1  # ints of -2**63 to 2**63-1, some negative (SGLang's signed hashes), their bits
    HASHES_BLOB = 2  # bytes of 32 (vLLM's sha256 hashes), one after another
    HASH_BLOB_SIZE = 32


cdef class Hashes(Listed):
    """An event's block hashes, all of one form, as the wire sent them, in a C array (in the object
    itself, after these fields): ``count`` u64s (their bits, for HASHES_I64) or 32-byte strings."""
    cdef const unsigned char* data
    cdef Py_ssize_t count
    cdef int form


cdef object hashes_at(const unsigned char* data, Py_ssize_t size, Py_ssize_t* start)
cdef object hash_item(Hashes hashes, Py_ssize_t i)


cdef inline uint64_t hash_bits(Hashes hashes, Py_ssize_t i) noexcept:
    """Hash ``i`` of a HASHES_U64 or HASHES_I64 array: its 64 bits."""
    return (<const uint64_t*>hashes.data)[i]


cdef class Field:
    """A Struct's ``token_ids`` or ``block_hashes`` field read as a list whatever its slot holds."""
    cdef readonly object owner
    cdef readonly object member
    cdef readonly Py_ssize_t offset
    cdef object read(self, object instance)


cdef inline Py_ssize_t slot_offset(object cls):
    """Where ``cls``'s ``token_ids`` slot is in its instances, or -1 where no :class:`Field` reads it."""
    field = cls.__dict__.get("token_ids")
    return (<Field>field).offset if type(field) is Field else -1


cdef inline object slot_value(object event, Py_ssize_t offset):
    """An event's ``token_ids`` as its slot holds them (a :class:`Tokens` not turned into a list), at
    ``offset`` (:func:`slot_offset` of its exact type); the attribute where that is -1 or the slot
    is empty (which raises as the attribute does)."""
    cdef PyObject* value
    if offset >= 0:
        value = (<PyObject**>((<char*><PyObject*>event) + offset))[0]
        if value != NULL:
            return <object>value
    return event.token_ids
