"""The one process shell of every command (``serve``, ``edge``, ``ingest``, the demo): binds the
HTTP port, enters what the command runs around its server, makes the role the command composes and
serves its app with uvicorn (uvloop when installed) until a signal, and turns start-up failures
into one line and exit code 1."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any, TypeAlias, TypeVar

import uvicorn
from starlette.applications import Starlette

from kvgateway.config.addresses import unresolved_hosts
from kvgateway.config.settings import Settings
from kvgateway.runtime import logging_setup
from kvgateway.runtime.memory import freeze_startup_heap
from kvgateway.runtime.startup import StartupError
from kvgateway.serve.role import Role

logger = logging.getLogger("kvgateway")


class WebSocketUpgrade(asyncio.Protocol):
    """What uvicorn makes for a WebSocket upgrade: the gateway's protocol
    (:class:`kvgateway.serve.ws_protocol.WebSocketProtocol`, uvicorn's ``websockets-sansio``
    writing the log's bytes as they are), its module imported at the first upgrade. The websockets
    library and uvicorn's protocol under it were 11 ms of start-up's imports, which a gateway
    catching up from an engine's buffer, with no client yet, spent before it could ask for the
    replay; the first WebSocket client pays them once."""

    def __new__(cls, **kwargs: Any) -> Any:  # uvicorn passes config, server_state and app_state
        from kvgateway.serve.ws_protocol import WebSocketProtocol

        return WebSocketProtocol(**kwargs)


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        ws=WebSocketUpgrade,
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


CLOSE_CLIENTS_SECONDS = 5.0
"""How long a signal's shutdown waits for the WebSocket sessions to send the gateway's own close
before uvicorn stops (and closes what is left with a bare 1012)."""

SEND_TIMEOUT_SECONDS = 15
"""A client whose TCP peer acknowledges nothing for this long is dropped by the kernel.

A cut slow consumer that never reads again would otherwise hold its connection forever: closing
it waits for its send buffer to drain, which never happens."""


def listen(settings: Settings, reuse_port: bool = False) -> socket.socket:
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


R = TypeVar("R", bound=Role)

Around: TypeAlias = Callable[[Settings], AbstractAsyncContextManager[Settings]]
"""What a command runs around its role and server: entered once the HTTP port is bound (given the
settings with the port it got), it yields the settings to serve with, and is left after the server
stopped: an edge lists the sources the ingest announced; the demo starts its engines (and stops
them after)."""


@contextlib.asynccontextmanager
async def as_given(settings: Settings) -> AsyncIterator[Settings]:
    """Nothing around the server (``serve``, ``ingest``): the settings as loaded."""
    yield settings


async def serve(
    settings: Settings,
    *,
    make_role: Callable[[Settings], R],
    make_app: Callable[[R], Starlette],
    around: Around = as_given,
    ready: Callable[[str], None] | None = None,
    reuse_port: bool = False,
    made: Callable[[R], None] = lambda role: None,
    built: Callable[[], None] = lambda: None,
    close_clients: Callable[[R], Awaitable[None]] | None = None,
) -> None:
    """The one HTTP runner: the port is bound, ``around`` entered, the role ``make_role(settings)``
    made (``made``) and its app ``make_app(role)`` and uvicorn's server built (``built``, before
    the role starts), served until SIGINT/SIGTERM (``close_clients`` first); the app's lifespan
    starts and stops the role, HTTP is served (``ready``); a failure is a :class:`StartupError`."""
    listener = listen(settings, reuse_port)
    settings = replace(settings, port=int(listener.getsockname()[1]))  # --port 0: the port it got
    try:
        async with around(settings) as settings:
            role = make_role(settings)
            made(role)
            server = _Server(uvicorn_config(make_app(role), settings))
            server.config.load()  # uvicorn's protocol modules imported now, not after ``built``
            for host in unresolved_hosts(settings):
                logger.warning("host %r does not resolve (yet): its streams stay down until it does", host)
            built()
            try:
                await _serve_until_signal(server, role, listener, settings, ready=ready, close_clients=close_clients)
            finally:
                await role.stop()  # idempotent: the lifespan has stopped it unless start-up failed
    finally:
        listener.close()


async def _serve_until_signal(
    server: _Server,
    role: R,
    listener: socket.socket,
    settings: Settings,
    *,
    ready: Callable[[str], None] | None,
    close_clients: Callable[[R], Awaitable[None]] | None,
) -> None:
    loop = asyncio.get_running_loop()
    closing: list[asyncio.Task[None]] = []

    async def close_then_exit(close: Callable[[R], Awaitable[None]]) -> None:
        # clients first, each sent our own close (1012 and its reason); then uvicorn, whose own
        # close of a connection still open is a bare 1012. A client that reads nothing cannot hold
        # the exit longer than CLOSE_CLIENTS_SECONDS.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(close(role), CLOSE_CLIENTS_SECONDS)
        server.should_exit = True

    def shut_down() -> None:
        if close_clients is None or closing:  # a second signal: stop now
            server.should_exit = True
            return
        closing.append(loop.create_task(close_then_exit(close_clients)))

    # A failed start is the role's own one line: uvicorn's echo of it (a traceback) is dropped.
    uvicorn_errors = logging.getLogger("uvicorn.error")
    quiet_failure = _QuietStartupFailure(role)
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
            if role.startup_error is not None:
                raise role.startup_error
            raise StartupError(f"cannot serve HTTP on {settings.host}:{settings.port}")
        if ready is not None:
            ready(base_url(settings))
        await task
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        uvicorn_errors.removeFilter(quiet_failure)
        for task in closing:
            task.cancel()


def base_url(settings: Settings) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"http://{host}:{settings.port}/"


class _QuietStartupFailure(logging.Filter):
    def __init__(self, role: Role) -> None:
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        return self.role.startup_error is None


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (uvicorn[standard] brings it), as ``uvicorn.run`` would choose: in the
    benchmark it cut p99 latency at 1,000 batches/s from about 15 ms to about 1 ms."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def start_up_built() -> None:
    """Start-up's heap is built (modules, the role, the app, uvicorn's server): freeze it out of
    the collector's walks (:func:`~kvgateway.runtime.memory.freeze_startup_heap`) and let the
    collector run again (``kvgateway.cli.main`` holds it through start-up). Before the role starts:
    frozen when the server was ready, the heap held the catch-up's first batches too, and the
    freeze's full collection (30 to 46 ms; there is none now) stalled the replay. The process's
    own heap: not for a :func:`serve` embedded in another program."""
    freeze_startup_heap()
    gc.enable()


def run(
    settings: Settings,
    make_role: Callable[[Settings], R],
    make_app: Callable[[R], Starlette],
    *,
    around: Around = as_given,
    close_clients: Callable[[R], Awaitable[None]] | None = None,
    on_ready: Callable[[str], None] | None = None,
    reuse_port: bool = False,
) -> int:
    """The one process shell (``serve``, ``edge``, ``ingest``, the demo): logging, the event loop
    (uvloop when installed), :func:`serve` with what the command runs ``around`` it, the role's
    started line once HTTP is served (then the command's own, ``on_ready``), and the exit code: 0
    after a signal, 1 with one line when it could not start or stopped on its own."""
    logging_setup.setup_for(settings)
    roles: list[R] = []

    def ready(url: str) -> None:
        logger.info("%s", roles[0].started_line(url))
        if on_ready is not None:
            on_ready(url)

    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(
                serve(
                    settings,
                    make_role=make_role,
                    make_app=make_app,
                    around=around,
                    ready=ready,
                    reuse_port=reuse_port,
                    made=roles.append,
                    built=start_up_built,
                    close_clients=close_clients,
                )
            )
    except StartupError as exc:
        logger.error("%s", exc)
        return 1
    return 1 if roles and roles[0].fatal else 0
