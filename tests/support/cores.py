"""The compiled twin a differential test holds against its pure-Python reference: imported, or the
test skipped (no C compiler at install, or the pure-Python core forced); and events as the compiled
parser hands them to the compiled core (:func:`packed`)."""

from __future__ import annotations

import copy
import importlib
import struct
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest


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


def _wide(hashes: list[Any]) -> bytes | None:
    """``hashes`` as a msgpack array the way engines send them (every int as a uint 64 or an int
    64, bytes as a bin 8), or None where one cannot be written so (a wider int, longer bytes)."""
    if len(hashes) > 0xFFFF:
        return None
    out = [bytes([0x90 | len(hashes)]) if len(hashes) <= 15 else b"\xdc" + struct.pack(">H", len(hashes))]
    for h in hashes:
        if type(h) is int and 0 <= h < 2**64:
            out.append(b"\xcf" + struct.pack(">Q", h))
        elif type(h) is int and -(2**63) <= h < 0:
            out.append(b"\xd3" + struct.pack(">q", h))
        elif type(h) is bytes and len(h) <= 0xFF:
            out.append(b"\xc4" + bytes([len(h)]) + h)
        else:
            return None
    return b"".join(out)


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
        wide = _wide(hashes) if type(hashes) is list else None
        if wide is None:
            out.append(event)
            continue
        copied = copy.copy(event)
        copied.block_hashes = tokens.block_hashes(wide)  # the field sets the slot as it is
        out.append(copied)
    return out
