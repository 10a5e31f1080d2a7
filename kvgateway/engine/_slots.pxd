# cython: language_level=3
"""For the compiled core only (``cimport``-ed by engine/_tokens_c.pyx, engine/_events_c.pyx, and the
per-batch readers: state/_apply_c.pyx, state/_learner_c.pyx, state/_analytics_c.pyx,
protocol/_render_c.pyx): where a Struct's instances keep a field, and the field read from there.

msgspec keeps each field in a slot at a fixed offset, read by a member descriptor that knows the
offset. ``event.block_hashes`` from Cython is a generic attribute lookup (the type's MRO searched
for the name, the descriptor called); :func:`field` reads the slot itself, where the object is of
the exact type whose offset :func:`field_offset` found, and otherwise asks ``getattr``, so that a
subclass (which may move or shadow the field), another type, or an empty slot reads as the
attribute does (an empty slot raises its AttributeError)."""

from cpython.object cimport Py_TYPE, PyObject, PyTypeObject

cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        Py_ssize_t offset

cdef extern from "Python.h":
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    PyTypeObject PyMemberDescr_Type  # types.MemberDescriptorType


cdef inline Py_ssize_t member_offset(object member):
    """The offset of the slot ``member`` (a member descriptor, which the caller checked) reads."""
    return (<PyMemberDescrObject*><PyObject*>member).d_member.offset


cdef inline object class_attribute(object cls, str name):
    """What attribute lookup finds for ``name`` first along ``cls``'s MRO, in a class's own
    ``__dict__`` (None: nothing)."""
    for klass in cls.__mro__:
        member = klass.__dict__.get(name)
        if member is not None:
            return member
    return None


cdef inline bint is_member(object attribute) noexcept:
    """Whether ``attribute`` is a member descriptor (``types.MemberDescriptorType``): a slot's."""
    return Py_TYPE(attribute) == &PyMemberDescr_Type


cdef inline Py_ssize_t field_offset(object cls, str name) except -2:
    """Where ``cls``'s instances keep the field ``name``: the offset of the member descriptor that
    attribute lookup finds first along the MRO, or that a :class:`kvgateway.engine._tokens_c.Field`
    found there reads; -1 where it finds anything else (a property, nothing) or ``cls`` looks its
    attributes up its own way."""
    if cls.__getattribute__ is not object.__getattribute__:
        return -1
    member = class_attribute(cls, name)
    if member is not None and not is_member(member):
        # the tokens core's Field (``token_ids``, ``block_hashes``): its slot, read as it is (the
        # compiled readers take a Tokens or a Hashes there without the list they read as)
        member = getattr(member, "member", None)
    return member_offset(member) if member is not None and is_member(member) else -1


cdef inline object field(object obj, object cls, Py_ssize_t offset, str name):
    """``getattr(obj, name)``, read from its slot at ``offset`` (``field_offset(cls, name)``) where
    ``obj`` is exactly a ``cls`` and the slot holds a value; otherwise the attribute."""
    cdef PyObject* value
    if offset >= 0 and type(obj) is cls:
        value = (<PyObject**>((<char*><PyObject*>obj) + offset))[0]
        if value is not NULL:
            return <object>value
    return getattr(obj, name)


cdef struct Fields:
    # where a type's instances keep each field the per-batch readers read (-1: read as an attribute):
    # a block event's, and a Batch's (``events``, ``ts``)
    Py_ssize_t block_hashes, parent_block_hash, block_size, lora_id, medium, lora_name, extra, events, ts


cdef inline Fields fields_of(object cls) except *:
    """:func:`field_offset` of ``cls`` for each of :c:type:`Fields`' names."""
    cdef Fields found
    found.block_hashes = field_offset(cls, "block_hashes")
    found.parent_block_hash = field_offset(cls, "parent_block_hash")
    found.block_size = field_offset(cls, "block_size")
    found.lora_id = field_offset(cls, "lora_id")
    found.medium = field_offset(cls, "medium")
    found.lora_name = field_offset(cls, "lora_name")
    found.extra = field_offset(cls, "extra")
    found.events = field_offset(cls, "events")
    found.ts = field_offset(cls, "ts")
    return found
