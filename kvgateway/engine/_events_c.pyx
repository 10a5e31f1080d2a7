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

:func:`parse_batch` goes further for what engines send nearly always (an array envelope of map
events, or of positional ones): it reads the payload itself, once, and makes the public events
without a private Struct in between (see its section below).

wire defines the types and hands them over once (:func:`install`), as to the reference.
tests/unit/engine/test_events_differential.py holds the two to each other over every layout and
field.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromLongLong, PyLong_FromUnsignedLongLong
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy
from kvgateway.engine._slots cimport member_offset  # where a Struct keeps a field

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object)
from kvgateway.engine._tokens_c cimport tokens_at  # a batch's token ids read where they lie

import types

from msgspec import UNSET

from kvgateway.engine._events_py import events_of as _reference
from kvgateway.engine._events_py import parse_batch as _parse_reference
from kvgateway.engine._events_py import from_array, located, present  # the reference's, as they are

cdef object _located = located

__all__ = ["events_of", "from_array", "install", "located", "parse_batch", "present"]

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
cdef object _Batch = None


cdef Py_ssize_t _offset(object cls, str name) except -2:
    """Where ``cls``'s instances keep the field ``name`` (-1: no such field)."""
    for klass in cls.__mro__:
        member = klass.__dict__.get(name)
        if member is not None:
            if type(member) is not types.MemberDescriptorType:
                raise TypeError(f"{cls.__name__}.{name} is not a slot of its instances")
            return member_offset(member)
    return -1


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
            fast_array_batch, stored_further, removed_further, token_ids, kept, batch, fast_decoders, refused):
    """wire's types, once (see the reference's ``install``; ``fast_array_batch``, the fast decoders
    and their errors are not needed here: each event's own type says how to read it, and a payload
    the parser declines goes to the reference)."""
    global _MapStored, _MapRemoved, _ArrayStored, _GeneralStored, _ArrayRemoved, _Batch
    global _BlockStored, _BlockRemoved, _AllBlocksCleared, _token_ids, _stored_names, _removed_names
    _Batch = batch
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


# --- an array envelope of map or positional events, parsed where it lies ----------------------
#
# The fast decoders make a private Struct of each event, skip its token ids as a Raw (a walk of
# them) for the tokens core to walk again, and the events are then made public and the private ones
# freed: some 40% of a batch's decoding. parse_batch reads the payload once and makes the public
# events straight away, for exactly what engines send: an array envelope of map events (vLLM >=
# 0.24) whose keys are the fast decoder's (each once, "type" first), or of positional events
# (SGLang, older vLLM) of the field counts the positional decoder takes, their values of the types
# the decoders take. Anything else (a map envelope, both layouts in one batch, a value of another
# type, a duplicate or unknown key, a locality, extra_keys with values, token ids that are no
# non-empty array of 32-bit ids, bytes after the batch) it declines, and the reference (msgspec's
# fast decoders) decides: what it parses, the reference parses to the same batch
# (tests/unit/engine/test_events_differential.py). The lists of hashes and the events' list it
# makes are not tracked by the garbage collector (ints, bytes and gc=False Structs: no cycle can
# pass through them), so a full collection does not visit the log's batches one list at a time.

cdef object _NO = object()  # a value the parser declines
cdef object _ABSENT = object()  # a key the event did not send

cdef struct _Cursor:
    const unsigned char* data
    Py_ssize_t size
    Py_ssize_t at

# a map event's keys, by their place here (each bit of a seen-mask)
cdef tuple _KEYS = (
    b"block_hashes", b"parent_block_hash", b"token_ids", b"block_size", b"lora_id", b"medium",
    b"lora_name", b"extra_keys", b"group_idx", b"kv_cache_spec_kind", b"kv_cache_spec_sliding_window",
)
cdef enum:
    _HASHES, _PARENT, _TOKENS, _SIZE, _LORA_ID, _MEDIUM, _LORA_NAME, _EXTRA_KEYS, _GROUP, _KIND, _WINDOW
    _REMOVED_KEYS = (1 << _HASHES) | (1 << _MEDIUM) | (1 << _GROUP)


cdef inline uint64_t _big_endian(const unsigned char* p, int width) noexcept:
    cdef uint64_t value = 0
    cdef int i
    for i in range(width):
        value = (value << 8) | p[i]
    return value


cdef Py_ssize_t _count(_Cursor* c, bint is_map) noexcept:
    """The element (pair) count of the array (map) at the cursor, moved past its header; -1 for
    anything else, or a count the rest of the payload cannot hold."""
    cdef Py_ssize_t at = c.at, count
    cdef unsigned char first, fix = 0x80 if is_map else 0x90
    cdef int width
    if at >= c.size:
        return -1
    first = c.data[at]
    if fix <= first <= fix + 0x0F:
        count, width = first & 0x0F, 0
    elif first == (0xDE if is_map else 0xDC):
        width = 2
    elif first == (0xDF if is_map else 0xDD):
        width = 4
    else:
        return -1
    if width:
        if at + 1 + width > c.size:
            return -1
        count = <Py_ssize_t>_big_endian(c.data + at + 1, width)
    c.at = at + 1 + width
    if count > c.size - c.at:  # every element takes a byte at least
        return -1
    return count


cdef object _int(_Cursor* c):
    """The msgpack int at the cursor, in any of its formats (what msgspec makes an ``int`` of)."""
    cdef Py_ssize_t at = c.at
    cdef unsigned char first
    cdef int width, bits
    cdef uint64_t value
    if at >= c.size:
        return _NO
    first = c.data[at]
    if first <= 0x7F:
        c.at = at + 1
        return <long>first
    if first >= 0xE0:  # negative fixint
        c.at = at + 1
        return <long>first - 256
    if 0xCC <= first <= 0xD3:
        width = 1 << ((first - 0xCC) & 3)
    else:
        return _NO
    if at + 1 + width > c.size:
        return _NO
    value = _big_endian(c.data + at + 1, width)
    c.at = at + 1 + width
    if first <= 0xCF:
        return PyLong_FromUnsignedLongLong(value)
    bits = 8 * width
    if bits < 64 and value >> (bits - 1):  # a negative value of a narrower signed format
        return PyLong_FromLongLong(<int64_t>value - (<int64_t>1 << bits))
    return PyLong_FromLongLong(<int64_t>value)


cdef Py_ssize_t _length(_Cursor* c, unsigned char fix_low, unsigned char fix_high, unsigned char one) noexcept:
    """The length of the str (``fix_low``..``fix_high``, then ``one`` the 8-bit-length format) or bin
    (no fix range) at the cursor, moved past its header; -1 for anything else or too short."""
    cdef Py_ssize_t at = c.at, n
    cdef unsigned char first
    cdef int width
    if at >= c.size:
        return -1
    first = c.data[at]
    if fix_low <= first <= fix_high:
        n, width = first & 0x1F, 0
    elif one <= first <= one + 2:
        width = 1 << (first - one)
        if at + 1 + width > c.size:
            return -1
        n = <Py_ssize_t>_big_endian(c.data + at + 1, width)
    else:
        return -1
    if n > c.size - at - 1 - width:
        return -1
    c.at = at + 1 + width
    return n


cdef inline Py_ssize_t _str_length(_Cursor* c) noexcept:
    return _length(c, 0xA0, 0xBF, 0xD9)


cdef object _hash(_Cursor* c):
    """A block hash: an int, or bytes (bin)."""
    cdef Py_ssize_t n
    if c.at < c.size and 0xC4 <= c.data[c.at] <= 0xC6:
        n = _length(c, 1, 0, 0xC4)
        if n < 0:
            return _NO
        c.at += n
        return PyBytes_FromStringAndSize(<const char*>c.data + c.at - n, n)
    return _int(c)


cdef inline bint _nil(_Cursor* c) noexcept:
    """Whether the value at the cursor is nil (then passed)."""
    if c.at < c.size and c.data[c.at] == 0xC0:
        c.at += 1
        return True
    return False


cdef list _last_text = [None] * len(_KEYS)  # by key: the last str made, for the next event's same bytes


cdef object _text(_Cursor* c, int key):
    """nil or a str. The last one made for ``key`` is made again from the same bytes: an engine
    sends the same few media and kinds in every event."""
    cdef Py_ssize_t n
    if _nil(c):
        return None
    n = _str_length(c)
    if n < 0:
        return _NO
    c.at += n
    last = _last_text[key]
    if last is not None and PyBytes_GET_SIZE((<tuple>last)[0]) == n and memcmp(
        PyBytes_AS_STRING((<tuple>last)[0]), c.data + c.at - n, n
    ) == 0:
        return (<tuple>last)[1]
    try:
        text = PyUnicode_DecodeUTF8(<const char*>c.data + c.at - n, n, NULL)
    except UnicodeDecodeError:
        return _NO
    if n <= 64:
        _last_text[key] = (PyBytes_FromStringAndSize(<const char*>c.data + c.at - n, n), text)
    return text


cdef list _hashes(_Cursor* c):
    """An array of block hashes; None for anything else."""
    cdef Py_ssize_t n = _count(c, False), i
    if n < 0:
        return None
    cdef list out = PyList_New(n)  # a slot left empty is freed as such
    for i in range(n):
        value = _hash(c)
        if value is _NO:
            return None
        Py_INCREF(value)
        PyList_SET_ITEM(out, i, value)
    PyObject_GC_UnTrack(out)  # ints and bytes: no cycle through it, nothing for the collector to visit
    return out


cdef object _nils(_Cursor* c):
    """nil, or an array of nils (vLLM's extra_keys of blocks without any); _NO for anything else."""
    cdef Py_ssize_t n, i
    if _nil(c):
        return None
    n = _count(c, False)
    if n < 0:
        return _NO
    cdef list out = PyList_New(n)
    for i in range(n):
        if not _nil(c):
            return _NO
        Py_INCREF(None)
        PyList_SET_ITEM(out, i, None)
    PyObject_GC_UnTrack(out)
    return out


cdef int _key(_Cursor* c) noexcept:
    """The place in _KEYS of the map key at the cursor (moved past it); -1 for any other key."""
    cdef Py_ssize_t n = _str_length(c), k
    cdef bytes name
    if n < 0:
        return -1
    for k in range(len(_KEYS)):
        name = <bytes>_KEYS[k]
        if PyBytes_GET_SIZE(name) == n and memcmp(PyBytes_AS_STRING(name), c.data + c.at, n) == 0:
            c.at += n
            return <int>k
    return -1


cdef bint _type_key(_Cursor* c) noexcept:
    """Whether the map key at the cursor is ``type`` (then passed)."""
    cdef Py_ssize_t at = c.at, n = _str_length(c)
    if n == 4 and memcmp(c.data + c.at, b"type", 4) == 0:
        c.at += 4
        return True
    c.at = at
    return False


cdef int _tag(_Cursor* c) noexcept:
    """An event's tag: 0 BlockStored, 1 BlockRemoved, 2 AllBlocksCleared; -1 for anything else."""
    cdef Py_ssize_t n = _str_length(c)
    if n < 0:
        return -1
    c.at += n
    if n == 11 and memcmp(c.data + c.at - n, b"BlockStored", 11) == 0:
        return 0
    if n == 12 and memcmp(c.data + c.at - n, b"BlockRemoved", 12) == 0:
        return 1
    if n == 16 and memcmp(c.data + c.at - n, b"AllBlocksCleared", 16) == 0:
        return 2
    return -1


cdef object _value(_Cursor* c, int key):
    """The value of the map key ``key`` (its place in _KEYS)."""
    if key == _HASHES:
        hashes = _hashes(c)
        return _NO if hashes is None else hashes
    if key == _PARENT:
        return None if _nil(c) else _hash(c)
    if key == _TOKENS:
        tokens = tokens_at(c.data, c.size, &c.at)
        return _NO if tokens is None else tokens
    if key == _SIZE:
        return _int(c)
    if key == _LORA_ID or key == _GROUP or key == _WINDOW:
        return None if _nil(c) else _int(c)
    if key == _EXTRA_KEYS:
        return _nils(c)
    return _text(c, key)  # medium, lora_name, kv_cache_spec_kind


cdef int _fields(_Cursor* c, int* layout) except -2:
    """The header of an event (a map or an array: the batch's first event sets the layout, a later
    one of the other is declined, as the fast decoders take only one) and its tag; the count of its
    fields after the tag is left in ``layout[1]``. -1 where declined."""
    cdef bint is_map
    cdef Py_ssize_t count
    cdef int tag
    if c.at >= c.size:
        return -1
    is_map = 0x80 <= c.data[c.at] <= 0x8F or c.data[c.at] == 0xDE or c.data[c.at] == 0xDF
    if layout[0] < 0:
        layout[0] = is_map
    elif layout[0] != is_map:
        return -1
    count = _count(c, is_map)
    if count < 1 or count > 32 or (is_map and not _type_key(c)):
        return -1
    tag = _tag(c)
    layout[1] = <int>count - 1
    if tag == 2:
        return tag if count == 1 else -1
    if not is_map and (count < 6 or count > 12 if tag == 0 else count < 2 or count > 4):
        return -1  # a positional event's field count (5 to 11 of a BlockStored's, 1 to 3 of a removal's)
    return tag


cdef object _event(_Cursor* c, int* layout):
    """One event, a map or a positional one, as the public one, as the reference makes it
    (``_from_map``, ``from_array``)."""
    cdef int tag = _fields(c, layout), key, last = 0, n
    cdef unsigned int seen = 0
    cdef bint unordered = False, is_map = layout[0]
    if tag < 0:
        return _NO
    if tag == 2:
        return _AllBlocksCleared()
    hashes = tokens = None
    parent = lora_id = medium = lora_name = None  # the defaults of the keys left out
    size = 0
    extra = {}
    for n in range(layout[1]):
        if is_map:
            key = _key(c)
            if key < 0 or seen & (1u << key) or (tag == 1 and not (_REMOVED_KEYS >> key) & 1):
                return _NO
        else:  # by place: a BlockStored's fields in _KEYS' order, a removal's hashes, medium, group
            key = n if tag == 0 else (_HASHES, _MEDIUM, _GROUP)[n]
        seen |= 1u << key
        value = _value(c, key)
        if value is _NO:
            return _NO
        if key >= _EXTRA_KEYS:
            extra[_KEY_NAMES[key]] = value
            if key < last:
                unordered = True  # put in the reference's order below
            last = key
        elif key == _HASHES:
            hashes = value
        elif key == _PARENT:
            parent = value
        elif key == _TOKENS:
            tokens = value
        elif key == _SIZE:
            size = value
        elif key == _LORA_ID:
            lora_id = value
        elif key == _MEDIUM:
            medium = value
        else:
            lora_name = value
    if hashes is None or (tag == 0 and tokens is None):
        return _NO
    if unordered:
        extra = {_KEY_NAMES[key]: extra[_KEY_NAMES[key]] for key in range(_EXTRA_KEYS, _WINDOW + 1) if seen & (1u << key)}
    if tag == 1:
        return _BlockRemoved(hashes, medium, extra)
    return _BlockStored(hashes, parent, tokens, size, lora_id, medium, lora_name, extra)


cdef tuple _KEY_NAMES = tuple(name.decode() for name in _KEYS)


cdef object _ts(_Cursor* c):
    """A float (msgpack's float 64 or float 32)."""
    cdef Py_ssize_t at = c.at
    cdef uint64_t bits
    cdef uint32_t narrow
    cdef double wide
    cdef float single
    if at + 9 <= c.size and c.data[at] == 0xCB:
        bits = _big_endian(c.data + at + 1, 8)
        memcpy(&wide, &bits, 8)
        c.at = at + 9
        return wide
    if at + 5 <= c.size and c.data[at] == 0xCA:
        narrow = <uint32_t>_big_endian(c.data + at + 1, 4)
        memcpy(&single, &narrow, 4)
        c.at = at + 5
        return <double>single
    return _NO


cdef object _batch(_Cursor* c):
    cdef Py_ssize_t fields = _count(c, False), n, count
    cdef int[2] layout  # the events' layout (-1 not yet known, 0 positional, 1 map); a field count
    layout[0] = -1
    if fields != 2 and fields != 3:
        return _NO
    ts = _ts(c)
    if ts is _NO:
        return _NO
    count = _count(c, False)
    if count < 0:
        return _NO
    cdef list events = PyList_New(count)
    for n in range(count):
        event = _event(c, layout)
        if event is _NO:
            return _NO
        Py_INCREF(event)
        PyList_SET_ITEM(events, n, event)
    rank = None
    if fields == 3 and not _nil(c):
        rank = _int(c)
        if rank is _NO:
            return _NO
    if c.at != c.size:
        return _NO
    PyObject_GC_UnTrack(events)  # its events hold no reference cycle (gc=False Structs)
    return _Batch(ts, events, rank)


def parse_batch(payload):
    """An array envelope of map events as the public ``Batch`` (see the reference), read where it
    lies; what the parser declines, the reference decides."""
    cdef Py_buffer view
    cdef _Cursor c
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        c.data, c.size, c.at = <const unsigned char*>view.buf, view.len, 0
        batch = _batch(&c)
    finally:
        PyBuffer_Release(&view)
    return _parse_reference(payload) if batch is _NO else batch
