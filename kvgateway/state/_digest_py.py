"""The state digest: one 64-bit number per stream that any client can compute from its own view.

A router that keeps its own index (from the ``state`` messages and batches, or straight from the
engines' events) compares its digest with the gateway's and knows at once whether its view drifted.

The algorithm (docs/protocol.md, "State digest", with test vectors):

- a key is ``(medium, group_idx, hash)`` as ``state`` messages carry it: the upper-cased medium name,
  the group index as an integer, the hash as the protocol's text (decimal with its sign for
  integer hashes, lowercase hex for bytes);
- ``element(key)`` is FNV-1a 64-bit over the UTF-8 bytes of ``medium + "\\n" + str(group_idx) +
  "\\n" + hash``;
- the digest of a stream is the sum of the elements of its resident keys (refs >= 1), modulo
  2**64, written as 16 lowercase hex digits.

A sum is order-independent and updated in O(1) per key: add when a key becomes resident (refs
0 -> 1), subtract when it leaves (1 -> 0); references beyond the first do not change it.

Sans-I/O, pure functions and ints. The index (kvgateway/state/occupancy.py) keeps a sum per
(medium, group_idx) once tracking is on, and starts each from the group's FNV state after its
``medium\\ngroup_idx\\n`` prefix, so an element costs the hash text's bytes only.

This module is the pure-Python reference; ``_digest_c.pyx`` is its compiled twin, and
:mod:`kvgateway.state.digest` chooses between them at import.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from kvgateway.engine.wire import Hash

__all__ = [
    "EMPTY",
    "FNV_OFFSET",
    "FNV_PRIME",
    "MASK",
    "WIDE_FROM",
    "element",
    "elements_sum",
    "hex_digest",
    "prefix_state",
]

FNV_OFFSET: Final = 0xCBF29CE484222325
FNV_PRIME: Final = 0x100000001B3
MASK: Final = 0xFFFFFFFFFFFFFFFF
EMPTY: Final = "0000000000000000"
"""The digest of a stream with no resident block."""


def _fnv(state: int, data: bytes) -> int:
    for byte in data:
        state = ((state ^ byte) * FNV_PRIME) & MASK
    return state


def prefix_state(medium: str, group_idx: int) -> int:
    """FNV-1a's state after ``medium\\ngroup_idx\\n``: where every element of that group starts."""
    return _fnv(FNV_OFFSET, f"{medium}\n{group_idx}\n".encode())


def _text(block_hash: Hash) -> bytes:
    # the protocol's rendering (kvgateway.protocol.render.hash_text), as ASCII bytes
    return str(block_hash).encode() if type(block_hash) is int else block_hash.hex().encode()  # type: ignore[union-attr]


def element(medium: str, group_idx: int, block_hash: Hash | str) -> int:
    """One key's element; ``block_hash`` as the index holds it (int or bytes) or as protocol text."""
    text = block_hash.encode() if isinstance(block_hash, str) else _text(block_hash)
    return _fnv(prefix_state(medium, group_idx), text)


WIDE_FROM: Final = 64
"""From this many hashes on, :func:`elements_sum` hashes them side by side (:func:`_wide_sum`)."""


def elements_sum(prefix: int, hashes: Collection[Hash]) -> int:
    """The sum (mod 2**64) of the elements of ``hashes`` (distinct) of the group whose
    :func:`prefix_state` is ``prefix``. The hot loop of the digest: inlined FNV-1a, or many
    hashes side by side (a group's first sum, a big batch)."""
    if len(hashes) >= WIDE_FROM:
        return _wide_sum(prefix, hashes)
    total = 0
    prime = FNV_PRIME
    mask = MASK
    for block_hash in hashes:
        state = prefix
        for byte in str(block_hash).encode() if type(block_hash) is int else block_hash.hex().encode():  # type: ignore[union-attr]
            state = ((state ^ byte) * prime) & mask
        total += state
    return total & mask


def _wide_sum(prefix: int, hashes: Collection[Hash]) -> int:
    """:func:`elements_sum` of many hashes, FNV-1a run on all texts of one length at once.

    One Python int holds every text's 64-bit state in a 128-bit lane (room for the product by the
    41-bit prime before the lane mask), so each byte position costs one XOR, one multiplication
    and one AND over the whole int (C loops) instead of a Python step per text: several times
    faster from a few hundred texts on, for the seconds a million blocks would otherwise take."""
    by_length: dict[int, list[bytes]] = {}
    for block_hash in hashes:
        text = str(block_hash).encode() if type(block_hash) is int else block_hash.hex().encode()  # type: ignore[union-attr]
        by_length.setdefault(len(text), []).append(text)
    total = 0
    for length, texts in by_length.items():
        for start in range(0, len(texts), _WIDE_CHUNK):  # bounded memory: a few MB at a time
            total += _lanes(prefix, length, texts[start : start + _WIDE_CHUNK])
    return total & MASK


_WIDE_CHUNK: Final = 16384
_LANE_SUM: Final = (1 << 128) - 1
"""Lanes summed by one remainder: 2**128 is 1 modulo it, and the sum of the lanes is smaller."""


def _lanes(prefix: int, length: int, texts: list[bytes]) -> int:
    """The sum of the elements of ``texts`` (each ``length`` bytes long), not reduced."""
    count = len(texts)
    zero = bytes(8)
    mask = int.from_bytes((MASK.to_bytes(8, "little") + zero) * count, "little")
    state = int.from_bytes((prefix.to_bytes(8, "little") + zero) * count, "little")
    matrix = b"".join(texts)  # text i's byte j at i * length + j
    column = bytearray(16 * count)
    for j in range(length):
        column[0::16] = matrix[j::length]  # byte j of every text, each at the bottom of its lane
        state = ((state ^ int.from_bytes(column, "little")) * FNV_PRIME) & mask
    return state % _LANE_SUM


def hex_digest(value: int) -> str:
    """A digest as the protocol writes it: 16 lowercase hex digits."""
    return f"{value & MASK:016x}"
