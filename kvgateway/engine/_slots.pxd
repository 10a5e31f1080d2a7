# cython: language_level=3
"""For the compiled core only (``cimport``-ed by engine/_tokens_c.pyx and engine/_events_c.pyx):
where a Struct's instances keep a field. msgspec keeps each field in a slot at a fixed offset,
read by a member descriptor that knows the offset."""

from cpython.object cimport PyObject

cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        Py_ssize_t offset

cdef extern from "Python.h":
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member


cdef inline Py_ssize_t member_offset(object member):
    """The offset of the slot ``member`` (a member descriptor, which the caller checked) reads."""
    return (<PyMemberDescrObject*><PyObject*>member).d_member.offset
