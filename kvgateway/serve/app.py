"""The web apps: module-level Starlette routes, thin adapters from HTTP, WebSocket and SSE to the
role and its serving half on ``app.state``; each app's lifespan (:func:`running`) starts and stops
what the command composed; middleware.py's gates check first. :func:`create_app` serves the whole
protocol (one process, an edge), :func:`probe_app` only the probes (an ingest)."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from http import HTTPStatus
from pathlib import Path
from typing import Final, Protocol, TypeAlias

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from kvgateway.protocol import messages
from kvgateway.protocol.messages import schema_bytes
from kvgateway.serve.dashboard_api import DashboardData, analytics_endpoint, history_endpoint
from kvgateway.serve.errors import json_error
from kvgateway.serve.http_query import bad_request, read_query
from kvgateway.serve.hub import ShuttingDown, TooManyClients
from kvgateway.serve.middleware import PROTECTED_PREFIX, Authentication, HostCheck, SecurityHeaders
from kvgateway.serve.query import INT_SEQS, BadRequest, ClientRequest
from kvgateway.serve.role import Role
from kvgateway.serve.router_api import ROUTER_ROUTES
from kvgateway.serve.serving import Serving
from kvgateway.serve.sessions import WS_CLOSE, sse_stream, ws_session

logger = logging.getLogger("kvgateway.web")


@functools.cache
def _schema() -> bytes:
    """The JSON Schema served at /v1/schema, read at its first request: read at import (through
    ``importlib.resources`` and the readers it imports then), it was 2.5 to 3 ms of every
    start-up, a catch-up's before it could ask for the replay."""
    return schema_bytes()


def static_dir() -> Path:
    """The dashboard files: inside the installed package, or the checkout's top-level static/."""
    package = Path(__file__).resolve().parent.parent  # this module lives in kvgateway/serve/
    packaged = package / "static"
    if (packaged / "index.html").is_file():
        return packaged
    return package.parent / "static"


class Beside(Protocol):
    """What an app runs beside its role while it serves (the dashboard's history sampler)."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


Lifespan: TypeAlias = Callable[[Starlette], AbstractAsyncContextManager[None]]


def running(role: Role, *beside: Beside) -> Lifespan:
    """An app's lifespan: ``role`` runs while the app does (started before the first request,
    stopped after the last), and ``beside`` it what the app composed with it."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await role.start()
            for part in beside:
                part.start()
            yield
        finally:
            for part in reversed(beside):
                await part.stop()
            await role.stop()

    return lifespan


def _serving(conn: HTTPConnection) -> Serving:
    serving: Serving = conn.app.state.serving
    return serving


# --- the probes: every role's (the token is checked before the routes: middleware.Authentication) ---


async def healthz(request: Request) -> Response:
    role: Role = request.app.state.role
    return JSONResponse({"status": "ok", **role.health()})


async def readyz(request: Request) -> Response:
    role: Role = request.app.state.role
    ready, body = role.readiness()
    return JSONResponse({"ready": ready, **body}, status_code=200 if ready else 503)


async def metrics_endpoint(request: Request) -> Response:
    role: Role = request.app.state.role
    role.refresh_gauges()
    body, content_type = role.metrics.exposition()
    return Response(body, media_type=content_type)


PROBE_ROUTES: Final[list[Route | WebSocketRoute]] = [
    Route("/healthz", healthz),
    Route("/readyz", readyz),
    Route("/metrics", metrics_endpoint),
]


def probe_app(role: Role) -> Starlette:
    """The app of a role that serves no clients (an ingest): the probes and metrics, and the
    lifespan that starts and stops it."""
    app = Starlette(routes=list(PROBE_ROUTES), lifespan=running(role))
    app.state.role = role
    return app


# --- the web protocol ----------------------------------------------------------------------------


async def sources(request: Request) -> Response:
    serving = _serving(request)
    try:
        client, _ = read_query(request, "/v1/sources")
    except BadRequest as exc:
        return bad_request(serving, exc)
    statuses = serving.statuses(client.filter)
    if INT_SEQS in client.compat:  # a client written against integer seqs, until 0.2.0
        statuses = [messages.int_seqs_status(status) for status in statuses]
    return JSONResponse({"offset": serving.hub.offset, "epoch": serving.hub.epoch, "sources": statuses})


async def occupancy(request: Request) -> Response:
    serving = _serving(request)
    try:
        client, _ = read_query(request, "/v1/occupancy")
    except BadRequest as exc:
        return bad_request(serving, exc)
    body = serving.snapshot(client_filter=client.filter)
    # the whole fleet whatever the filter: counted every 15 s in the background (kvgateway/serve/router_state.py)
    body["fleet"] = serving.routers.fleet
    return Response(msgspec.json.encode(body), media_type="application/json")


async def schema(request: Request) -> Response:
    try:
        read_query(request, "/v1/schema")
    except BadRequest as exc:
        return bad_request(_serving(request), exc)
    return Response(_schema(), media_type="application/schema+json")


def _client_request(conn: HTTPConnection, transport: str) -> ClientRequest:
    # EventSource resends the page's original URL on reconnect: its Last-Event-ID header wins.
    header = conn.headers.get("last-event-id") if transport == "sse" else None
    route = "/v1/events" if transport == "sse" else "/v1/ws"
    return read_query(conn, route, last_event_id=header)[0]


async def events(request: Request) -> Response:
    serving = _serving(request)
    metrics = serving.metrics
    try:
        client = _client_request(request, "sse")
    except BadRequest as exc:
        metrics.client_rejections.labels("sse", "bad_request").inc()
        return json_error(400, str(exc))
    try:
        subscription = await serving.subscribe(client, "sse")
    except ShuttingDown:
        metrics.client_rejections.labels("sse", "shutdown").inc()
        return json_error(503, "gateway shutting down", **{"Retry-After": "5"})
    except TooManyClients:
        metrics.client_rejections.labels("sse", "too_many_clients").inc()
        return json_error(503, "too many clients", **{"Retry-After": "5"})
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
    return StreamingResponse(
        sse_stream(subscription, serving.settings.keepalive_seconds),
        media_type="text/event-stream; charset=utf-8",
        headers=headers,
    )


async def websocket_endpoint(websocket: WebSocket) -> None:
    serving = _serving(websocket)
    metrics = serving.metrics
    try:
        client = _client_request(websocket, "ws")
    except BadRequest as exc:
        metrics.client_rejections.labels("ws", "bad_request").inc()
        await websocket.send_denial_response(json_error(400, str(exc)))
        return
    try:
        subscription = await serving.subscribe(client, "ws")
    except (ShuttingDown, TooManyClients) as exc:
        why = "shutdown" if isinstance(exc, ShuttingDown) else "too_many_clients"
        metrics.client_rejections.labels("ws", why).inc()
        code, reason = WS_CLOSE[why]
        await websocket.accept()
        await websocket.close(code, reason)
        return
    with serving.writers.writing():
        await ws_session(websocket, subscription)


ROUTES: Final[list[Route | WebSocketRoute]] = [
    *PROBE_ROUTES,
    Route("/v1/sources", sources),
    Route("/v1/occupancy", occupancy),
    Route("/v1/history", history_endpoint),
    Route("/v1/analytics", analytics_endpoint),
    Route("/v1/schema", schema),
    Route("/v1/events", events),
    WebSocketRoute("/v1/ws", websocket_endpoint),
    *ROUTER_ROUTES,
]
_KNOWN_V1: Final = {
    route.path: ", ".join(sorted(getattr(route, "methods", None) or {"GET", "HEAD"}))
    for route in ROUTES
    if route.path.startswith(PROTECTED_PREFIX)
}


async def not_found(request: Request, exc: Exception) -> Response:
    """404 and 405 (raised by the dashboard's static mount): JSON under /v1/, like every API answer."""
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    path = request.url.path
    if not path.startswith(PROTECTED_PREFIX):
        return PlainTextResponse(HTTPStatus(status).phrase, status_code=status)
    if path == "/v1/ws":
        return json_error(426, "/v1/ws is a WebSocket endpoint: use a WebSocket client", Upgrade="websocket")
    if path in _KNOWN_V1:
        return json_error(405, f"method {request.method} not allowed on {path}", Allow=_KNOWN_V1[path])
    return json_error(404, f"no such endpoint: {path[:200]} (see docs/protocol.md)")


def create_app(role: Role, serving: Serving) -> Starlette:
    """The web app of ``role`` (one process, or an edge) and its serving half; the app's lifespan
    starts and stops the role."""
    routes = [*ROUTES, Mount("/", app=StaticFiles(directory=static_dir(), html=True), name="static")]
    dashboard_data = DashboardData(serving)
    app = Starlette(
        routes=routes,
        exception_handlers={404: not_found, 405: not_found},
        lifespan=running(role, dashboard_data),
    )
    app.state.role = role
    app.state.serving = serving
    app.state.dashboard_data = dashboard_data
    settings = serving.settings
    if settings.allow_unauthenticated and settings.token is None:
        logging.getLogger("kvgateway").warning(
            "authentication is OFF on %s:%d (--allow-unauthenticated)", settings.host, settings.port
        )
    # The last added runs first: headers on every answer, then the Host, then Origin and token.
    app.add_middleware(Authentication, settings=serving.settings, metrics=serving.metrics)
    app.add_middleware(HostCheck, settings=serving.settings, metrics=serving.metrics)
    app.add_middleware(SecurityHeaders)
    return app
