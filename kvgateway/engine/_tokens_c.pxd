# cython: language_level=3
"""What the compiled renderer and learner read of a BlockStored's ``token_ids`` without turning
them into a list: the compact array (:class:`Tokens`) and the field's slot (:func:`slot_value`)."""

from cpython.object cimport PyObject
from libc.stdint cimport uint32_t


cdef class Tokens:
    """Token ids that all fit 32 bits, as the wire sent them, in a C array (in the object itself,
    after these fields, for those :func:`tokens_at` makes)."""
    cdef uint32_t* ids
    cdef Py_ssize_t count


cdef object tokens_at(const unsigned char* data, Py_ssize_t size, Py_ssize_t* start)


cdef class Field:
    """A Struct's ``token_ids`` field read as a list of ints whatever its slot holds."""
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
