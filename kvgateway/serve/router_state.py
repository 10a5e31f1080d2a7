"""What the gateway keeps for KV-aware routers, beside the index: the learned token chains (a
follower of the ordered log), the lookup rate limit, the cached fleet facts, and the block snapshots
in flight (``snapshot=blocks`` and ``GET /v1/blocks``).

The routes (kvgateway/serve/router_api.py) and the client writers (kvgateway/serve/sessions.py) use it; the
rendering and the lookups themselves are the I/O-free kvgateway/state/blocks.py and kvgateway/state/lookup.py.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from kvgateway.config.settings import Settings
from kvgateway.engine.wire import Hash, Stream
from kvgateway.log.entry import Entry
from kvgateway.log.records import BatchRecord
from kvgateway.protocol import messages
from kvgateway.protocol.filters import ClientFilter
from kvgateway.protocol.messages import OutMessage
from kvgateway.runtime.metrics import Metrics
from kvgateway.runtime.tasks import cancel_and_wait
from kvgateway.serve.hub import TooManyClients
from kvgateway.state import blocks
from kvgateway.state.blocks import StreamBlocks
from kvgateway.state.lookup import ChainLearner, FleetCount, HashQuery, TokenBucket, TokenQuery, lookup
from kvgateway.state.occupancy import OccupancyIndex, StreamIndex

logger = logging.getLogger("kvgateway.routers")

LEARNER_FOLLOWS_EVERY: Final = 256
"""Batches between two counts of the fleet's resident blocks for the learner's cap (O(groups))."""

FLEET_REFRESH_SECONDS: Final = 15.0
"""How often the fleet facts are counted again: O(resident blocks), so never per request."""

FLEET_EMPTY_CHECK_SECONDS: Final = 0.25
"""How often, between two counts, the index is asked whether it holds blocks although the last
count found none (O(1)): the count at start, before the engines' first blocks, is then
followed by another as soon as blocks exist, not 15 s later."""


def without_gc(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """``pieces``, each rendered with the garbage collector paused.

    Rendering a chunk allocates a dict per block; those allocations would trigger collections
    that walk the whole heap (the index's sets: hundreds of milliseconds at a million blocks)
    again and again during a snapshot. Paused for the chunk, and the chunk's dicts freed before
    it resumes, they trigger none. Safe: one chunk is rendered synchronously on the event loop.
    """
    while True:
        enabled = gc.isenabled()
        gc.disable()
        try:
            piece = next(pieces, None)
        finally:
            if enabled:
                gc.enable()
        if piece is None:
            return
        yield piece


class TooManySnapshots(TooManyClients):
    """``max_snapshots`` block snapshots are being served already (HTTP 503, or close 1013): a
    kind of :class:`~kvgateway.serve.hub.TooManyClients`, refused where those are."""


class BlockSnapshot:
    """One client's frozen block state: the ``state`` messages of its hello's offset, rendered
    lazily, chunk by chunk, while the client's writer sends them (kvgateway/serve/sessions.py)."""

    __slots__ = ("_release", "hello_id", "offset", "queue_bytes", "streams")

    def __init__(
        self,
        streams: list[StreamBlocks],
        offset: int,
        hello_id: str | None,
        release: Callable[[], None],
        queue_bytes: int,
    ) -> None:
        self.streams = streams
        self.offset = offset
        self.hello_id = hello_id
        self._release: Callable[[], None] | None = release
        self.queue_bytes = queue_bytes
        """A client's live messages queue behind its state up to this (``snapshot_queue_bytes``)."""

    def messages(self, chunk_blocks: int = blocks.DEFAULT_CHUNK_BLOCKS) -> Iterator[OutMessage]:
        """The ``state`` messages; the very last one carries the hello's id (its SSE ``id:``
        line), so an EventSource that drops mid-snapshot cannot resume into a partial state."""
        rendered = blocks.encoded_state_messages(self.streams, self.offset, chunk_blocks)
        pending: bytes | None = None
        for data in without_gc(rendered):
            if pending is not None:
                yield OutMessage(pending, messages.STATE)
            pending = data
        if pending is not None:
            yield OutMessage(pending, messages.STATE, self.hello_id)

    def release(self) -> None:
        """The snapshot is sent (or abandoned): its slot is free (idempotent)."""
        release, self._release = self._release, None
        if release is not None:
            release()

    def __del__(self) -> None:
        # A response dropped before its body was iterated never runs the body's finally.
        self.release()


class RouterState:
    """The routers' side of one gateway (use from the event loop's thread)."""

    def __init__(self, settings: Settings, index: OccupancyIndex, metrics: Metrics) -> None:
        self.index = index
        self.metrics = metrics
        self.max_snapshots = settings.max_snapshots
        self.snapshot_queue_bytes = settings.snapshot_queue_bytes
        # asked at each eviction: the fleet's holders in C first, the stream's groups only for a held block
        self.learner = ChainLearner(settings.max_learned_blocks, resident=index.holds, held=index.holders)
        self.bucket = TokenBucket(settings.lookup_rate, settings.lookup_burst)
        self._fleet: dict[str, Any] | None = None
        self._snapshots = 0
        self._evicted = 0
        self._batches = 0
        self._task: asyncio.Task[None] | None = None

    # --- the learner follows the ordered log -------------------------------------------------

    def follow(self, entry: Entry) -> None:
        """Learn the chains of a delivered batch (live and replayed alike)."""
        record = entry.record
        if type(record) is BatchRecord:
            learner = self.learner
            self._batches += 1
            if self._batches % LEARNER_FOLLOWS_EVERY == 0:
                learner.follow_fleet(self.index.resident_blocks())
            learner.learn_batch(record.stream[0], record.stream[1], record.batch)

    def resident(self, stream: Stream, block_hash: Hash) -> bool:
        """Whether ``stream`` still holds ``block_hash`` in some medium and group (the learner
        keeps such chains at its cap: a long-lived prefix survives churn elsewhere). O(1) in the
        fleet's size: the fleet's holders, then the stream that announced the block, not every stream."""
        return self.index.holds(stream, block_hash)

    # --- lookups ------------------------------------------------------------------------------

    def allow_lookup(self) -> bool:
        return self.bucket.allow(time.monotonic())

    def lookup(self, streams: Sequence[StreamIndex], query: HashQuery | TokenQuery, offset: int) -> dict[str, Any]:
        """The answer at ``offset`` (synchronous: exactly the state after it)."""
        self.metrics.lookups.labels("hashes" if isinstance(query, HashQuery) else "tokens").inc()
        return lookup(streams, self.learner, query, offset)

    # --- snapshots ----------------------------------------------------------------------------

    def matching(self, keys: Sequence[Stream], client_filter: ClientFilter) -> list[StreamIndex]:
        """The indexes of the configured streams ``client_filter`` selects, sorted."""
        return [self.index.stream(*key) for key in sorted(keys) if client_filter.matches_stream(*key)]

    def reserve(self) -> None:
        """Take a snapshot slot; raises :class:`TooManySnapshots`."""
        if self._snapshots >= self.max_snapshots:
            raise TooManySnapshots(f"{self.max_snapshots} block snapshots are being served already")
        self._snapshots += 1

    def _free(self) -> None:
        self._snapshots -= 1

    def capture(
        self, streams: Sequence[StreamIndex], offset: int, hello_id: str | None, route: str, *, digest: bool = False
    ) -> BlockSnapshot:
        """Freeze ``streams`` now (call it at ``offset``, with no await since) in a reserved slot;
        ``digest``: with each stream's state digest."""
        self.metrics.block_snapshots.labels(route).inc()
        frozen = blocks.capture(streams, digest=digest)
        return BlockSnapshot(frozen, offset, hello_id, self._free, self.snapshot_queue_bytes)

    @property
    def snapshots(self) -> int:
        """Snapshots being served now."""
        return self._snapshots

    # --- fleet facts, counted in the background --------------------------------------------

    def start(self, offset: Callable[[], int]) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._refresh_fleet(offset))

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    @property
    def fleet(self) -> dict[str, Any] | None:
        """The last fleet facts (:func:`kvgateway.state.lookup.fleet_facts`) with their ``offset``
        and ``at``; None while they are being counted: before the first count, and while the last
        count found no block but the index holds some (a count of 0 beside resident blocks would
        be read as the fleet's state, not as a count from before they arrived)."""
        fleet = self._fleet
        return None if fleet is None or self._found_none_before_blocks(fleet) else fleet

    def _found_none_before_blocks(self, fleet: dict[str, Any]) -> bool:
        return fleet["distinct_blocks"] == 0 and self.index.holds_any()

    async def count_fleet(self, offset: int) -> dict[str, Any]:
        """Fleet facts at ``offset`` (frozen now), counted one stream and group per event-loop turn."""
        count = FleetCount(self.index.streams(), holders=self.index)
        for _ in iter(count.step, True):  # one stream and group, then a turn for everything else
            await asyncio.sleep(0)
        facts = count.result()
        fleet = self._fleet = {"offset": offset, "at": time.time(), **facts}
        self._set_fleet_gauges(facts)
        return fleet

    async def _refresh_fleet(self, offset: Callable[[], int]) -> None:
        while True:
            try:
                await self.count_fleet(offset())
            except Exception:  # a bug here must not end the refreshes for good
                logger.exception("counting the fleet's blocks failed")
            await self._until_next_count()

    async def _until_next_count(self) -> None:
        """FLEET_REFRESH_SECONDS, or less when blocks arrived after a count that found none."""
        loop = asyncio.get_running_loop()
        due = loop.time() + FLEET_REFRESH_SECONDS
        while (left := due - loop.time()) > 0:
            await asyncio.sleep(min(left, FLEET_EMPTY_CHECK_SECONDS))
            fleet = self._fleet
            if fleet is not None and self._found_none_before_blocks(fleet):
                return

    def _set_fleet_gauges(self, facts: dict[str, Any]) -> None:
        distinct, shared = self.metrics.fleet_distinct_blocks, self.metrics.fleet_shared_blocks
        distinct.clear()  # a medium no stream holds any more leaves the exposition
        shared.clear()
        distinct.labels("all").set(facts["distinct_blocks"])
        shared.labels("all").set(facts["shared_blocks"])
        for medium, counts in facts["mediums"].items():
            distinct.labels(medium).set(counts["distinct_blocks"])
            shared.labels(medium).set(counts["shared_blocks"])

    def refresh_gauges(self) -> None:
        """At scrape time: the learner's figures. Its evictions are counted here too, not per
        batch: at its cap nearly every batch evicts, and a Counter.inc per batch cost 1 us."""
        learner = self.learner
        if learner.evicted != self._evicted:
            self.metrics.learned_evictions.inc(learner.evicted - self._evicted)
            self._evicted = learner.evicted
        learner.follow_fleet(self.index.resident_blocks())
        self.metrics.learned_blocks.set(len(self.learner))
        self.metrics.learned_blocks_cap.set(self.learner.cap)
