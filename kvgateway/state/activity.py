"""When each stream's last batch was received, as the log says: what the dashboard's history
reads a stream's idleness and lag freshness from."""

from __future__ import annotations

from kvgateway.engine.wire import Stream
from kvgateway.log.entry import Entry
from kvgateway.log.records import BatchRecord


class Activity:
    """Follows the log: when each stream's last batch (and last live batch) was received."""

    __slots__ = ("last_batch", "last_live")

    def __init__(self) -> None:
        self.last_batch: dict[Stream, float] = {}
        self.last_live: dict[Stream, float] = {}

    def follow(self, entry: Entry) -> None:
        record = entry.record
        if type(record) is BatchRecord:
            self.last_batch[record.stream] = record.received
            if not record.replayed:
                self.last_live[record.stream] = record.received
