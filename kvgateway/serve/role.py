"""What a process runs: one process's gateway, an edge, or an ingest. The one lifecycle the command
runner (:mod:`kvgateway.serve.server`) and the apps' probes and lifespans (:mod:`kvgateway.serve.app`)
know; each command composes its role and the app that serves it (and, when the role serves web
clients, how to close them on a signal: :func:`kvgateway.serve.server.run`'s ``close_clients``)."""

from __future__ import annotations

from typing import Any, Protocol

from kvgateway.runtime.metrics import Metrics
from kvgateway.runtime.startup import StartupError


class Role(Protocol):
    @property
    def metrics(self) -> Metrics:
        """The process's one registry (/metrics)."""

    @property
    def startup_error(self) -> StartupError | None:
        """Why :meth:`start` failed (the runner says it in one line), or None."""

    @property
    def fatal(self) -> str | None:
        """Why the process stopped on its own (exit code 1), or None."""

    async def start(self) -> None:
        """Started by the app's lifespan, before the first request."""

    async def stop(self) -> None:
        """Idempotent: the lifespan stops it, and the runner again when start-up failed."""

    def health(self) -> dict[str, Any]:
        """/healthz's body beside ``"status": "ok"``."""

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Whether it is ready, and /readyz's body beside ``ready``."""

    def refresh_gauges(self) -> None:
        """Gauges read at scrape time."""

    def started_line(self, url: str) -> str:
        """The line that says it serves at ``url`` (its HTTP port works and it has started)."""
