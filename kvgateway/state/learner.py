"""The learned token chains behind lookups by tokens (``ChainLearner``, ``block_digests``): the
compiled learner (``_learner_c.pyx``, a C hash table and ring) where it was built, else the
pure-Python one (:mod:`kvgateway.state._learner_py`, the reference: the same API, the same answers,
evictions and order, checked by tests/unit/test_core_differential.py).

See :mod:`kvgateway.state._learner_py` for what the table holds and how it ages entries out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvgateway.runtime.extensions import load
from kvgateway.state import _learner_py
from kvgateway.state._learner_py import (
    DEFAULT_MAX_LEARNED_BLOCKS,
    LEARNED_FLOOR,
    LEARNED_PER_RESIDENT,
    block_digests,
)

__all__ = [
    "DEFAULT_MAX_LEARNED_BLOCKS",
    "LEARNED_FLOOR",
    "LEARNED_PER_RESIDENT",
    "ChainLearner",
    "block_digests",
]

if TYPE_CHECKING:  # one API: the reference's
    from kvgateway.state._learner_py import ChainLearner
else:
    _compiled = load("kvgateway.state._learner_c")
    ChainLearner = _learner_py.ChainLearner if _compiled is None else _compiled.ChainLearner
