# cython: language_level=3, boundscheck=False, wraparound=False
"""An array envelope of map or positional events parsed where it lies, in C: the compiled twin of
:mod:`kvgateway.engine._batch_py` (the reference, whose API it has: ``install``, ``parse_batch``).

The fast decoders make a private Struct of each event, skip its token ids as a Raw (a walk of
them) for the tokens core to walk again, and the events are then made public and the private ones
freed: some 40% of a batch's decoding. parse_batch reads the payload once and makes the public
events straight away, for exactly what engines send: an array envelope of map events (vLLM >=
0.24) whose keys are the fast decoder's (each once, "type" first), or of positional events
(SGLang, older vLLM) of the field counts the positional decoder takes, their values of the types
the decoders take. Anything else (a map envelope, both layouts in one batch, a value of another
type, a duplicate or unknown key, a locality, extra_keys with values, token ids that are no
non-empty array of 32-bit ids, bytes after the batch) it declines, and the reference (msgspec's
fast decoders) decides: what it parses, the reference parses to the same batch
(tests/unit/engine/test_batch_differential.py). The lists of hashes and the events' list it
makes are not tracked by the garbage collector (ints, bytes and gc=False Structs: no cycle can
pass through them), so a full collection does not visit the log's batches one list at a time.

The events and the Batch are made as msgspec's constructor makes them, without calling it (a
Python-level call that matches its arguments to the fields): allocated by the type's own
``tp_alloc`` (zeroed, the type's reference taken, not tracked), each slot set at its member's
offset, the ``type`` field given its default (engine/_direct.pxd, shared with the renderer). Only
where a class's constructor does no more than that (``plain_struct``: no ``__post_init__``, not
tracked, no cached hash, the fields in the parser's order, every other default a plain value) and
one instance made each way at install is the same; otherwise the class is called, as before
(``DIRECT`` says which). An event's ``extra`` is a copy
of the first one the parser made of the same keys, each value that is not the same object set again
(``_extra``): the same items in the same order, a dict of its own.

wire defines the types and hands them over once (:func:`install`), as to the reference.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Copy
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromLongLong
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy
from kvgateway._pylong cimport kv_be16, kv_be32, kv_be64, u64_long  # big-endian loads; a hash's int made
from kvgateway.engine._direct cimport Maker, make, maker_init  # a Struct made without its constructor
from kvgateway.engine._slots cimport class_attribute, is_member, member_offset  # where a Struct keeps a field
from kvgateway.engine._tokens_c cimport Field, hashes_at, tokens_at  # token ids and hashes read where they lie

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object)

cdef extern from *:
    """
    /* Whether the n bytes at a and b are the same (n >= 4: every key and tag the parser compares),
       compared in overlapping words of 8 (or 4) bytes: no call, and no loop for 16 bytes or fewer. */
    static inline int kv_same(const unsigned char *a, const unsigned char *b, Py_ssize_t n) {
        uint64_t x, y;
        uint32_t u, v;
        Py_ssize_t i;
        if (n >= 8) {
            for (i = 0; i + 8 < n; i += 8) {
                memcpy(&x, a + i, 8); memcpy(&y, b + i, 8);
                if (x != y) return 0;
            }
            memcpy(&x, a + n - 8, 8); memcpy(&y, b + n - 8, 8);
            return x == y;
        }
        memcpy(&u, a, 4); memcpy(&v, b, 4);
        if (u != v) return 0;
        memcpy(&u, a + n - 4, 4); memcpy(&v, b + n - 4, 4);
        return u == v;
    }
    """
    bint kv_same(const unsigned char* a, const unsigned char* b, Py_ssize_t n) noexcept

import msgspec

from kvgateway.engine._batch_py import parse_batch as _parse_reference

__all__ = ["DIRECT", "install", "parse_batch"]

cdef Maker _stored_maker, _removed_maker, _cleared_maker, _batch_maker
cdef list _held = []  # the classes and defaults the makers point at
# the fields each Struct is given, in this order (the first of its fields)
cdef tuple _STORED_GIVEN = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra"
)
cdef tuple _REMOVED_GIVEN = ("block_hashes", "medium", "extra")
cdef tuple _CLEARED_GIVEN = ("extra",)
cdef tuple _BATCH_GIVEN = ("ts", "events", "dp_rank")

DIRECT = {}
"""By class name: whether its instances are made here without its constructor (see :func:`_maker`)."""


def install(*, stored, removed, cleared, batch, fast_decoders, refused, events_of):
    """wire's types, once (see the reference's ``install``; the fast decoders, their errors and
    ``events_of`` are the reference's, which a payload the parser declines goes to)."""
    DIRECT.clear()
    _maker(&_stored_maker, stored, _STORED_GIVEN)
    _maker(&_removed_maker, removed, _REMOVED_GIVEN)
    _maker(&_cleared_maker, cleared, _CLEARED_GIVEN)
    _maker(&_batch_maker, batch, _BATCH_GIVEN)


cdef Py_ssize_t _slot_offset(object cls, str name) except -2:
    """Where ``cls``'s instances keep the field ``name``: its slot's member descriptor's offset, or
    the tokens core's :class:`Field`'s (BlockStored's token_ids); -1 for anything else."""
    member = class_attribute(cls, name)
    if member is None:
        return -1
    if type(member) is Field:
        return (<Field>member).offset
    return member_offset(member) if is_member(member) else -1


cdef int _maker(Maker* maker, object cls, tuple given) except -1:
    """How ``cls`` is made (engine/_direct.pxd), its slots found by :func:`_slot_offset`; noted in
    :data:`DIRECT`."""
    maker_init(maker, cls, given, _held, type(msgspec.Struct), _slot_offset)
    DIRECT[cls.__name__] = maker.direct
    return 0


cdef object _NO = object()  # a value the parser declines

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
    _HASHES, _PARENT, _TOKENS, _SIZE, _LORA_ID, _MEDIUM, _LORA_NAME, _EXTRA_KEYS, _GROUP, _KIND, _WINDOW, _KEY_COUNT
    _REMOVED_KEYS = (1 << _HASHES) | (1 << _MEDIUM) | (1 << _GROUP)


cdef inline uint64_t _big_endian(const unsigned char* p, int width) noexcept:
    """The unsigned int of ``width`` (1, 2, 4 or 8) big-endian bytes at ``p``."""
    if width == 8:
        return kv_be64(p)
    if width == 4:
        return kv_be32(p)
    if width == 2:
        return kv_be16(p)
    return p[0]


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
        return u64_long(value)
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
    cdef Py_ssize_t at = c.at, n
    if at < c.size and 0xA0 <= c.data[at] <= 0xBF:  # a fixstr (every key, medium and kind sent)
        n = c.data[at] & 0x1F
        if n > c.size - at - 1:
            return -1
        c.at = at + 1
        return n
    return _length(c, 0xA0, 0xBF, 0xD9)


cdef inline object _hash(_Cursor* c):
    """A block hash: an int, or bytes (bin). A uint 64 (the engines' u64 hashes, nearly all of them
    2**32 or more) is read here, its int made with its digits; an int 64 (a signed hash's negative
    half, SGLang's) and a bin 8 (vLLM's raw sha256 hashes) here too; any other int by
    :func:`_int`, any other bin after :func:`_length`."""
    cdef Py_ssize_t n, at = c.at
    cdef unsigned char first
    if at + 9 <= c.size:
        first = c.data[at]
        if first == 0xCF:
            c.at = at + 9
            return u64_long(kv_be64(c.data + at + 1))
        if first == 0xD3:
            c.at = at + 9
            return PyLong_FromLongLong(<int64_t>kv_be64(c.data + at + 1))
    if at + 2 <= c.size and c.data[at] == 0xC4:
        n = c.data[at + 1]
        if n > c.size - at - 2:
            return _NO
        c.at = at + 2 + n
        return PyBytes_FromStringAndSize(<const char*>c.data + at + 2, n)
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


cdef const char* _KEY_TEXT[_KEY_COUNT]  # _KEYS' bytes (the tuple keeps them)


cdef int _key_texts() except -1:
    cdef Py_ssize_t k
    if len(_KEYS) != _KEY_COUNT:
        raise ImportError("_KEYS and their places disagree")
    for k in range(_KEY_COUNT):
        _KEY_TEXT[k] = <bytes>_KEYS[k]
    return 0


_key_texts()


cdef int _key(_Cursor* c) noexcept:
    """The place in _KEYS of the map key at the cursor (moved past it); -1 for any other key. The
    one key a name of that length and first letter can be, compared once."""
    cdef Py_ssize_t n = _str_length(c)
    cdef const unsigned char* name = c.data + c.at
    cdef int k
    if n == 12:
        k = _HASHES
    elif n == 9:  # token_ids, lora_name, group_idx
        k = _TOKENS if name[0] == 116 else (_LORA_NAME if name[0] == 108 else _GROUP)
    elif n == 10:  # block_size, extra_keys
        k = _SIZE if name[0] == 98 else _EXTRA_KEYS
    elif n == 6:
        k = _MEDIUM
    elif n == 17:
        k = _PARENT
    elif n == 7:
        k = _LORA_ID
    elif n == 18:
        k = _KIND
    elif n == 28:
        k = _WINDOW
    else:
        return -1  # and n < 0: no str
    if not kv_same(<const unsigned char*>_KEY_TEXT[k], name, n):  # every key 6 bytes or more
        return -1
    c.at += n
    return k


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
    if n == 11 and kv_same(c.data + c.at - n, <const unsigned char*>b"BlockStored", 11):
        return 0
    if n == 12 and kv_same(c.data + c.at - n, <const unsigned char*>b"BlockRemoved", 12):
        return 1
    if n == 16 and kv_same(c.data + c.at - n, <const unsigned char*>b"AllBlocksCleared", 16):
        return 2
    return -1


cdef object _value(_Cursor* c, int key):
    """The value of the map key ``key`` (its place in _KEYS)."""
    if key == _HASHES:
        hashes = hashes_at(c.data, c.size, &c.at)  # as the wire sent them, where of one form
        if hashes is None:
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


cdef tuple _KEY_NAMES = tuple(name.decode() for name in _KEYS)
cdef str _EXTRA_KEYS_NAME = _KEY_NAMES[_EXTRA_KEYS], _GROUP_NAME = _KEY_NAMES[_GROUP]
cdef str _KIND_NAME = _KEY_NAMES[_KIND], _WINDOW_NAME = _KEY_NAMES[_WINDOW]


cdef dict _built(unsigned int mask, object extra_keys, object group, object kind, object window):
    """An event's ``extra`` built key by key: the further keys sent (``mask``: a bit each, in _KEYS'
    order from extra_keys) with their values, in the reference's order whatever the wire's."""
    cdef dict extra = {}
    if mask & 1:
        extra[_EXTRA_KEYS_NAME] = extra_keys
    if mask & 2:
        extra[_GROUP_NAME] = group
    if mask & 4:
        extra[_KIND_NAME] = kind
    if mask & 8:
        extra[_WINDOW_NAME] = window
    return extra


cdef list _shapes = [None] * 16  # by the mask of extra's keys: the first such event's extra (see _extra)
cdef PyObject* _shape_values[16][4]  # the values it holds, by its mask's bits (``_shapes`` holds them)


cdef dict _shape(unsigned int mask, object group, object kind, object window):
    """The dict :func:`_extra` copies for ``mask``, made of the first such event's values and kept,
    with the values it holds (its kind where short, as _text's): at most 15 small dicts held."""
    cdef PyObject** held = _shape_values[mask]
    kept = kind if kind is None or len(kind) <= 64 else None
    shape = _built(mask, None, group, kept, window)
    _shapes[mask] = shape
    held[0], held[1], held[2], held[3] = <PyObject*>None, <PyObject*>group, <PyObject*>kept, <PyObject*>window
    return shape


cdef dict _extra(unsigned int mask, object extra_keys, object group, object kind, object window):
    """An event's ``extra`` (as :func:`_built` makes it): a copy of the first one made of the same
    keys (kept here, never handed out; its extra_keys None, and its kind None where over 64
    characters), each value that is not the same object set again in its place. The copy is one
    allocation and a memcpy, where each key's insertion looks for its place (a BlockStored's three
    keys cost twice their copy, a removal's one key a third more), and an engine sends the same
    group and kind event after event: only a BlockStored's own extra_keys list is set again."""
    cdef PyObject** held = _shape_values[mask]
    if mask == 0:
        return {}
    shape = _shapes[mask]
    if shape is None:
        shape = _shape(mask, group, kind, window)
    cdef dict extra = PyDict_Copy(shape)
    if mask & 1 and <PyObject*>extra_keys != held[0]:
        extra[_EXTRA_KEYS_NAME] = extra_keys
    if mask & 2 and <PyObject*>group != held[1]:
        extra[_GROUP_NAME] = group
    if mask & 4 and <PyObject*>kind != held[2]:
        extra[_KIND_NAME] = kind
    if mask & 8 and <PyObject*>window != held[3]:
        extra[_WINDOW_NAME] = window
    return extra


cdef int[3] _REMOVAL_PLACES = [_HASHES, _MEDIUM, _GROUP]  # a positional removal's fields


cdef object _event(_Cursor* c, int* layout):
    """One event, a map or a positional one, as the public one, as the reference makes it
    (``_from_map``, ``from_array``)."""
    cdef int tag = _fields(c, layout), key, n
    cdef unsigned int seen = 0
    cdef bint is_map = layout[0]
    if tag < 0:
        return _NO
    cdef PyObject* values[8]
    if tag == 2:
        extra = {}
        values[0] = <PyObject*>extra
        return make(&_cleared_maker, values)
    hashes = tokens = None
    parent = lora_id = medium = lora_name = None  # the defaults of the keys left out
    extra_keys = group = kind = window = None
    size = 0
    for n in range(layout[1]):
        if is_map:
            key = _key(c)
            if key < 0 or seen & (1u << key) or (tag == 1 and not (_REMOVED_KEYS >> key) & 1):
                return _NO
        else:  # by place: a BlockStored's fields in _KEYS' order, a removal's hashes, medium, group
            key = n if tag == 0 else _REMOVAL_PLACES[n]
        seen |= 1u << key
        value = _value(c, key)
        if value is _NO:
            return _NO
        if key == _HASHES:
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
        elif key == _LORA_NAME:
            lora_name = value
        elif key == _EXTRA_KEYS:
            extra_keys = value
        elif key == _GROUP:
            group = value
        elif key == _KIND:
            kind = value
        else:
            window = value
    if hashes is None or (tag == 0 and tokens is None):
        return _NO
    extra = _extra(seen >> _EXTRA_KEYS, extra_keys, group, kind, window)
    values[0] = <PyObject*>hashes
    if tag == 1:
        values[1], values[2] = <PyObject*>medium, <PyObject*>extra
        return make(&_removed_maker, values)
    values[1], values[2], values[3] = <PyObject*>parent, <PyObject*>tokens, <PyObject*>size
    values[4], values[5], values[6], values[7] = <PyObject*>lora_id, <PyObject*>medium, <PyObject*>lora_name, <PyObject*>extra
    return make(&_stored_maker, values)


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
    cdef PyObject* values[3]
    values[0], values[1], values[2] = <PyObject*>ts, <PyObject*>events, <PyObject*>rank
    return make(&_batch_maker, values)


def parse_batch(payload):
    """An array envelope of map or positional events as the public ``Batch`` (see the reference),
    read where it lies (a bytes object's own buffer, any other's through the buffer protocol); what
    the parser declines, the reference decides."""
    cdef Py_buffer view
    cdef _Cursor c
    if type(payload) is bytes:
        c.data, c.size, c.at = <const unsigned char*>PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), 0
        batch = _batch(&c)
    else:
        PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
        try:
            c.data, c.size, c.at = <const unsigned char*>view.buf, view.len, 0
            batch = _batch(&c)
        finally:
            PyBuffer_Release(&view)
    return _parse_reference(payload) if batch is _NO else batch
