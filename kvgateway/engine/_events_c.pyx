# cython: language_level=3, boundscheck=False, wraparound=False
"""A fast-decoded batch's events made the public ones, in C: the compiled twin of
:mod:`kvgateway.engine._events_py` (the reference, whose API it has).

The fast decoders give each event as a private Struct (every key the engine may send a field of
its own, ``UNSET`` where it sent none), and each becomes the public ``BlockStored``,
``BlockRemoved`` or ``AllBlocksCleared``: the fields the public event has, ``extra`` for the
others that were sent, in the same order, and the medium of a block held by a remote pool
renamed. The reference does it with a Python frame per event and a dozen attribute reads, about
0.75 us an event: 4 of a batch's 8.5 us of decoding. Here each field is read from its slot
(msgspec keeps a Struct's fields in slots at fixed offsets, found once per type by
:func:`install`) and the public event is made by one call of its class. A slot that holds nothing
(which msgspec's decode never leaves) sends the event to the reference.

wire defines the types and hands them over once (:func:`install`), as to the reference.
tests/unit/engine/test_events_differential.py holds the two to each other over every layout and
field.
"""

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from kvgateway.engine._slots cimport class_attribute, is_member, member_offset  # where a Struct keeps a field

from msgspec import UNSET

from kvgateway.engine._events_py import events_of as _reference
from kvgateway.engine._events_py import from_array, located, present  # the reference's, as they are

cdef object _located = located

__all__ = ["events_of", "from_array", "install", "located", "present"]

cdef enum:
    _MAX_EXTRA = 8  # the further fields a plan reads (4 for BlockStored, 1 for BlockRemoved)


cdef struct _Plan:
    # where a private event type keeps each field, -1 for one it does not have
    Py_ssize_t hashes, parent, tokens, size, lora_id, medium, lora_name, locality
    Py_ssize_t extra[_MAX_EXTRA]  # the further fields, in the order ``extra`` takes them
    int extras
    bint convert_tokens  # token_ids as the wire sent them: the tokens core makes the field's value


cdef _Plan _map_stored, _map_removed, _array_stored, _general_stored, _array_removed
cdef tuple _stored_names = (), _removed_names = ()  # the further fields' names, in their order
cdef object _MapStored = None, _MapRemoved = None, _ArrayStored = None, _GeneralStored = None, _ArrayRemoved = None
cdef object _BlockStored = None, _BlockRemoved = None, _AllBlocksCleared = None
cdef object _UNSET = UNSET
cdef object _token_ids = None


cdef Py_ssize_t _offset(object cls, str name) except -2:
    """Where ``cls``'s instances keep the field ``name`` (-1: no such field)."""
    member = class_attribute(cls, name)
    if member is None:
        return -1
    if not is_member(member):
        raise TypeError(f"{cls.__name__}.{name} is not a slot of its instances")
    return member_offset(member)


cdef int _plan(_Plan* plan, object cls, tuple further, bint convert_tokens) except -1:
    plan.hashes = _offset(cls, "block_hashes")
    plan.parent = _offset(cls, "parent_block_hash")
    plan.tokens = _offset(cls, "token_ids")
    plan.size = _offset(cls, "block_size")
    plan.lora_id = _offset(cls, "lora_id")
    plan.medium = _offset(cls, "medium")
    plan.lora_name = _offset(cls, "lora_name")
    plan.locality = _offset(cls, "locality")
    if len(further) > _MAX_EXTRA:
        raise ValueError(f"{cls.__name__}: more further fields than {_MAX_EXTRA}")
    plan.extras = len(further)
    for n, name in enumerate(further):
        plan.extra[n] = _offset(cls, name)
        if plan.extra[n] < 0:
            raise TypeError(f"{cls.__name__} has no field {name}")
    plan.convert_tokens = convert_tokens
    return 0


def install(*, stored, removed, cleared, map_stored, map_removed, array_stored, general_stored, array_removed,
            fast_array_batch, stored_further, removed_further, token_ids, kept):
    """wire's types, once (see the reference's ``install``; ``fast_array_batch`` is not needed here:
    each event's own type says how to read it)."""
    global _MapStored, _MapRemoved, _ArrayStored, _GeneralStored, _ArrayRemoved
    global _BlockStored, _BlockRemoved, _AllBlocksCleared, _token_ids, _stored_names, _removed_names
    _stored_names, _removed_names = tuple(stored_further), tuple(removed_further)
    _plan(&_map_stored, map_stored, _stored_names, kept)
    _plan(&_map_removed, map_removed, _removed_names, False)
    _plan(&_array_stored, array_stored, _stored_names, kept)
    _plan(&_general_stored, general_stored, _stored_names, False)
    _plan(&_array_removed, array_removed, _removed_names, False)
    _MapStored, _MapRemoved, _ArrayRemoved = map_stored, map_removed, array_removed
    _ArrayStored, _GeneralStored = array_stored, general_stored
    _BlockStored, _BlockRemoved, _AllBlocksCleared = stored, removed, cleared
    _token_ids = token_ids


cdef inline PyObject* _slot(object event, Py_ssize_t offset) noexcept:
    return (<PyObject**>((<char*><PyObject*>event) + offset))[0]


cdef inline object _field(object event, Py_ssize_t offset):
    """The field at ``offset`` (None for a field the type does not have, or one sent as UNSET)."""
    cdef PyObject* value
    if offset < 0:
        return None
    value = _slot(event, offset)
    if value == NULL or <object>value is _UNSET:
        return None
    return <object>value


cdef bint _complete(object event, _Plan* plan, bint stored) noexcept:
    """Every slot the plan reads holds a value (msgspec's decode leaves none empty)."""
    cdef Py_ssize_t n
    cdef Py_ssize_t[8] core
    core[0] = plan.hashes
    core[1] = plan.medium
    core[2] = plan.locality
    core[3] = plan.parent if stored else -1
    core[4] = plan.tokens if stored else -1
    core[5] = plan.size if stored else -1
    core[6] = plan.lora_id if stored else -1
    core[7] = plan.lora_name if stored else -1
    for n in range(8):
        if core[n] >= 0 and _slot(event, core[n]) == NULL:
            return False
    for n in range(plan.extras):
        if _slot(event, plan.extra[n]) == NULL:
            return False
    return True


cdef dict _extra(object event, _Plan* plan, tuple names):
    """The further fields that were sent, in their order, then the locality where sent."""
    cdef dict extra = {}
    cdef Py_ssize_t n
    cdef PyObject* value
    for n in range(plan.extras):
        value = _slot(event, plan.extra[n])
        if <object>value is not _UNSET:
            extra[names[n]] = <object>value
    return extra


cdef object _medium(object event, _Plan* plan, dict extra):
    """The block's medium, renamed for a block a remote pool holds (``locality`` sent)."""
    medium = _field(event, plan.medium)
    cdef PyObject* locality
    if plan.locality >= 0:
        locality = _slot(event, plan.locality)
        if <object>locality is not _UNSET:
            extra["locality"] = <object>locality
            return _located(medium, extra)
    return medium


cdef object _stored(object event, _Plan* plan):
    extra = _extra(event, plan, _stored_names)
    medium = _medium(event, plan, extra)
    tokens = <object>_slot(event, plan.tokens)
    if plan.convert_tokens:
        tokens = _token_ids(tokens)
    return _BlockStored(
        <object>_slot(event, plan.hashes),
        <object>_slot(event, plan.parent),
        tokens,
        <object>_slot(event, plan.size),
        <object>_slot(event, plan.lora_id),
        medium,
        _field(event, plan.lora_name),
        extra,
    )


cdef object _removed(object event, _Plan* plan):
    extra = _extra(event, plan, _removed_names)
    medium = _medium(event, plan, extra)
    return _BlockRemoved(<object>_slot(event, plan.hashes), medium, extra)


cdef object _public(object event):
    """One private event's public one; None where the reference must make it."""
    kind = type(event)
    cdef _Plan* plan
    cdef bint stored = True
    if kind is _MapStored:
        plan = &_map_stored
    elif kind is _ArrayStored:
        plan = &_array_stored
    elif kind is _GeneralStored:
        plan = &_general_stored
    elif kind is _MapRemoved:
        plan, stored = &_map_removed, False
    elif kind is _ArrayRemoved:
        plan, stored = &_array_removed, False
    else:
        return _AllBlocksCleared()
    if not _complete(event, plan, stored):
        return None
    return _stored(event, plan) if stored else _removed(event, plan)


def events_of(fast):
    """A fast-decoded batch's events as the public ones (see the reference)."""
    cdef list events = fast.events
    cdef Py_ssize_t n, count = PyList_GET_SIZE(events)
    cdef list out = PyList_New(count)
    for n in range(count):
        public = _public(<object>PyList_GET_ITEM(events, n))
        if public is None:
            return _reference(fast)
        Py_INCREF(public)
        PyList_SET_ITEM(out, n, public)
    return out
