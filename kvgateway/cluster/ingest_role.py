"""``kvgateway ingest``: the engines' streams in, records out to JetStream; HTTP for probes only.

The gateway's reader, sequencer and sink run exactly as in one process; only the log differs
(:class:`~kvgateway.cluster.publisher.PublishingLog`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import uvicorn

from kvgateway.cluster import nats_link
from kvgateway.cluster.options import NatsOptions
from kvgateway.cluster.publisher import PublishingLog
from kvgateway.cluster.sources import publish_sources
from kvgateway.config import Settings
from kvgateway.engine.sequencer import Unrecovered
from kvgateway.gateway import Gateway, StartupError
from kvgateway.runtime.memory import freeze_startup_heap

log = logging.getLogger("kvgateway.cluster")


class IngestGateway(Gateway):
    """The single process's gateway whose log is the JetStream stream."""

    def __init__(self, settings: Settings, publishing: PublishingLog) -> None:
        super().__init__(settings, log=publishing)
        self.publishing = publishing
        publishing.index = self.index  # its stale marks decide the gateway's own notices

    last_seqs: dict[tuple[str, int], int] = {}

    def _start_readers(self) -> None:
        """A takeover: each stream goes on after the last batch the stream holds, as after a
        reconnect (a gap replay from there, losses counted exactly), not from seq 0. The
        sequencers are told before their readers handle any event."""
        super()._start_readers()
        for reader in self.readers:
            seq = self.last_seqs.get(reader.key)
            if seq is not None:
                reader.sequencer.resume_after(seq)
                log.info("stream %s[%d]: continuing after seq %d (the stream's last)", *reader.key, seq)

    def publishes_lost(self, lost: dict[tuple[str, int], list[int]]) -> None:
        """Batches the stream will never hold in order: counted and noticed as any loss."""
        for key, seqs in lost.items():
            outlet = self.outlets.get(key)
            if outlet is None:
                continue
            losses = [Unrecovered(first, last, "transit") for first, last in seq_ranges(seqs)]
            outlet.apply(losses, self.clock(), outlet.held)

    def refresh_gauges(self) -> None:
        super().refresh_gauges()
        self.metrics.jetstream_pending.set(self.publishing.pending)

    def ingest_readiness(self, nats_connected: bool) -> tuple[bool, dict[str, Any]]:
        ready, not_ready = self.readiness()
        body = {"streams": len(self.outlets), "not_ready": not_ready, "nats_connected": nats_connected}
        return ready and nats_connected, body


async def run_ingest(settings: Settings, options: NatsOptions, *, ready_line: bool = True) -> None:
    """Until SIGINT/SIGTERM. Raises :class:`StartupError` (one line)."""
    try:  # the probes' port first: a taken one fails at once, and the start-up line shows the real one
        listener = socket.create_server((settings.host, settings.port), reuse_port=False)
    except OSError as exc:
        raise StartupError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}") from None
    settings = replace(settings, port=int(listener.getsockname()[1]))
    try:
        await _run(settings, options, listener, ready_line=ready_line)
    finally:
        listener.close()


async def _run(settings: Settings, options: NatsOptions, listener: socket.socket, *, ready_line: bool) -> None:
    try:
        nc = await nats_link.connect(options)
    except Exception as exc:
        raise StartupError(f"cannot connect to NATS {','.join(options.servers)}: {exc}") from None
    js = nc.jetstream()
    try:
        state = await nats_link.ensure_stream(js, options)
        await publish_sources(js, options, settings.sources)  # for edges started without --source
        publishing = PublishingLog(nc, js, options.subject_prefix, options.stream)
        gateway = IngestGateway(settings, publishing)
        publishing.metrics = gateway.metrics
        publishing.epoch = state.epoch
        await publishing.load_positions([s.key for s in settings.streams()])

        async def recreate() -> None:
            # A lost store (or a deleted stream) is a new stream: a new epoch for every edge.
            again = await nats_link.ensure_stream(js, options)
            if again.epoch != publishing.epoch:
                log.warning("stream %s is new (epoch %s): publishing to it", options.stream, again.epoch)
                publishing.epoch = again.epoch
                await publish_sources(js, options, settings.sources)  # the bucket went with the store

        publishing.on_failure = recreate
        publishing.on_lost = gateway.publishes_lost
        publishing.start()
        gateway.last_seqs = publishing.last_seqs()
        await gateway.start()
        try:
            await _serve_probes(gateway, settings, nc, listener, ready_line=ready_line)
        finally:
            await gateway.stop()
            await publishing.stop()
            log.info(
                "ingest stopped: %d published, %d duplicates dropped by the server, %d retries",
                publishing.stats.published,
                publishing.stats.duplicates,
                publishing.stats.retries,
            )
    finally:
        await nats_link.close(nc)  # the publishes were waited for: no drain


class _ProbeServer(uvicorn.Server):
    """The role handles the signals (stop publishing cleanly), not uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve_probes(
    gateway: IngestGateway, settings: Settings, nc: Any, listener: socket.socket, *, ready_line: bool
) -> None:
    from kvgateway.cluster.probes import probe_app
    from kvgateway.serve.server import uvicorn_config

    publishing = gateway.publishing
    app = probe_app(
        health=lambda: {"epoch": publishing.epoch, "role": "ingest", "pending_publishes": publishing.pending},
        readiness=lambda: gateway.ingest_readiness(bool(nc.is_connected)),
        metrics=gateway.metrics,
        refresh=gateway.refresh_gauges,
    )
    config = uvicorn_config(app, settings)
    config.lifespan = "off"
    server = _ProbeServer(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    try:
        task = asyncio.create_task(server.serve(sockets=[listener]))
        while not server.started and not task.done():  # noqa: ASYNC110 - uvicorn offers no start event
            await asyncio.sleep(0.02)
        if ready_line and server.started:  # the command's own process (ready_line=False embeds it)
            freeze_startup_heap()
            log.info("ingest publishing to %s; probes on http://%s:%d/", options_text(nc), settings.host, settings.port)
        await task
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def options_text(nc: Any) -> str:
    url = nc.connected_url
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
