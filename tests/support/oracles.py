"""The engine's truth, computed apart from the gateway: :class:`RefModel`, a reference-count model
of an engine's cache built from its raw msgpack payloads with msgspec (independent of the
gateway's index), and :class:`WorkloadOracle`, what ``kvgateway simulate --seed SEED`` holds after
each number of batches."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

from kvgateway.engine import wire
from kvgateway.protocol import render
from kvgateway.simulator import Workload


@dataclass
class _Medium:
    # (group_idx, hash) -> references
    refs: Counter[tuple[int, Any]] = field(default_factory=Counter)
    block_size: int = 0
    stores: int = 0
    removes: int = 0


class RefModel:
    """An independent reference-count model of one engine publisher's cache.

    Fed raw msgpack payloads (map-form events, as ``kvgateway simulate`` sends by default),
    decoded with msgspec into plain Python values. The rules are those of docs/wire-format.md:
    a store adds one reference per hash, a remove takes one away (an unknown hash is only
    counted), AllBlocksCleared empties every medium; a missing medium is GPU, a missing
    group_idx is group 0.
    """

    def __init__(self) -> None:
        self.mediums: dict[str, _Medium] = {}
        self.unknown_removes = 0
        self.batches = 0

    def _medium(self, name: str | None) -> _Medium:
        return self.mediums.setdefault((name or "GPU").upper(), _Medium())

    def feed_any(self, payload: bytes) -> None:
        """Any layout: events decoded by the gateway's own wire decoder, counted by this model."""
        decoded = wire.decode_batch(payload)
        events = [render.render_event(event) for event in decoded.events]
        self.feed(msgspec.msgpack.encode([decoded.ts, events]))

    def feed(self, payload: bytes) -> None:
        batch = msgspec.msgpack.decode(payload)
        assert isinstance(batch, list) and len(batch) >= 2, batch
        self.batches += 1
        for event in batch[1]:
            assert isinstance(event, dict), f"expected map-form events, got {event!r}"
            kind = event["type"]
            if kind == "AllBlocksCleared":
                for medium in self.mediums.values():
                    medium.refs.clear()
                continue
            if kind not in ("BlockStored", "BlockRemoved"):
                continue
            medium = self._medium(event.get("medium"))
            group = event.get("group_idx") or 0
            hashes = event["block_hashes"]
            if kind == "BlockStored":
                for h in hashes:
                    medium.refs[(group, h)] += 1
                medium.stores += len(hashes)
                if event.get("block_size", 0) > 0:
                    medium.block_size = event["block_size"]
            else:
                for h in hashes:
                    key = (group, h)
                    left = medium.refs.get(key, 0)
                    if left == 0:
                        self.unknown_removes += 1
                    elif left == 1:
                        del medium.refs[key]
                    else:
                        medium.refs[key] = left - 1
                medium.removes += len(hashes)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per medium: resident blocks, their tokens, block size, announced stores and removes."""
        out = {}
        for name, medium in sorted(self.mediums.items()):
            blocks = len(medium.refs)
            out[name] = {
                "blocks": blocks,
                "tokens": blocks * medium.block_size,
                "block_size": medium.block_size,
                "stores": medium.stores,
                "removes": medium.removes,
            }
        return out

    def blocks(self) -> dict[str, int]:
        return {name: len(medium.refs) for name, medium in sorted(self.mediums.items())}


class WorkloadOracle:
    """Resident GPU blocks of ``kvgateway simulate --seed SEED`` after each number of batches."""

    def __init__(self, seed: int, **options: Any) -> None:
        self._workload = Workload(seed, stream=0, **options)
        self._resident = [0]
        self._events: list[list[Any]] = []

    def _grow(self, batches: int) -> None:
        while len(self._resident) <= batches:
            batch = self._workload.next_batch(0.0, 0)
            self._events.append(batch.events)
            self._resident.append(len(self._workload.resident_counts("GPU")))

    def resident_after(self, batches: int) -> int:
        self._grow(batches)
        return self._resident[batches]

    def hashes_of(self, index: int) -> list[list[str]]:
        """The block hashes (as the gateway renders them: decimal strings) of each event of batch ``index``."""
        self._grow(index + 1)
        return [[str(h) for h in getattr(event, "block_hashes", [])] for event in self._events[index]]


def event_hashes(batch: dict[str, Any]) -> list[list[str]]:
    return [list(event.get("block_hashes", [])) for event in batch["events"]]
