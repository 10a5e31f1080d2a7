"""The gateway: builds readers, outlets, the log, the index and the hub from Settings, and wires them."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import zmq

from kvgateway.config import SUMMARY_STREAMS, Settings, StreamConfig, stream_lines, summary
from kvgateway.engine.endpoints import is_ipv6, split_tcp
from kvgateway.ingest.outlet import StreamOutlet
from kvgateway.ingest.reader import StreamReader
from kvgateway.log import messages
from kvgateway.log.filters import ClientFilter
from kvgateway.log.ordered import MemoryLog
from kvgateway.runtime.memory import CollectionTimer
from kvgateway.runtime.metrics import Metrics
from kvgateway.serve.hub import Hub
from kvgateway.serve.query import ClientRequest
from kvgateway.serve.router_state import Routers
from kvgateway.serve.subscription import Subscription, Transport
from kvgateway.state.occupancy import OccupancyIndex

log = logging.getLogger("kvgateway")


class Gateway:
    """Everything but the HTTP server: readers -> outlets -> ordered log -> index and hub."""

    def __init__(
        self,
        settings: Settings,
        *,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        clock: Callable[[], float] = time.time,
        log: MemoryLog | None = None,
    ) -> None:
        """``log``: another log than the process's own (the cluster's: kvgateway/cluster/)."""
        self.settings = settings
        self.clock = clock
        self.metrics = Metrics()
        self.collections = CollectionTimer(self.metrics.observe_gc_pause)
        """Times the garbage collector's pauses while the gateway runs (kvgateway_gc_pause_seconds)."""
        self.started_at = clock()
        streams = settings.streams()
        self.index = OccupancyIndex(
            capacity={s.key: s.capacity_blocks for s in streams if s.capacity_blocks}, started=self.started_at
        )
        hub_metrics = self.metrics.hub()
        self.log = (
            log
            if log is not None
            else MemoryLog(settings.ring_messages, settings.ring_bytes, retained=hub_metrics.retained)
        )
        hub_metrics.retained(0, 0)
        self.outlets: dict[tuple[str, int], StreamOutlet] = {}
        """Each stream's downstream, in (source, dp_rank) order."""
        for stream in sorted(streams, key=lambda s: s.key):
            outlet = StreamOutlet(
                stream,
                self.log,
                self.index.stream(*stream.key),
                clock=clock,
                on_connection=self._connection,
            )
            self.outlets[stream.key] = outlet
            self.metrics.streams.add(outlet)
            for medium, blocks in stream.capacity_blocks.items():
                self.metrics.cache_capacity_blocks.labels(stream.source, str(stream.dp_rank), medium).set(blocks)
        # The index follows the log before the hub: a hello's snapshot is exact at its offset.
        self.log.follow(self.index.follow)
        self.routers = Routers(settings, self.index, self.metrics)
        self.log.follow(self.routers.follow)  # the learned token chains
        self.hub = Hub(
            self.log,
            metrics=hub_metrics,
            sources=[s.key for s in streams],
            client_queue_bytes=settings.client_queue_bytes,
            max_clients=settings.max_clients,
        )
        self._own_context = context is None
        self.context: zmq.Context[zmq.Socket[bytes]] = context if context is not None else zmq.Context()
        self.readers: list[StreamReader] = []
        self._streams = streams
        self._logged: dict[tuple[str, int], tuple[bool, str]] = {}  # last connection state logged
        self._diagnoses: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._diagnosed_at: dict[tuple[str, int], float] = {}  # time.monotonic() of the last diagnosis
        self.startup_error: StartupError | None = None
        self._stopped = False

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Open every stream's sockets; raises :class:`StartupError` (kept in ``startup_error``)."""
        try:
            self._start_readers()
        except StartupError as exc:
            self.startup_error = exc
            raise
        self._begin_background()
        log.info("gateway started: %s", summary(self.settings))
        if len(self.settings.streams()) > SUMMARY_STREAMS:
            for line in stream_lines(self.settings):
                log.debug("stream %s", line)

    def _begin_background(self) -> None:
        """What runs beside the log once it is fed (here, or by an edge): the routers' fleet
        count and the garbage collector's pause timing; :meth:`stop` ends both."""
        self.routers.start(lambda: self.log.last_offset)
        self.collections.install()

    def _start_readers(self) -> None:
        slots = asyncio.Semaphore(self.settings.max_concurrent_replays)
        for stream in self._streams:
            reader = StreamReader(
                stream,
                self.context,
                self.outlets[stream.key],
                replay_slots=slots,
                replay_timeout=self.settings.replay_timeout,
                restart_window=self.settings.restart_window,
                hold_limit=self.settings.hold_limit,
                clock=self.clock,
            )
            try:
                reader.start()
            except zmq.ZMQError as exc:
                raise StartupError(_zmq_failure(stream, exc)) from None
            self.readers.append(reader)

    async def stop(self) -> None:
        """Close clients and sockets (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        self.collections.uninstall()
        self.hub.close()
        await self.routers.stop()
        for task in list(self._diagnoses.values()):
            task.cancel()
        # Every reader at once: one after the other, each waited for the loop's next turn while
        # the others went on ingesting (a backlogged fleet of 64 took minutes to stop).
        await asyncio.gather(*(reader.stop() for reader in self.readers))
        self.readers.clear()
        if self._own_context:
            # destroy, not term: a reader whose bind failed left its socket open, and term() would wait
            # for it forever.
            self.context.destroy(linger=0)

    # --- views ------------------------------------------------------------------------------

    def snapshot(self, offset: int | None = None, client_filter: ClientFilter | None = None) -> dict[str, Any]:
        """The occupancy snapshot; ``client_filter``: only the streams its source/dp_rank select."""
        select = None if client_filter is None else client_filter.matches_stream
        return self.index.snapshot(self.log.last_offset if offset is None else offset, self.clock(), select)

    def subscribe(self, request: ClientRequest, transport: Transport) -> Subscription:
        """A new client: its hello (statuses, and the snapshot unless it resumes) and its
        subscription, in one synchronous step. Raises :class:`~kvgateway.serve.hub.TooManyClients`."""
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
        sub = self.hub.subscribe(request, transport, hello, point)
        if with_state:  # nothing was appended since point.offset: the state is the hello's
            self.routers.attach(sub, self.routers.matching(list(self.outlets), request.filter))
        return sub

    def statuses(self, client_filter: ClientFilter | None = None) -> list[dict[str, Any]]:
        """Every stream's status; ``client_filter``: only the streams its source/dp_rank select."""
        now = self.clock()
        return [
            outlet.to_json(now)
            for (source, dp_rank), outlet in self.outlets.items()
            if client_filter is None or client_filter.matches_stream(source, dp_rank)
        ]

    def readiness(self) -> tuple[bool, list[dict[str, Any]]]:
        not_ready = [
            {"source": key[0], "dp_rank": key[1], "reason": outlet.status.down_reason}
            for key, outlet in self.outlets.items()
            if not outlet.status.connected
        ]
        return not not_ready, not_ready

    def refresh_gauges(self) -> None:
        """Gauges read at scrape time (each stream's figures are collected then by its outlet)."""
        self.metrics.asyncio_tasks.set(len(asyncio.all_tasks()))
        self.routers.refresh_gauges()

    # --- a stream that stays down -------------------------------------------------------------

    def _connection(self, outlet: StreamOutlet, connected: bool, changed: bool, reason: str) -> None:
        """Log connection changes; find out why a TCP engine stays unreachable (off the loop's path)."""
        config = outlet.config
        if connected or config.bind or not config.endpoint.startswith("tcp://"):
            self._log_connection(outlet, connected, reason)
            return
        key = outlet.key
        now = time.monotonic()
        if changed:  # the engine went away: say so at once, find out more on the next retries
            self._diagnosed_at[key] = now
            self._log_connection(outlet, connected, reason)
        elif key not in self._diagnoses and now - self._diagnosed_at.get(key, -1e9) >= DIAGNOSE_INTERVAL_SECONDS:
            # ZeroMQ only says "retrying": find out why (DNS, refused, no answer).
            self._diagnosed_at[key] = now
            task = asyncio.ensure_future(self._diagnose(outlet, reason))
            self._diagnoses[key] = task
            task.add_done_callback(lambda _: self._diagnoses.pop(key, None))

    async def _diagnose(self, outlet: StreamOutlet, reason: str) -> None:
        why = await diagnose_connect(outlet.config.endpoint)
        if outlet.status.connected:
            return  # it came up meanwhile
        outlet.diagnosed(why or reason)
        self._log_connection(outlet, False, outlet.status.down_reason)

    def _log_connection(self, outlet: StreamOutlet, connected: bool, reason: str) -> None:
        """The first failure and every later change at WARNING; a first connection at INFO."""
        previous = self._logged.get(outlet.key)
        if previous == (connected, reason) or (previous is not None and previous[0] == connected and connected):
            return
        self._logged[outlet.key] = (connected, reason)
        level = logging.INFO if connected and previous is None else logging.WARNING
        log.log(level, "stream %s %s (%s)", outlet.name, "up" if connected else "down", reason)


DIAGNOSE_INTERVAL_SECONDS = 30.0
"""A stream that stays down has its reason re-checked (DNS, refused, no answer) at most this often;
a changed reason is logged."""


def _zmq_failure(stream: StreamConfig, exc: zmq.ZMQError) -> str:
    """One line naming the stream, the address and the OS's reason.

    ZeroMQ's errno after a failed bind is unreliable with a monitor attached (it reports
    "Resource temporarily unavailable" for a port in use), so a TCP bind is tried once more with a
    plain socket, whose error is the OS's own."""
    code = exc.errno
    if stream.bind and (parts := split_tcp(stream.endpoint)) is not None and parts[1].isdigit():
        host = "" if parts[0] in ("*", "") else parts[0]
        try:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((host, int(parts[1])))
        except OSError as probe_error:
            code = probe_error.errno or code
    # Codes from ZMQ_HAUSNUMERO (156384712) up are ZeroMQ's own, which the OS cannot name.
    reason = os.strerror(code).lower() if code and code < 156384712 else str(exc).split(" (addr=")[0]
    if code == errno.ENODEV and is_ipv6(stream.endpoint):
        reason = "no interface has this IPv6 address"
    verb = "bind" if stream.bind else "connect to"
    hint = " (another process or source holds it)" if code == errno.EADDRINUSE else ""
    return f"source {stream.source!r} rank {stream.dp_rank}: cannot {verb} {stream.endpoint}: {reason}{hint}"


async def diagnose_connect(endpoint: str, within: float = 3.0) -> str | None:
    """Why a TCP connection to ``endpoint`` fails, as the OS says it: the name does not resolve,
    connection refused, no answer... None when a TCP connection works (the engine is up again,
    or speaks no ZeroMQ)."""
    parts = split_tcp(endpoint)
    if parts is None or not parts[1].isdigit():
        return None
    host, port = parts
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(loop.getaddrinfo(host, int(port), type=socket.SOCK_STREAM), within)
    except TimeoutError:
        return f"cannot resolve host {host!r}: no answer from DNS within {within:g} s"
    except socket.gaierror as exc:
        return f"cannot resolve host {host!r}: {str(exc.strerror or exc).lower()}"
    # As ZeroMQ does without IPV6 set: IPv4 addresses of a name, the address itself for a literal.
    family = socket.AF_INET6 if is_ipv6(endpoint) else socket.AF_INET
    addresses = [info[4] for info in infos if info[0] == family] or [infos[0][4]]
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(str(addresses[0][0]), int(port)), within)
    except TimeoutError:
        return f"no answer from {endpoint} within {within:g} s, retrying"
    except OSError as exc:
        text = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        return f"{text}, retrying"
    writer.close()
    return None


class StartupError(Exception):
    """The gateway could not start (one line, exit code 1)."""
