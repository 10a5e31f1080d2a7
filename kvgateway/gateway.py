"""The gateway: builds ingest, index and hub from Settings, and applies ingest decisions."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import zmq

from kvgateway import messages, wire
from kvgateway.config import Settings, StreamConfig, summary
from kvgateway.endpoints import is_ipv6, split_tcp
from kvgateway.hub import Hub
from kvgateway.ingest import StreamReader
from kvgateway.log import MemoryLog, NoticeRecord, batch_record
from kvgateway.metrics import Metrics, StreamMetrics
from kvgateway.occupancy import OccupancyIndex
from kvgateway.query import ClientRequest
from kvgateway.routers import Routers
from kvgateway.status import QUIET_LOSSES, StreamStatus
from kvgateway.subscription import Subscription, Transport

log = logging.getLogger("kvgateway")


class Gateway:
    """Everything but the HTTP server: readers -> sequencer decisions -> index, hub, metrics."""

    def __init__(
        self,
        settings: Settings,
        *,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = Metrics()
        self.started_at = clock()
        streams = settings.streams()
        self.index = OccupancyIndex(
            capacity={s.key: s.capacity_blocks for s in streams if s.capacity_blocks}, started=self.started_at
        )
        self.status: dict[tuple[str, int], StreamStatus] = {s.key: StreamStatus(s) for s in streams}
        self.stream_metrics: dict[tuple[str, int], StreamMetrics] = {}
        for stream in streams:
            self.stream_metrics[stream.key] = self.metrics.init_stream(stream.source, stream.dp_rank)
            self.index.stream(stream.source, stream.dp_rank)
            for medium, blocks in stream.capacity_blocks.items():
                self.metrics.cache_capacity_blocks.labels(stream.source, str(stream.dp_rank), medium).set(blocks)
        hub_metrics = self.metrics.hub()
        self.log = MemoryLog(settings.ring_messages, settings.ring_bytes, retained=hub_metrics.retained)
        hub_metrics.retained(0, 0)
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
        self.routers.start(lambda: self.log.last_offset)
        log.info("gateway started: %s", summary(self.settings))

    def _start_readers(self) -> None:
        slots = asyncio.Semaphore(self.settings.max_concurrent_replays)
        for stream in self._streams:
            reader = StreamReader(
                stream,
                self.context,
                self,
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
        self.hub.close()
        await self.routers.stop()
        for task in list(self._diagnoses.values()):
            task.cancel()
        for reader in self.readers:
            await reader.stop()
        self.readers.clear()
        if self._own_context:
            # destroy, not term: a reader whose bind failed left its socket open, and term() would wait
            # for it forever.
            self.context.destroy(linger=0)

    # --- views ------------------------------------------------------------------------------

    def snapshot(self, offset: int | None = None) -> dict[str, Any]:
        return self.index.snapshot(self.log.last_offset if offset is None else offset, self.clock())

    def subscribe(self, request: ClientRequest, transport: Transport) -> Subscription:
        """A new client: its hello (statuses, and the snapshot unless it resumes) and its
        subscription, in one synchronous step. Raises :class:`~kvgateway.hub.TooManyClients`."""
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
            self.routers.attach(sub, self.routers.matching(list(self.status), request.filter))
        return sub

    def statuses(self) -> list[dict[str, Any]]:
        now = self.clock()
        out = []
        for key, status in sorted(self.status.items()):
            index = self.index.stream(*key)
            out.append(status.to_json(now, index.stale, index.stale_reason))
        return out

    def readiness(self) -> tuple[bool, list[dict[str, Any]]]:
        not_ready = [
            {"source": key[0], "dp_rank": key[1], "reason": status.down_reason}
            for key, status in sorted(self.status.items())
            if not status.connected
        ]
        return not not_ready, not_ready

    def refresh_gauges(self) -> None:
        """Cache gauges are read from the index at scrape time, not on every batch."""
        now = self.clock()
        self.metrics.asyncio_tasks.set(len(asyncio.all_tasks()))
        self.routers.refresh_gauges()
        for key, children in self.stream_metrics.items():
            children.index_stale.set(1 if self.index.stream(*key).stale else 0)
            for medium, stats in self.index.stream(*key).medium_stats(now).items():
                blocks, tokens = children.cache(medium)
                blocks.set(stats.blocks)
                tokens.set(stats.tokens)

    # --- Sink: decisions from the readers ---------------------------------------------------

    def _notice(self, key: tuple[str, int], kind: str, **fields: Any) -> None:
        self.log.append(NoticeRecord(key, kind, fields))

    def _log_stream(self, stream: StreamReader) -> str:
        return f"{stream.config.source}[{stream.config.dp_rank}]"

    def received(self, stream: StreamReader, count: int) -> None:
        self.stream_metrics[stream.key].batches_received.inc(count)
        self.status[stream.key].counters["batches"] += count

    def deliver(self, stream: StreamReader, seq: int, batch: wire.Batch, replayed: bool, received: float) -> None:
        config: StreamConfig = stream.config
        status = self.status[stream.key]
        children = self.stream_metrics[stream.key]
        status.last_seq = seq
        children.source_last_seq.set(seq)
        if batch.dp_rank is not None and batch.dp_rank != config.dp_rank:
            children.rank_mismatches.inc()
            log.warning(
                "stream %s: seq %d carries data_parallel_rank %d, expected %d",
                self._log_stream(stream),
                seq,
                batch.dp_rank,
                config.dp_rank,
            )
        if replayed:
            children.replayed_batches.inc()
            status.counters["replayed"] += 1
        else:
            lag = received - batch.ts
            status.lag_seconds = lag
            children.event_lag.observe(max(lag, 0.0))
        events = batch.events
        if len(events) == 1:
            children.events_received(events[0].type).inc()
        elif events:
            for event_type, count in Counter(event.type for event in events).items():
                children.events_received(event_type).inc(count)
        index = self.index.stream(config.source, config.dp_rank)
        unknown_before = index.unknown_removes
        # The index and the hub follow the log: both have applied the batch when append returns.
        self.log.append(batch_record(stream.key, seq, batch, received=received, replayed=replayed))
        if index.unknown_removes != unknown_before:
            children.unknown_removes.inc(index.unknown_removes - unknown_before)

    def delivered_skip(self, stream: StreamReader, seq: int) -> None:
        """An undecodable batch took its place in the order: the index now misses its events."""
        self.status[stream.key].last_seq = seq
        self.stream_metrics[stream.key].source_last_seq.set(seq)
        self._mark_stale(stream, "undecodable", seq=seq, detail="the batch could not be decoded; see the log")

    def decode_error(self, stream: StreamReader, seq: int | None, reason: str) -> None:
        self.stream_metrics[stream.key].decode_errors.inc()
        self.status[stream.key].counters["decode_errors"] += 1
        where = "" if seq is None else f" seq {seq}"
        log.warning("stream %s:%s skipped undecodable message: %s", self._log_stream(stream), where, reason[:300])

    def _mark_stale(
        self, stream: StreamReader, reason: str, *, seq: int | None = None, detail: str | None = None
    ) -> None:
        """The index of ``stream`` is incomplete: say so once per cause (a notice to every client)."""
        index = self.index.stream(*stream.key)
        if index.stale and index.stale_reason == reason:
            return  # already said; a second loss of the same kind changes nothing for a client
        self._notice(stream.key, "stale", reason=reason, seq=seq, detail=detail)  # the index follows: now stale

    def duplicate(self, stream: StreamReader, seq: int) -> None:
        self.stream_metrics[stream.key].duplicate_batches.inc()
        self.status[stream.key].counters["duplicates"] += 1

    def gap(self, stream: StreamReader, first: int, last: int) -> None:
        count = last - first + 1
        children = self.stream_metrics[stream.key]
        children.sequence_gaps.inc()
        children.missed_batches.inc(count)
        counters = self.status[stream.key].counters
        counters["gaps"] += 1
        counters["missed"] += count
        log.warning("stream %s: gap, seq %d..%d missing (%d batches)", self._log_stream(stream), first, last, count)

    def unrecovered(self, stream: StreamReader, first: int, last: int, reason: str) -> None:
        count = last - first + 1
        now = self.clock()
        status = self.status[stream.key]
        was_degraded = status.degraded(now)
        if reason not in QUIET_LOSSES:
            status.last_loss_at = now
        status.counters["unrecovered"] += count
        status.losses[reason] = status.losses.get(reason, 0) + count
        self.stream_metrics[stream.key].unrecovered_batches(reason).inc(count)
        log.warning(
            "stream %s: %d batches lost for good (seq %d..%d, %s)", self._log_stream(stream), count, first, last, reason
        )
        self._notice(stream.key, "unrecovered_gap", first=first, last=last, count=count, reason=reason)
        if reason != "not_sent":
            # not_sent: the engine fenced the hole with an AllBlocksCleared, which resets the index.
            self._mark_stale(stream, "unrecovered", seq=first, detail=f"{count} batches lost ({reason})")
        if reason not in QUIET_LOSSES and not was_degraded:
            self._notice(stream.key, "degraded", reason=f"{count} batches unrecovered ({reason})")

    def history_truncated(self, stream: StreamReader, first: int) -> None:
        self.stream_metrics[stream.key].history_truncations.inc()
        self.status[stream.key].counters["history_truncations"] += 1
        log.warning(
            "stream %s: the engine no longer holds its history before seq %d; the index lacks it until the "
            "next AllBlocksCleared or restart",
            self._log_stream(stream),
            first,
        )
        self._mark_stale(stream, "history_truncated", seq=first, detail=f"seqs 0..{first - 1} no longer buffered")

    def replay_requested(self, stream: StreamReader, start: int, purpose: str, attempt: int) -> None:
        self.stream_metrics[stream.key].replay_attempts(purpose).inc()
        if attempt > 1:
            log.info("stream %s: replay again from seq %d (attempt %d)", self._log_stream(stream), start, attempt)

    def replay_finished(self, stream: StreamReader, outcome: str, replayed: int, attempts: int, purpose: str) -> None:
        if purpose == "tail" and outcome == "recovered" and replayed == 0:
            # A quiet stream's tail probe that found nothing dropped: no recovery took place.
            log.debug("stream %s: tail probe found nothing missing", self._log_stream(stream))
            return
        self.stream_metrics[stream.key].replay_requests(outcome).inc()
        level = logging.INFO if outcome == "recovered" else logging.WARNING
        log.log(
            level,
            "stream %s: replay %s, %d batches replayed in %d attempt(s)",
            self._log_stream(stream),
            outcome,
            replayed,
            attempts,
        )

    def restart(self, stream: StreamReader, seq: int, previous: int, reason: str) -> None:
        self.stream_metrics[stream.key].publisher_restarts.inc()
        self.status[stream.key].counters["restarts"] += 1
        log.warning(
            "stream %s: publisher restart (%s): seq %d after %d; its cache state was reset",
            self._log_stream(stream),
            reason,
            seq,
            previous,
        )
        self._notice(stream.key, "restart", seq=seq, previous=previous, reason=reason)  # resets the index

    def connection(self, stream: StreamReader, connected: bool, reason: str) -> None:
        status = self.status[stream.key]
        changed = status.connected != connected
        status.connected = connected
        if not connected:
            status.down_reason = reason
        self.stream_metrics[stream.key].source_up.set(1 if connected else 0)
        if changed:
            self._notice(stream.key, "up" if connected else "down", reason=reason)
        if connected or stream.config.bind or not stream.config.endpoint.startswith("tcp://"):
            self._log_connection(stream, connected, reason)
            return
        now = time.monotonic()
        if changed:  # the engine went away: say so at once, find out more on the next retries
            self._diagnosed_at[stream.key] = now
            self._log_connection(stream, connected, reason)
        elif stream.key not in self._diagnoses and now - self._diagnosed_at.get(stream.key, -1e9) >= (
            DIAGNOSE_INTERVAL_SECONDS
        ):
            # ZeroMQ only says "retrying": find out why (DNS, refused, no answer) off the loop's path.
            self._diagnosed_at[stream.key] = now
            task = asyncio.ensure_future(self._diagnose(stream, reason))
            self._diagnoses[stream.key] = task
            task.add_done_callback(lambda _: self._diagnoses.pop(stream.key, None))

    async def _diagnose(self, stream: StreamReader, reason: str) -> None:
        why = await diagnose_connect(stream.config.endpoint)
        status = self.status[stream.key]
        if status.connected:
            return  # it came up meanwhile
        status.down_reason = why or reason
        self._log_connection(stream, False, status.down_reason)

    def _log_connection(self, stream: StreamReader, connected: bool, reason: str) -> None:
        """The first failure and every later change at WARNING; a first connection at INFO."""
        previous = self._logged.get(stream.key)
        if previous == (connected, reason) or (previous is not None and previous[0] == connected and connected):
            return
        self._logged[stream.key] = (connected, reason)
        level = logging.INFO if connected and previous is None else logging.WARNING
        log.log(level, "stream %s %s (%s)", self._log_stream(stream), "up" if connected else "down", reason)

    def queue_depth(self, stream: StreamReader, depth: int) -> None:
        self.stream_metrics[stream.key].ingest_queue_depth.set(depth)


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
