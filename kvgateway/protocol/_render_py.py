"""The pure-Python renderer (the reference); ``_render_c`` compiles this file (Cython's include)
and replaces its two per-batch writers, :func:`events_json` and :func:`batch_message`, with one-pass
C writers that give the same bytes (:mod:`kvgateway.protocol.render` picks a module at import).

Engine events rendered for clients: the JSON-ready form a ``batch`` message carries
(:mod:`kvgateway.protocol.messages` encodes it), with the engine's own field names, and any msgpack value an
engine may send (bytes, extension types, maps keyed by nil or arrays, deep nesting) as JSON can
carry it. :func:`events_json` is what the log keeps of a batch's events (their JSON, where each
ends, each one's filter key); :func:`batch_message` puts a message's head in front of them at its
offset."""

# No ``from __future__ import annotations``: _render_c.pyx includes this file after its own lines,
# where a __future__ import may not stand (every annotation here evaluates on Python 3.11).

from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec

from kvgateway.engine.mediums import medium_tier
from kvgateway.engine.wire import (
    CLEARED,
    REMOVED,
    STORED,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    Hash,
    Stream,
    UnknownEvent,
)
from kvgateway.protocol import messages
from kvgateway.protocol.filters import EventKey, event_key

# --- msgpack values made JSON-ready ---------------------------------------------------------

_SCALARS: Final = frozenset({int, str, float, bool, type(None)})

MAX_RENDER_DEPTH: Final = 32
"""Opaque values nested deeper render as :data:`TOO_DEEP` (real ones nest 3-4 levels)."""
TOO_DEEP: Final = "(nested too deeply)"


def plain(value: Any, depth: int = 0) -> Any:
    """Any value made JSON-ready: bytes as lowercase hex (msgspec would write base64), msgpack
    extensions as ``{"ext_type", "data"}``, every map key a string or number, depth bounded."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is bytes:
        return value.hex()
    if kind is list or kind is tuple:
        # The common case (extra_keys of Nones, ints, strings) needs no copy; the test loops in C.
        if all(map(_SCALARS.__contains__, map(type, value))):
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


# --- events ---------------------------------------------------------------------------------


def hash_text(value: Hash) -> str:
    """A block hash as text: decimal digits (sign kept) for ints, lowercase hex for bytes."""
    return str(value) if type(value) is int else value.hex()  # type: ignore[union-attr]


def _hashes_text(values: list[Hash]) -> list[str]:
    return [str(h) if type(h) is int else h.hex() for h in values]  # type: ignore[union-attr]


def _further(extra: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        out[key] = value if type(value) in _SCALARS else plain(value)
    return out


def render_event(event: Event) -> dict[str, Any]:
    """One event as a JSON-ready dict with the engine's own field names.

    Block events also carry ``tier`` (GPU, CPU, DISK, EXTERNAL: :mod:`kvgateway.engine.mediums`) right
    after ``medium``, which stays as the engine sent it.
    """
    if type(event) is BlockStored:
        parent = event.parent_block_hash
        return _further(
            event.extra,
            {
                "type": STORED,
                "block_hashes": _hashes_text(event.block_hashes),
                "parent_block_hash": None if parent is None else hash_text(parent),
                "token_ids": event.token_ids,
                "block_size": event.block_size,
                "lora_id": event.lora_id,
                "medium": event.medium,
                "tier": medium_tier(event.medium),
                "lora_name": event.lora_name,
            },
        )
    if type(event) is BlockRemoved:
        return _further(
            event.extra,
            {
                "type": REMOVED,
                "block_hashes": _hashes_text(event.block_hashes),
                "medium": event.medium,
                "tier": medium_tier(event.medium),
            },
        )
    if type(event) is AllBlocksCleared:
        return _further(event.extra, {"type": CLEARED})
    assert type(event) is UnknownEvent
    if isinstance(event.body, dict):
        return {str(k): v for k, v in plain(event.body).items()}
    return {"type": event.type, "fields": plain(event.body[1:])}


def render_events(events: Iterable[Event]) -> list[dict[str, Any]]:
    return [render_event(event) for event in events]


# --- what the log keeps of a batch ------------------------------------------------------------


def event_counts(events: Sequence[Event]) -> messages.EventCounts:
    """How many of ``events`` are a BlockStored, a BlockRemoved, an AllBlocksCleared, and of another
    type (:data:`kvgateway.protocol.messages.EventCounts`)."""
    kinds = [type(event) for event in events]
    stored, removed, cleared = kinds.count(BlockStored), kinds.count(BlockRemoved), kinds.count(AllBlocksCleared)
    return stored, removed, cleared, len(kinds) - stored - removed - cleared


def events_json(events: Sequence[Event]) -> tuple[messages.EncodedEvents, tuple[EventKey, ...]]:
    """A batch's events as the log keeps them: their JSON, comma-joined, with where each ends and
    how many there are of each type (:class:`~kvgateway.protocol.messages.EncodedEvents`), and each
    event's filter key (:func:`kvgateway.protocol.filters.event_key`). Made once per batch, before
    it has an offset."""
    encoded = messages.encode_events(render_events(events), event_counts(events))
    return encoded, tuple(event_key(event) for event in events)


def batch_message(
    epoch: str, offset: int, stream: Stream, *, seq: int, ts: float, events: messages.EncodedEvents
) -> messages.EncodedBatch:
    """The batch message at ``offset`` of ``epoch``: its head, then ``events`` (:func:`events_json`)."""
    source, dp_rank = stream
    return messages.encode_batch(
        epoch=epoch, offset=offset, source=source, dp_rank=dp_rank, seq=seq, ts=ts, events=events
    )
