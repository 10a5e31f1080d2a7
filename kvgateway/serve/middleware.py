"""The web app's gates, as ASGI middleware: the Host check (DNS rebinding), the token (every
``/v1/*`` route, so a new route is protected by default), the WebSocket Origin check, and the
security headers of every HTTP answer."""

from __future__ import annotations

import hmac
import logging
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from kvgateway.config.addresses import is_loopback
from kvgateway.config.settings import Settings
from kvgateway.runtime.metrics import Metrics
from kvgateway.serve.errors import json_error

logger = logging.getLogger("kvgateway.web")

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Probes and scrapes: no token, no Host check (they carry no events and come by pod address)."""

HOST_VERDICTS = 64
"""Host headers whose verdict :class:`HostCheck` keeps (all forgotten when one more comes)."""

PROTECTED_PREFIX = "/v1/"
"""Every path under it needs the token (when one is set), whether a route serves it or not."""


async def _refuse(scope: Scope, receive: Receive, send: Send, response: JSONResponse) -> None:
    if scope["type"] == "websocket":
        await WebSocket(scope, receive, send).send_denial_response(response)
    else:
        await response(scope, receive, send)


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
        # The verdicts of the Host headers seen last: a client sends the same one every time, and
        # parsing it as an address (is_loopback) cost 2.5 us a request. Bounded: the header is
        # the client's to choose.
        self._verdicts: dict[str, bool] = {}

    def allows(self, header: str | None) -> bool:
        if header is None:
            return True  # HTTP/1.0 tools: no name to rebind
        verdict = self._verdicts.get(header)
        if verdict is None:
            name = host_name(header)
            verdict = _is_loopback_name(name) or name in self.allowed or not self.strict
            if len(self._verdicts) >= HOST_VERDICTS:
                self._verdicts.clear()
            self._verdicts[header] = verdict
        return verdict

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        raw = headers.get(b"host")
        if self.allows(None if raw is None else raw.decode("latin-1")):
            await self.app(scope, receive, send)
            return
        self.metrics.client_rejections.labels(_transport(scope), "forbidden_host").inc()
        logger.warning("request for a foreign host refused: %r", (raw or b"").decode("latin-1")[:200])
        await _refuse(scope, receive, send, json_error(400, "host not allowed (see --allowed-host)"))


class Authentication:
    """The token, for every path under ``/v1/`` (routed or not: a 404 there tells nothing to a
    stranger either); and before it, for WebSocket handshakes, the Origin check.

    The token comes as ``Authorization: Bearer <token>`` or, for clients that cannot set headers
    (EventSource, browsers' WebSocket), as the ``token`` query parameter.
    """

    def __init__(self, app: ASGIApp, settings: Settings, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self.token = settings.token.encode() if settings.token else None
        self.allowed_origins = frozenset(settings.allowed_origins)

    def authorized(self, conn: HTTPConnection) -> bool:
        if self.token is None:
            return True
        header = conn.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        given = value.strip() if scheme.lower() == "bearer" else conn.query_params.get("token", "")
        # compare_digest: the time taken does not tell how much of a guess was right.
        return hmac.compare_digest(given.encode(), self.token)

    def origin_allowed(self, conn: HTTPConnection) -> bool:
        origin = conn.headers.get("origin")
        if origin is None:
            return True  # not a browser: Origin is the browsers' cross-site guard
        if origin in self.allowed_origins:
            return True
        # The gateway's own pages (the dashboard) are always welcome: same origin is no threat.
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and parts.netloc == conn.headers.get("host", "")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not scope["path"].startswith(PROTECTED_PREFIX):
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        if scope["type"] == "websocket" and not self.origin_allowed(conn):
            self.metrics.client_rejections.labels("ws", "forbidden_origin").inc()
            logger.warning("websocket from foreign origin %r refused", conn.headers.get("origin", "")[:200])
            await _refuse(scope, receive, send, json_error(403, "origin not allowed"))
            return
        if self.authorized(conn):
            await self.app(scope, receive, send)
            return
        transport = _transport(scope)
        self.metrics.client_rejections.labels(transport, "unauthorized").inc()
        client = conn.client.host if conn.client else "?"
        logger.warning("auth failure: %s %s from %s", transport, conn.url.path, client)
        response = json_error(401, "missing or invalid token", **{"WWW-Authenticate": 'Bearer realm="kvgateway"'})
        await _refuse(scope, receive, send, response)


SSE_PATH = "/v1/events"


def _transport(scope: Scope) -> str:
    """The ``transport`` label of a rejection: ws, sse (a stream request) or http."""
    if scope["type"] == "websocket":
        return "ws"
    return "sse" if scope["path"] == SSE_PATH and scope["method"] in ("GET", "HEAD") else "http"
