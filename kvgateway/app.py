"""Starlette routes: thin adapters from HTTP, WebSocket and SSE to the gateway and its hub."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator
from http import HTTPStatus
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from kvgateway.config import Settings, is_loopback
from kvgateway.gateway import Gateway
from kvgateway.hub import WS_CLOSE, BadRequest, ClientRequest, Subscription, TooManyClients
from kvgateway.messages import SSE_PING, schema_bytes, sse_bytes, sse_preamble, ws_text
from kvgateway.metrics import Metrics

log = logging.getLogger("kvgateway.web")

SSE_RETRY_MS = 2000


def static_dir() -> Path:
    """The dashboard files: inside the installed package, or the checkout's top-level static/."""
    packaged = Path(__file__).parent / "static"
    if (packaged / "index.html").is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "static"


def _json_error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


class SecurityHeaders:
    """Headers that keep the dashboard from being framed or sniffed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = message.setdefault("headers", [])
                headers.append((b"x-content-type-options", b"nosniff"))
                headers.append((b"x-frame-options", b"DENY"))
                headers.append((b"referrer-policy", b"no-referrer"))
                headers.append(
                    (
                        b"content-security-policy",
                        b"default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; "
                        b"style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
                    )
                )
            await send(message)

        await self.app(scope, receive, send_with_headers)


OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Probes and scrapes: no token, no Host check (they carry no events and come by pod address)."""


def host_name(header: str) -> str:
    """The name in a Host header, without port or IPv6 brackets, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _is_loopback_name(name: str) -> bool:
    return name == "localhost" or name.endswith(".localhost") or is_loopback(name)


class HostCheck:
    """Refuse requests whose Host the gateway does not answer to: the defence against DNS
    rebinding, where a foreign page's own host name resolves to the gateway's address.

    Loopback names always pass, and so do ``allowed_hosts`` and the hosts of
    ``allowed_origins``. Bound to loopback, nothing else does; bound to another address, any
    Host passes unless ``allowed_hosts`` is set (the token, required there, guards the data).
    """

    def __init__(self, app: ASGIApp, settings: Settings, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self.allowed = frozenset(name.lower() for name in settings.allowed_hosts) | {
            host_name(urlsplit(origin).netloc) for origin in settings.allowed_origins
        }
        self.strict = bool(settings.allowed_hosts) or is_loopback(settings.host)

    def allows(self, header: str | None) -> bool:
        if header is None:
            return True  # HTTP/1.0 tools: no name to rebind
        name = host_name(header)
        return _is_loopback_name(name) or name in self.allowed or not self.strict

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        raw = headers.get(b"host")
        if self.allows(None if raw is None else raw.decode("latin-1")):
            await self.app(scope, receive, send)
            return
        transport = "ws" if scope["type"] == "websocket" else "http"
        self.metrics.client_rejections.labels(transport, "forbidden_host").inc()
        log.warning("request for a foreign host refused: %r", (raw or b"").decode("latin-1")[:200])
        response = _json_error(400, "host not allowed (see --allowed-host)")
        if scope["type"] == "websocket":
            await WebSocket(scope, receive, send).send_denial_response(response)
        else:
            await response(scope, receive, send)


def create_app(gateway: Gateway) -> Starlette:
    settings = gateway.settings
    hub = gateway.hub
    metrics = gateway.metrics
    token = settings.token.encode() if settings.token else None
    schema_body = schema_bytes()

    def authorized(conn: HTTPConnection) -> bool:
        if token is None:
            return True
        header = conn.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        given = value.strip() if scheme.lower() == "bearer" else conn.query_params.get("token", "")
        # compare_digest: the time taken does not tell how much of a guess was right.
        return hmac.compare_digest(given.encode(), token)

    def reject_unauthorized(conn: HTTPConnection, transport: str) -> JSONResponse:
        metrics.client_rejections.labels(transport, "unauthorized").inc()
        client = conn.client.host if conn.client else "?"
        log.warning("auth failure: %s %s from %s", transport, conn.url.path, client)
        return _json_error(401, "missing or invalid token", **{"WWW-Authenticate": 'Bearer realm="kvgateway"'})

    def origin_allowed(conn: HTTPConnection) -> bool:
        origin = conn.headers.get("origin")
        if origin is None:
            return True  # not a browser: Origin is the browsers' cross-site guard
        if origin in settings.allowed_origins:
            return True
        # The gateway's own pages (the dashboard) are always welcome: same origin is no threat.
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and parts.netloc == conn.headers.get("host", "")

    async def healthz(request: Request) -> Response:
        return JSONResponse(
            {"status": "ok", "epoch": hub.epoch, "uptime_seconds": gateway.clock() - gateway.started_at}
        )

    async def readyz(request: Request) -> Response:
        ready, not_ready = gateway.readiness()
        return JSONResponse(
            {"ready": ready, "streams": len(gateway.status), "not_ready": not_ready}, status_code=200 if ready else 503
        )

    async def metrics_endpoint(request: Request) -> Response:
        gateway.refresh_gauges()
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    async def sources(request: Request) -> Response:
        if not authorized(request):
            return reject_unauthorized(request, "http")
        return JSONResponse({"offset": hub.offset, "epoch": hub.epoch, "sources": gateway.statuses()})

    async def occupancy(request: Request) -> Response:
        if not authorized(request):
            return reject_unauthorized(request, "http")
        return Response(msgspec.json.encode(gateway.snapshot()), media_type="application/json")

    async def schema(request: Request) -> Response:
        if not authorized(request):
            return reject_unauthorized(request, "http")
        return Response(schema_body, media_type="application/schema+json")

    def client_request(conn: HTTPConnection, transport: str) -> ClientRequest:
        # EventSource resends the page's original URL on reconnect: its Last-Event-ID header wins.
        header = conn.headers.get("last-event-id") if transport == "sse" else None
        return hub.parse_query(conn.query_params, last_event_id=header)

    async def events(request: Request) -> Response:
        if not authorized(request):
            return reject_unauthorized(request, "sse")
        try:
            client = client_request(request, "sse")
        except BadRequest as exc:
            metrics.client_rejections.labels("sse", "bad_request").inc()
            return _json_error(400, str(exc))
        try:
            subscription = hub.subscribe(client, "sse")
        except TooManyClients:
            metrics.client_rejections.labels("sse", "too_many_clients").inc()
            return _json_error(503, "too many clients", **{"Retry-After": "5"})
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
        return StreamingResponse(
            _sse_stream(subscription, settings.keepalive_seconds),
            media_type="text/event-stream; charset=utf-8",
            headers=headers,
        )

    async def websocket_endpoint(websocket: WebSocket) -> None:
        if not origin_allowed(websocket):
            metrics.client_rejections.labels("ws", "forbidden_origin").inc()
            log.warning("websocket from foreign origin %r refused", websocket.headers.get("origin", "")[:200])
            await websocket.send_denial_response(_json_error(403, "origin not allowed"))
            return
        if not authorized(websocket):
            await websocket.send_denial_response(reject_unauthorized(websocket, "ws"))
            return
        try:
            client = client_request(websocket, "ws")
        except BadRequest as exc:
            metrics.client_rejections.labels("ws", "bad_request").inc()
            await websocket.send_denial_response(_json_error(400, str(exc)))
            return
        try:
            subscription = hub.subscribe(client, "ws")
        except TooManyClients:
            metrics.client_rejections.labels("ws", "too_many_clients").inc()
            code, reason = WS_CLOSE["too_many_clients"]
            await websocket.accept()
            await websocket.close(code, reason)
            return
        await _ws_session(websocket, subscription)

    known_v1 = {"/v1/sources", "/v1/occupancy", "/v1/schema", "/v1/events", "/v1/ws"}

    async def not_found(request: Request, exc: Exception) -> Response:
        """404 and 405 (raised by the dashboard's static mount): JSON under /v1/, like every API answer."""
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        path = request.url.path
        if not path.startswith("/v1/"):
            return PlainTextResponse(HTTPStatus(status).phrase, status_code=status)
        if not authorized(request):
            return reject_unauthorized(request, "http")
        if path == "/v1/ws":
            return _json_error(426, "/v1/ws is a WebSocket endpoint: use a WebSocket client", Upgrade="websocket")
        if path in known_v1:
            return _json_error(405, f"method {request.method} not allowed on {path}", Allow="GET, HEAD")
        return _json_error(404, f"no such endpoint: {path[:200]} (see docs/protocol.md)")

    static = StaticFiles(directory=static_dir(), html=True)
    routes = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics_endpoint),
        Route("/v1/sources", sources),
        Route("/v1/occupancy", occupancy),
        Route("/v1/schema", schema),
        Route("/v1/events", events),
        WebSocketRoute("/v1/ws", websocket_endpoint),
        Mount("/", app=static, name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    app.add_middleware(HostCheck, settings=settings, metrics=metrics)
    app.add_middleware(SecurityHeaders)
    return app


async def _ws_session(websocket: WebSocket, subscription: Subscription) -> None:
    await websocket.accept()
    # The reader closes the subscription when the client leaves, which wakes the pump: the pump
    # awaits next_chunk() itself, with no task and no asyncio.wait() per chunk (they cost more
    # than the write).
    reader = asyncio.ensure_future(_drain_inbound(websocket, subscription))
    try:
        await websocket.send_text(subscription.hello_message.text)
        while True:
            chunk = await subscription.next_chunk()
            if chunk is None:
                if not reader.done():  # cut by the gateway (slow, shutdown), not gone by itself
                    code, reason = WS_CLOSE.get(subscription.closed_reason or "", (1000, ""))
                    await websocket.close(code, reason)
                return
            # Several messages in one frame, newline-delimited: one frame per message would
            # collapse throughput under load.
            subscription.writing = True
            try:
                await websocket.send_text(ws_text(chunk))
            finally:
                subscription.writing = False
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        subscription.close("closed")


async def _drain_inbound(websocket: WebSocket, subscription: Subscription) -> None:
    """Clients have nothing to say: what they send (at most 64 KiB a frame) is read and dropped,
    which is also how a departure is noticed: the subscription is closed, waking the pump."""
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
    finally:
        subscription.close("closed")


async def _sse_stream(subscription: Subscription, keepalive: float) -> AsyncIterator[bytes]:
    try:
        yield sse_preamble(SSE_RETRY_MS) + subscription.hello_message.sse
        while True:
            # One timer per wait for the keepalive, none when messages are already queued.
            chunk = await subscription.next_chunk(idle=keepalive)
            if chunk == []:
                yield SSE_PING  # nothing for `keepalive` seconds: keeps proxies from closing the stream
                continue
            if chunk is None:
                farewell = subscription.farewell()
                if farewell is not None:
                    yield farewell.sse
                return
            subscription.writing = True
            try:
                yield sse_bytes(chunk)
            finally:
                subscription.writing = False
    finally:
        subscription.close("closed")
