"""The serving half: everything clients see, derived from an ordered log it follows.

The index, the status board, the routers' state and the hub follow any
:class:`~kvgateway.log.ordered.Log`: the single process's memory log (fed by the ingest half in
the same process) or an edge's JetStream log. Nothing here knows which: one process and every
edge of a cluster serve the same statuses, snapshots, lookups and resumes from the same records.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from kvgateway.config.settings import Settings, StreamConfig
from kvgateway.log.ordered import MemoryLog, ReadBack
from kvgateway.protocol import messages
from kvgateway.protocol.filters import ClientFilter
from kvgateway.runtime.memory import CollectionTimer
from kvgateway.runtime.metrics import Metrics
from kvgateway.serve.analytics_sink import AnalyticsSink
from kvgateway.serve.digests import DigestTicker
from kvgateway.serve.hub import Hub
from kvgateway.serve.query import ClientRequest
from kvgateway.serve.router_state import RouterState
from kvgateway.serve.sessions import Writers
from kvgateway.serve.subscription import Subscription, Transport
from kvgateway.state import checkpoint
from kvgateway.state.activity import Activity
from kvgateway.state.analytics import CacheAnalytics
from kvgateway.state.attribution import Attribution
from kvgateway.state.occupancy import OccupancyIndex
from kvgateway.state.status_board import BoardFigures, StatusBoard


class Serving:
    """The serving half over ``log`` (its followers are wired here, in the order that matters)."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        read_back: ReadBack | None = None,
        clock: Callable[[], float] = time.time,
        silence: float | None = None,
    ) -> None:
        """Over its own ring log (:class:`~kvgateway.log.ordered.MemoryLog`): one process's ingest
        appends to it, an edge appends what it reads from the stream, whose older part it reads
        back through ``read_back``. ``silence``: in a cluster, how long a stream may go unreported
        before it shows down (:class:`~kvgateway.state.status_board.StatusBoard`)."""
        self.settings = settings
        hub_metrics = metrics.hub()
        log = self.log = MemoryLog(settings.ring_messages, settings.ring_bytes, read_back=read_back)
        hub_metrics.watch_ring(log.held)
        self.metrics, self.clock, self.started_at = metrics, clock, clock()
        streams = settings.streams()
        # told of each store before the index applies it and each remove after (issue 30)
        self.attribution = Attribution(settings.refetch_window)
        metrics.streams.add(self.attribution)
        self.index = OccupancyIndex(
            capacity={s.key: s.capacity_blocks for s in streams if s.capacity_blocks},
            started=self.started_at,
            observer=self.attribution,
        )
        _export_capacities(metrics, streams)
        self.board = StatusBoard(streams, self.index, silence=silence, clock=clock)
        metrics.streams.add(BoardFigures(self.board, clock))
        self.routers = RouterState(settings, self.index, metrics)
        self.writers = Writers()
        self.hub = Hub(
            log,
            metrics=hub_metrics,
            sources=[s.key for s in streams],
            client_queue_bytes=settings.client_queue_bytes,
            max_clients=settings.max_clients,
        )
        self.activity = Activity()
        self.analytics = CacheAnalytics(settings.refetch_window)
        AnalyticsSink(metrics, self.analytics)  # its figures, when /metrics is scraped
        # Everything that follows the log, here only. The hub first (a client's chunk is written
        # before the state's 10-20 us); a hello's snapshot stays exact: appends are synchronous.
        for follower in (
            self.hub.follow,
            self.index.follow,
            self.board.follow,
            self.routers.follow,  # the learned token chains
            self.activity.follow,  # the dashboard's history
            self.analytics.follow,
        ):
            log.follow(follower)
        # monotonic: a step of the wall clock must not hold the digests back
        self.digests = DigestTicker(self.hub, self.index, lambda: self.board.streams, time.monotonic)
        """The ``digest`` messages of the clients that asked for them (``digest=SECONDS``)."""
        self.collections = CollectionTimer(metrics.observe_gc_pause)
        """Times the garbage collector's pauses while the gateway runs (kvgateway_gc_pause_seconds)."""

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """What runs beside the log once it is fed: the routers' fleet count and the garbage
        collector's pause timing; :meth:`stop` ends both."""
        self.routers.start(lambda: self.log.last_offset)
        self.digests.start()
        self.collections.install()

    async def close_clients(self) -> None:
        """Close every web client with the gateway's own close, and return once each WebSocket
        session has sent it (a signal's shutdown, before uvicorn closes the connections)."""
        self.hub.close()
        await self.writers.closed()

    async def stop(self) -> None:
        self.collections.uninstall()
        self.hub.close()
        await self.digests.stop()
        await self.routers.stop()

    # --- checkpoints --------------------------------------------------------------------------

    async def load_checkpoint(self) -> checkpoint.Checkpoint | None:
        """Before anything is followed: what the log's latest checkpoint held (the log goes on right
        after it), or None. Raises :class:`~kvgateway.state.checkpoint.CheckpointError`."""
        data = await self.log.checkpoint()
        if data is None:
            return None
        taken = checkpoint.decode(data)
        checkpoint.restore(taken, self.index, self.board)
        return taken

    def capture_checkpoint(self, extra: dict[str, Any]) -> checkpoint.Checkpoint:
        """The state at the log's last offset (synchronous: nothing is applied meanwhile)."""
        log = self.log
        return checkpoint.capture(
            self.index, self.board, epoch=log.epoch, offset=log.last_offset, now=self.clock(), extra=extra
        )

    # --- views ------------------------------------------------------------------------------

    def snapshot(self, offset: int | None = None, client_filter: ClientFilter | None = None) -> dict[str, Any]:
        """The occupancy snapshot; ``client_filter``: only the streams its source/dp_rank select."""
        select = None if client_filter is None else client_filter.matches_stream
        return self.index.snapshot(self.log.last_offset if offset is None else offset, self.clock(), select)

    def statuses(self, client_filter: ClientFilter | None = None) -> list[dict[str, Any]]:
        """Every stream's status; ``client_filter``: only the streams its source/dp_rank select."""
        return self.board.to_json(self.clock(), None if client_filter is None else client_filter.matches_stream)

    async def subscribe(self, request: ClientRequest, transport: Transport) -> Subscription:
        """A new client, on whatever log: the log first holds what a resume reads (an edge waits
        for an id ahead of it, or fetches a range older than its ring), then one synchronous
        step makes the hello and the subscription. Raises :class:`~kvgateway.serve.hub.ShuttingDown` or
        :class:`~kvgateway.serve.hub.TooManyClients`."""
        async with self.log.holding(request.last_event_id):
            return self.subscribe_held(request, transport)

    def subscribe_held(self, request: ClientRequest, transport: Transport) -> Subscription:
        """:meth:`subscribe`'s synchronous step: its hello (statuses, and the snapshot unless it
        resumes) and its subscription, with nothing appended in between."""
        point = self.hub.resume_point(request, transport)
        with_state = request.snapshot is not None and not point.recovered
        if with_state:
            self.routers.reserve()  # raises TooManySnapshots, a TooManyClients
        hello = messages.encode_hello(
            epoch=self.log.epoch,
            offset=point.offset,
            recovered=point.recovered,
            sources=self.statuses(),
            occupancy=None if point.recovered else self.snapshot(point.offset),
        )
        state = None
        if with_state:  # nothing is appended before the subscription: the state is the hello's
            streams = self.routers.matching(self.board.streams, request.filter)
            digest = request.digest is not None
            state = self.routers.capture(streams, point.offset, hello.id, transport, digest=digest)
        return self.hub.subscribe(request, transport, hello, point, state)

    def refresh_gauges(self) -> None:
        """Gauges read at scrape time (each stream's figures are collected then)."""
        self.metrics.asyncio_tasks.set(len(asyncio.all_tasks()))
        self.routers.refresh_gauges()

    # --- the probes, in both modes ----------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return {"epoch": self.hub.epoch, "uptime_seconds": self.clock() - self.started_at}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when every stream is up, as the status board shows it."""
        not_ready = self.board.not_ready(self.clock())
        return not not_ready, {"streams": len(self.board.streams), "not_ready": not_ready}


def _export_capacities(metrics: Metrics, streams: Iterable[StreamConfig]) -> None:
    """The configured capacities as gauges (they never change while the process runs)."""
    for stream in streams:
        for medium, blocks in stream.capacity_blocks.items():
            metrics.cache_capacity_blocks.labels(stream.source, str(stream.dp_rank), medium).set(blocks)
