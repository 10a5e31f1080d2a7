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

wire defines the types and hands them over once (:func:`install`), as to the reference.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromLongLong
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy
from kvgateway._pylong cimport kv_be16, kv_be32, kv_be64, u64_long  # big-endian loads; a hash's int made
from kvgateway.engine._tokens_c cimport tokens_at  # a batch's token ids read where they lie

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object)

from kvgateway.engine._batch_py import parse_batch as _parse_reference

__all__ = ["install", "parse_batch"]

cdef object _BlockStored = None, _BlockRemoved = None, _AllBlocksCleared = None, _Batch = None


def install(*, stored, removed, cleared, batch, fast_decoders, refused, events_of):
    """wire's types, once (see the reference's ``install``; the fast decoders, their errors and
    ``events_of`` are the reference's, which a payload the parser declines goes to)."""
    global _BlockStored, _BlockRemoved, _AllBlocksCleared, _Batch
    _BlockStored, _BlockRemoved, _AllBlocksCleared, _Batch = stored, removed, cleared, batch


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
    if memcmp(_KEY_TEXT[k], name, n) != 0:
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


cdef tuple _KEY_NAMES = tuple(name.decode() for name in _KEYS)
cdef str _EXTRA_KEYS_NAME = _KEY_NAMES[_EXTRA_KEYS], _GROUP_NAME = _KEY_NAMES[_GROUP]
cdef str _KIND_NAME = _KEY_NAMES[_KIND], _WINDOW_NAME = _KEY_NAMES[_WINDOW]


cdef dict _extra(unsigned int mask, object extra_keys, object group, object kind, object window):
    """An event's ``extra``: the further keys sent (``mask``: a bit each, in _KEYS' order from
    extra_keys) with their values, in the reference's order whatever the wire's."""
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


cdef int[3] _REMOVAL_PLACES = [_HASHES, _MEDIUM, _GROUP]  # a positional removal's fields


cdef object _event(_Cursor* c, int* layout):
    """One event, a map or a positional one, as the public one, as the reference makes it
    (``_from_map``, ``from_array``)."""
    cdef int tag = _fields(c, layout), key, n
    cdef unsigned int seen = 0
    cdef bint is_map = layout[0]
    if tag < 0:
        return _NO
    if tag == 2:
        return _AllBlocksCleared()
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
    if tag == 1:
        return _BlockRemoved(hashes, medium, extra)
    return _BlockStored(hashes, parent, tokens, size, lora_id, medium, lora_name, extra)


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
    """An array envelope of map or positional events as the public ``Batch`` (see the reference),
    read where it lies; what the parser declines, the reference decides."""
    cdef Py_buffer view
    cdef _Cursor c
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        c.data, c.size, c.at = <const unsigned char*>view.buf, view.len, 0
        batch = _batch(&c)
    finally:
        PyBuffer_Release(&view)
    return _parse_reference(payload) if batch is _NO else batch
