"""Per engine stream, an edge applies batches in increasing seq only (without I/O).

One ingest process delivers each engine stream's batches in seq order. Two of them for the same
engines (a hot standby) can disagree: one reports a batch lost (``unrecovered_gap``) and goes on,
the other publishes that batch later, after its successors. Applied as it comes, the late batch
would go into the index out of order. Every edge reads the same records in the same order, so each
makes the same decision here: a batch at or below its stream's last one (same engine generation)
becomes a ``stale`` notice at that offset, and the offsets it replaced are remembered so that a
resume read back from JetStream renders the same message.
"""

from __future__ import annotations

from typing import Any

from kvgateway.cluster.records import WireBatch, WireRecord, to_record
from kvgateway.engine.wire import Stream
from kvgateway.log.records import NoticeRecord, Record


class OrderGuard:
    def __init__(self) -> None:
        self._last: dict[Stream, tuple[int, int]] = {}  # (generation, seq) of the last batch applied
        self.replaced: dict[int, NoticeRecord] = {}  # offset -> what was applied there instead

    def admit(self, offset: int, wire_record: WireRecord) -> Record:
        """The record to apply at ``offset``."""
        if type(wire_record) is WireBatch:
            stream: Stream = (wire_record.source, wire_record.dp_rank)
            last = self._last.get(stream)
            generation, seq = wire_record.generation, wire_record.seq
            if last is not None and last[0] == generation and seq <= last[1]:
                notice = late_notice(stream, seq)
                self.replaced[offset] = notice
                return notice
            self._last[stream] = (generation, seq)
        return to_record(wire_record)

    def state(self) -> dict[str, Any]:
        """What an edge started from a checkpoint needs to decide as this one does from there."""
        return {
            "last": [[source, rank, generation, seq] for (source, rank), (generation, seq) in self._last.items()],
            "replaced": [
                [offset, *record.stream, record.kind, record.fields] for offset, record in self.replaced.items()
            ],
        }

    def restore(self, state: dict[str, Any]) -> None:
        for source, rank, generation, seq in state.get("last", []):
            self._last[(source, rank)] = (generation, seq)
        for offset, source, rank, kind, fields in state.get("replaced", []):
            self.replaced[offset] = NoticeRecord((source, rank), kind, fields)

    def at(self, offset: int, wire_record: WireRecord) -> Record:
        """The record applied at ``offset`` (an offset the edge has applied already)."""
        return self.replaced.get(offset) or to_record(wire_record)


def late_notice(stream: Stream, seq: int) -> NoticeRecord:
    detail = f"a late copy of seq {seq} (after later batches) is left out"
    return NoticeRecord(stream, "stale", {"reason": "unrecovered", "seq": seq, "detail": detail})
