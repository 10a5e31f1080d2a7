"""The runner: binds the HTTP port, serves the app with uvicorn (uvloop when installed) until a
signal, and turns start-up failures into one line and exit code 1."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import uvicorn

from kvgateway.config import Settings, unresolved_hosts
from kvgateway.gateway import Gateway, StartupError
from kvgateway.runtime import logging_setup
from kvgateway.runtime.fd_budget import Budget, BudgetError, open_context, raise_open_files
from kvgateway.runtime.memory import freeze_startup_heap
from kvgateway.serve.app import create_app

log = logging.getLogger("kvgateway")


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        ws="websockets-sansio",
        ws_max_size=64 * 1024,
        ws_per_message_deflate=False,
        ws_ping_interval=settings.keepalive_seconds,
        # One line per request only at debug: at info a busy dashboard would drown the stream logging_setup.
        access_log=settings.log_level == "debug",
        log_config=None,  # uvicorn's records go to the gateway's handler (logging_setup.setup)
        lifespan="on",
        timeout_graceful_shutdown=3,
    )


class _Server(uvicorn.Server):
    """Signals are the gateway's to handle: stop cleanly and exit 0, not re-raise them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn answers a failed lifespan start-up with sys.exit(3), which would escape the event
        # loop; :func:`serve` sees ``started`` stay False and raises the gateway's own reason.
        with contextlib.suppress(SystemExit):
            await super().serve(sockets)


SEND_TIMEOUT_SECONDS = 15
"""A client whose TCP peer acknowledges nothing for this long is dropped by the kernel.

A cut slow consumer that never reads again would otherwise hold its connection forever: closing
it waits for its send buffer to drain, which never happens."""


def _listen(settings: Settings, reuse_port: bool = False) -> socket.socket:
    """The HTTP listening socket, bound before anything starts: a taken port is one clear line."""
    host = settings.host.strip("[]")
    where = f"{settings.host}:{settings.port}"
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise StartupError(f"cannot listen on {where}: {str(exc.strerror or exc).lower()}") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restart during TIME_WAIT
        if reuse_port:  # cluster edges on one machine: the kernel spreads connections over them
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind((host, settings.port))
    except OSError as exc:
        listener.close()
        reason = str(exc.strerror or exc).lower()
        if exc.errno == errno.EADDRINUSE:
            hint = "another process uses that port: stop it, or choose another with --port"
        elif exc.errno == errno.EACCES:
            hint = "ports below 1024 need privileges: choose another with --port"
        else:
            hint = "check --host"
        raise StartupError(f"cannot listen on {where}: {reason}; {hint}") from None
    listener.set_inheritable(True)
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux; accepted connections inherit it
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, SEND_TIMEOUT_SECONDS * 1000)
    return listener


async def serve(
    settings: Settings,
    *,
    ready: Callable[[str], None] | None = None,
    make_gateway: Callable[..., Gateway] = Gateway,
    reuse_port: bool = False,
    listening: Callable[[str], None] = lambda url: None,
) -> None:
    """Run the gateway and its HTTP server until SIGINT/SIGTERM: the port is bound (``listening``), the
    app's lifespan starts the gateway, HTTP is served (``ready``); a failure is a :class:`StartupError`."""
    listener = _listen(settings, reuse_port)
    settings = replace(settings, port=int(listener.getsockname()[1]))  # --port 0: the port it got
    listening(base_url(settings))
    try:
        budget = Budget.of(settings)
        raise_open_files(budget)
        context = open_context(budget)
    except BudgetError as exc:
        listener.close()
        raise StartupError(str(exc)) from None
    try:
        gateway = make_gateway(settings, context=context)
        app = create_app(gateway)
        server = _Server(uvicorn_config(app, settings))
        loop = asyncio.get_running_loop()

        def shut_down() -> None:
            # Clients first, with our own close code (1012) and nothing half-sent; then uvicorn.
            gateway.hub.close()
            server.should_exit = True

        for host in unresolved_hosts(settings):
            log.warning("host %r does not resolve (yet): its streams stay down until it does", host)
        # A failed start is the gateway's own one line: uvicorn's echo of it (a traceback) is dropped.
        uvicorn_errors = logging.getLogger("uvicorn.error")
        quiet_failure = _QuietStartupFailure(gateway)
        uvicorn_errors.addFilter(quiet_failure)
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, shut_down)
            task = asyncio.create_task(server.serve(sockets=[listener]))
            while not server.started and not task.done():  # noqa: ASYNC110 - uvicorn offers no start event
                await asyncio.sleep(0.02)
            if not server.started:
                with contextlib.suppress(Exception):
                    await task
                if gateway.startup_error is not None:
                    raise gateway.startup_error
                raise StartupError(f"cannot serve HTTP on {settings.host}:{settings.port}")
            if ready is not None:
                ready(base_url(settings))
            await task
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            uvicorn_errors.removeFilter(quiet_failure)
            await gateway.stop()  # idempotent: the lifespan has stopped it unless start-up failed
    finally:
        listener.close()
        context.destroy(linger=0)  # destroy, not term: see Gateway.stop


def base_url(settings: Settings) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"http://{host}:{settings.port}/"


class _QuietStartupFailure(logging.Filter):
    def __init__(self, gateway: Gateway) -> None:
        super().__init__()
        self.gateway = gateway

    def filter(self, record: logging.LogRecord) -> bool:
        return self.gateway.startup_error is None


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (uvicorn[standard] brings it), as ``uvicorn.run`` would choose: in the
    benchmark it cut p99 latency at 1,000 batches/s from about 15 ms to about 1 ms."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(settings: Settings) -> int:
    logging_setup.setup(settings.log_level, settings.log_format, secrets=(settings.token,) if settings.token else ())
    if settings.allow_unauthenticated and settings.token is None:
        log.warning("authentication is OFF on %s:%d (--allow-unauthenticated)", settings.host, settings.port)

    def ready(url: str) -> None:
        freeze_startup_heap()  # the process's own heap: not for a serve() embedded in another program
        log.info("serving on %s", url)

    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(serve(settings, ready=ready))
    except StartupError as exc:
        log.error("%s", exc)
        return 1
    return 0
