"""The little HTTP side of a process that serves no clients (ingest): probes and metrics, and a
lifespan that starts and stops the process's service (as the web app's does for a gateway)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kvgateway.runtime.metrics import Metrics


class Probed(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def refresh_gauges(self) -> None: ...


def probe_app(
    service: Probed,
    *,
    health: Callable[[], dict[str, Any]],
    readiness: Callable[[], tuple[bool, dict[str, Any]]],
    metrics: Metrics,
) -> Starlette:
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", **health()})

    async def readyz(request: Request) -> Response:
        ready, body = readiness()
        return JSONResponse({"ready": ready, **body}, status_code=200 if ready else 503)

    async def metrics_endpoint(request: Request) -> Response:
        service.refresh_gauges()
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await service.start()
            yield
        finally:
            await service.stop()

    routes = [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics_endpoint)]
    return Starlette(routes=routes, lifespan=lifespan)
