"""The state digest (``element``, ``elements_sum``, ``prefix_state``, ``hex_digest``): the compiled
element loop (``_digest_c.pyx``, FNV-1a in C over the hashes' protocol text) where it was built,
else the pure-Python one (:mod:`kvgateway.state._digest_py`, the reference: the same sums for every
hash, checked by tests/unit/test_core_differential.py).

See :mod:`kvgateway.state._digest_py` for the algorithm and how the index keeps its sums."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvgateway.runtime.extensions import load
from kvgateway.state import _digest_py
from kvgateway.state._digest_py import EMPTY, FNV_OFFSET, FNV_PRIME, MASK, WIDE_FROM, hex_digest

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

if TYPE_CHECKING:  # one API: the reference's
    from kvgateway.state._digest_py import element, elements_sum, prefix_state
else:
    _chosen = load("kvgateway.state._digest_c") or _digest_py
    element = _chosen.element
    elements_sum = _chosen.elements_sum
    prefix_state = _chosen.prefix_state
