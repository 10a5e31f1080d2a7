"""``kvgateway ingest``: the engines' streams in, records out to JetStream; HTTP for probes only.

The ingest half (:class:`~kvgateway.ingest.streams.Ingest`: readers, sequencers, outlets) runs
exactly as in one process; only what it appends to differs (:class:`~kvgateway.cluster.publisher.Publisher`).
The command runner and HTTP runner are the single process's (:mod:`kvgateway.serve.server`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError

from kvgateway.cluster import nats_link
from kvgateway.cluster.heartbeat import HEARTBEAT_SECONDS
from kvgateway.cluster.leases import Leases
from kvgateway.cluster.publisher import Publisher
from kvgateway.cluster.shards import LEASE_SECONDS, ROUND_SECONDS, Shards
from kvgateway.cluster.sources import publish_sources
from kvgateway.config.cluster import NatsOptions
from kvgateway.config.settings import Settings, StreamConfig
from kvgateway.config.summary import streams_text
from kvgateway.engine.sequencer import Unrecovered
from kvgateway.engine.wire import Stream
from kvgateway.ingest.streams import Ingest
from kvgateway.runtime.metrics import Metrics, StreamFamilies
from kvgateway.runtime.startup import StartupError
from kvgateway.runtime.tasks import cancel_and_wait

logger = logging.getLogger("kvgateway.cluster")


class IngestRole:
    """An ingest process (a :class:`~kvgateway.serve.role.Role`): the ingest half appending to the
    JetStream stream, started and stopped by its probe app's lifespan."""

    def __init__(
        self,
        settings: Settings,
        options: NatsOptions,
        *,
        member: str | None = None,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        """``member``: this process's id among the ingest processes sharing the sources (None: a new
        one); a process started again under the same id reclaims its leases at once."""
        self.settings = settings
        self.options = options
        self.metrics = Metrics()
        self.startup_error: StartupError | None = None
        self.fatal: str | None = None
        self.publishing: Publisher | None = None
        self.epoch: str | None = None  # the stream's, once connected (a re-created stream has a new one)
        self.ingest: Ingest | None = None
        self._nc: Client | None = None
        self._beats: asyncio.Task[None] | None = None
        self.shards: Shards | None = None
        self.owner = member or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._lease_seconds = lease_seconds
        self._stopped = False

    async def start(self) -> None:
        try:
            await self._start()
        except StartupError as exc:
            self.startup_error = exc
            raise

    async def _start(self) -> None:
        options, settings = self.options, self.settings
        try:
            nc = self._nc = await nats_link.connect(options)
        except Exception as exc:
            raise StartupError(f"cannot connect to NATS {','.join(options.servers)}: {exc}") from None
        js = nc.jetstream()
        state = await nats_link.ensure_stream(js, options)
        self.epoch = state.epoch
        await publish_sources(js, options, settings.sources)  # for edges started without --source

        async def recreate() -> None:
            # A lost store (or a deleted stream) is a new stream: a new epoch for every edge.
            again = await nats_link.ensure_stream(js, options)
            if again.epoch != self.epoch:
                logger.warning("stream %s is new (epoch %s): publishing to it", options.stream, again.epoch)
                self.epoch = again.epoch
                await publish_sources(js, options, settings.sources)  # the bucket went with the store

        publishing = self.publishing = Publisher(
            nc,
            js,
            options.subject_prefix,
            options.stream,
            metrics=self.metrics,
            on_failure=recreate,
            on_lost=self.publishes_lost,
            linger=options.linger_seconds,
        )
        await publishing.load_positions([s.key for s in settings.streams()])
        shared = options.leases
        # A takeover: each stream goes on after the last batch the stream holds, as after a
        # reconnect (a gap replay from there, losses counted exactly), not from seq 0.
        ingest = self.ingest = Ingest(
            settings, publishing, self.metrics, streams=[] if shared else None, resume_after=publishing.last_seqs()
        )
        # No serving half here: the statuses' figures are the outlets' own (an edge shows the same).
        self.metrics.streams.add(_StatusFigures(ingest))
        publishing.start()
        ingest.start(f"ingest started: {ingest_summary(settings)}")
        if shared:
            self.shards = await self._shards(js, ingest, publishing)
            await self.shards.round()  # before the ready line: a lone process holds every stream
        self._beats = asyncio.ensure_future(self._beat(ingest))

    async def _shards(self, js: JetStreamContext, ingest: Ingest, publishing: Publisher) -> Shards:
        bucket = f"{self.options.stream}_leases"
        try:
            kv = await js.key_value(bucket)
        except BucketNotFoundError:
            kv = await js.create_key_value(bucket=bucket, history=1, replicas=self.options.replicas)

        async def take(stream: StreamConfig) -> None:
            await publishing.load_positions([stream.key])  # what the last reader left in the stream
            ingest.add(stream, publishing.last_seqs().get(stream.key))

        leases = Leases(kv, self.owner, self._lease_seconds)
        return Shards(leases, self.settings.streams(), take, ingest.remove)

    async def _beat(self, ingest: Ingest) -> None:
        """Every stream's status every few seconds: what tells the edges this process is alive; and
        with shared sources, the leases' rounds."""
        beat = rounds = asyncio.get_running_loop().time()
        while True:
            now = asyncio.get_running_loop().time()
            await asyncio.sleep(max(0.0, min(beat + HEARTBEAT_SECONDS, rounds + ROUND_SECONDS) - now))
            now = asyncio.get_running_loop().time()
            if self.shards is not None and now >= rounds + ROUND_SECONDS:
                rounds = now
                try:
                    await self.shards.round()
                except Exception as exc:  # NATS away: the leases run out, another process takes them
                    logger.warning("leases not renewed: %s", exc)
            if now >= beat + HEARTBEAT_SECONDS:
                beat = now
                ingest.heartbeat()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await cancel_and_wait(self._beats)
        if self.shards is not None:
            with contextlib.suppress(Exception):  # NATS away: the leases run out instead
                await self.shards.release_all()
        if self.ingest is not None:
            await self.ingest.stop()
        publishing = self.publishing
        if publishing is not None:
            await publishing.stop()
            logger.info(
                "ingest stopped: %d published, %d duplicates dropped by the server, %d retries",
                publishing.stats.published,
                publishing.stats.duplicates,
                publishing.stats.retries,
            )
        if self._nc is not None:
            await nats_link.close(self._nc)  # the publishes were waited for: no drain

    def publishes_lost(self, lost: dict[Stream, list[int]]) -> None:
        """Batches the stream will never hold in order: counted and noticed as any loss."""
        assert self.ingest is not None
        for key, seqs in lost.items():
            outlet = self.ingest.outlets.get(key)
            if outlet is None:
                continue
            losses = [Unrecovered(first, last, "transit") for first, last in seq_ranges(seqs)]
            outlet.apply(losses, self.ingest.clock(), outlet.held)

    # --- the probes ---------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        publishing = self.publishing
        return {
            "epoch": self.epoch,
            "role": "ingest",
            "pending_publishes": 0 if publishing is None else publishing.pending,
        }

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        connected = self._nc is not None and bool(self._nc.is_connected)
        not_ready = [] if self.ingest is None else self.ingest.not_ready()
        streams = len(self.settings.streams())
        body = {"streams": streams, "not_ready": not_ready, "nats_connected": connected}
        return not not_ready and connected and self.ingest is not None, body

    def refresh_gauges(self) -> None:
        self.metrics.asyncio_tasks.set(len(asyncio.all_tasks()))
        self.metrics.jetstream_pending.set(0 if self.publishing is None else self.publishing.pending)

    def started_line(self, url: str) -> str:
        linger = self.publishing.linger if self.publishing is not None else 0.0
        shown = f"{linger * 1e3:g} ms" if linger else "none"
        return f"ingest publishing to {options_text(self._nc)} (linger {shown}); probes on {url}"


def ingest_summary(settings: Settings) -> str:
    """The ingest's start line: its probes' address and the streams it may read (it serves no
    clients: no ring, queue or client limit to show)."""
    return f"probes http {settings.host}:{settings.port}, streams: {streams_text(settings)}"


class _StatusFigures:
    def __init__(self, ingest: Ingest) -> None:
        self._ingest = ingest

    def export(self, families: StreamFamilies) -> None:
        for outlet in self._ingest.outlets.values():
            outlet.status.export(families)


def options_text(nc: Any) -> str:
    url = None if nc is None else nc.connected_url
    return "nats" if url is None else f"{url.scheme}://{url.hostname}:{url.port}"


def seq_ranges(seqs: list[int]) -> list[tuple[int, int]]:
    """Sorted, de-duplicated ``seqs`` as contiguous (first, last) ranges."""
    out: list[tuple[int, int]] = []
    for seq in sorted(set(seqs)):
        if out and out[-1][1] == seq - 1:
            out[-1] = (out[-1][0], seq)
        else:
            out.append((seq, seq))
    return out
