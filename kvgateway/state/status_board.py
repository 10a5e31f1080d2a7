"""Every stream's status as the serving half shows it (/v1/sources, hello, /readyz, metrics),
derived from the ordered log alone: the same records give the same statuses in one process and
on every edge of a cluster.

A ``status`` notice (the ingest's view, :meth:`kvgateway.log.status.StreamStatus.report`) replaces
a stream's status; each delivered batch after it moves its seq, count and lag on; staleness is the
index's (:class:`kvgateway.log.staleness.Staleness`, from the same notices). A stream the
configuration does not list (an edge started without sources, a source added later) is listed
from its first status notice on.

In a cluster the ingest process reports every stream every few seconds whether it changed or not
(a heartbeat); given ``silence``, a stream not heard from for that long is shown ``down`` with the
reason ``ingest unreachable``, whatever its last report said: the process that reads it is gone.
Sans-I/O: the caller passes ``now``, and ``clock`` (for when a report was heard) with ``silence``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from kvgateway.config.settings import StreamConfig
from kvgateway.engine.wire import Stream
from kvgateway.log.entry import Entry
from kvgateway.log.records import STATUS, BatchRecord, NoticeRecord
from kvgateway.log.status import StreamStatus, not_ready
from kvgateway.runtime.metrics import StreamFamilies
from kvgateway.state.occupancy import OccupancyIndex


class StatusBoard:
    """The statuses of every stream, following the log (call :meth:`follow` for every entry)."""

    def __init__(
        self,
        streams: Iterable[StreamConfig],
        index: OccupancyIndex,
        *,
        silence: float | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._index = index
        self._statuses: dict[Stream, StreamStatus] = {s.key: StreamStatus(s) for s in sorted(streams, key=_key)}
        self._silence = silence
        self._clock = clock
        started = clock() if clock is not None else 0.0
        self._heard: dict[Stream, float] = dict.fromkeys(self._statuses, started)  # when last reported

    def follow(self, entry: Entry) -> None:
        record = entry.record
        if type(record) is BatchRecord:
            status = self._statuses.get(record.stream)
            if status is not None:  # a stream is listed from its first status notice on
                # The batch moves the status on here, not in a method of the status: a Python call
                # fewer a batch. Its seq, one more batch, and its lag unless replayed.
                status.last_seq = record.seq
                counters = status.counters
                counters["batches"] += 1
                if record.replayed:
                    counters["replayed"] += 1
                else:
                    status.lag_seconds = record.received - record.batch.ts
        elif type(record) is NoticeRecord and record.kind == STATUS:
            status = self._statuses.get(record.stream)
            if status is None:
                status = self._add(record.stream, record.fields)
            status.take_report(record.fields)
            if self._clock is not None:
                self._heard[record.stream] = self._clock()

    def restore(self, stream: Stream, fields: dict[str, Any]) -> None:
        """A stream's status as a checkpoint had it (a report), heard now."""
        status = self._statuses.get(stream)
        if status is None:
            status = self._add(stream, fields)
        status.take_report(fields)
        if self._clock is not None:
            self._heard[stream] = self._clock()

    def _add(self, stream: Stream, fields: dict[str, Any]) -> StreamStatus:
        status = self._statuses[stream] = StreamStatus.from_report(stream[0], stream[1], fields)
        self._statuses = dict(sorted(self._statuses.items()))  # listed in (source, dp_rank) order
        return status

    # --- views ------------------------------------------------------------------------------

    @property
    def streams(self) -> list[Stream]:
        return list(self._statuses)

    def status(self, stream: Stream, now: float | None = None) -> StreamStatus | None:
        """``stream``'s status as shown at ``now`` (None: as last reported)."""
        status = self._statuses.get(stream)
        if status is None or now is None:
            return status
        return self._shown(stream, status, now)

    def _shown(self, stream: Stream, status: StreamStatus, now: float) -> StreamStatus:
        silence = self._silence
        if silence is None or now - self._heard.get(stream, now) <= silence:
            return status
        return replace(status, connected=False, down_reason=INGEST_UNREACHABLE, down_code="ingest_unreachable")

    def to_json(self, now: float, select: Callable[[str, int], bool] | None = None) -> list[dict[str, Any]]:
        """Every stream's entry in /v1/sources and a hello; ``select`` (source, dp_rank): only those."""
        out = []
        for (source, dp_rank), status in self._statuses.items():
            if select is None or select(source, dp_rank):
                index = self._index.stream(source, dp_rank)
                shown = self._shown((source, dp_rank), status, now)
                out.append(shown.to_json(now, index.stale, index.stale_reason))
        return out

    def not_ready(self, now: float) -> list[dict[str, Any]]:
        """The streams that are down, with why (/readyz)."""
        return not_ready((key, self._shown(key, status, now)) for key, status in self._statuses.items())

    def export(self, families: StreamFamilies, now: float) -> None:
        """Every stream's status and index figures as Prometheus samples (at scrape time)."""
        for (source, dp_rank), status in self._statuses.items():
            self._shown((source, dp_rank), status, now).export(families)
            index = self._index.stream(source, dp_rank)
            labels = (source, str(dp_rank))
            families.add("index_stale", labels, 1 if index.stale else 0)
            families.add("unknown_removes", labels, index.unknown_removes)
            for medium, stats in index.medium_stats(now).items():
                families.add("cache_blocks", (*labels, medium), stats.blocks)
                families.add("cache_tokens", (*labels, medium), stats.tokens)


class BoardFigures:
    """A board's figures for the metrics' stream collector, at scrape time."""

    def __init__(self, board: StatusBoard, clock: Callable[[], float]) -> None:
        self._board = board
        self._clock = clock

    def export(self, families: StreamFamilies) -> None:
        self._board.export(families, self._clock())


INGEST_UNREACHABLE = "ingest unreachable"
"""The reason of a stream whose ingest process stopped reporting it (a cluster only)."""


def _key(config: StreamConfig) -> Stream:
    return config.key
