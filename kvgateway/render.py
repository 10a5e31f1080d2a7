"""Engine events rendered for clients: the JSON-ready form a ``batch`` message carries
(:mod:`kvgateway.messages` encodes it), with the engine's own field names."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvgateway.mediums import medium_tier
from kvgateway.plain import SCALARS, plain
from kvgateway.wire import (
    CLEARED,
    REMOVED,
    STORED,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    Hash,
    UnknownEvent,
)


def hash_text(value: Hash) -> str:
    """A block hash as text: decimal digits (sign kept) for ints, lowercase hex for bytes."""
    return str(value) if type(value) is int else value.hex()  # type: ignore[union-attr]


def _hashes_text(values: list[Hash]) -> list[str]:
    return [str(h) if type(h) is int else h.hex() for h in values]  # type: ignore[union-attr]


def _further(extra: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        out[key] = value if type(value) in SCALARS else plain(value)
    return out


def render_event(event: Event) -> dict[str, Any]:
    """One event as a JSON-ready dict with the engine's own field names.

    Block events also carry ``tier`` (GPU, CPU, DISK, EXTERNAL: :mod:`kvgateway.mediums`) right
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
