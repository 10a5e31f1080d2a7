"""The engine events and batches the unit tests build, one builder of each.

- :func:`stored` and :func:`removed` take the block hashes as arguments and every other field by
  name; ``group`` is the ``group_idx`` further field, and any other keyword another further field.
  A stored block carries ``block_size`` tokens unless ``tokens`` says which (``tokens=[]`` for a
  store without content, as a hash-only engine sends it).
- :func:`cleared` and :func:`batch`; :data:`MIXED`, one batch's worth of every kind of event and
  medium; :func:`workload_batches`, the simulator's batches.

A test module whose events all share a field names it once, with :func:`functools.partial`
(``stored = partial(events.stored, block_size=4)``), rather than writing a builder of its own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvgateway.engine import wire
from kvgateway.simulator import Workload

BIG = 2**64 - 12345  # a u64 hash above 2^63


def _further(group: int | None, fields: dict[str, Any]) -> dict[str, Any]:
    return fields if group is None else {"group_idx": group, **fields}


def stored(
    *hashes: wire.Hash,
    parent: wire.Hash | None = None,
    tokens: list[int] | None = None,
    block_size: int = 16,
    medium: str | None = None,
    lora_name: str | None = None,
    group: int | None = None,
    **further: Any,
) -> wire.BlockStored:
    """A ``BlockStored`` of ``hashes``, chained to ``parent``."""
    return wire.BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=parent,
        token_ids=list(range(block_size * len(hashes))) if tokens is None else tokens,
        block_size=block_size,
        medium=medium,
        lora_name=lora_name,
        extra=_further(group, further),
    )


def removed(
    *hashes: wire.Hash, medium: str | None = None, group: int | None = None, **further: Any
) -> wire.BlockRemoved:
    """A ``BlockRemoved`` of ``hashes``."""
    return wire.BlockRemoved(block_hashes=list(hashes), medium=medium, extra=_further(group, further))


def placeholder(*hashes: wire.Hash, medium: str = "CPU") -> wire.BlockStored:
    """An offload's placeholder store: the blocks, with no tokens and a block size of 0."""
    return stored(*hashes, tokens=[], block_size=0, medium=medium)


def cleared() -> wire.AllBlocksCleared:
    return wire.AllBlocksCleared()


def batch(*events: wire.Event, ts: float = 0.0, dp_rank: int | None = 0) -> wire.Batch:
    return wire.Batch(ts=ts, events=list(events), dp_rank=dp_rank)


MIXED: list[wire.Event] = [
    stored(1, medium="GPU"),
    stored(2),  # no medium: counts as GPU
    stored(3, medium="cpu"),
    removed(4, medium="CPU"),
    cleared(),
    wire.UnknownEvent(type="Offloaded", body={"type": "Offloaded", "medium": "disk"}),
    wire.UnknownEvent(type="Offloaded", body=["Offloaded", 7]),  # no medium: fails medium filters
]


def workload_batches(workload: Workload, n: int, dp_rank: int | None = 0) -> Iterator[wire.Batch]:
    """The simulator's next ``n`` batches, one a second."""
    for i in range(n):
        yield workload.next_batch(1_700_000_000.0 + i, dp_rank)
