"""The NATS side shared by the roles: the connection (TLS, credentials as nats-py offers them) and
the stream that is the log."""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from kvgateway.cluster.records import epoch_of
from kvgateway.config.cluster import NatsOptions

logger = logging.getLogger("kvgateway.cluster")


def _tls(options: NatsOptions) -> ssl.SSLContext | None:
    if not (options.tls_ca or options.tls_cert):
        return None
    context = ssl.create_default_context(cafile=options.tls_ca)
    if options.tls_cert:
        context.load_cert_chain(options.tls_cert, options.tls_key)
    return context


async def connect(options: NatsOptions, within: float = 15.0) -> Client:
    """Connected, reconnecting forever (a nats-server restart is a pause, not an exit)."""
    kwargs: dict[str, Any] = {
        "servers": list(options.servers),
        "name": options.name,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "connect_timeout": 5,
    }
    tls = _tls(options)
    if tls is not None:
        kwargs["tls"] = tls
    if options.creds:
        kwargs["user_credentials"] = options.creds
    if options.token_file:
        kwargs["token"] = Path(options.token_file).read_text(encoding="utf-8").strip()  # noqa: ASYNC240 - once, at start

    last_error: list[str] = []  # a failure is logged once, not at every retry

    async def error_cb(exc: Exception) -> None:
        text = str(exc) or type(exc).__name__
        if not last_error or last_error[-1] != text:
            logger.warning("nats: %s", text)
        last_error[:] = [text]

    async def disconnected_cb() -> None:
        if not client or not (client[0].is_closed or client[0].is_draining):  # closing is no warning
            logger.warning("nats: disconnected, reconnecting")

    async def reconnected_cb() -> None:
        last_error.clear()
        logger.info("nats: reconnected")

    kwargs.update(error_cb=error_cb, disconnected_cb=disconnected_cb, reconnected_cb=reconnected_cb)
    client: list[Client] = []
    try:
        nc = await asyncio.wait_for(nats.connect(**kwargs), within)
    except TimeoutError:
        reason = last_error[-1] if last_error else "no answer"
        raise ConnectionError(f"no NATS server reachable within {within:g} s ({reason})") from None
    client.append(nc)
    return nc


async def close(nc: Client, within: float = 5.0) -> None:
    """Close ``nc`` at shutdown, quietly: with the server gone, nats-py's close still writes its
    pending buffer to the dead transport (RuntimeError from the loop) and may wait on it; nothing is
    left to flush then, so a shutdown that ends in either is a clean one."""
    if nc.is_closed:
        return
    try:
        await asyncio.wait_for(nc.close(), within)
    except (RuntimeError, OSError, TimeoutError) as exc:
        logger.debug("nats: closed with the connection already gone (%s)", exc)


@dataclass(frozen=True, slots=True)
class StreamState:
    epoch: str
    first_seq: int
    last_seq: int


def _state(options: NatsOptions, info: js_api.StreamInfo) -> StreamState:
    created = info.created.isoformat() if info.created is not None else "unknown"
    return StreamState(epoch_of(options.stream, created), info.state.first_seq, info.state.last_seq)


async def stream_state(js: JetStreamContext, options: NatsOptions) -> StreamState | None:
    """The stream's epoch and range; None when it does not exist."""
    try:
        info = await js.stream_info(options.stream)
    except NotFoundError:
        return None
    return _state(options, info)


async def ensure_stream(js: JetStreamContext, options: NatsOptions) -> StreamState:
    """Create the stream unless it exists (a stream that exists is used as it is)."""
    state = await stream_state(js, options)
    if state is not None:
        return state
    config = js_api.StreamConfig(
        name=options.stream,
        subjects=[f"{options.subject_prefix}.>"],
        storage=js_api.StorageType.FILE,
        retention=js_api.RetentionPolicy.LIMITS,
        max_age=options.retention_seconds,
        duplicate_window=options.duplicate_window_seconds,
        num_replicas=options.replicas,
        allow_direct=True,
    )
    info = await js.add_stream(config)
    logger.info("created stream %s (subjects %s.>)", options.stream, options.subject_prefix)
    return _state(options, info)


OTHER_STREAMS_GRACE_SECONDS = 5.0
"""How long an edge waits for its stream when the server holds others (most likely a wrong
--nats-stream) rather than none (an ingest process still starting: the full wait)."""


async def wait_stream(js: JetStreamContext, options: NatsOptions, within: float) -> StreamState:
    """The stream, once an ingest process has created it; raises TimeoutError."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    while True:
        state = await stream_state(js, options)
        if state is not None:
            return state
        others = sorted(info.config.name or "" for info in await js.streams_info())
        waited = loop.time() - began
        if waited >= within or (others and waited >= OTHER_STREAMS_GRACE_SECONDS):
            held = f"this server has {', '.join(others)}" if others else "no ingest process has created it"
            raise TimeoutError(f"stream {options.stream} does not exist ({held}; see --nats-stream)")
        await asyncio.sleep(0.25)
