"""An array envelope of map or positional events decoded to the public batch (the pure-Python
reference of :func:`parse_batch`; its compiled twin, ``_batch_c.pyx``, parses what engines send
from the payload itself and leaves every other shape here: tests/unit/engine/
test_batch_differential.py).

Every shipped engine sends an array envelope: of map events (vLLM >= 0.24), or of positional ones
(SGLang, older vLLM). wire's two fast decoders each take one layout in one msgspec call, and the
chosen events core makes their private events the public ``BlockStored``, ``BlockRemoved`` and
``AllBlocksCleared`` (:mod:`kvgateway.engine._events_py`). Anything either decoder refuses (mixed
layouts, unknown types or keys, bad data) is the general path's, which also words the errors.

wire defines the types and hands them to both once (:func:`install`): it imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvgateway.engine._tokens_py import NotTokens

__all__ = ["install", "parse_batch"]

# wire's, given by install()
_Batch: Any = None
_fast_decoders: tuple[Any, Any] = (None, None)
_refused: tuple[type[BaseException], ...] = ()
_events_of: Callable[[Any], list[Any]] = list


def install(
    *,
    stored: type,
    removed: type,
    cleared: type,
    batch: type,
    fast_decoders: tuple[Any, Any],
    refused: tuple[type[BaseException], ...],
    events_of: Callable[[Any], list[Any]],
) -> None:
    """wire's types, once: the public events (the compiled twin makes them itself) and ``batch``;
    the fast decoders of an array envelope, of map events and of positional events; the errors
    they refuse a payload by; and the chosen events core's ``events_of``."""
    global _Batch, _fast_decoders, _refused, _events_of
    _Batch, _fast_decoders, _refused, _events_of = batch, fast_decoders, refused, events_of


class _Layout:
    """Which fast decoder an array envelope tries first: the one the last such batch decoded with.
    An engine keeps its layout, so the other one is tried (and fails, a few microseconds) only when
    the layout changes. A speed hint only: what either fast decoder takes, the other refuses."""

    __slots__ = ("positional",)

    def __init__(self) -> None:
        self.positional = False


_layout = _Layout()


def parse_batch(payload: bytes | memoryview) -> Any:
    """An array envelope of map events (vLLM >= 0.24: nearly every batch) or of positional events
    (SGLang, older vLLM) as the public ``Batch``, by the fast decoders; None where both refuse the
    payload, or its token ids send it to the general path (:class:`~kvgateway.engine._tokens_py.NotTokens`)."""
    for positional in (_layout.positional, not _layout.positional):
        try:
            fast = _fast_decoders[positional].decode(payload)
        except _refused:
            continue
        _layout.positional = positional
        try:
            events = _events_of(fast)
        except NotTokens:
            return None
        return _Batch(ts=fast.ts, events=events, dp_rank=fast.data_parallel_rank)
    return None
