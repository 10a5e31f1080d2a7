"""What the gateway knows about each stream's health, for /v1/sources, hello and /readyz.

The ingest half keeps one :class:`StreamStatus` per stream as its outlet sees it, and reports it
into the ordered log (a ``status`` notice, :meth:`StreamStatus.report`) whenever it changes in a
way that batches and notices do not say. The serving half's status board keeps its own copy from
those reports (:meth:`StreamStatus.take_report`) and the batches after them (which move its seq,
count and lag on: :meth:`kvgateway.state.status_board.StatusBoard.follow`), the same in one process
and on every edge of a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, get_args

from kvgateway.config.settings import StreamConfig
from kvgateway.engine.wire import Stream
from kvgateway.protocol.messages import ConnectionCode
from kvgateway.runtime.metrics import LOSS_REASONS, StreamFamilies

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

_CODES: Final[dict[str, ConnectionCode]] = {code: code for code in get_args(ConnectionCode)}
NEVER_CONNECTED: Final = "never connected"


def connection_code(value: object, connected: bool) -> ConnectionCode:
    """A record's ``reason_code``; a record without one (an older ingest's) gets the broadest."""
    code = _CODES.get(value) if isinstance(value, str) else None
    return code or ("connected" if connected else "disconnected")


QUIET_LOSSES = frozenset({"restart"})
"""Loss reasons that do not make a stream degraded: batches a restarted engine published before the
gateway reconnected are an ordinary part of a restart (the restart notice says so)."""


@dataclass(slots=True)
class StreamStatus:
    config: StreamConfig
    connected: bool = False
    down_reason: str = NEVER_CONNECTED
    down_code: ConnectionCode = "never_connected"
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

    # --- through the log ----------------------------------------------------------------------

    def report(self, stale_reason: str | None, at: float) -> dict[str, Any]:
        """The fields of a ``status`` record: this view at ``at`` (with the stream's staleness, as
        the ingest's own notices made it), and where the stream is read from (an edge that was not
        given the sources lists the stream from it)."""
        cfg = self.config
        return {
            "at": at,
            "stale_reason": stale_reason,
            "endpoint": cfg.endpoint,
            "replay": cfg.replay,
            "bind": cfg.bind,
            "connected": self.connected,
            "reason": self.down_reason,
            "reason_code": self.down_code,
            "last_seq": self.last_seq,
            "lag_seconds": self.lag_seconds,
            "last_loss_at": self.last_loss_at,
            "counters": dict(self.counters),
            "losses": dict(self.losses),
        }

    @classmethod
    def from_report(cls, source: str, dp_rank: int, fields: dict[str, Any]) -> StreamStatus:
        """The status a ``status`` record describes (its stream's config from the record too)."""
        config = StreamConfig(
            source=source,
            dp_rank=dp_rank,
            endpoint=str(fields.get("endpoint", "")),
            replay=fields.get("replay"),
            topic="",
            bind=bool(fields.get("bind", False)),
            capacity_blocks={},
        )
        status = cls(config)
        status.take_report(fields)
        return status

    def take_report(self, fields: dict[str, Any]) -> None:
        """A ``status`` notice's fields (:meth:`report`): the ingest's view replaces this one."""
        self.connected = bool(fields["connected"])
        self.down_reason = str(fields["reason"])
        self.down_code = connection_code(fields.get("reason_code"), self.connected)
        self.last_seq = fields["last_seq"]
        self.lag_seconds = fields["lag_seconds"]
        self.last_loss_at = fields["last_loss_at"]
        counters = fields["counters"]
        self.counters = {name: int(counters.get(name, 0)) for name in COUNTERS}
        self.losses = {str(reason): int(count) for reason, count in fields["losses"].items()}

    # --- views ------------------------------------------------------------------------------

    def export(self, families: StreamFamilies) -> None:
        """The stream's status figures as Prometheus samples (at scrape time)."""
        labels = (self.config.source, str(self.config.dp_rank))
        counters = self.counters
        add = families.add
        for key, counter in STATUS_FAMILIES:
            add(key, labels, counters[counter])
        losses = self.losses
        for reason in LOSS_REASONS:
            add("unrecovered_batches", (*labels, reason), losses.get(reason, 0))
        add("source_up", labels, 1 if self.connected else 0)
        add("source_last_seq", labels, -1 if self.last_seq is None else self.last_seq)

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
            "reason_code": None if self.connected else self.down_code,
            "stale": stale,
            "stale_reason": stale_reason if stale else None,
            # a decimal string, as every engine seq a client gets (kvgateway.protocol.messages.seq_text)
            "last_seq": None if self.last_seq is None else str(self.last_seq),
            "lag_seconds": self.lag_seconds,
            "counters": dict(self.counters),
            "unrecovered_by_reason": dict(sorted(self.losses.items())),
        }


STATUS_FAMILIES = (
    ("batches_received", "batches"),
    ("sequence_gaps", "gaps"),
    ("missed_batches", "missed"),
    ("replayed_batches", "replayed"),
    ("publisher_restarts", "restarts"),
    ("duplicate_batches", "duplicates"),
    ("decode_errors", "decode_errors"),
    ("history_truncations", "history_truncations"),
)
"""Metric families read from the status counters (one number serves /v1/sources and Prometheus)."""


def not_ready(statuses: Iterable[tuple[Stream, StreamStatus]]) -> list[dict[str, Any]]:
    """The streams that are down, with why: /readyz's one rule (the status board's statuses, or an
    ingest's own)."""
    return [
        {"source": key[0], "dp_rank": key[1], "reason": status.down_reason}
        for key, status in statuses
        if not status.connected
    ]
