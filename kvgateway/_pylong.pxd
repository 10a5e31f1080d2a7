# cython: language_level=3
"""An exact int's value as a C ``uint64_t``, read from CPython's own digits: for the compiled core's
modules (``cimport``-ed, so compiled into each; nothing of it exists at run time).

The engines' block hashes are u64 (three 30-bit digits for most) and their token ids small (one
digit). Cython's own conversion takes CPython's general path for three digits, and the C API's
(``PyLong_AsLongLongAndOverflow``) is a call per int: reading the digits in line is a few
instructions (cachegrind: a tenth of the index's and the renderer's conversions).
"""

from libc.stdint cimport uint64_t


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
    """
    bint KV_LONG_DIGITS_READ
    bint KV_LONG_NEGATIVE(object h) noexcept
    Py_ssize_t KV_LONG_DIGIT_COUNT(object h) noexcept
    uint64_t KV_LONG_DIGIT(object h, Py_ssize_t i) noexcept


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
