"""What a client asked to see: the stream filter (source, dp_rank) and the event filter (type,
medium or tier), and the per-event keys the event filter is checked against.

Mediums are normalised by :mod:`kvgateway.engine.mediums`, the one normaliser the occupancy index uses too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from kvgateway.engine import wire
from kvgateway.engine.mediums import medium_tier, normalise_medium

EventFilterKey: TypeAlias = tuple[frozenset[str] | None, frozenset[str] | None]
"""(types, mediums) of a filter that looks inside batches; the cache key of a filtered variant."""

_ANY_MEDIUM: Final = "*"  # AllBlocksCleared clears every medium: it passes any medium filter

EventKey: TypeAlias = tuple[str, str | None, str | None]
"""(type, medium, tier) of one event as filters see it. The medium is normalised as the occupancy
index does it (:func:`kvgateway.engine.mediums.normalise_medium`: upper case, "GPU" for None or empty)
and the tier is its :func:`kvgateway.engine.mediums.medium_tier`; both are "*" for AllBlocksCleared and
None for an unknown event without a string ``medium`` (it passes no medium filter)."""

_interned: dict[EventKey, EventKey] = {}
_block_keys: dict[tuple[type, str | None], EventKey] = {}


def event_key(event: wire.Event) -> EventKey:
    kind = type(event)
    if kind is wire.BlockStored or kind is wire.BlockRemoved:
        # One dict lookup for the common case: a block event's key depends on its type and medium only.
        known = _block_keys.get((kind, event.medium))  # type: ignore[union-attr]
        if known is not None:
            return known
        raw: str | None = event.medium  # type: ignore[union-attr]
        key: EventKey = (event.type, normalise_medium(raw), medium_tier(raw))
        if len(_block_keys) < 256:  # medium names come from the wire: bounded
            _block_keys[(kind, raw)] = _intern(key)
    elif kind is wire.AllBlocksCleared:
        key = (wire.CLEARED, _ANY_MEDIUM, _ANY_MEDIUM)
    else:
        assert type(event) is wire.UnknownEvent
        found = event.body.get("medium") if isinstance(event.body, dict) else None
        if isinstance(found, str):
            key = (event.type, normalise_medium(found), medium_tier(found))
        else:
            key = (event.type, None, None)
    return _intern(key)


def _intern(key: EventKey) -> EventKey:
    # a ring holds many events but few distinct keys: share the tuples
    if len(_interned) < 4096:
        return _interned.setdefault(key, key)
    return _interned.get(key, key)


def select(keys: Sequence[EventKey], types: frozenset[str] | None, names: frozenset[str] | None) -> list[int]:
    """Indices of the keys that pass. A ``medium=`` value matches an event's medium name or its tier:
    ``CPU`` (a tier name) passes CPU and CPU_PINNED, ``CPU_PINNED`` only CPU_PINNED."""
    return [
        i
        for i, (kind, medium, tier) in enumerate(keys)
        if (types is None or kind in types)
        and (names is None or medium == _ANY_MEDIUM or (medium is not None and (medium in names or tier in names)))
    ]


@dataclass(frozen=True, slots=True)
class ClientFilter:
    """What a client asked for; None means "everything". Values are ORed, parameters ANDed."""

    sources: frozenset[str] | None = None
    dp_ranks: frozenset[int] | None = None
    types: frozenset[str] | None = None
    mediums: frozenset[str] | None = None  # upper-cased medium or tier names (a tier name matches its tier)

    def matches_stream(self, source: str, dp_rank: int) -> bool:
        return (self.sources is None or source in self.sources) and (self.dp_ranks is None or dp_rank in self.dp_ranks)

    @property
    def event_key(self) -> EventFilterKey | None:
        """None when the filter does not look inside batches (the unfiltered message fits)."""
        if self.types is None and self.mediums is None:
            return None
        return (self.types, self.mediums)
