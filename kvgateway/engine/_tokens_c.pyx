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

A block event's ``block_hashes`` likewise (:class:`Hashes`, made by the batch parser, and
:func:`block_hashes` for one array): the engines' u64, signed and 32-byte hashes were an int or a
bytes object each (about 40 a batch) and a list, made and freed with the batch; the compiled
index, learner, renderer and analytics read them from the C array instead.

The event's field keeps its name, its place and its list: :func:`install` puts a :class:`Field` in
place of the Struct's own descriptor of the ``token_ids`` slot (and of ``block_hashes``), which
answers a :class:`Tokens` (a :class:`Hashes`) as the list it stands for, made on the first read and
kept in the slot in its place. Everything that reads ``event.token_ids`` gets the list; what msgspec
does with the slot itself (equality, ``repr``, copies, pickling) sees a :class:`Tokens`, which
compares equal to its list, prints as it and pickles as it. The compiled readers take the slot as it is (``slot_value`` in the .pxd).
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.long cimport PyLong_FromLongLong, PyLong_FromUnsignedLong
from cpython.mem cimport PyObject_Malloc
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset
from kvgateway._pylong cimport kv_be32, kv_be64, u64_long  # big-endian loads; a u64's int
from kvgateway.engine._slots cimport member_offset  # where a Struct keeps a field

cdef extern from "Python.h":
    PyObject* PyObject_Init(PyObject*, PyTypeObject*)

import types

from kvgateway.engine._tokens_py import EMPTY, NotTokens, block_hashes as _reference_hashes, token_ids as _reference

__all__ = ["EMPTY", "Field", "Hashes", "Listed", "NotTokens", "Tokens", "block_hashes", "install", "token_ids"]


cdef class Listed:
    """What a compact array (:class:`Tokens`, :class:`Hashes`) is to everything but the compiled
    readers: the list it stands for (``tolist``), which it compares equal to, prints as, pickles as
    and iterates as; unhashable, as a list. (Python methods only: the arrays are made without their
    type's ``tp_new``, and a C method would need the table it sets up.)"""

    def __eq__(self, other):
        if type(other) is type(self) or isinstance(other, list):
            return self.tolist() == (other if isinstance(other, list) else other.tolist())
        return NotImplemented

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # as a list's

    def __iter__(self):
        return iter(self.tolist())

    def __getitem__(self, index):
        return self.tolist()[index]

    def __repr__(self):
        return repr(self.tolist())

    def __reduce__(self):
        return (list, (self.tolist(),))


cdef class Tokens(Listed):
    """Token ids of 0 to 2**32-1 in a C array: what ``token_ids`` holds until it is read as a list.
    Those :func:`tokens_at` makes are one allocation, the ids after the object's fields; one made
    from Python holds none (no C methods: no table of them to set up, see ``_made``)."""

    def __len__(self):
        return self.count

    def tolist(self):
        """The token ids as a list of ints (what the field reads as)."""
        return _to_list(self)

    def __eq__(self, other):
        if type(other) is Tokens:  # the ids compared where they lie
            return self.count == (<Tokens>other).count and (
                self.count == 0 or memcmp(self.ids, (<Tokens>other).ids, self.count * sizeof(uint32_t)) == 0
            )
        return Listed.__eq__(self, other)


cdef list _to_list(Tokens tokens):
    cdef list out = PyList_New(tokens.count)
    cdef Py_ssize_t i
    for i in range(tokens.count):
        item = PyLong_FromUnsignedLong(tokens.ids[i])
        Py_INCREF(item)
        PyList_SET_ITEM(out, i, item)
    return out


cdef inline Py_ssize_t _fields(PyTypeObject* kind) noexcept:
    """Where a made object of ``kind`` keeps its array: after its fields, at a multiple of 8."""
    return (kind.tp_basicsize + 7) & ~7


cdef Listed _made_of(PyTypeObject* kind, Py_ssize_t room):
    """An object of ``kind`` (Tokens, Hashes) with ``room`` bytes after its fields, in one
    allocation: what ``kind.__new__`` makes (a plain object of the type, fields zeroed: the type has
    no method table, no __cinit__ and is not tracked by the collector), freed as every one of them
    is (the type's tp_free: PyObject_Free)."""
    cdef PyObject* made = <PyObject*>PyObject_Malloc(_fields(kind) + room)
    if made == NULL:
        raise MemoryError()
    memset(made, 0, _fields(kind))
    PyObject_Init(made, kind)
    listed = <Listed>made
    Py_DECREF(listed)  # PyObject_Init's reference, now held by ``listed``
    return listed


cdef Tokens _made(Py_ssize_t count):
    """A Tokens of room for ``count`` ids, in one allocation with them."""
    tokens = <Tokens>_made_of(<PyTypeObject*>Tokens, count * sizeof(uint32_t))
    tokens.ids = <uint32_t*>((<char*><PyObject*>tokens) + _fields(<PyTypeObject*>Tokens))
    return tokens


cdef inline Py_ssize_t _array_head(const unsigned char* data, Py_ssize_t size, Py_ssize_t* at) noexcept:
    """The count of the msgpack array whose header is at ``data[at[0]]`` (``at`` moved past the
    header); -1 where there is none within ``size``."""
    cdef Py_ssize_t i = at[0]
    cdef unsigned char first
    if i >= size:
        return -1
    first = data[i]
    if 0x90 <= first <= 0x9F:  # fixarray
        at[0] = i + 1
        return first & 0x0F
    if first == 0xDC and i + 3 <= size:  # array 16
        at[0] = i + 3
        return (<Py_ssize_t>data[i + 1] << 8) | data[i + 2]
    if first == 0xDD and i + 5 <= size:  # array 32
        at[0] = i + 5
        return (<Py_ssize_t>data[i + 1] << 24) | (<Py_ssize_t>data[i + 2] << 16) | (<Py_ssize_t>data[i + 3] << 8) | data[i + 4]
    return -1


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
    cdef Py_ssize_t at = start[0], i
    cdef Py_ssize_t count = _array_head(data, size, &at)
    cdef Tokens tokens
    cdef uint32_t* ids
    if count <= 0 or count > size - at:  # empty (the reference's []), or shorter than its count
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


cdef class Hashes(Listed):
    """An event's block hashes, all of one form, in a C array: what ``block_hashes`` holds until it
    is read as a list (as :class:`Tokens` for ``token_ids``). The compiled batch parser makes one
    where every hash of a non-empty array is a uint 64 (a u64 array), a uint 64 or an int 64 with
    some negative and none of 2**63 or more (an i64 array: its bits), or a bin 8 of 32 bytes;
    anything else stays the list it was. An int per hash (32 bytes, and 65 for a 32-byte bytes) and
    the list were made and freed with every batch; the compiled index, learner, renderer and
    analytics read the hashes from here (engine/_tokens_c.pxd, state/_hashtable.pxd)."""

    def __len__(self):
        return self.count

    def tolist(self):
        """The hashes as a list of ints or bytes (what the field reads as)."""
        return _hashes_list(self)


cdef object hash_item(Hashes hashes, Py_ssize_t i):
    """Hash ``i`` as the list holds it: an int, or bytes."""
    cdef uint64_t bits
    if hashes.form == HASHES_BLOB:
        return PyBytes_FromStringAndSize(<const char*>hashes.data + i * HASH_BLOB_SIZE, HASH_BLOB_SIZE)
    bits = hash_bits(hashes, i)
    if hashes.form == HASHES_I64:
        return PyLong_FromLongLong(<int64_t>bits)
    return u64_long(bits)


cdef list _hashes_list(Hashes hashes):
    cdef list out = PyList_New(hashes.count)
    cdef Py_ssize_t i
    for i in range(hashes.count):
        item = hash_item(hashes, i)
        Py_INCREF(item)
        PyList_SET_ITEM(out, i, item)
    return out


cdef Hashes _made_hashes(Py_ssize_t count, int form):
    """A Hashes of room for ``count`` hashes of ``form``, in one allocation with them (each u64 read
    aligned: the array starts at a multiple of 8)."""
    cdef Py_ssize_t each = HASH_BLOB_SIZE if form == HASHES_BLOB else sizeof(uint64_t)
    hashes = <Hashes>_made_of(<PyTypeObject*>Hashes, count * each)
    hashes.data = (<const unsigned char*><PyObject*>hashes) + _fields(<PyTypeObject*>Hashes)
    hashes.count = count
    hashes.form = form
    return hashes


cdef object hashes_at(const unsigned char* data, Py_ssize_t size, Py_ssize_t* start):
    """The msgpack array at ``data[start[0]]`` as a :class:`Hashes` (``start`` moved past it); None
    where it is not a non-empty array of hashes of one of its forms within ``size`` (``start`` left
    as it was: the caller reads it its own way)."""
    cdef Py_ssize_t at = start[0], i
    cdef Py_ssize_t count = _array_head(data, size, &at)
    cdef unsigned char first
    cdef uint64_t* out
    cdef bint negative = False, high = False
    if count <= 0 or at >= size:
        return None
    if data[at] == 0xC4:  # bin 8: each a 32-byte hash
        if count > (size - at) // (2 + HASH_BLOB_SIZE):
            return None
        for i in range(count):
            if data[at + i * (2 + HASH_BLOB_SIZE)] != 0xC4 or data[at + i * (2 + HASH_BLOB_SIZE) + 1] != HASH_BLOB_SIZE:
                return None
        hashes = _made_hashes(count, HASHES_BLOB)
        for i in range(count):
            memcpy(<void*>(<Hashes>hashes).data + i * HASH_BLOB_SIZE, data + at + i * (2 + HASH_BLOB_SIZE) + 2, HASH_BLOB_SIZE)
        start[0] = at + count * (2 + HASH_BLOB_SIZE)
        return hashes
    if count > (size - at) // 9:
        return None
    for i in range(count):  # uint 64 or int 64 each, read once the forms are known
        first = data[at + 9 * i]
        if first == 0xCF:
            high |= data[at + 9 * i + 1] >= 0x80  # 2**63 or more
        elif first == 0xD3:
            negative |= data[at + 9 * i + 1] >= 0x80
        else:
            return None
    if negative and high:
        return None  # no one form holds both: the caller's list
    hashes = _made_hashes(count, HASHES_I64 if negative else HASHES_U64)
    out = <uint64_t*>(<Hashes>hashes).data
    for i in range(count):
        out[i] = kv_be64(data + at + 9 * i + 1)
    start[0] = at + 9 * count
    return hashes


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


def block_hashes(raw):
    """What a block event's ``block_hashes`` field holds for the msgpack array ``raw``: a
    :class:`Hashes` where the batch parser makes one (a non-empty array of one of its forms,
    filling ``raw`` exactly); otherwise the reference's answer (its list, or its error)."""
    cdef Py_buffer view
    cdef Py_ssize_t at = 0
    PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE)
    try:
        found = hashes_at(<const unsigned char*>view.buf, view.len, &at)
        if found is not None and at != view.len:
            found = None
    finally:
        PyBuffer_Release(&view)
    return _reference_hashes(raw) if found is None else found


cdef class Field:
    """A Struct's ``token_ids`` or ``block_hashes`` field, read through the slot's own descriptor
    (``member``) but answering a :class:`Tokens` or :class:`Hashes` there as its list, which then
    takes its place in the slot."""

    def __init__(self, owner, member, name="token_ids"):
        if type(member) is not types.MemberDescriptorType or not isinstance(owner, type) or not issubclass(owner, member.__objclass__):
            raise TypeError(f"{owner.__name__}.{name} is not a slot of its instances")
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
        if type(<object>value) is Tokens:
            items = _to_list(<Tokens><object>value)
        elif type(<object>value) is Hashes:
            items = _hashes_list(<Hashes><object>value)
        else:
            return <object>value
        old = <object>value
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


def install(cls, name="token_ids"):
    """Make ``cls``'s field ``name`` (``token_ids``, ``block_hashes``) read as a list whatever its
    slot holds: a :class:`Field` in place of the slot's own descriptor (once; the field is left as
    it is)."""
    current = cls.__dict__[name]
    if type(current) is not Field:
        type.__setattr__(cls, name, Field(cls, current, name))
