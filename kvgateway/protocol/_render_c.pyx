# cython: language_level=3, binding=True, boundscheck=False, wraparound=False, cdivision=True, annotation_typing=False
"""The compiled renderer: the pure-Python reference (``_render_py.py``) compiled through Cython's
include, so everything it defines is the same code, with its two per-batch writers replaced.

:func:`events_json` writes a batch's events straight from the decoded structs into one C buffer:
no dict per event, no list of hash strings, no second pass for the filter keys. It writes exactly
what the reference's dicts encode to (msgspec's compact JSON: keys in the reference's order, ints
in decimal, hashes as decimal or hex strings, strings escaped as msgspec escapes them). What it has
no fast path for (an unknown event, a further field named like one of the event's own, a value of
a type the reference only passes through) it hands to the reference for that event, whose bytes
it then copies: the output is the reference's in every case, which
tests/unit/protocol/test_render_differential.py checks over every wire layout.

:func:`batch_message` writes a message's head (``type`` .. ``ts``) in C and joins it with the
events' JSON in one allocation; the per-epoch and per-stream parts of the head are encoded once and
kept.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.array cimport array, clone
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

from kvgateway._pylong cimport negative_of, u64_of  # an int read from its digits
from kvgateway.engine._direct cimport Maker, make, maker_init, member_slot  # a Struct made without its constructor
from kvgateway.engine._slots cimport Fields, field, field_offset, fields_of  # a Struct's field read from its slot
from kvgateway.engine._tokens_c cimport (  # token ids and hashes as the wire sent them
    HASH_BLOB_SIZE, HASHES_BLOB, HASHES_I64, Hashes, Tokens, hash_bits, slot_offset, slot_value,
)

cdef extern from "Python.h":
    bint PyLong_CheckExact(object)
    bint PyUnicode_CheckExact(object)
    bint PyBytes_CheckExact(object)
    bint PyList_CheckExact(object)
    bint PyDict_CheckExact(object)
    bint PyUnicode_IS_ASCII(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    const char* PyUnicode_1BYTE_DATA(object)
    int PyDict_Next(object, Py_ssize_t*, PyObject**, PyObject**)
    object PyUnicode_New(Py_ssize_t, Py_UCS4)
    void* PyUnicode_DATA(object)
    Py_ssize_t Py_SIZE(object)

include "_render_py.py"

# --- constants -------------------------------------------------------------------------------------

cdef object _encoder = msgspec.json.Encoder()
cdef bytes _STORED_OPEN = b'{"type":"BlockStored","block_hashes":'
cdef bytes _PARENT_BLOCK_HASH = b',"parent_block_hash":'
cdef bytes _TOKEN_IDS = b',"token_ids":'
cdef bytes _BLOCK_SIZE = b',"block_size":'
cdef bytes _LORA_ID = b',"lora_id":'
cdef bytes _LORA_NAME = b',"lora_name":'
cdef bytes _REMOVED_OPEN = b'{"type":"BlockRemoved","block_hashes":'
cdef bytes _CLEARED_OPEN = b'{"type":"AllBlocksCleared"'
cdef bytes _OFFSET = b'","offset":'
cdef bytes _TS = b'","ts":'
cdef bytes _EVENTS = b',"events":['
# The event's fixed parts as C text, each of a size the compiler knows: a copy of it is a few
# moves, no call (checked against the bytes at import)
cdef const char* _STORED_OPEN_C = _STORED_OPEN
cdef const char* _PARENT_BLOCK_HASH_C = _PARENT_BLOCK_HASH
cdef const char* _TOKEN_IDS_C = _TOKEN_IDS
cdef const char* _BLOCK_SIZE_C = _BLOCK_SIZE
cdef const char* _LORA_ID_C = _LORA_ID
cdef const char* _LORA_NAME_C = _LORA_NAME
cdef const char* _REMOVED_OPEN_C = _REMOVED_OPEN
cdef const char* _CLEARED_OPEN_C = _CLEARED_OPEN
cdef enum:
    _STORED_OPEN_SIZE = 37
    _PARENT_BLOCK_HASH_SIZE = 21
    _TOKEN_IDS_SIZE = 13
    _BLOCK_SIZE_SIZE = 14
    _LORA_ID_SIZE = 11
    _LORA_NAME_SIZE = 13
    _REMOVED_OPEN_SIZE = 38
    _CLEARED_OPEN_SIZE = 26
if [len(_STORED_OPEN), len(_PARENT_BLOCK_HASH), len(_TOKEN_IDS), len(_BLOCK_SIZE), len(_LORA_ID), len(_LORA_NAME),
        len(_REMOVED_OPEN), len(_CLEARED_OPEN)] != [
        _STORED_OPEN_SIZE, _PARENT_BLOCK_HASH_SIZE, _TOKEN_IDS_SIZE, _BLOCK_SIZE_SIZE, _LORA_ID_SIZE, _LORA_NAME_SIZE,
        _REMOVED_OPEN_SIZE, _CLEARED_OPEN_SIZE]:
    raise ImportError("kvgateway.protocol._render_c: a fixed part's size is not its text's")

cdef extern from *:
    """
    /* n bytes copied from `from` to `to` (apart): for 8 to 32 (a further field's name and value, a
       medium's part) two or four 8-byte moves that may overlap, no call; else memcpy (which the
       compiler writes in line for a size it knows). */
    static inline void kv_copy(char *to, const char *from, Py_ssize_t n) {
        uint64_t a, b, c, d;
        if (n >= 8 && n <= 16) {
            memcpy(&a, from, 8); memcpy(&b, from + n - 8, 8);
            memcpy(to, &a, 8); memcpy(to + n - 8, &b, 8);
        } else if (n > 16 && n <= 32) {
            memcpy(&a, from, 8); memcpy(&b, from + 8, 8);
            memcpy(&c, from + n - 16, 8); memcpy(&d, from + n - 8, 8);
            memcpy(to, &a, 8); memcpy(to + 8, &b, 8);
            memcpy(to + n - 16, &c, 8); memcpy(to + n - 8, &d, 8);
        } else {
            memcpy(to, from, (size_t)n);
        }
    }
    """
    void kv_copy(char* to, const char* source, Py_ssize_t n) noexcept


cdef extern from *:
    """
    /* 16 bytes at `from` as their 32 lowercase hex digits at `to`, where the compiler has SSE2 (every
       x86-64): each byte's two nibbles split and interleaved, high first, and each nibble made a
       digit by adding "0", and 39 more ("a" - "0" - 10) where it is above 9. A 32-byte hash (vLLM's
       raw sha256) in two steps, where the table of digit pairs took a load and a store a byte. */
    #if defined(__SSE2__)
      #include <emmintrin.h>
      #define KV_HEX16 1
      static inline __m128i kv_hex_digits(__m128i nibbles) {
          __m128i above = _mm_cmpgt_epi8(nibbles, _mm_set1_epi8(9));
          return _mm_add_epi8(_mm_add_epi8(nibbles, _mm_set1_epi8('0')), _mm_and_si128(above, _mm_set1_epi8(39)));
      }
      static inline void kv_hex16(char *to, const unsigned char *from) {
          __m128i bytes = _mm_loadu_si128((const __m128i *)from);
          __m128i low_four = _mm_set1_epi8(0x0F);
          __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_four);
          __m128i low = _mm_and_si128(bytes, low_four);
          _mm_storeu_si128((__m128i *)to, kv_hex_digits(_mm_unpacklo_epi8(high, low)));
          _mm_storeu_si128((__m128i *)(to + 16), kv_hex_digits(_mm_unpackhi_epi8(high, low)));
      }
    #else
      #define KV_HEX16 0
      static inline void kv_hex16(char *to, const unsigned char *from) { (void)to; (void)from; }
    #endif
    """
    bint KV_HEX16
    void kv_hex16(char* to, const unsigned char* source) noexcept

# --- a growing C buffer ---------------------------------------------------------------------------

cdef struct Buffer:
    char* data
    Py_ssize_t size
    Py_ssize_t capacity


cdef int _reserve(Buffer* out, Py_ssize_t more) except -1:
    cdef Py_ssize_t capacity = out.capacity
    cdef char* data
    if out.size + more <= capacity:
        return 0
    while capacity < out.size + more:
        capacity *= 2
    data = <char*>PyMem_Realloc(out.data, capacity)
    if data == NULL:
        raise MemoryError()
    out.data = data
    out.capacity = capacity
    return 0


cdef inline int _put(Buffer* out, const char* text, Py_ssize_t size) except -1:
    if out.size + size > out.capacity:
        _reserve(out, size)
    kv_copy(out.data + out.size, text, size)
    out.size += size
    return 0


cdef inline int _put_bytes(Buffer* out, bytes text) except -1:
    return _put(out, PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text))


cdef inline int _put_char(Buffer* out, char c) except -1:
    if out.size + 1 > out.capacity:
        _reserve(out, 1)
    out.data[out.size] = c
    out.size += 1
    return 0


# --- values -----------------------------------------------------------------------------------------

cdef const char* _HEX = b"0123456789abcdef"


cdef const char* _PAIRS = (
    b"00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    b"40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    b"8081828384858687888990919293949596979899"
)


cdef char _TRIPLES[4 * 1000 + 4]
"""Each of 0 to 999 as four bytes: its three digits, zeros in front, and how many of them are those
zeros (2 for 0 to 9, 1 for 10 to 99, else 0; 0 itself is its last digit)."""


cdef int _fill_triples() except -1:
    cdef int i
    for i in range(1000):
        _TRIPLES[4 * i] = <char>(48 + i // 100)
        _TRIPLES[4 * i + 1] = <char>(48 + i // 10 % 10)
        _TRIPLES[4 * i + 2] = <char>(48 + i % 10)
        _TRIPLES[4 * i + 3] = 2 if i < 10 else 1 if i < 100 else 0
    _TRIPLES[4000] = _TRIPLES[4001] = _TRIPLES[4002] = _TRIPLES[4003] = 0
    return 0


_fill_triples()


cdef struct _Lead:
    char text[4]  # a comma and the value's digits without zeros in front: ",d", ",dd" or ",ddd"
    uint32_t size  # how many of the four bytes that is


cdef _Lead _LEADS[1000]
"""Each of 0 to 999 after a comma: a list's next int's leading group of digits, one copy."""


cdef int _fill_leads() except -1:
    cdef int i, k, digits
    for i in range(1000):
        digits = 1 if i < 10 else 2 if i < 100 else 3
        _LEADS[i].text[0] = 44  # ","
        for k in range(3):
            _LEADS[i].text[1 + k] = _TRIPLES[4 * i + 3 - digits + k] if k < digits else 0
        _LEADS[i].size = 1 + digits
    return 0


_fill_leads()


cdef inline char* _next_u32(char* at, uint32_t value) noexcept:
    """A comma and ``value`` in decimal at ``at`` (room for 12 bytes: the comma, 10 digits and one
    written beyond them); returns the end. A token id of four to six digits (most of a large
    vocabulary's) is one comparison, one division and two copies: its leading group after the comma
    from :data:`_LEADS`, then its last three digits from :data:`_TRIPLES`."""
    cdef uint32_t high
    if value - <uint32_t>1000 < <uint32_t>999000:  # 1,000 to 999,999 (below 1,000 wraps above)
        high = value // 1000
        memcpy(at, _LEADS[high].text, 4)
        at += _LEADS[high].size
        return _three(at, value - high * 1000)
    if value < 1000:
        memcpy(at, _LEADS[value].text, 4)
        return at + _LEADS[value].size
    at[0] = 44  # ","
    return _write_u32(at + 1, value)


cdef inline char* _lead(char* at, uint32_t value) noexcept:
    """``value`` (under 1000) in one to three digits at ``at``; returns the end. Four bytes copied
    from the digits' first (the fourth a byte that the next writes cover or that lies beyond the
    text)."""
    cdef const char* entry = _TRIPLES + 4 * value
    cdef Py_ssize_t zeros = entry[3]
    memcpy(at, entry + zeros, 4)
    return at + 3 - zeros


cdef inline char* _three(char* at, uint32_t value) noexcept:
    """``value`` (under 1000) in exactly three digits, zeros in front; returns the end (a fourth byte
    written beyond it, as :func:`_lead`)."""
    memcpy(at, _TRIPLES + 4 * value, 4)
    return at + 3


cdef inline char* _write_u32(char* at, uint32_t value) noexcept:
    """``value`` in decimal at ``at`` (room for 11 bytes: 10 digits and one written beyond them);
    returns the end. A token id's digits are most of a batch's JSON: its groups of three digits,
    each copied from a 4,000-byte table (:data:`_TRIPLES`), the leading group without its zeros;
    the groups split off by divisions by constants (multiplications). A five- or six-digit id (most
    of a large vocabulary's) is two comparisons, one division and two copies."""
    cdef uint32_t high, middle
    if value < 1000:
        return _lead(at, value)
    if value < 1000000:
        high = value // 1000
        return _three(_lead(at, high), value - high * 1000)
    if value < 1000000000:
        high = value // 1000000
        value -= high * 1000000
        middle = value // 1000
        return _three(_three(_lead(at, high), middle), value - middle * 1000)
    high = value // 1000000000  # 1 to 4
    value -= high * 1000000000
    at[0] = <char>(48 + high)
    high = value // 1000000
    value -= high * 1000000
    middle = value // 1000
    return _three(_three(_three(at + 1, high), middle), value - middle * 1000)


cdef inline char* _eight(char* at, uint32_t value) noexcept:
    """``value`` (under 10**8) in exactly eight digits, zeros in front; returns the end (a byte
    written beyond it, as :func:`_three`): its first two digits from :data:`_PAIRS`, then two
    groups of three."""
    cdef uint32_t high = value // 1000000, middle
    value -= high * 1000000
    middle = value // 1000
    memcpy(at, _PAIRS + 2 * high, 2)
    return _three(_three(at + 2, middle), value - middle * 1000)


cdef inline char* _write_u64(char* at, uint64_t value) noexcept:
    """``value`` in decimal at ``at`` (room for 21 bytes: 20 digits and one written beyond them);
    returns the end. Token ids (most of a batch's bytes) fit 32 bits; a hash's 64 bits are its
    leading part (under 10**8, or at most 1844 above 10**16) and one or two parts of exactly eight
    digits (:func:`_eight`), each split off by a 64-bit division by a constant (a multiplication)."""
    cdef uint64_t high, middle
    if value <= 0xFFFFFFFFULL:
        return _write_u32(at, <uint32_t>value)
    if value < 10000000000000000ULL:  # up to 16 digits
        high = value // 100000000ULL
        return _eight(_write_u32(at, <uint32_t>high), <uint32_t>(value - high * 100000000ULL))
    high = value // 10000000000000000ULL  # 17 to 20 digits: at most 1844
    value -= high * 10000000000000000ULL
    middle = value // 100000000ULL
    return _eight(_eight(_write_u32(at, <uint32_t>high), <uint32_t>middle), <uint32_t>(value - middle * 100000000ULL))


cdef inline int _put_unsigned(Buffer* out, uint64_t value) except -1:
    if out.size + 21 > out.capacity:
        _reserve(out, 21)
    out.size = _write_u64(out.data + out.size, value) - out.data
    return 0


cdef int _put_int(Buffer* out, object value) except -1:
    """An exact int in decimal, as msgspec writes it (and str() does, for a hash's text)."""
    cdef uint64_t unsigned
    if u64_of(value, &unsigned):  # nearly every int: read from its digits
        return _put_unsigned(out, unsigned)
    if negative_of(value, &unsigned):  # -2**63 to -1, its magnitude read from its digits too
        _put_char(out, 45)  # "-"
        return _put_unsigned(out, unsigned)
    return _put_bytes(out, str(value).encode())  # wider than 64 bits: rare, and the same digits


cdef char _HEX_PAIRS[512]
"""Each byte's two lowercase hex digits (a byte hash's text: bytes.hex())."""


cdef int _fill_hex_pairs() except -1:
    cdef int i
    for i in range(256):
        _HEX_PAIRS[2 * i] = _HEX[i >> 4]
        _HEX_PAIRS[2 * i + 1] = _HEX[i & 15]
    return 0


_fill_hex_pairs()


cdef inline char* _write_hex(char* at, const unsigned char* data, Py_ssize_t n) noexcept:
    """The ``n`` bytes at ``data`` in lowercase hex at ``at`` (room for ``2 * n``); returns the end.
    Sixteen bytes a step where the compiler has SSE2 (:func:`kv_hex16`); the rest each byte's two
    digits one copy from :data:`_HEX_PAIRS`, four bytes a step."""
    cdef const unsigned char* end = data + n
    if KV_HEX16:
        while end - data >= 16:
            kv_hex16(at, data)
            at += 32
            data += 16
    while end - data >= 4:
        memcpy(at, _HEX_PAIRS + 2 * <size_t>data[0], 2)
        memcpy(at + 2, _HEX_PAIRS + 2 * <size_t>data[1], 2)
        memcpy(at + 4, _HEX_PAIRS + 2 * <size_t>data[2], 2)
        memcpy(at + 6, _HEX_PAIRS + 2 * <size_t>data[3], 2)
        at += 8
        data += 4
    while data < end:
        memcpy(at, _HEX_PAIRS + 2 * <size_t>data[0], 2)
        at += 2
        data += 1
    return at


cdef int _put_hex(Buffer* out, bytes value) except -1:
    cdef Py_ssize_t n = PyBytes_GET_SIZE(value)
    _reserve(out, 2 * n)
    out.size = _write_hex(out.data + out.size, <const unsigned char*>PyBytes_AS_STRING(value), n) - out.data
    return 0


cdef bint _put_hash(Buffer* out, object value) except -1:
    """A block hash as its quoted text (render.hash_text); False for another type (not written). A
    u64 (nearly every int hash) in place after one room check."""
    cdef uint64_t unsigned
    cdef char* at
    if u64_of(value, &unsigned):
        if out.size + 22 > out.capacity:  # two quotes and 20 digits (the byte past them is the quote)
            _reserve(out, 22)
        at = out.data + out.size
        at[0] = 34  # '"'
        at = _write_u64(at + 1, unsigned)
        at[0] = 34
        out.size = at + 1 - out.data
        return True
    if PyLong_CheckExact(value):
        _put_char(out, 34)
        _put_int(out, value)
    elif PyBytes_CheckExact(value):
        _put_char(out, 34)
        _put_hex(out, value)
    else:
        return False
    _put_char(out, 34)
    return True


cdef int _put_str(Buffer* out, object text) except -1:
    """An exact str as a JSON string: ASCII without quotes, backslashes or control characters is
    copied; anything else is msgspec's own escaping."""
    cdef Py_ssize_t n, i
    cdef const unsigned char* data
    if PyUnicode_IS_ASCII(text):
        n = PyUnicode_GET_LENGTH(text)
        data = <const unsigned char*>PyUnicode_1BYTE_DATA(text)
        for i in range(n):
            if data[i] < 32 or data[i] == 34 or data[i] == 92:
                break
        else:
            _put_char(out, 34)
            _put(out, <const char*>data, n)
            return _put_char(out, 34)
    return _put_bytes(out, _encoder.encode(text))


cdef int _put_value(Buffer* out, object value) except -1:
    """Any value as the reference encodes it: the common ones here, the rest through msgspec."""
    if value is None:
        return _put(out, "null", 4)
    if value is True:
        return _put(out, "true", 4)
    if value is False:
        return _put(out, "false", 5)
    if PyLong_CheckExact(value):
        return _put_int(out, value)
    if PyUnicode_CheckExact(value):
        return _put_str(out, value)
    return _put_bytes(out, _encoder.encode(value))


cdef int _put_further(Buffer* out, object value) except -1:
    """A further field's value (render._further: scalars as they are, anything else plain())."""
    cdef Py_ssize_t i, n
    cdef char* at
    if PyList_CheckExact(value):
        n = PyList_GET_SIZE(value)
        for i in range(n):  # extra_keys of Nones, the common case
            if <object>PyList_GET_ITEM(value, i) is not None:
                break
        else:  # written in place, its room reserved once: "null," each, the last comma the bracket
            _reserve(out, 2 + 5 * n)
            at = out.data + out.size
            at[0] = 91  # "["
            at += 1
            for i in range(n):
                memcpy(at, b"null,", 5)
                at += 5
            if n:
                at -= 1
            at[0] = 93  # "]"
            out.size = at + 1 - out.data
            return 0
        return _put_bytes(out, _encoder.encode(plain(value)))
    if value is None or value is True or value is False or PyLong_CheckExact(value) or PyUnicode_CheckExact(value):
        return _put_value(out, value)
    return _put_bytes(out, _encoder.encode(plain(value)))


# --- events -----------------------------------------------------------------------------------------

cdef frozenset _STORED_OWN = frozenset(
    {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "tier", "lora_name"}
)
cdef frozenset _REMOVED_OWN = frozenset({"type", "block_hashes", "medium", "tier"})
cdef frozenset _CLEARED_OWN = frozenset({"type"})

cdef Py_ssize_t _TOKENS_AT = slot_offset(BlockStored)
# The fields the writers read from their slots (``field``): an event reaches them of its exact type
cdef object _BlockStored = BlockStored
cdef object _BlockRemoved = BlockRemoved
cdef object _AllBlocksCleared = AllBlocksCleared
cdef Fields _STORED = fields_of(BlockStored)
cdef Fields _REMOVED = fields_of(BlockRemoved)
cdef Fields _CLEARED = fields_of(AllBlocksCleared)

cdef dict _media = {}
"""(event type, medium) -> (b',"medium":..,"tier":..', the filter key): few distinct, from the wire."""
cdef int _MEDIA_MAX = 256


cdef class _Seen:
    """A block event type's last medium (the str object: the parser makes an engine's medium once,
    and it is kept alive here) and its part and key, as :func:`_medium_part` found them."""
    cdef object medium
    cdef tuple media


cdef _Seen _STORED_SEEN = _Seen(), _REMOVED_SEEN = _Seen()


cdef tuple _medium_part(object event, object kind, object medium, _Seen seen):
    if seen.media is not None and medium is seen.medium:
        return seen.media
    if medium is not None and not PyUnicode_CheckExact(medium):
        return None
    found = _media.get((kind, medium))
    if found is None:
        part = b',"medium":' + _encoder.encode(medium) + b',"tier":' + _encoder.encode(medium_tier(medium))
        found = (part, event_key(event))
        if len(_media) < _MEDIA_MAX:
            _media[(kind, medium)] = found
    seen.medium, seen.media = medium, <tuple>found
    return <tuple>found


# A further field's name as written (',"name":') and which event types have a field of that name,
# in slots by the name's str object (the parser makes each name once, so a few slots hold them all;
# each slot keeps its name alive, so its address names it), filled from a dict by the name.
cdef enum:
    _NAME_SLOTS = 64
    _OWN_STORED = 1
    _OWN_REMOVED = 2
    _OWN_CLEARED = 4
cdef PyObject* _name_of[_NAME_SLOTS]
cdef PyObject* _name_json[_NAME_SLOTS]
cdef unsigned char _name_own[_NAME_SLOTS]
# And the value last written under the slot's name, where it is an immutable scalar (an exact int or
# str, None, a bool: held, so its address names it), with the name and the value as written once the
# same object came twice in a row (``',"name":value'``, held; NULL before): an engine's fixed further
# fields (vLLM's group_idx, kv_cache_spec_kind) are then one copy
cdef PyObject* _name_value[_NAME_SLOTS]
cdef PyObject* _name_pair[_NAME_SLOTS]
cdef dict _names = {}  # name -> (its JSON, its own bits)
cdef int _NAMES_MAX = 4096


cdef inline void _name_forget(Py_ssize_t slot) noexcept:
    """The slot's last value and its pair dropped."""
    Py_XDECREF(_name_value[slot])
    Py_XDECREF(_name_pair[slot])
    _name_value[slot] = _name_pair[slot] = NULL


cdef Py_ssize_t _name_slot(object key) except -1:
    """``key``'s (an exact str) slot, filled for it where it held another name."""
    cdef Py_ssize_t slot = <Py_ssize_t>(((<size_t><PyObject*>key >> 4) * <size_t>0x9E3779B97F4A7C15ULL) >> 58)
    if _name_of[slot] == <PyObject*>key:
        return slot
    found = _names.get(key)
    if found is None:
        json = b"," + _encoder.encode(key) + b":"  # _put_str's bytes: msgspec's
        own = (
            (_OWN_STORED if key in _STORED_OWN else 0)
            | (_OWN_REMOVED if key in _REMOVED_OWN else 0)
            | (_OWN_CLEARED if key in _CLEARED_OWN else 0)
        )
        found = (json, own)
        if len(_names) < _NAMES_MAX:
            _names[key] = found
    json = (<tuple>found)[0]
    Py_INCREF(key)
    Py_INCREF(json)
    Py_XDECREF(_name_of[slot])
    Py_XDECREF(_name_json[slot])
    _name_of[slot], _name_json[slot] = <PyObject*>key, <PyObject*>json
    _name_forget(slot)
    _name_own[slot] = <unsigned char>(<tuple>found)[1]
    return slot


cdef bint _put_extra(Buffer* out, object extra, unsigned char own) except -1:
    """The further fields after the event's own; False (nothing usable written) where the reference
    would not simply append them: a name of the event's own (``own``: it overwrites it in place),
    or not a str."""
    cdef Py_ssize_t pos = 0, slot, start
    cdef PyObject* key
    cdef PyObject* value
    if not PyDict_CheckExact(extra):
        return False
    while PyDict_Next(extra, &pos, &key, &value):
        if not PyUnicode_CheckExact(<object>key):
            return False
        slot = _name_slot(<object>key)
        if _name_own[slot] & own:
            return False
        if value == _name_value[slot] and _name_pair[slot] != NULL:
            _put_bytes(out, <bytes>_name_pair[slot])
            continue
        start = out.size
        _put_bytes(out, <bytes>_name_json[slot])
        _put_further(out, <object>value)
        if value == _name_value[slot]:  # the second time in a row: kept as written
            pair = PyBytes_FromStringAndSize(out.data + start, out.size - start)
            Py_INCREF(pair)
            _name_pair[slot] = <PyObject*>pair
        elif _scalar(<object>value):
            _name_forget(slot)
            Py_INCREF(<object>value)
            _name_value[slot] = value
    return True


cdef inline bint _scalar(object value) noexcept:
    """Whether ``value`` is immutable and written as it is: None, a bool, an exact int or str."""
    return value is None or value is True or value is False or PyLong_CheckExact(value) or PyUnicode_CheckExact(value)


cdef bint _put_hashes(Buffer* out, object hashes) except -1:
    """A list of block hashes as their quoted texts; False for anything else (not all written).
    Room for every hash as a quoted u64 and its comma is reserved once and each written in place
    (a negative int64's sign and 19 digits fit in it too); bytes (their hex) in place, after room
    for them is reserved; any other (a wider int) through :func:`_put_hash`, the room after it
    reserved again."""
    cdef Py_ssize_t i, n, size
    cdef uint64_t value
    cdef char* at
    if type(hashes) is Hashes:
        return _put_packed_hashes(out, <Hashes>hashes)
    if not PyList_CheckExact(hashes):
        return False
    n = PyList_GET_SIZE(hashes)
    _reserve(out, 2 + 23 * n)  # 20 digits, two quotes and a comma each; the brackets
    at = out.data + out.size
    at[0] = 91  # "["
    at += 1
    for i in range(n):
        if i:
            at[0] = 44  # ","
            at += 1
        item = <object>PyList_GET_ITEM(hashes, i)
        if u64_of(item, &value):
            at[0] = 34  # '"'
            at = _write_u64(at + 1, value)
            at[0] = 34
            at += 1
            continue
        if negative_of(item, &value):  # a signed hash's negative half (SGLang's): '"-', its magnitude
            at[0] = 34
            at[1] = 45  # "-"
            at = _write_u64(at + 2, value)
            at[0] = 34
            at += 1
            continue
        out.size = at - out.data
        if PyBytes_CheckExact(item):  # a sha256 hash (vLLM's): two quotes and its hex, then the rest's room
            size = PyBytes_GET_SIZE(item)
            if out.size + 3 + 2 * size + 23 * (n - i - 1) > out.capacity:
                _reserve(out, 3 + 2 * size + 23 * (n - i - 1))
            at = out.data + out.size
            at[0] = 34  # '"'
            at = _write_hex(at + 1, <const unsigned char*>PyBytes_AS_STRING(item), size)
            at[0] = 34
            at += 1
            continue
        if not _put_hash(out, item):
            return False
        _reserve(out, 1 + 23 * (n - i - 1))
        at = out.data + out.size
    at[0] = 93  # "]"
    out.size = at + 1 - out.data
    return True


cdef bint _put_packed_hashes(Buffer* out, Hashes hashes) except -1:
    """Block hashes held as the wire sent them (a :class:`kvgateway.engine._tokens_c.Hashes`, never
    empty) as :func:`_put_hashes` writes their list: each u64 or int64 quoted in decimal, each
    32-byte hash quoted in hex; the room for all of them reserved once."""
    cdef Py_ssize_t i, n = hashes.count
    cdef uint64_t value
    cdef char* at
    cdef char* start
    # each hash after a comma and a quote (the first comma then the opening bracket): a sign, 20
    # digits or 64 hex digits, the quotes and the comma; the closing bracket
    _reserve(out, 1 + n * (3 + (2 * HASH_BLOB_SIZE if hashes.form == HASHES_BLOB else 21)))
    start = at = out.data + out.size
    for i in range(n):
        at[0] = 44  # ","
        at[1] = 34  # '"'
        at += 2
        if hashes.form == HASHES_BLOB:
            at = _write_hex(at, hashes.data + i * HASH_BLOB_SIZE, HASH_BLOB_SIZE)
        else:
            value = hash_bits(hashes, i)
            if hashes.form == HASHES_I64 and <int64_t>value < 0:
                at[0] = 45  # "-", then the magnitude
                at += 1
                value = 0 - value
            at = _write_u64(at, value)
        at[0] = 34
        at += 1
    start[0] = 91  # "["
    at[0] = 93  # "]"
    out.size = at + 1 - out.data
    return True


cdef int _put_tokens(Buffer* out, Tokens tokens) except -1:
    """token_ids held as the wire sent them (:class:`kvgateway.engine._tokens_c.Tokens`, never
    empty): the digits of each, as msgspec writes the list they read as."""
    cdef Py_ssize_t i, n = tokens.count
    cdef const uint32_t* ids = tokens.ids
    cdef char* at
    cdef char* start
    _reserve(out, 3 + 11 * n)  # a comma and 10 digits each, the closing bracket, two bytes beyond
    start = at = out.data + out.size
    for i in range(n):  # each after a comma: the first's is then the opening bracket
        at = _next_u32(at, ids[i])
    if n == 0:
        at += 1
    start[0] = 91  # "["
    at[0] = 93  # "]"
    out.size = at + 1 - out.data
    return 0


cdef int _put_ints(Buffer* out, object values) except -1:
    """token_ids: a list of exact ints in C, anything else as msgspec encodes it. The list's room is
    reserved once and each id written in place; a list with an int that is not a u64 (negative,
    wider) is written again from its start, an int at a time."""
    cdef Py_ssize_t i, n, start = out.size
    cdef uint64_t value
    cdef char* at
    if type(values) is Tokens:
        return _put_tokens(out, <Tokens>values)
    if PyList_CheckExact(values):
        n = PyList_GET_SIZE(values)
        _reserve(out, 2 + 21 * n)  # 20 digits and a comma each, the brackets
        at = out.data + start
        at[0] = 91  # "["
        at += 1
        for i in range(n):
            if not u64_of(<object>PyList_GET_ITEM(values, i), &value):
                break
            if i:
                at[0] = 44  # ","
                at += 1
            at = _write_u64(at, value)
        else:
            at[0] = 93  # "]"
            out.size = at + 1 - out.data
            return 0
        for i in range(n):
            if not PyLong_CheckExact(<object>PyList_GET_ITEM(values, i)):
                break
        else:
            _put_char(out, 91)
            for i in range(n):
                if i:
                    _put_char(out, 44)
                _put_int(out, <object>PyList_GET_ITEM(values, i))
            return _put_char(out, 93)
    return _put_bytes(out, _encoder.encode(values))


cdef tuple _opened(
    Buffer* out, object event, object kind, const char* opening, Py_ssize_t size, object medium, object hashes, _Seen seen
):
    """A block event's type and hashes (its ``medium`` and ``block_hashes``); its medium part and
    key, or None where the reference must write the event."""
    media = _medium_part(event, kind, medium, seen)
    if media is None:
        return None
    _put(out, opening, size)
    if not _put_hashes(out, hashes):
        return None
    return media


cdef object _put_stored(Buffer* out, object event):
    """A BlockStored's JSON; its filter key, or None where the reference must write it."""
    hashes = field(event, _BlockStored, _STORED.block_hashes, "block_hashes")
    medium = field(event, _BlockStored, _STORED.medium, "medium")
    media = _opened(out, event, STORED, _STORED_OPEN_C, _STORED_OPEN_SIZE, medium, hashes, _STORED_SEEN)
    if media is None:
        return None
    _put(out, _PARENT_BLOCK_HASH_C, _PARENT_BLOCK_HASH_SIZE)
    parent = field(event, _BlockStored, _STORED.parent_block_hash, "parent_block_hash")
    if parent is None:
        _put(out, "null", 4)
    elif not _put_hash(out, parent):
        return None
    _put(out, _TOKEN_IDS_C, _TOKEN_IDS_SIZE)
    _put_ints(out, slot_value(event, _TOKENS_AT))  # not made a list where the wire's ids are kept
    _put(out, _BLOCK_SIZE_C, _BLOCK_SIZE_SIZE)
    _put_value(out, field(event, _BlockStored, _STORED.block_size, "block_size"))
    _put(out, _LORA_ID_C, _LORA_ID_SIZE)
    _put_value(out, field(event, _BlockStored, _STORED.lora_id, "lora_id"))
    _put_bytes(out, <bytes>media[0])
    _put(out, _LORA_NAME_C, _LORA_NAME_SIZE)
    _put_value(out, field(event, _BlockStored, _STORED.lora_name, "lora_name"))
    if not _put_extra(out, field(event, _BlockStored, _STORED.extra, "extra"), _OWN_STORED):
        return None
    _put_char(out, 125)
    return media[1]


cdef object _put_removed(Buffer* out, object event):
    hashes = field(event, _BlockRemoved, _REMOVED.block_hashes, "block_hashes")
    medium = field(event, _BlockRemoved, _REMOVED.medium, "medium")
    media = _opened(out, event, REMOVED, _REMOVED_OPEN_C, _REMOVED_OPEN_SIZE, medium, hashes, _REMOVED_SEEN)
    if media is None:
        return None
    _put_bytes(out, <bytes>media[0])
    if not _put_extra(out, field(event, _BlockRemoved, _REMOVED.extra, "extra"), _OWN_REMOVED):
        return None
    _put_char(out, 125)
    return media[1]


cdef object _CLEARED_KEY = None


cdef object _put_cleared(Buffer* out, object event):
    global _CLEARED_KEY
    _put(out, _CLEARED_OPEN_C, _CLEARED_OPEN_SIZE)
    if not _put_extra(out, field(event, _AllBlocksCleared, _CLEARED.extra, "extra"), _OWN_CLEARED):
        return None
    _put_char(out, 125)
    if _CLEARED_KEY is None:
        _CLEARED_KEY = event_key(event)
    return _CLEARED_KEY


cdef object _put_event(Buffer* out, object event, bint careful):
    """One event's JSON and its filter key; where the fast paths do not apply, the reference's.
    ``careful``: a value a fast path raised on (msgspec refused it where the reference may never
    encode it: overwritten) is the reference's to write, here; otherwise the error is the caller's
    (:func:`_put_events`, which writes the batch again carefully: a try block per event cost more
    than the rare second pass)."""
    cdef Py_ssize_t start = out.size
    kind = type(event)
    key = None
    if careful:
        try:
            key = _put_known(out, event, kind)
        except (TypeError, ValueError, AttributeError, OverflowError):
            key = None
    else:
        key = _put_known(out, event, kind)
    if key is None:
        out.size = start
        _put_bytes(out, _encoder.encode(render_event(event)))
        key = event_key(event)
    return key


cdef inline object _put_known(Buffer* out, object event, object kind):
    """A block event's JSON and filter key by its writer; None (anything written unused) otherwise."""
    if kind is _BlockStored:
        return _put_stored(out, event)
    if kind is _BlockRemoved:
        return _put_removed(out, event)
    if kind is _AllBlocksCleared:
        return _put_cleared(out, event)
    return None


cdef object _EncodedEvents = messages.EncodedEvents
cdef object _BATCH = messages.BATCH
# The three Structs a batch makes here, made as their constructors make them without calling them
# (engine/_direct.pxd), where a check at import finds them the same; otherwise called (DIRECT says)
cdef Maker _events_maker, _batch_maker, _message_maker
cdef list _held = []  # the classes and defaults the makers point at
maker_init(&_events_maker, messages.EncodedEvents, ("body", "ends", "counts"), _held, type(msgspec.Struct), member_slot)
maker_init(&_batch_maker, messages.EncodedBatch, ("message", "_prefix", "_ends"), _held, type(msgspec.Struct), member_slot)
maker_init(&_message_maker, messages.OutMessage, ("data", "type", "id"), _held, type(msgspec.Struct), member_slot)
DIRECT = {
    "EncodedEvents": bool(_events_maker.direct),
    "EncodedBatch": bool(_batch_maker.direct),
    "OutMessage": bool(_message_maker.direct),
}
"""By class name: whether its instances are made here without its constructor."""

cdef list _COUNTS = [None] * 128
"""The events' counts by type (``EncodedEvents.counts``, a tuple) of a batch of under 8 stored and 8
removed events, at most one clear and none of another type, each made once: by
``(stored * 8 + removed) * 2 + cleared``."""


cdef tuple _counts(Py_ssize_t stored, Py_ssize_t removed, Py_ssize_t cleared, Py_ssize_t other):
    cdef Py_ssize_t at
    if stored >= 8 or removed >= 8 or cleared >= 2 or other:
        return (stored, removed, cleared, other)
    at = (stored * 8 + removed) * 2 + cleared
    found = _COUNTS[at]
    if found is None:
        found = _COUNTS[at] = (stored, removed, cleared, other)
    return <tuple>found
cdef Py_ssize_t _BODY_AT = field_offset(messages.EncodedEvents, "body")
cdef Py_ssize_t _ENDS_AT = field_offset(messages.EncodedEvents, "ends")
cdef array _ENDS = array("q")


cdef Buffer _out = Buffer(NULL, 0, 0)
"""Reused by every call (the GIL serialises them, and nothing called while writing writes here): a
fresh buffer per batch cost more in page faults than the writing itself."""
cdef Py_ssize_t _KEPT = 1 << 20  # a larger one (a huge batch) is given back after its call


cdef tuple _put_events(list events, Py_ssize_t n, array ends, Py_ssize_t* counts, bint careful):
    """The events' JSON in :data:`_out`, each one's end in ``ends``; their filter keys. ``counts``:
    the BlockStored, BlockRemoved and AllBlocksCleared among them (the reference's event_counts)."""
    cdef Py_ssize_t i
    cdef tuple keys = PyTuple_New(n)
    counts[0] = counts[1] = counts[2] = 0
    _out.size = 0
    for i in range(n):
        if i:
            _put_char(&_out, 44)
        event = <object>PyList_GET_ITEM(events, i)
        key = _put_event(&_out, event, careful)
        kind = type(event)  # counted here, for the ingest's metrics
        if kind is _BlockStored:
            counts[0] += 1
        elif kind is _BlockRemoved:
            counts[1] += 1
        elif kind is _AllBlocksCleared:
            counts[2] += 1
        Py_INCREF(key)
        PyTuple_SET_ITEM(keys, i, key)
        ends.data.as_longlongs[i] = _out.size
    return keys


def _events_json_c(events):
    cdef Py_ssize_t n
    cdef Py_ssize_t counts[3]
    cdef PyObject* values[3]
    cdef array ends
    if not PyList_CheckExact(events):
        events = list(events)
    n = PyList_GET_SIZE(events)
    ends = clone(_ENDS, n, False)
    if _out.data == NULL:
        _out.data = <char*>PyMem_Malloc(65536)
        if _out.data == NULL:
            raise MemoryError()
        _out.capacity = 65536
    try:
        try:
            keys = _put_events(events, n, ends, counts, False)
        except (TypeError, ValueError, AttributeError, OverflowError):  # again, each event's own error handled
            keys = _put_events(events, n, ends, counts, True)
        body = PyBytes_FromStringAndSize(_out.data, _out.size)
    finally:
        if _out.capacity > _KEPT:
            PyMem_Free(_out.data)
            _out.data = NULL
            _out.capacity = 0
    found = _counts(counts[0], counts[1], counts[2], n - counts[0] - counts[1] - counts[2])
    values[0], values[1], values[2] = <PyObject*>body, <PyObject*>ends, <PyObject*>found
    return make(&_events_maker, values), keys


# --- the batch message --------------------------------------------------------------------------

cdef object _epoch = None
cdef bytes _epoch_head = b""  # '{"type":"batch","id":"<epoch>:' as msgspec writes it
cdef dict _streams = {}  # stream -> b',"source":..,"dp_rank":..,"seq":"'
cdef int _STREAMS_MAX = 4096


cdef object _last_stream = None  # held: the identity test below is sound while it lives
cdef bytes _last_stream_part = b""


cdef bytes _stream_part(object stream):
    """The head's part for ``stream``; the last one's again for the same object (a stream's batches
    come with one tuple), without the tuple's hash and the dict's probe."""
    global _last_stream, _last_stream_part
    if stream is _last_stream:
        return _last_stream_part
    found = _streams.get(stream)
    if found is None:
        source, dp_rank = stream
        found = b',"source":' + _encoder.encode(source) + b',"dp_rank":' + _encoder.encode(dp_rank) + b',"seq":"'
        if len(_streams) < _STREAMS_MAX:
            _streams[stream] = found
    if type(stream) is tuple:  # immutable: the same object, the same part
        _last_stream, _last_stream_part = stream, <bytes>found
    return <bytes>found


cdef str _message_id(object epoch, const char* digits, Py_ssize_t count):
    """``epoch + ":" + str(offset)``, the offset's ``count`` digits at ``digits`` (as the head has
    them): made in place for an ASCII epoch."""
    cdef Py_ssize_t n
    cdef char* at
    if not PyUnicode_IS_ASCII(epoch):
        return epoch + ":" + digits[:count].decode()
    n = PyUnicode_GET_LENGTH(epoch)
    found = PyUnicode_New(n + 1 + count, 127)
    at = <char*>PyUnicode_DATA(found)
    memcpy(at, PyUnicode_1BYTE_DATA(epoch), n)
    at[n] = 58  # ":"
    memcpy(at + n + 1, digits, count)
    return found


cdef bytes _ends_bytes(object ends):
    """``ends.tobytes()``, copied from an ``array("q")`` itself."""
    if type(ends) is array and (<array>ends).ob_descr.typecode == 113:  # "q"
        return PyBytes_FromStringAndSize((<array>ends).data.as_chars, Py_SIZE(ends) * 8)
    return ends.tobytes()


def _batch_message_c(epoch, offset, stream, *, seq, ts, events):
    global _epoch, _epoch_head
    cdef Buffer head
    cdef char space[256]
    cdef Py_ssize_t prefix, size, digits
    cdef bytes body
    cdef char* at
    cdef PyObject* values[3]
    if not (PyUnicode_CheckExact(epoch) and PyLong_CheckExact(offset) and PyLong_CheckExact(seq)):
        return batch_message_reference(epoch, offset, stream, seq=seq, ts=ts, events=events)
    if epoch is not _epoch:
        quoted = _encoder.encode(epoch)
        _epoch_head = b'{"type":"batch","id":' + quoted[: len(quoted) - 1] + b":"
        _epoch = epoch
    head.data = space
    head.size = 0
    head.capacity = 256
    stream_part = _stream_part(stream)
    if PyBytes_GET_SIZE(_epoch_head) + PyBytes_GET_SIZE(stream_part) > 160:
        return batch_message_reference(epoch, offset, stream, seq=seq, ts=ts, events=events)  # long names: rare
    _put_bytes(&head, _epoch_head)
    digits = head.size
    _put_int(&head, offset)
    digits = head.size - digits
    _put_bytes(&head, _OFFSET)
    _put_int(&head, offset)
    _put_bytes(&head, stream_part)
    _put_int(&head, seq)
    _put_bytes(&head, _TS)
    ts_json = _encoder.encode(ts)
    if head.size + PyBytes_GET_SIZE(ts_json) + 11 > 256:
        return batch_message_reference(epoch, offset, stream, seq=seq, ts=ts, events=events)
    _put_bytes(&head, ts_json)
    _put_bytes(&head, _EVENTS)
    body = field(events, _EncodedEvents, _BODY_AT, "body")
    prefix = head.size
    size = prefix + PyBytes_GET_SIZE(body) + 2
    data = PyBytes_FromStringAndSize(NULL, size)
    at = PyBytes_AS_STRING(data)
    memcpy(at, head.data, prefix)
    memcpy(at + prefix, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body))
    at[size - 2] = 93  # "]"
    at[size - 1] = 125  # "}"
    message_id = _message_id(epoch, head.data + PyBytes_GET_SIZE(_epoch_head), digits)
    ends = _ends_bytes(field(events, _EncodedEvents, _ENDS_AT, "ends"))
    values[0], values[1], values[2] = <PyObject*>data, <PyObject*>_BATCH, <PyObject*>message_id
    message = make(&_message_maker, values)
    prefix_int = <object>prefix
    values[0], values[1], values[2] = <PyObject*>message, <PyObject*>prefix_int, <PyObject*>ends
    return make(&_batch_maker, values)


# The public names: the C writers in place of the reference's (which the rest of the included code
# does not call).
batch_message_reference = batch_message
events_json = _events_json_c
batch_message = _batch_message_c
