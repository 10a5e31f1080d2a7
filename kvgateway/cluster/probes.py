"""The little HTTP side of a process that serves no clients (ingest): probes and metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvgateway.runtime.metrics import Metrics


def probe_app(
    health: Callable[[], dict[str, Any]],
    readiness: Callable[[], tuple[bool, dict[str, Any]]],
    metrics: Metrics,
    refresh: Callable[[], None],
) -> Starlette:
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", **health()})

    async def readyz(request: Request) -> Response:
        ready, body = readiness()
        return JSONResponse({"ready": ready, **body}, status_code=200 if ready else 503)

    async def metrics_endpoint(request: Request) -> Response:
        refresh()
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    return Starlette(routes=[Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics_endpoint)])
