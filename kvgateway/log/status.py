"""What the gateway knows about each stream's health, for /v1/sources, hello and /readyz."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvgateway.config import StreamConfig

DEGRADED_SECONDS = 60.0
"""A stream that lost batches for good shows as degraded for this long after the last loss."""

COUNTERS = (
    "batches",
    "gaps",
    "missed",
    "replayed",
    "unrecovered",
    "restarts",
    "duplicates",
    "decode_errors",
    "history_truncations",
)

QUIET_LOSSES = frozenset({"restart"})
"""Loss reasons that do not make a stream degraded: batches a restarted engine published before the
gateway reconnected are an ordinary part of a restart (the restart notice says so)."""


@dataclass(slots=True)
class StreamStatus:
    config: StreamConfig
    connected: bool = False
    down_reason: str = "never connected"
    last_seq: int | None = None
    lag_seconds: float | None = None
    last_loss_at: float | None = None
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    losses: dict[str, int] = field(default_factory=dict)  # unrecovered batches by reason

    def degraded(self, now: float) -> bool:
        return self.last_loss_at is not None and now - self.last_loss_at < DEGRADED_SECONDS

    def state(self, now: float, stale: bool) -> str:
        """down > degraded (lost batches within a minute) > stale (index missing events) > up."""
        if not self.connected:
            return "down"
        if self.degraded(now):
            return "degraded"
        return "stale" if stale else "up"

    def to_json(self, now: float, stale: bool, stale_reason: str | None = None) -> dict[str, Any]:
        cfg = self.config
        return {
            "source": cfg.source,
            "dp_rank": cfg.dp_rank,
            "endpoint": cfg.endpoint,
            "replay": cfg.replay,
            "bind": cfg.bind,
            "state": self.state(now, stale),
            "connected": self.connected,
            "reason": None if self.connected else self.down_reason,
            "stale": stale,
            "stale_reason": stale_reason if stale else None,
            "last_seq": self.last_seq,
            "lag_seconds": self.lag_seconds,
            "counters": dict(self.counters),
            "unrecovered_by_reason": dict(sorted(self.losses.items())),
        }
