"""Whether a stream's index misses events, as the ordered log says: one rule for the ingest half
(which notices it still owes) and the serving half (what the index and the status board show).

A ``stale`` notice makes the stream stale with its reason (events lost for good, history the
engine no longer holds, an undecodable batch); a ``restart`` notice or a batch holding an
``AllBlocksCleared`` makes it whole again, since the engine's cache state starts over there.
"""

from __future__ import annotations

from kvgateway.engine import wire


class Staleness:
    """One stream's stale flag and its reason, following that stream's records."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason: str | None = None
        """Why the stream's index misses events (the latest cause); None while it is whole."""

    @property
    def stale(self) -> bool:
        return self.reason is not None

    def batch(self, batch: wire.Batch) -> None:
        if self.reason is not None and any(type(event) is wire.AllBlocksCleared for event in batch.events):
            self.cleared()

    def notice(self, kind: str, fields: dict[str, object]) -> None:
        if kind == "restart":
            self.cleared()
        elif kind == "stale":
            self.mark(str(fields["reason"]))

    def mark(self, reason: str) -> None:
        self.reason = reason

    def cleared(self) -> None:
        """The engine's cache state starts over (a clear, a restart): nothing is missing any more."""
        self.reason = None
