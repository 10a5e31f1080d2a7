# cython: language_level=3
"""An exact int's value as a C ``uint64_t``, read from CPython's own digits, and its ``hash()``; an
unsigned int of msgpack's big-endian bytes: for the compiled core's modules (``cimport``-ed, so
compiled into each; nothing of it exists at run time).

The engines' block hashes are u64 (three 30-bit digits for most) and their token ids small (one
digit). Cython's own conversion takes CPython's general path for three digits, and the C API's
(``PyLong_AsLongLongAndOverflow``) is a call per int: reading the digits in line is a few
instructions (cachegrind: a tenth of the index's and the renderer's conversions).
"""

from cpython.long cimport PyLong_FromLongLong, PyLong_FromUnsignedLongLong
from cpython.object cimport PyObject_Hash
from libc.stdint cimport uint16_t, uint32_t, uint64_t


cdef extern from *:
    """
    /* An int's digits, read where Cython reads them (its own macros, expanded where these are used,
       after Cython defines them): 30-bit digits on every CPython this package supports. */
    #if CYTHON_USE_PYLONG_INTERNALS && PYLONG_BITS_IN_DIGIT == 30
      #define KV_LONG_DIGITS_READ 1
      #define KV_LONG_NEGATIVE(h) __Pyx_PyLong_IsNeg(h)
      #define KV_LONG_DIGIT_COUNT(h) __Pyx_PyLong_DigitCount(h)
      #define KV_LONG_DIGIT(h, i) ((uint64_t)__Pyx_PyLong_Digits(h)[i])
    #else
      #define KV_LONG_DIGITS_READ 0
      #define KV_LONG_NEGATIVE(h) 0
      #define KV_LONG_DIGIT_COUNT(h) 0
      #define KV_LONG_DIGIT(h, i) 0
    #endif
    /* And written: an int of n digits made (CPython's _PyLong_New, which sets its sign and size)
       and its digits set, where they are read and the interpreter still has _PyLong_New. */
    #if KV_LONG_DIGITS_READ && PY_VERSION_HEX < 0x030D0000
      #define KV_LONG_DIGITS_WRITTEN 1
      #define KV_LONG_NEW(n) ((PyObject *)_PyLong_New(n))
      #define KV_LONG_SET_DIGIT(h, i, d) (__Pyx_PyLong_Digits(h)[i] = (digit)(d))
    #else
      #define KV_LONG_DIGITS_WRITTEN 0
      #define KV_LONG_NEW(n) PyLong_FromLong(0)
      #define KV_LONG_SET_DIGIT(h, i, d) ((void)0)
    #endif
    """
    bint KV_LONG_DIGITS_READ
    bint KV_LONG_NEGATIVE(object h) noexcept
    Py_ssize_t KV_LONG_DIGIT_COUNT(object h) noexcept
    uint64_t KV_LONG_DIGIT(object h, Py_ssize_t i) noexcept
    bint KV_LONG_DIGITS_WRITTEN
    object KV_LONG_NEW(Py_ssize_t n)
    void KV_LONG_SET_DIGIT(object h, Py_ssize_t i, uint64_t d) noexcept


cdef extern from "Python.h":
    # does not raise for an exact int: an overflow is reported through its flag
    long long PyLong_AsLongLongAndOverflow(object value, int* overflow) noexcept


cdef inline bint u64_of(object h, uint64_t* value) except -1:
    """Whether ``h`` is an int (exactly) of 0 to 2**64-1, then in ``value``. Read from its digits
    where Cython can; otherwise converted, an overflow saying it is out of range (a try block
    around the conversion cost as much as the conversion)."""
    cdef Py_ssize_t size
    if type(h) is not int:
        return False
    if KV_LONG_DIGITS_READ:
        if KV_LONG_NEGATIVE(h):
            return False
        size = KV_LONG_DIGIT_COUNT(h)
        if size == 0:
            value[0] = 0
        elif size == 1:
            value[0] = KV_LONG_DIGIT(h, 0)
        elif size == 2:
            value[0] = (KV_LONG_DIGIT(h, 1) << 30) | KV_LONG_DIGIT(h, 0)
        elif size == 3 and KV_LONG_DIGIT(h, 2) < 16:  # 4 bits above the 60 of the two below
            value[0] = (KV_LONG_DIGIT(h, 2) << 60) | (KV_LONG_DIGIT(h, 1) << 30) | KV_LONG_DIGIT(h, 0)
        else:
            return False  # 2**64 or more
        return True
    try:
        value[0] = h  # a negative or larger int raises here
    except OverflowError:
        return False
    return True


cdef inline bint negative_of(object h, uint64_t* magnitude) except -1:
    """Whether ``h`` is an int (exactly) of -2**63 to -1 (a signed 64-bit hash's negative half, as
    SGLang's and older vLLM's engines send half their hashes), then its magnitude (1 to 2**63) in
    ``magnitude``: :func:`u64_of`'s twin for the other half of the int64 range."""
    cdef Py_ssize_t size
    cdef long long small
    cdef int overflow = 0
    if type(h) is not int:
        return False
    if KV_LONG_DIGITS_READ:
        if not KV_LONG_NEGATIVE(h):
            return False
        size = KV_LONG_DIGIT_COUNT(h)
        if size == 1:
            magnitude[0] = KV_LONG_DIGIT(h, 0)
        elif size == 2:
            magnitude[0] = (KV_LONG_DIGIT(h, 1) << 30) | KV_LONG_DIGIT(h, 0)
        elif size == 3 and KV_LONG_DIGIT(h, 2) <= 8:  # 2**63 at most: 8 << 60 and nothing below
            magnitude[0] = (KV_LONG_DIGIT(h, 2) << 60) | (KV_LONG_DIGIT(h, 1) << 30) | KV_LONG_DIGIT(h, 0)
            if magnitude[0] > (<uint64_t>1 << 63):
                return False
        else:
            return False
        return True
    small = PyLong_AsLongLongAndOverflow(h, &overflow)
    if overflow != 0 or small >= 0:
        return False
    magnitude[0] = (<uint64_t>(-(small + 1))) + 1  # INT64_MIN's too, without overflow
    return True


cdef inline object negative_long(uint64_t magnitude):
    """The int ``-magnitude`` (``magnitude`` 1 to 2**63): :func:`negative_of`'s answer made back."""
    return PyLong_FromLongLong(-<long long>(magnitude - 1) - 1)


cdef inline object u64_long(uint64_t value):
    """The int ``value`` (``PyLong_FromUnsignedLongLong``): one of 31 to 64 bits (a block hash: two
    or three digits) made as such, without counting its digits or taking them off one at a time."""
    if not KV_LONG_DIGITS_WRITTEN or value < (<uint64_t>1 << 30):
        return PyLong_FromUnsignedLongLong(value)  # one digit or none: the small ints are cached
    made = KV_LONG_NEW(2 if value < (<uint64_t>1 << 60) else 3)
    KV_LONG_SET_DIGIT(made, 0, value & 0x3FFFFFFF)
    KV_LONG_SET_DIGIT(made, 1, (value >> 30) & 0x3FFFFFFF)
    if value >= (<uint64_t>1 << 60):
        KV_LONG_SET_DIGIT(made, 2, value >> 60)
    return made


cdef extern from *:
    """
    /* CPython's int hash on a 64-bit build: the value modulo this prime (sys.hash_info.modulus). */
    #define KV_HASH_MODULUS ((uint64_t)0x1FFFFFFFFFFFFFFFULL)
    """
    const uint64_t HASH_MODULUS "KV_HASH_MODULUS"


cdef inline uint64_t u64_hash(uint64_t value) noexcept nogil:
    """``hash()`` of the int ``value`` (0 to 2**64-1) as a 64-bit CPython works it out: the value
    modulo :data:`HASH_MODULUS`, 2**61 - 1 (2**61 is 1 modulo it, so the bits above 61 fold onto the
    rest once). Its callers check once that the interpreter hashes so."""
    value = (value & HASH_MODULUS) + (value >> 61)
    return value - HASH_MODULUS if value >= HASH_MODULUS else value


cdef inline Py_hash_t int_hash(object h, bint in_line) except? -1:
    """``hash(h)``, Python's own: an int64 or u64 int's worked out here from its digits where ``in_line`` (the
    caller's check, once at import, that ``sys.hash_info.modulus`` is :data:`HASH_MODULUS`), since
    CPython's ``long_hash`` is a call and a loop of modular steps; anything else hashed by CPython."""
    cdef uint64_t value
    if in_line:
        if u64_of(h, &value):
            return <Py_hash_t>u64_hash(value)
        if negative_of(h, &value):
            return negative_hash(value)
    return PyObject_Hash(h)


cdef inline Py_hash_t negative_hash(uint64_t magnitude) noexcept nogil:
    """``hash(-magnitude)`` (``magnitude`` 1 to 2**63), as :func:`u64_hash` works it out: -x hashes
    to -hash(x), except that -1 is -2 (the error value)."""
    cdef Py_hash_t negative = -<Py_hash_t>u64_hash(magnitude)
    return -2 if negative == -1 else negative


cdef extern from *:
    """
    /* The unsigned int of 2, 4 or 8 big-endian bytes at p (msgpack's ints, lengths and floats): one
       load and a byte swap where the compiler has them and the host is little-endian, else a
       byte at a time. */
    #include <string.h>
    #if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
      static inline uint16_t kv_be16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return __builtin_bswap16(v); }
      static inline uint32_t kv_be32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return __builtin_bswap32(v); }
      static inline uint64_t kv_be64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return __builtin_bswap64(v); }
    #else
      static inline uint16_t kv_be16(const unsigned char *p) { return (uint16_t)(((unsigned)p[0] << 8) | p[1]); }
      static inline uint32_t kv_be32(const unsigned char *p) {
          return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
      }
      static inline uint64_t kv_be64(const unsigned char *p) { return ((uint64_t)kv_be32(p) << 32) | kv_be32(p + 4); }
    #endif
    """
    uint16_t kv_be16(const unsigned char* p) noexcept nogil
    uint32_t kv_be32(const unsigned char* p) noexcept nogil
    uint64_t kv_be64(const unsigned char* p) noexcept nogil
