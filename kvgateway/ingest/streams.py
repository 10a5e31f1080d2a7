"""The ingest half: every engine stream read into an ordered log.

One :class:`~kvgateway.ingest.reader.StreamReader` and one
:class:`~kvgateway.ingest.outlet.StreamOutlet` per stream, appending to whatever log it is given
(the single process's memory log, or the cluster's JetStream stream), and the diagnosis of a
stream that stays down. It shows nothing itself: the serving half follows the log.
"""

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

from kvgateway.config.settings import Settings, StreamConfig
from kvgateway.config.summary import SUMMARY_STREAMS, stream_lines
from kvgateway.engine.endpoints import is_ipv6, split_tcp
from kvgateway.engine.wire import Stream
from kvgateway.ingest.outlet import StreamOutlet
from kvgateway.ingest.reader import StreamReader
from kvgateway.log.ordered import Appender
from kvgateway.log.status import not_ready
from kvgateway.protocol.messages import ConnectionCode
from kvgateway.runtime.fd_budget import Budget, BudgetError, open_context, raise_open_files
from kvgateway.runtime.metrics import Metrics
from kvgateway.runtime.startup import StartupError

logger = logging.getLogger("kvgateway")

DIAGNOSE_INTERVAL_SECONDS = 30.0
"""A stream that stays down has its reason re-checked (DNS, refused, no answer) this often, by a
timer (its monitor does not wake at every retry once its reason is known); a changed reason is
logged."""


class Ingest:
    """Readers and outlets for every configured stream, appending to ``log``."""

    def __init__(
        self,
        settings: Settings,
        log: Appender,
        metrics: Metrics,
        *,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        clock: Callable[[], float] = time.time,
        streams: list[StreamConfig] | None = None,
        resume_after: dict[Stream, int] | None = None,
    ) -> None:
        """``streams``: the ones to read from the start (None: every configured stream); a cluster
        ingest that shares its streams with others through leases adds and removes them later.
        ``resume_after``: where each stream goes on, when this process takes it over from another
        (the cluster: after the last batch of it the stream holds)."""
        self.settings = settings
        self.clock = clock
        self._log = log
        self._metrics = metrics
        self.streams = sorted(settings.streams() if streams is None else streams, key=lambda s: s.key)
        self.outlets: dict[Stream, StreamOutlet] = {}
        """Each stream's downstream, in (source, dp_rank) order."""
        for stream in self.streams:
            self._outlet(stream)
        self._own_context = context is None
        self.context: zmq.Context[zmq.Socket[bytes]] = context if context is not None else _sized_context(settings)
        self.readers: list[StreamReader] = []
        self._slots = asyncio.Semaphore(settings.max_concurrent_replays)
        self.resume_after: dict[Stream, int] = dict(resume_after or {})
        self._logged: dict[Stream, tuple[bool, str]] = {}  # last connection state logged
        self._diagnoses: dict[Stream, asyncio.Task[None]] = {}
        self._diagnosed_at: dict[Stream, float] = {}  # time.monotonic() of the last diagnosis
        self._next_diagnosis: dict[Stream, asyncio.TimerHandle] = {}  # of each stream that is down
        self._said: dict[Stream, tuple[str, ConnectionCode]] = {}  # ZeroMQ's last word on a stream down

    def _outlet(self, stream: StreamConfig) -> StreamOutlet:
        outlet = self.outlets[stream.key] = StreamOutlet(
            stream, self._log, clock=self.clock, on_connection=self._connection
        )
        self._metrics.streams.add(outlet)
        return outlet

    def start(self, started: str) -> None:
        """Open every stream's sockets, then log ``started`` (what the process is, its role's
        line); raises :class:`StartupError`."""
        for stream in self.streams:
            self._start_reader(stream)
        logger.info("%s", started)
        if len(self.streams) > SUMMARY_STREAMS:
            for line in stream_lines(self.settings):
                logger.debug("stream %s", line)

    def _start_reader(self, stream: StreamConfig) -> None:
        reader = StreamReader(
            stream,
            self.context,
            self.outlets[stream.key],
            replay_slots=self._slots,
            replay_timeout=self.settings.replay_timeout,
            restart_window=self.settings.restart_window,
            hold_limit=self.settings.hold_limit,
            clock=self.clock,
        )
        seq = self.resume_after.get(stream.key)
        if seq is not None:  # told before the reader handles any event
            reader.sequencer.resume_after(seq)
            logger.info("stream %s[%d]: continuing after seq %d (the stream's last)", *stream.key, seq)
        try:
            reader.start()
        except zmq.ZMQError as exc:
            raise StartupError(_zmq_failure(stream, exc)) from None
        self.readers.append(reader)

    def add(self, stream: StreamConfig, after_seq: int | None) -> None:
        """Start reading ``stream`` (taken over in a cluster), after ``after_seq`` when the log holds
        that much of it already. Raises :class:`StartupError`."""
        if stream.key in self.outlets:
            return
        if after_seq is not None:
            self.resume_after[stream.key] = after_seq
        self._outlet(stream)
        self.streams = sorted([*self.streams, stream], key=lambda s: s.key)
        self._start_reader(stream)

    async def remove(self, key: Stream) -> None:
        """Stop reading a stream (another process reads it now)."""
        outlet = self.outlets.pop(key, None)
        if outlet is None:
            return
        self._metrics.streams.remove(outlet)
        self.streams = [s for s in self.streams if s.key != key]
        task = self._diagnoses.pop(key, None)
        if task is not None:
            task.cancel()
        self._stop_diagnosing(key)
        self._said.pop(key, None)
        for reader in [r for r in self.readers if r.key == key]:
            self.readers.remove(reader)
            await reader.stop()

    async def stop(self) -> None:
        for task in list(self._diagnoses.values()):
            task.cancel()
        for timer in self._next_diagnosis.values():
            timer.cancel()
        self._next_diagnosis.clear()
        # Every reader at once: one after the other, each waited for the loop's next turn while
        # the others went on ingesting (a backlogged fleet of 64 took minutes to stop).
        await asyncio.gather(*(reader.stop() for reader in self.readers))
        self.readers.clear()
        if self._own_context:
            # destroy, not term: a reader whose bind failed left its socket open, and term() would wait
            # for it forever.
            self.context.destroy(linger=0)

    def heartbeat(self) -> None:
        """Every stream's status, changed or not (see :meth:`StreamOutlet.heartbeat`)."""
        for outlet in self.outlets.values():
            outlet.heartbeat()

    def not_ready(self) -> list[dict[str, Any]]:
        """The streams that are down, with why, as this process reads them (the ingest's /readyz, by
        the status board's rule: an ingest has no board, its outlets hold the statuses)."""
        return not_ready((key, outlet.status) for key, outlet in self.outlets.items())

    # --- a stream that stays down -------------------------------------------------------------

    def _connection(
        self, outlet: StreamOutlet, connected: bool, changed: bool, reason: str, code: ConnectionCode
    ) -> None:
        """Log connection changes; find out why a TCP engine stays unreachable (off the loop's path),
        from its first word of being down (its first retry) and every DIAGNOSE_INTERVAL_SECONDS
        after, while it stays down."""
        config = outlet.config
        key = outlet.key
        if connected or config.bind or not config.endpoint.startswith("tcp://"):
            if connected:
                self._stop_diagnosing(key)
            self._log_connection(outlet, connected, reason)
            return
        self._said[key] = (reason, code)
        now = time.monotonic()
        if changed:  # the engine went away: say so at once, find out more a diagnosis period later
            self._diagnosed_at[key] = now
            self._log_connection(outlet, connected, reason)
            self._stop_diagnosing(key)
            self._diagnose_at(outlet, now + DIAGNOSE_INTERVAL_SECONDS)
        elif key not in self._next_diagnosis:  # ZeroMQ only says "retrying": find out why (DNS, refused, no answer)
            self._diagnose_at(outlet, self._diagnosed_at.get(key, -1e9) + DIAGNOSE_INTERVAL_SECONDS)

    def _diagnose_at(self, outlet: StreamOutlet, when: float) -> None:
        """Diagnose ``outlet``'s stream at ``when`` (time.monotonic()), at once if that is past."""
        delay = when - time.monotonic()
        if delay > 0:
            self._next_diagnosis[outlet.key] = asyncio.get_running_loop().call_later(delay, self._diagnosis_due, outlet)
        else:
            self._diagnosis_due(outlet)

    def _diagnosis_due(self, outlet: StreamOutlet) -> None:
        key = outlet.key
        self._next_diagnosis.pop(key, None)
        if self.outlets.get(key) is not outlet or outlet.status.connected:
            return  # removed, or up again
        now = time.monotonic()
        if key not in self._diagnoses:
            self._diagnosed_at[key] = now
            task = asyncio.ensure_future(self._diagnose(outlet, *self._said[key]))
            self._diagnoses[key] = task
            task.add_done_callback(lambda _: self._diagnoses.pop(key, None))
        self._diagnose_at(outlet, now + DIAGNOSE_INTERVAL_SECONDS)

    def _stop_diagnosing(self, key: Stream) -> None:
        timer = self._next_diagnosis.pop(key, None)
        if timer is not None:
            timer.cancel()

    async def _diagnose(self, outlet: StreamOutlet, reason: str, code: ConnectionCode) -> None:
        why = await diagnose_connect(outlet.config.endpoint)
        if outlet.status.connected:
            return  # it came up meanwhile
        outlet.diagnosed(*(why or (reason, code)))  # TCP works: ZeroMQ's own word stands
        self._log_connection(outlet, False, outlet.status.down_reason)

    def _log_connection(self, outlet: StreamOutlet, connected: bool, reason: str) -> None:
        """The first failure and every later change at WARNING; a first connection at INFO."""
        previous = self._logged.get(outlet.key)
        if previous == (connected, reason) or (previous is not None and previous[0] == connected and connected):
            return
        self._logged[outlet.key] = (connected, reason)
        level = logging.INFO if connected and previous is None else logging.WARNING
        logger.log(level, "stream %s %s (%s)", outlet.name, "up" if connected else "down", reason)


def _sized_context(settings: Settings) -> zmq.Context[zmq.Socket[bytes]]:
    """A ZeroMQ context that admits every stream's sockets, the descriptor limit raised to fit;
    raises :class:`StartupError` (one line) when the OS's hard limit cannot hold them."""
    budget = Budget.of(settings)
    try:
        raise_open_files(budget)
        return open_context(budget)
    except BudgetError as exc:
        raise StartupError(str(exc)) from None


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


async def diagnose_connect(endpoint: str, within: float = 3.0) -> tuple[str, ConnectionCode] | None:
    """Why a TCP connection to ``endpoint`` fails, as the OS says it (the name does not resolve,
    connection refused, no answer...), with its code. None when a TCP connection works (the
    engine is up again, or speaks no ZeroMQ: the reader's monitor tells that, from the failed
    handshake).

    Every stream that stays down is diagnosed every 30 s (2,000 absent engines: 67 a second), so
    an address is asked of DNS only when it is a name, and the connection is a bare non-blocking
    socket watched by the loop (no transport, no exception, no timeout task)."""
    parts = split_tcp(endpoint)
    if parts is None or not parts[1].isdigit():
        return None
    host, port = parts
    # As ZeroMQ does without IPV6 set: IPv4 addresses of a name, the address itself for a literal.
    family = socket.AF_INET6 if is_ipv6(endpoint) else socket.AF_INET
    address = _literal(host, family)
    if address is None:
        found = await _resolve(host, int(port), family, within)
        if isinstance(found, tuple):
            return found
        address = found
    try:
        code = await _connect_error(address, int(port), within)
    except OSError as exc:  # no socket of that family, an address the OS refuses
        return f"{os.strerror(exc.errno).lower() if exc.errno else str(exc)}, retrying", "unreachable"
    if code is None:
        return f"no answer from {endpoint} within {within:g} s, retrying", "no_answer"
    if code == 0:
        return None
    return f"{os.strerror(code).lower()}, retrying", "refused" if code == errno.ECONNREFUSED else "unreachable"


def _literal(host: str, family: socket.AddressFamily) -> str | None:
    """``host`` when it is an address of ``family`` as written (what DNS would answer for it)."""
    try:
        socket.inet_pton(family, host)
    except OSError:  # a name, or an address only getaddrinfo reads (a zone, IPv4's short forms)
        return None
    return host


async def _resolve(
    host: str, port: int, family: socket.AddressFamily, within: float
) -> str | tuple[str, ConnectionCode]:
    """The address to try for a name (one of ``family`` first), or why there is none."""
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), within)
    except TimeoutError:
        return f"cannot resolve host {host!r}: no answer from DNS within {within:g} s", "unresolved"
    except socket.gaierror as exc:
        return f"cannot resolve host {host!r}: {str(exc.strerror or exc).lower()}", "unresolved"
    addresses = [info[4] for info in infos if info[0] == family] or [infos[0][4]]
    return str(addresses[0][0])


async def _connect_error(address: str, port: int, within: float) -> int | None:
    """The OS's error of a TCP connection to ``address``: 0 when it was accepted, None when nothing
    answered within ``within`` seconds. Raises OSError when no socket could try."""
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        code = sock.connect_ex((address, port))
        if code != errno.EINPROGRESS:
            return code
        if not await _writable(sock.fileno(), within):
            return None
        return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
    finally:
        sock.close()


async def _writable(fd: int, within: float) -> bool:
    """Until ``fd`` is writable (a connection attempt ended either way); False after ``within`` s."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[bool] = loop.create_future()
    loop.add_writer(fd, _settle, waiter, True)
    timer = loop.call_later(within, _settle, waiter, False)
    try:
        return await waiter
    finally:
        timer.cancel()
        loop.remove_writer(fd)


def _settle(waiter: asyncio.Future[bool], value: bool) -> None:
    if not waiter.done():
        waiter.set_result(value)
