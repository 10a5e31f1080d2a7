"""The engine events and batches tests build, one of each."""

from __future__ import annotations

from collections.abc import Iterator

from kvgateway.engine import wire
from kvgateway.simulator import Workload

BIG = 2**64 - 12345  # a u64 hash above 2^63


def stored(*hashes: wire.Hash, medium: str | None = None) -> wire.BlockStored:
    return wire.BlockStored(
        block_hashes=list(hashes), parent_block_hash=None, token_ids=[1, 2], block_size=2, medium=medium
    )


def removed(*hashes: wire.Hash, medium: str | None = None) -> wire.BlockRemoved:
    return wire.BlockRemoved(block_hashes=list(hashes), medium=medium)


def batch(*events: wire.Event, ts: float = 1.5) -> wire.Batch:
    return wire.Batch(ts=ts, events=list(events))


MIXED: list[wire.Event] = [
    stored(1, medium="GPU"),
    stored(2),  # no medium: counts as GPU
    stored(3, medium="cpu"),
    removed(4, medium="CPU"),
    wire.AllBlocksCleared(),
    wire.UnknownEvent(type="Offloaded", body={"type": "Offloaded", "medium": "disk"}),
    wire.UnknownEvent(type="Offloaded", body=["Offloaded", 7]),  # no medium: fails medium filters
]


def workload_batches(workload: Workload, n: int, dp_rank: int | None = 0) -> Iterator[wire.Batch]:
    """The simulator's next ``n`` batches, one a second."""
    for i in range(n):
        yield workload.next_batch(1_700_000_000.0 + i, dp_rank)
