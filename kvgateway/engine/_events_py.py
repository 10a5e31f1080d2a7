"""A fast-decoded batch's events made the public ones (the pure-Python reference).

The fast decoders of :mod:`kvgateway.engine.wire` give each event as a private Struct: every key
the engine may send a field of its own, ``UNSET`` where it sent none. :func:`events_of` makes
them the public ``BlockStored``, ``BlockRemoved`` and ``AllBlocksCleared``: the fields the public
event has, ``extra`` for the others that were sent (in their order, the locality last), and the
medium of a block held by a remote pool renamed (:func:`located`). The compiled twin
(``_events_c``) reads the private events' slots instead of their attributes, a frame and a dozen
attribute reads an event fewer.

wire defines the types and hands them to both once (:func:`install`): it imports this module
(for :func:`located` and :func:`present`, which its general path uses too), so this module cannot
import them from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from kvgateway.engine.mediums import remote_medium

if TYPE_CHECKING:
    from collections.abc import Callable

Event = Any  # wire's Event union, which this module cannot import (wire imports it)

__all__ = ["events_of", "from_array", "install", "located", "present"]

# wire's types and the tokens core's answer, given by install()
_BlockStored: Any = None
_BlockRemoved: Any = None
_AllBlocksCleared: Any = None
_MapStored: Any = None
_MapRemoved: Any = None
_ArrayStored: Any = None
_GeneralStored: Any = None
_ArrayRemoved: Any = None
_FastArrayBatch: Any = None
_STORED_FURTHER: tuple[str, ...] = ()
_REMOVED_FURTHER: tuple[str, ...] = ()
_token_ids: Any = None
_KEPT = False


def install(
    *,
    stored: type,
    removed: type,
    cleared: type,
    map_stored: type,
    map_removed: type,
    array_stored: type,
    general_stored: type,
    array_removed: type,
    fast_array_batch: type,
    stored_further: tuple[str, ...],
    removed_further: tuple[str, ...],
    token_ids: Callable[[Any], list[int]],
    kept: bool,
) -> None:
    """wire's types, once: the public events; the fast decoders' private ones (``array_stored``
    the fast positional BlockStored, ``general_stored`` the general path's); the further fields'
    names in their order; the tokens core's ``token_ids``, applied where ``kept`` (the fast
    decoders then take token_ids as the wire sent them)."""
    global _BlockStored, _BlockRemoved, _AllBlocksCleared, _MapStored, _MapRemoved, _ArrayStored
    global _GeneralStored, _ArrayRemoved, _FastArrayBatch, _STORED_FURTHER, _REMOVED_FURTHER, _token_ids, _KEPT
    _BlockStored, _BlockRemoved, _AllBlocksCleared = stored, removed, cleared
    _MapStored, _MapRemoved, _ArrayStored, _GeneralStored = map_stored, map_removed, array_stored, general_stored
    _ArrayRemoved, _FastArrayBatch = array_removed, fast_array_batch
    _STORED_FURTHER, _REMOVED_FURTHER = stored_further, removed_further
    _token_ids, _KEPT = token_ids, kept


def located(medium: str | None, extra: dict[str, Any]) -> str | None:
    """The medium a block is counted under: its own, or for a block held by a remote pool
    (``locality: "REMOTE"``) ``REMOTE_<medium>``, in the EXTERNAL tier."""
    locality = extra.get("locality")
    if type(locality) is str and locality.upper() == "REMOTE":
        return remote_medium(medium)
    return medium


def present(struct: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The fields ``names`` of ``struct`` that were sent (not ``UNSET``), in that order."""
    return {name: value for name in names if (value := getattr(struct, name)) is not UNSET}


def events_of(fast: Any) -> list[Event]:
    """A fast-decoded batch's events (a positional batch's, or a batch of map events) as the public ones."""
    if type(fast) is _FastArrayBatch:
        return [from_array(e) for e in fast.events]
    return [_from_map(e) for e in fast.events]


def _from_map(event: Any) -> Event:
    if type(event) is _MapStored:
        extra: dict[str, Any] = {}
        if event.extra_keys is not UNSET:
            extra["extra_keys"] = event.extra_keys
        if event.group_idx is not UNSET:
            extra["group_idx"] = event.group_idx
        if event.kv_cache_spec_kind is not UNSET:
            extra["kv_cache_spec_kind"] = event.kv_cache_spec_kind
        if event.kv_cache_spec_sliding_window is not UNSET:
            extra["kv_cache_spec_sliding_window"] = event.kv_cache_spec_sliding_window
        medium = event.medium
        if event.locality is not UNSET:
            extra["locality"] = event.locality
            medium = located(medium, extra)
        return _BlockStored(
            event.block_hashes,
            event.parent_block_hash,
            _token_ids(event.token_ids) if _KEPT else event.token_ids,
            event.block_size,
            event.lora_id,
            medium,
            event.lora_name,
            extra,
        )
    if type(event) is _MapRemoved:
        removed_extra: dict[str, Any] = {} if event.group_idx is UNSET else {"group_idx": event.group_idx}
        medium = event.medium
        if event.locality is not UNSET:
            removed_extra["locality"] = event.locality
            medium = located(medium, removed_extra)
        return _BlockRemoved(event.block_hashes, medium, removed_extra)
    return _AllBlocksCleared()


def from_array(decoded: Any) -> Event:
    """One positional event, the fast decoder's or the general path's, as the public one."""
    if type(decoded) is _GeneralStored or type(decoded) is _ArrayStored:
        kept = _KEPT and type(decoded) is _ArrayStored
        return _BlockStored(
            block_hashes=decoded.block_hashes,
            parent_block_hash=decoded.parent_block_hash,
            token_ids=_token_ids(decoded.token_ids) if kept else decoded.token_ids,
            block_size=decoded.block_size,
            lora_id=decoded.lora_id,
            medium=None if decoded.medium is UNSET else decoded.medium,
            lora_name=None if decoded.lora_name is UNSET else decoded.lora_name,
            extra=present(decoded, _STORED_FURTHER),
        )
    if type(decoded) is _ArrayRemoved:
        return _BlockRemoved(
            block_hashes=decoded.block_hashes,
            medium=None if decoded.medium is UNSET else decoded.medium,
            extra=present(decoded, _REMOVED_FURTHER),
        )
    return _AllBlocksCleared()
