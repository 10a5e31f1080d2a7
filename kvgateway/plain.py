"""msgpack values made JSON-ready: what an engine may send (bytes, extension types, maps keyed by
nil or arrays, deep nesting) as JSON can carry it. Shared by the decoder (the names of unknown
map keys) and the renderer (every opaque value)."""

from __future__ import annotations

from typing import Any, Final

import msgspec

SCALARS: Final = frozenset({int, str, float, bool, type(None)})

MAX_RENDER_DEPTH: Final = 32
"""Opaque values nested deeper render as :data:`TOO_DEEP` (real ones nest 3-4 levels)."""
TOO_DEEP: Final = "(nested too deeply)"


def plain(value: Any, depth: int = 0) -> Any:
    """Any value made JSON-ready: bytes as lowercase hex (msgspec would write base64), msgpack
    extensions as ``{"ext_type", "data"}``, every map key a string or number, depth bounded."""
    kind = type(value)
    if kind in SCALARS:
        return value
    if kind is bytes:
        return value.hex()
    if kind is list or kind is tuple:
        # The common case (extra_keys of Nones, ints, strings) needs no copy.
        if all(type(item) in SCALARS for item in value):
            return value
        return TOO_DEEP if depth >= MAX_RENDER_DEPTH else [plain(item, depth + 1) for item in value]
    if kind is dict:
        if depth >= MAX_RENDER_DEPTH:
            return TOO_DEEP
        return {plain_key(k): plain(v, depth + 1) for k, v in value.items()}
    if kind is msgspec.msgpack.Ext:
        return {"ext_type": value.code, "data": bytes(value.data).hex()}
    return value


def plain_key(key: Any) -> str | int | float:
    """A msgpack map key as a JSON object key (msgpack also allows nil, bools, arrays, bytes)."""
    if isinstance(key, str) or (isinstance(key, int | float) and not isinstance(key, bool)):
        return key
    if isinstance(key, bytes):
        return key.hex()
    return msgspec.json.encode(plain(key, MAX_RENDER_DEPTH - 1)).decode()
