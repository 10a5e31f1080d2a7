"""The single process: the ingest half and the serving half over one memory log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from kvgateway.config import Settings
from kvgateway.engine.wire import Stream
from kvgateway.ingest.outlet import StreamOutlet
from kvgateway.ingest.reader import StreamReader
from kvgateway.ingest.streams import Ingest
from kvgateway.log.ordered import MemoryLog
from kvgateway.runtime.metrics import Metrics
from kvgateway.runtime.startup import StartupError
from kvgateway.serve.serving import Serving

__all__ = ["Gateway", "StartupError"]

logger = logging.getLogger("kvgateway")


class Gateway:
    """readers -> outlets -> memory log -> index, status board, routers and hub, in one process."""

    def __init__(
        self,
        settings: Settings,
        *,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.metrics = Metrics()
        hub_metrics = self.metrics.hub()
        self.log = MemoryLog(settings.ring_messages, settings.ring_bytes, retained=hub_metrics.retained)
        hub_metrics.retained(0, 0)
        self.serving = Serving(settings, self.log, self.metrics, clock=clock)
        self.ingest = Ingest(settings, self.log, self.metrics, context=context, clock=clock)
        self.startup_error: StartupError | None = None
        self.fatal: str | None = None  # one process never stops on its own
        self._stopped = False

    # The parts, by the names the tests and benchmarks reach them by.
    @property
    def outlets(self) -> dict[Stream, StreamOutlet]:
        return self.ingest.outlets

    @property
    def readers(self) -> list[StreamReader]:
        return self.ingest.readers

    async def start(self) -> None:
        """Open every stream's sockets; raises :class:`StartupError` (kept in ``startup_error``)."""
        try:
            self.ingest.start()
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

    def close_clients(self) -> None:
        self.serving.hub.close()

    def readiness(self) -> tuple[bool, list[dict[str, Any]]]:
        """Ready when every stream is up, as the serving half shows it."""
        not_ready = self.serving.board.not_ready(self.serving.clock())
        return not not_ready, not_ready

    def refresh_gauges(self) -> None:
        self.serving.refresh_gauges()
