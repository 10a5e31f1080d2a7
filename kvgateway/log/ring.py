"""The resume ring: the recent messages of the ordered log, bounded by count and bytes, with the
filtered variant of each batch for each event filter that asked, made once and cached
(:class:`Ring`); and the append that fills it (:class:`RingAppender`). The compiled ones
(``_ring_c.pyx``) where they were built, else the pure-Python ones (:mod:`kvgateway.log._ring_py`,
the reference: the same entries, offsets, bounds and calls, checked by
tests/unit/log/test_ring_differential.py).

See :mod:`kvgateway.log._ring_py` for what each holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvgateway.log import _ring_py
from kvgateway.runtime.extensions import load

__all__ = ["Ring", "RingAppender"]

if TYPE_CHECKING:  # one API: the reference's
    from kvgateway.log._ring_py import Ring, RingAppender
else:
    _compiled = load("kvgateway.log._ring_c")
    Ring = _ring_py.Ring if _compiled is None else _compiled.Ring
    RingAppender = _ring_py.RingAppender if _compiled is None else _compiled.RingAppender
