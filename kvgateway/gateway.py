"""The single process: the ingest half and the serving half over one ring log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import zmq
from starlette.applications import Starlette

from kvgateway.config.settings import Settings
from kvgateway.config.summary import summary
from kvgateway.ingest.streams import Ingest
from kvgateway.runtime.metrics import Metrics
from kvgateway.runtime.startup import StartupError
from kvgateway.serve.app import create_app
from kvgateway.serve.serving import Serving

__all__ = ["OneProcess", "StartupError", "one_process_app"]

logger = logging.getLogger("kvgateway")


class OneProcess:
    """readers -> outlets -> the serving half's ring log -> index, status board, routers and hub,
    in one process (``kvgateway serve``, the demo): a :class:`~kvgateway.serve.role.Role`."""

    def __init__(
        self,
        settings: Settings,
        *,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``context``: the engines' ZeroMQ context (None: the ingest's own, sized to its streams)."""
        self.settings = settings
        self.metrics = Metrics()
        self.serving = Serving(settings, self.metrics, clock=clock)
        self.log = self.serving.log
        self.ingest = Ingest(settings, self.log, self.metrics, context=context, clock=clock)
        self.startup_error: StartupError | None = None
        self.fatal: str | None = None  # one process never stops on its own
        self._stopped = False

    async def start(self) -> None:
        """Open every stream's sockets; raises :class:`StartupError` (kept in ``startup_error``)."""
        try:
            self.ingest.start(f"gateway started: {summary(self.settings)}")
        except StartupError as exc:
            self.startup_error = exc
            raise
        self.serving.start()

    async def stop(self) -> None:
        """Close clients and sockets (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        await self.serving.stop()
        await self.ingest.stop()

    async def close_clients(self) -> None:
        await self.serving.close_clients()

    def health(self) -> dict[str, Any]:
        return self.serving.health()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return self.serving.readiness()

    def refresh_gauges(self) -> None:
        self.serving.refresh_gauges()

    def started_line(self, url: str) -> str:
        return f"serving on {url}"


def one_process_app(gateway: OneProcess) -> Starlette:
    """The web app of one process."""
    return create_app(gateway, gateway.serving)
