# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled state digest: :mod:`kvgateway.state._digest_py`'s ``element``, ``elements_sum`` and
``prefix_state`` with FNV-1a run in C over each hash's protocol text, the text never built.

The same sums for every hash the reference takes (checked by tests/unit/test_core_differential.py):

- an int in the int64 or uint64 range is written in C, in decimal with its sign, as ``str()``
  writes it (two digits a step: ``_fnv_decimal`` in state/_hashtable.pxd, which the index's
  pass shares to keep its sums from the keys it reads); a wider one (the wire sends none, but a Python int may be any size) goes through
  ``str()`` itself, so its text is Python's by construction;
- bytes are read two lowercase hex digits a byte, as ``bytes.hex()`` writes them;
- anything else goes through ``.hex()``, as in the reference (and fails there alike).

FNV-1a's state and the sum are unsigned 64-bit C integers on purpose: the reference masks its
arithmetic to 64 bits (``& MASK``), which is what C's unsigned wrap-around does.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint64_t

from kvgateway._pylong cimport negative_of, u64_of  # an int of -2**63 to 2**64-1 read from its digits
from kvgateway.state._hashtable cimport _fnv, _fnv_decimal, _fnv_hex, _negative_element  # FNV-1a over the texts, shared with the index's pass

from kvgateway.state._digest_py import EMPTY, FNV_OFFSET, FNV_PRIME, MASK, WIDE_FROM, hex_digest

cdef uint64_t _OFFSET = 0xCBF29CE484222325ULL


cdef uint64_t _fnv_text(uint64_t state, bytes text):
    return _fnv(state, <const unsigned char*>PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text))


cdef uint64_t _fnv_int(uint64_t state, object value) except? 0:
    """FNV-1a over ``str(value)`` for an exact int of any size."""
    cdef uint64_t magnitude
    if u64_of(value, &magnitude):  # 0 to 2**64-1: every u64 hash the wire sends
        return _fnv_decimal(state, magnitude)
    if negative_of(value, &magnitude):  # -2**63 to -1: a signed hash's negative half
        return _negative_element(state, magnitude)
    return _fnv_text(state, str(value).encode())  # beyond 64 bits


cdef uint64_t _element(uint64_t prefix, object block_hash) except? 0:
    """One hash's element from its group's prefix state (the reference's inner loop)."""
    cdef type kind = type(block_hash)
    if kind is int:
        return _fnv_int(prefix, block_hash)
    if kind is bytes:
        return _fnv_hex(prefix, <const unsigned char*>PyBytes_AS_STRING(block_hash), PyBytes_GET_SIZE(block_hash))
    return _fnv_text(prefix, block_hash.hex().encode())


cdef uint64_t _state(object value):
    """A Python int as the reference's arithmetic sees it: modulo 2**64."""
    return <uint64_t>(value & MASK)


def prefix_state(object medium, object group_idx):
    """FNV-1a's state after ``medium\\ngroup_idx\\n``: where every element of that group starts."""
    return _fnv_text(_OFFSET, f"{medium}\n{group_idx}\n".encode())


def element(object medium, object group_idx, object block_hash):
    """One key's element; ``block_hash`` as the index holds it (int or bytes) or as protocol text."""
    cdef uint64_t prefix = _fnv_text(_OFFSET, f"{medium}\n{group_idx}\n".encode())
    if isinstance(block_hash, str):
        return _fnv_text(prefix, block_hash.encode())
    return _element(prefix, block_hash)


def elements_sum(object prefix, object hashes):
    """The sum (mod 2**64) of the elements of ``hashes`` (distinct) of the group whose
    :func:`prefix_state` is ``prefix``."""
    cdef uint64_t start = _state(prefix)
    cdef uint64_t total = 0  # wraps around modulo 2**64, as the reference's final mask
    cdef object block_hash
    for block_hash in hashes:
        total += _element(start, block_hash)
    return total
