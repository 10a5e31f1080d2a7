"""The compiled twin a differential test holds against its pure-Python reference: imported, or the
test skipped (no C compiler at install, or the pure-Python core forced); what a compact array's
slot holds before it is read (:func:`slot`); and events as the compiled parser hands them to the
compiled core (:func:`packed`)."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from tests.support.msgpack_forms import wide_array


def compiled_twin(name: str, chosen: Callable[[ModuleType], bool] | None = None) -> ModuleType:
    """The compiled module ``name``; the test is skipped where it was not built, or where
    ``chosen(module)`` says the gateway does not run it (``KVGATEWAY_NO_EXTENSIONS``)."""
    try:
        module = importlib.import_module(name)
    except ImportError:
        pytest.skip("the compiled core is not built here (no C compiler at install)")
    if chosen is not None and not chosen(module):
        pytest.skip("the pure-Python core is forced (KVGATEWAY_NO_EXTENSIONS)")
    return module


def slot(event: Any, name: str) -> Any:
    """What ``event``'s slot ``name`` holds, not read through the field (a compact array until read)."""
    return type(event).__dict__[name].member.__get__(event, type(event))


def compiled_tokens() -> ModuleType:
    """kvgateway/engine/_tokens_c as the gateway runs it (the test skipped where it does not)."""
    from kvgateway.engine import wire

    return compiled_twin("kvgateway.engine._tokens_c", lambda module: wire._tokens is module)


def packed(events: list[Any]) -> list[Any]:
    """``events`` as the compiled batch parser hands them over: each block event a copy of its own,
    its ``block_hashes`` slot holding what the parser keeps for them sent as engines send them (a
    :class:`kvgateway.engine._tokens_c.Hashes` where it keeps one, else their list). The tests feed
    these to the compiled core's side, built events to the reference's. Where the gateway runs the
    reference core, the events as they are."""
    from kvgateway.engine import wire

    tokens = wire._tokens
    if tokens.__name__.endswith("_py"):  # the reference core runs (KVGATEWAY_NO_EXTENSIONS): lists
        return events
    out = []
    for event in events:
        hashes = getattr(event, "block_hashes", None)
        wide = wide_array(hashes) if type(hashes) is list else None
        if wide is None:
            out.append(event)
            continue
        copied = copy.copy(event)
        copied.block_hashes = tokens.block_hashes(wide)  # the field sets the slot as it is
        out.append(copied)
    return out
