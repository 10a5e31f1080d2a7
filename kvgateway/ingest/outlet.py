"""One stream's downstream: the sequencer's actions applied to its status, figures and the log.

A :class:`StreamOutlet` takes the actions of :mod:`kvgateway.engine.sequencer` as they are (one
vocabulary from the sequencer to the log) and owns everything the gateway knows about its stream:
the :class:`~kvgateway.log.status.StreamStatus` (/v1/sources, hello, /readyz), the stream's metric
figures and its handle on the occupancy index. Delivered batches and stream notices become
records of the ordered log; the index and the hub follow the log, never the outlet.

No I/O: the reader (:mod:`kvgateway.ingest.reader`) starts and cancels the replays the actions ask for,
and the gateway decides what to do about a stream that stays down (``on_connection``).

The figures are plain numbers written on the hot path without locks or label lookups;
Prometheus reads them at scrape time through :meth:`StreamOutlet.export`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from kvgateway.config import StreamConfig
from kvgateway.engine import wire
from kvgateway.engine.sequencer import (
    Action,
    CancelReplay,
    Deliver,
    Duplicate,
    GapDetected,
    HistoryTruncated,
    Outcome,
    Purpose,
    ReplayFinished,
    RequestReplay,
    Restart,
    Unrecovered,
)
from kvgateway.log.ordered import Log, NoticeRecord, batch_record
from kvgateway.log.status import QUIET_LOSSES, StreamStatus
from kvgateway.runtime.metrics import LOSS_REASONS, REPLAY_OUTCOMES, REPLAY_PURPOSES, LagHistogram, StreamFamilies
from kvgateway.state.occupancy import StreamIndex

log = logging.getLogger("kvgateway")

ConnectionHook = Callable[["StreamOutlet", bool, bool, str], None]
"""Called with (outlet, connected, changed, reason) after each connection report."""


class StreamOutlet:
    """Everything downstream of one stream's sequencer."""

    def __init__(
        self,
        config: StreamConfig,
        log: Log,
        index: StreamIndex,
        *,
        clock: Callable[[], float],
        on_connection: ConnectionHook | None = None,
    ) -> None:
        self.config = config
        self.key = config.key
        self.name = f"{config.source}[{config.dp_rank}]"
        self.status = StreamStatus(config)
        self.index = index
        self._log = log
        self._clock = clock
        self._on_connection = on_connection
        self._purpose: Purpose = "gap"  # the purpose of the recovery in progress (one at a time)
        # Figures that only metrics show (the status counters are the others).
        self._labels = (config.source, str(config.dp_rank))
        self.events: dict[str, int] = {}
        self.replay_requests: dict[Outcome, int] = dict.fromkeys(REPLAY_OUTCOMES, 0)
        self.replay_attempts: dict[Purpose, int] = dict.fromkeys(REPLAY_PURPOSES, 0)
        self.rank_mismatches = 0
        self.held = 0  # batches the sequencer holds (the ingest queue depth)
        self._diagnosed = False  # the down reason came from a diagnosis (see diagnosed)
        self.lag = LagHistogram()

    # --- what the reader reports --------------------------------------------------------------

    def apply(self, actions: Iterable[Action], received: float, held: int) -> None:
        """The sequencer's actions, in order; ``held``: what it holds after them."""
        for action in actions:
            match action:
                case Deliver(seq=seq, batch=None):
                    self._skipped(seq)
                case Deliver(seq=seq, batch=batch, replayed=replayed) if batch is not None:
                    self._deliver(seq, batch, replayed, received)
                case Duplicate():
                    self.status.counters["duplicates"] += 1
                case GapDetected():
                    self._gap(action)
                case RequestReplay():
                    self._replay_requested(action)
                case CancelReplay():
                    pass  # the reader cancels the request's task
                case ReplayFinished():
                    self._replay_finished(action)
                case Unrecovered():
                    self._unrecovered(action)
                case HistoryTruncated(first=first):
                    self._history_truncated(first)
                case Restart():
                    self._restart(action)
        self.held = held

    def received(self, count: int = 1) -> None:
        self.status.counters["batches"] += count

    def decode_error(self, seq: int | None, reason: str) -> None:
        self.status.counters["decode_errors"] += 1
        where = "" if seq is None else f" seq {seq}"
        log.warning("stream %s:%s skipped undecodable message: %s", self.name, where, reason[:300])

    def connection(self, connected: bool, reason: str) -> None:
        status = self.status
        changed = status.connected != connected
        status.connected = connected
        if changed:
            self._diagnosed = False
        # A retry says only "retrying": it must not overwrite the reason a diagnosis found (a host
        # that does not resolve), which stays until the connection changes or a diagnosis differs.
        if not connected and not self._diagnosed:
            status.down_reason = reason
        if changed:
            self._notice("up" if connected else "down", reason=reason)
        if self._on_connection is not None:
            self._on_connection(self, connected, changed, reason)

    def diagnosed(self, reason: str) -> None:
        """Why the stream stays down, as the gateway found out (DNS, refused, no answer): kept as its
        reason until the connection changes or the next diagnosis."""
        if not self.status.connected:
            self.status.down_reason = reason
            self._diagnosed = True

    # --- the actions ------------------------------------------------------------------------

    def _deliver(self, seq: int, batch: wire.Batch, replayed: bool, received: float) -> None:
        status = self.status
        status.last_seq = seq
        if batch.dp_rank is not None and batch.dp_rank != self.config.dp_rank:
            self.rank_mismatches += 1
            log.warning(
                "stream %s: seq %d carries data_parallel_rank %d, expected %d",
                self.name,
                seq,
                batch.dp_rank,
                self.config.dp_rank,
            )
        if replayed:
            status.counters["replayed"] += 1
        else:
            lag = received - batch.ts
            status.lag_seconds = lag
            self.lag.observe(max(lag, 0.0))
        counts = self.events
        for event in batch.events:
            kind = event.type
            counts[kind] = counts.get(kind, 0) + 1
        # The index and the hub follow the log: both have applied the batch when append returns.
        self._log.append(batch_record(self.key, seq, batch, received=received, replayed=replayed))

    def _skipped(self, seq: int) -> None:
        """An undecodable batch took its place in the order: the index now misses its events."""
        self.status.last_seq = seq
        self._mark_stale("undecodable", seq=seq, detail="the batch could not be decoded; see the log")

    def _gap(self, gap: GapDetected) -> None:
        counters = self.status.counters
        counters["gaps"] += 1
        counters["missed"] += gap.count
        log.warning("stream %s: gap, seq %d..%d missing (%d batches)", self.name, gap.first, gap.last, gap.count)

    def _replay_requested(self, request: RequestReplay) -> None:
        self._purpose = request.purpose
        self.replay_attempts[request.purpose] += 1
        if request.attempt > 1:
            log.info("stream %s: replay again from seq %d (attempt %d)", self.name, request.start, request.attempt)

    def _replay_finished(self, finished: ReplayFinished) -> None:
        if self._purpose == "tail" and finished.outcome == "recovered" and finished.replayed == 0:
            # A quiet stream's tail probe that found nothing dropped: no recovery took place.
            log.debug("stream %s: tail probe found nothing missing", self.name)
            return
        self.replay_requests[finished.outcome] += 1
        if finished.by_restart and finished.outcome != "recovered":
            # Routine: the engine restarted mid-recovery. What the old process still owed is logged
            # as a loss (reason restart) on its own line; the replay socket did not fail.
            log.info(
                "stream %s: replay ended by the publisher's restart, %d batches replayed in %d attempt(s)",
                self.name,
                finished.replayed,
                finished.attempts,
            )
            return
        log.log(
            logging.INFO if finished.outcome == "recovered" else logging.WARNING,
            "stream %s: replay %s, %d batches replayed in %d attempt(s)",
            self.name,
            finished.outcome,
            finished.replayed,
            finished.attempts,
        )

    def _unrecovered(self, loss: Unrecovered) -> None:
        count, reason = loss.count, loss.reason
        now = self._clock()
        status = self.status
        was_degraded = status.degraded(now)
        if reason not in QUIET_LOSSES:
            status.last_loss_at = now
        status.counters["unrecovered"] += count
        status.losses[reason] = status.losses.get(reason, 0) + count
        log.warning(
            "stream %s: %d batches lost for good (seq %d..%d, %s)", self.name, count, loss.first, loss.last, reason
        )
        self._notice("unrecovered_gap", first=loss.first, until=loss.last, count=count, reason=reason)
        if reason != "not_sent":
            # not_sent: the engine fenced the hole with an AllBlocksCleared, which resets the index.
            self._mark_stale("unrecovered", seq=loss.first, detail=f"{count} batches lost ({reason})")
        if reason not in QUIET_LOSSES and not was_degraded:
            self._notice("degraded", reason=f"{count} batches unrecovered ({reason})", reason_code=reason)

    def _history_truncated(self, first: int) -> None:
        self.status.counters["history_truncations"] += 1
        log.warning(
            "stream %s: the engine no longer holds its history before seq %d; the index lacks it until the "
            "next AllBlocksCleared or restart",
            self.name,
            first,
        )
        self._mark_stale("history_truncated", seq=first, detail=f"seqs 0..{first - 1} no longer buffered")

    def _restart(self, restart: Restart) -> None:
        self.status.counters["restarts"] += 1
        log.warning(
            "stream %s: publisher restart (%s): seq %d after %d; its cache state was reset",
            self.name,
            restart.reason,
            restart.seq,
            restart.previous,
        )
        self._notice("restart", seq=restart.seq, previous=restart.previous, reason=restart.reason)  # resets the index

    # --- notices ----------------------------------------------------------------------------

    def _notice(self, kind: str, **fields: Any) -> None:
        self._log.append(NoticeRecord(self.key, kind, fields))

    def _mark_stale(self, reason: str, *, seq: int | None = None, detail: str | None = None) -> None:
        """The index is incomplete: say so once per cause (a notice to every client)."""
        index = self.index
        if index.stale and index.stale_reason == reason:
            return  # already said; a second loss of the same kind changes nothing for a client
        self._notice("stale", reason=reason, seq=seq, detail=detail)  # the index follows: now stale

    # --- views ------------------------------------------------------------------------------

    def to_json(self, now: float) -> dict[str, Any]:
        """The stream's entry in /v1/sources and a hello."""
        return self.status.to_json(now, self.index.stale, self.index.stale_reason)

    def export(self, families: StreamFamilies) -> None:
        """The stream's figures as Prometheus samples (at scrape time)."""
        labels = self._labels
        status = self.status
        counters = status.counters
        add = families.add
        for key, counter in _STATUS_COUNTERS:
            add(key, labels, counters[counter])
        for kind, count in list(self.events.items()):
            add("events_received", (*labels, kind), count)
        for outcome, count in self.replay_requests.items():
            add("replay_requests", (*labels, outcome), count)
        for purpose, count in self.replay_attempts.items():
            add("replay_attempts", (*labels, purpose), count)
        losses = status.losses
        for reason in LOSS_REASONS:
            add("unrecovered_batches", (*labels, reason), losses.get(reason, 0))
        add("rank_mismatches", labels, self.rank_mismatches)
        add("ingest_queue_depth", labels, self.held)
        add("source_up", labels, 1 if status.connected else 0)
        add("source_last_seq", labels, -1 if status.last_seq is None else status.last_seq)
        families.add_histogram("event_lag", labels, self.lag)
        index = self.index
        add("index_stale", labels, 1 if index.stale else 0)
        add("unknown_removes", labels, index.unknown_removes)
        for medium, stats in index.medium_stats(self._clock()).items():
            add("cache_blocks", (*labels, medium), stats.blocks)
            add("cache_tokens", (*labels, medium), stats.tokens)


_STATUS_COUNTERS = (
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
