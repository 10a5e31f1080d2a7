# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A BlockStored's ``token_ids`` kept as the wire sent them: the compiled twin of
:mod:`kvgateway.engine._tokens_py` (the reference, whose API it has).

msgspec makes a Python int of each token id a batch carries (about 320 a batch) and the list
holding them, and they are all freed when the log lets the batch go; the compiled renderer writes
them out again in decimal and the compiled learner digests them, neither needing an int object.
:func:`token_ids` reads the msgpack array itself: where every element is an int of 0 to 2**32-1
(every vocabulary's token ids), it answers a :class:`Tokens`, the ids in a C array (4 bytes each
against an int's 32 and a list's 8); anything else (an empty array, ints outside that range, or no
array of ints at all) it answers as the reference does.

The event's field keeps its name, its place and its list: :func:`install` puts a :class:`Field` in
place of the Struct's own descriptor of the ``token_ids`` slot, which answers a :class:`Tokens` as
the list it stands for, made on the first read and kept in the slot in its place. Everything that
reads ``event.token_ids`` gets the list; what msgspec does with the slot itself (equality,
``repr``, copies, pickling) sees a :class:`Tokens`, which compares equal to its list, prints as it
and pickles as it. The compiled readers take the slot as it is (``slot_value`` in the .pxd).
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromUnsignedLong
from cpython.mem cimport PyObject_Malloc
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcmp, memset
from kvgateway._pylong cimport kv_be32  # big-endian loads
from kvgateway.engine._slots cimport member_offset  # where a Struct keeps a field

cdef extern from "Python.h":
    PyObject* PyObject_Init(PyObject*, PyTypeObject*)

import types

from kvgateway.engine._tokens_py import EMPTY, NotTokens, token_ids as _reference

__all__ = ["EMPTY", "Field", "NotTokens", "Tokens", "install", "token_ids"]


cdef class Tokens:
    """Token ids of 0 to 2**32-1 in a C array: what ``token_ids`` holds until it is read as a list.
    Those :func:`tokens_at` makes are one allocation, the ids after the object's fields; one made
    from Python holds none (no methods of its own: no table of them to set up, see ``_made``)."""

    def __len__(self):
        return self.count

    def tolist(self):
        """The token ids as a list of ints (what the field reads as)."""
        return _to_list(self)

    def __eq__(self, other):
        if type(other) is Tokens:
            return self.count == (<Tokens>other).count and (
                self.count == 0 or memcmp(self.ids, (<Tokens>other).ids, self.count * sizeof(uint32_t)) == 0
            )
        if isinstance(other, list):
            return _to_list(self) == other
        return NotImplemented

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # as a list's

    def __repr__(self):
        return repr(_to_list(self))

    def __reduce__(self):
        return (list, (_to_list(self),))


cdef list _to_list(Tokens tokens):
    cdef list out = PyList_New(tokens.count)
    cdef Py_ssize_t i
    for i in range(tokens.count):
        item = PyLong_FromUnsignedLong(tokens.ids[i])
        Py_INCREF(item)
        PyList_SET_ITEM(out, i, item)
    return out


cdef Py_ssize_t _FIELDS = (<PyTypeObject*>Tokens).tp_basicsize  # where a made object's ids start


cdef Tokens _made(Py_ssize_t count):
    """A Tokens of room for ``count`` ids, in one allocation with them: what Tokens.__new__ makes
    (a plain object of the type, fields zeroed: the type has no method table, no __cinit__ and is
    not tracked by the collector), freed as every Tokens is (the type's tp_free: PyObject_Free)."""
    cdef PyObject* made = <PyObject*>PyObject_Malloc(_FIELDS + count * sizeof(uint32_t))
    if made == NULL:
        raise MemoryError()
    memset(made, 0, _FIELDS)
    PyObject_Init(made, <PyTypeObject*>Tokens)
    tokens = <Tokens>made
    Py_DECREF(tokens)  # PyObject_Init's reference, now held by ``tokens``
    tokens.ids = <uint32_t*>((<char*>made) + _FIELDS)
    return tokens


cdef inline bint _read(const unsigned char* data, Py_ssize_t size, Py_ssize_t* at, uint32_t* out) noexcept:
    """The msgpack int at ``data[at[0]]`` into ``out`` (``at`` moved past it) where it is one of 0 to
    2**32-1, in any of msgpack's int formats; False for anything else (nothing promised of ``at``)."""
    cdef Py_ssize_t i = at[0]
    cdef unsigned char first
    cdef Py_ssize_t width
    if i >= size:
        return False
    first = data[i]
    if first <= 0x7F:  # positive fixint
        out[0] = first
        at[0] = i + 1
        return True
    if first == 0xCC or first == 0xD0:  # uint 8, int 8
        width = 1
    elif first == 0xCD or first == 0xD1:  # uint 16, int 16
        width = 2
    elif first == 0xCE or first == 0xD2:  # uint 32, int 32
        width = 4
    elif first == 0xCF or first == 0xD3:  # uint 64, int 64: the top half must be zero
        if i + 9 > size or data[i + 1] | data[i + 2] | data[i + 3] | data[i + 4]:
            return False
        i += 4
        width = 4
        first = 0xCE
    else:
        return False
    if i + 1 + width > size:
        return False
    if first >= 0xD0 and data[i + 1] & 0x80:  # a signed format's negative value
        return False
    if width == 1:
        out[0] = data[i + 1]
    elif width == 2:
        out[0] = (<uint32_t>data[i + 1] << 8) | data[i + 2]
    else:
        out[0] = (
            (<uint32_t>data[i + 1] << 24) | (<uint32_t>data[i + 2] << 16) | (<uint32_t>data[i + 3] << 8) | data[i + 4]
        )
    at[0] = i + 1 + width
    return True


cdef unsigned char _WIDTH[256]
"""By an id's first byte, the bytes of its value after it in the formats :func:`_one` reads: 0 for a
positive fixint (the value is the byte), 1, 2 and 4 for a uint 8, 16 and 32; 8 for any other."""


cdef int _fill_widths() except -1:
    cdef int first
    for first in range(256):
        _WIDTH[first] = 0 if first <= 0x7F else 1 if first == 0xCC else 2 if first == 0xCD else 4 if first == 0xCE else 8
    return 0


_fill_widths()


cdef inline bint _one(const unsigned char** p, uint32_t* out) noexcept:
    """The id at ``p[0]`` into ``out`` (``p[0]`` moved past it) where it is a uint 32, a uint 16, a
    positive fixint or a uint 8; False for another format. The caller promises room for the widest
    (5 bytes). Without a branch on the format: a large vocabulary's ids are uint 16 and uint 32 about
    evenly (a Qwen's 151,000: 43% above 65,535), so a branch on it was mispredicted about every other
    id. The four bytes after the first are read whatever the format and shifted down to the width's
    (a fixint's: none, its value the first byte)."""
    cdef const unsigned char* at = p[0]
    cdef uint32_t first = at[0]
    cdef uint32_t width = _WIDTH[first]
    cdef uint64_t after = kv_be32(at + 1)
    if width > 4:
        return False
    out[0] = <uint32_t>(after >> (32 - 8 * width)) | (first & (0 - <uint32_t>(width == 0)))
    p[0] = at + 1 + width
    return True


cdef inline Py_ssize_t _common(
    const unsigned char* data, Py_ssize_t size, uint32_t* ids, Py_ssize_t i, Py_ssize_t count, Py_ssize_t* at
) noexcept:
    """Ids ``i`` on of ``count`` at ``data[at[0]]`` read into ``ids`` four at a time, while four of the
    widest format fit in ``size`` and each is of a format :func:`_one` reads: the index of the first
    not read (``at`` moved past those read)."""
    cdef const unsigned char* p = data + at[0]
    cdef const unsigned char* end = data + size
    while count - i >= 4 and end - p >= 20:
        if not _one(&p, ids + i):
            break
        if not _one(&p, ids + i + 1):
            i += 1
            break
        if not _one(&p, ids + i + 2):
            i += 2
            break
        if not _one(&p, ids + i + 3):
            i += 3
            break
        i += 4
    at[0] = p - data
    return i


cdef object tokens_at(const unsigned char* data, Py_ssize_t size, Py_ssize_t* start):
    """The msgpack array at ``data[start[0]]`` as a :class:`Tokens` (``start`` moved past it); None
    where it is not a non-empty array of ints of 0 to 2**32-1 within ``size`` (nothing promised of
    ``start`` then). The compiled batch parser (engine/_batch_c.pyx) reads a batch's ids here."""
    cdef Py_ssize_t count, at = start[0], i
    cdef Tokens tokens
    cdef uint32_t* ids
    cdef unsigned char first
    if at >= size:
        return None
    first = data[at]
    if 0x90 <= first <= 0x9F:  # fixarray
        count, at = first & 0x0F, at + 1
    elif first == 0xDC and at + 3 <= size:  # array 16
        count, at = (<Py_ssize_t>data[at + 1] << 8) | data[at + 2], at + 3
    elif first == 0xDD and at + 5 <= size:  # array 32
        count = (<Py_ssize_t>data[at + 1] << 24) | (<Py_ssize_t>data[at + 2] << 16) | (<Py_ssize_t>data[at + 3] << 8) | data[at + 4]
        at += 5
    else:
        return None
    if count == 0 or count > size - at:  # empty (the reference's []), or shorter than its count
        return None
    tokens = _made(count)
    ids = tokens.ids
    i = 0
    while True:
        i = _common(data, size, ids, i, count, &at)
        if i == count:
            break
        if not _read(data, size, &at, &ids[i]):  # one of another format, or of the last few
            return None
        i += 1
    tokens.count = count
    start[0] = at
    return tokens


cdef object _packed(const unsigned char* data, Py_ssize_t size):
    """The msgpack array ``data`` as a :class:`Tokens`; None where it is not a non-empty array of
    ints of 0 to 2**32-1 filling ``data`` exactly."""
    cdef Py_ssize_t at = 0
    tokens = tokens_at(data, size, &at)
    return None if tokens is None or at != size else tokens


def token_ids(raw):
    """What a BlockStored's ``token_ids`` field holds for the msgpack value ``raw``: a
    :class:`Tokens` for a non-empty array of ints of 0 to 2**32-1; otherwise the reference's answer
    (its list of ints, or :class:`NotTokens` where it is no array of msgpack ints)."""
    cdef Py_buffer view
    PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE)
    try:
        found = _packed(<const unsigned char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return _reference(raw) if found is None else found


cdef class Field:
    """A Struct's ``token_ids`` field, read through the slot's own descriptor (``member``) but
    answering a :class:`Tokens` there as its list, which then takes its place in the slot."""

    def __init__(self, owner, member):
        if type(member) is not types.MemberDescriptorType or not isinstance(owner, type) or not issubclass(owner, member.__objclass__):
            raise TypeError(f"{owner.__name__}.token_ids is not a slot of its instances")
        self.owner = owner
        self.member = member
        self.offset = member_offset(member)

    cdef object read(self, object instance):
        cdef PyObject** slot
        cdef PyObject* value
        if not isinstance(instance, self.owner):
            return self.member.__get__(instance, type(instance))  # the slot descriptor's TypeError
        slot = <PyObject**>((<char*><PyObject*>instance) + self.offset)
        value = slot[0]
        if value == NULL:
            return self.member.__get__(instance, type(instance))  # its AttributeError
        if type(<object>value) is not Tokens:
            return <object>value
        old = <object>value
        items = _to_list(<Tokens>old)
        Py_INCREF(items)
        slot[0] = <PyObject*>items
        Py_DECREF(old)  # the slot's reference (``old`` holds its own until it goes)
        return items

    def __get__(self, instance, owner):
        if instance is None:
            return self
        return self.read(instance)

    def __set__(self, instance, value):
        self.member.__set__(instance, value)

    def __delete__(self, instance):
        self.member.__delete__(instance)


def install(cls):
    """Make ``cls.token_ids`` (a Struct's field) read as a list of ints whatever its slot holds: a
    :class:`Field` in place of the slot's own descriptor (once; the field is left as it is)."""
    current = cls.__dict__["token_ids"]
    if type(current) is not Field:
        type.__setattr__(cls, "token_ids", Field(cls, current))
