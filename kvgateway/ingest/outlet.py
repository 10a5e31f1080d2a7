"""One stream's downstream: the sequencer's actions applied to its status, figures and the log.

A :class:`StreamOutlet` takes the actions of :mod:`kvgateway.engine.sequencer` as they are (one
vocabulary from the sequencer to the log) and owns what the ingest half knows about its stream:
its :class:`~kvgateway.log.status.StreamStatus` and its ingest figures. Delivered batches, stream
notices and the status itself (a ``status`` notice whenever it changes in a way the batches do not
say) become records of the ordered log; everything the serving half shows follows the log, never
the outlet, so one process and an edge of a cluster show the same.

No I/O: the reader (:mod:`kvgateway.ingest.reader`) starts and cancels the replays the actions ask for,
and the gateway decides what to do about a stream that stays down (``on_connection``).

The figures are plain numbers written on the hot path without locks or label lookups;
Prometheus reads them at scrape time through :meth:`StreamOutlet.export`.
"""

from __future__ import annotations

import logging
from collections import _count_elements  # type: ignore[attr-defined]  # Counter's counting loop, in C
from collections.abc import Callable, Iterable
from typing import Any

from kvgateway.config.settings import StreamConfig
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
from kvgateway.log.ordered import Appender
from kvgateway.log.records import STATUS, NoticeRecord, batch_record
from kvgateway.log.staleness import Staleness
from kvgateway.log.status import QUIET_LOSSES, StreamStatus
from kvgateway.protocol.filters import EventKey
from kvgateway.protocol.messages import ConnectionCode
from kvgateway.runtime.metrics import FOLD_AT, REPLAY_OUTCOMES, REPLAY_PURPOSES, LagHistogram, StreamFamilies

logger = logging.getLogger("kvgateway")

ConnectionHook = Callable[["StreamOutlet", bool, bool, str, ConnectionCode], None]
"""Called with (outlet, connected, changed, reason, its code) after each connection report."""


class StreamOutlet:
    """Everything downstream of one stream's sequencer."""

    def __init__(
        self,
        config: StreamConfig,
        log: Appender,
        *,
        clock: Callable[[], float],
        on_connection: ConnectionHook | None = None,
    ) -> None:
        self.config = config
        self.key = config.key
        self.name = f"{config.source}[{config.dp_rank}]"
        self.status = StreamStatus(config)
        self.staleness = Staleness()  # as the serving half's index will say, from the same notices
        self._reported = False  # the status changed since the last status notice
        # The batches the serving half counts: those of the last status notice, plus one for each
        # batch delivered since (a received message not delivered, a duplicate, one held for later,
        # is counted only by the next status notice: see settle).
        self._shown_batches = 0
        self._log = log
        self._clock = clock
        self._on_connection = on_connection
        self._purpose: Purpose = "gap"  # the purpose of the recovery in progress (one at a time)
        # Figures that only metrics show (the status counters are the others).
        self._labels = (config.source, str(config.dp_rank))
        # Delivered events by type, as the renderer counted them in each batch (its EventCounts):
        # BlockStored, BlockRemoved, AllBlocksCleared. A batch with events of another type (or
        # not counted) is counted by its filter keys (type, medium, tier) instead, each key
        # interned by the renderer: :attr:`events` sums both by type.
        self._stored = self._removed = self._cleared = 0
        self._keyed: dict[EventKey, int] = {}
        self.replay_requests: dict[Outcome, int] = dict.fromkeys(REPLAY_OUTCOMES, 0)
        self.replay_attempts: dict[Purpose, int] = dict.fromkeys(REPLAY_PURPOSES, 0)
        self.rank_mismatches = 0
        self.held = 0  # batches the sequencer holds (the ingest queue depth)
        self._diagnosed = False  # the down reason came from a diagnosis (see diagnosed)
        self.lag = LagHistogram()
        self._lags = self.lag.values  # the lags not yet bucketed

    # --- what the reader reports --------------------------------------------------------------

    def apply(self, actions: Iterable[Action], received: float, held: int) -> None:
        """The sequencer's actions, in order; ``held``: what it holds after them."""
        for action in actions:
            # The common action, a delivered batch, in line: without the match of the others (its
            # class patterns cost a type test and attribute reads per case tried, about 0.5 us a
            # batch) and without a Python call of its own.
            if type(action) is not Deliver or action.batch is None:
                self._act(action)
                continue
            seq, batch = action.seq, action.batch
            status = self.status
            status.last_seq = seq
            if batch.dp_rank is not None and batch.dp_rank != self.config.dp_rank:
                self._rank_mismatch(seq, batch.dp_rank)
            replayed = action.replayed
            if replayed:
                status.counters["replayed"] += 1
            else:
                lag = received - batch.ts
                status.lag_seconds = lag
                lags = self._lags  # observed as the histogram's plain list: no Python call a batch
                lags.append(0.0 if lag < 0.0 else lag)  # max(lag, 0.0), NaN kept, without the call
                if len(lags) >= FOLD_AT:
                    self.lag.fold()
            if self.staleness.reason is not None:  # a call per batch only while the stream is stale
                self.staleness.batch(batch)
            self._shown_batches += 1
            record = batch_record(self.key, seq, batch, received=received, replayed=replayed)
            # Counted as the renderer counted them (docs/performance.md, round fourteen): counting
            # the record's filter keys, even in C, cost 4,200 instructions a batch.
            counts = record.events.counts
            if counts is not None and not counts[3]:
                stored, removed, cleared, _others = counts
                self._stored += stored
                self._removed += removed
                self._cleared += cleared
            else:
                _count_elements(self._keyed, record.keys)
            # The serving half follows the log: it has applied the batch when append returns.
            self._log.append(record)
        self.held = held
        if not self._reported:  # the test in line: a delivered batch leaves nothing to report
            self.report()

    def received(self, count: int = 1) -> None:
        self.status.counters["batches"] += count

    def decode_error(self, seq: int | None, reason: str) -> None:
        self.status.counters["decode_errors"] += 1
        self._reported = False
        where = "" if seq is None else f" seq {seq}"
        logger.warning("stream %s:%s skipped undecodable message: %s", self.name, where, reason[:300])
        self.report()

    def heartbeat(self) -> None:
        """A ``status`` notice even if nothing changed: in a cluster, the proof that this stream is
        still read (and a late edge's first word of it)."""
        self._reported = False
        self.report()

    def report(self) -> None:
        """A ``status`` notice, when the status changed since the last one in a way that the
        batches do not say (a delivered batch's seq, lag and count the serving half and a client
        take from the batch itself)."""
        if not self._reported:
            self._reported = True
            status = self.status
            report = status.report(self.staleness.reason, self._clock())
            self._shown_batches = status.counters["batches"]
            self._log.append(NoticeRecord(self.key, STATUS, report))

    def settle(self) -> None:
        """The reader's burst (or replay reply) is applied and counted: when the serving half's
        count of received batches is off (a message received that delivered nothing, or was held),
        a status notice sets it right; when every message delivered a batch, nothing is appended."""
        if self._shown_batches != self.status.counters["batches"]:
            self._reported = False
            self.report()

    def connection(self, connected: bool, reason: str, code: ConnectionCode) -> None:
        """The engine's connection came up or went down (``reason``, and ``code`` for programs)."""
        status = self.status
        before = (status.connected, status.down_reason)
        changed = status.connected != connected
        status.connected = connected
        if changed:
            self._diagnosed = False
        # A retry says only "retrying": it must not overwrite the reason a diagnosis found (a host
        # that does not resolve), which stays until the connection changes or a diagnosis differs.
        if not connected and not self._diagnosed:
            status.down_reason = reason
            status.down_code = code
        if changed:
            self._notice("up" if connected else "down", reason=reason, reason_code=code)
        if (status.connected, status.down_reason) != before:
            self._reported = False
            self.report()
        if self._on_connection is not None:
            self._on_connection(self, connected, changed, reason, code)

    def diagnosed(self, reason: str, code: ConnectionCode) -> None:
        """Why the stream stays down, as the gateway found out (DNS, refused, no answer): kept as its
        reason until the connection changes or the next diagnosis."""
        status = self.status
        if not status.connected:
            self._diagnosed = True
            if status.down_reason != reason:
                status.down_reason = reason
                status.down_code = code
                self._reported = False
                self.report()

    # --- the actions ------------------------------------------------------------------------

    def _act(self, action: Action) -> None:
        """An action other than a delivered batch (:meth:`apply` delivers those)."""
        match action:
            case Deliver(seq=seq):  # its batch could not be decoded
                self._skipped(seq)
            case Duplicate():
                self.status.counters["duplicates"] += 1
                self._reported = False
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

    def _rank_mismatch(self, seq: int, dp_rank: int) -> None:
        self.rank_mismatches += 1
        logger.warning(
            "stream %s: seq %d carries data_parallel_rank %d, expected %d", self.name, seq, dp_rank, self.config.dp_rank
        )

    def _skipped(self, seq: int) -> None:
        """An undecodable batch took its place in the order: the index now misses its events."""
        self.status.last_seq = seq
        self._reported = False
        self._mark_stale("undecodable", seq=seq, detail="the batch could not be decoded; see the log")

    def _gap(self, gap: GapDetected) -> None:
        counters = self.status.counters
        counters["gaps"] += 1
        counters["missed"] += gap.count
        self._reported = False
        logger.warning("stream %s: gap, seq %d..%d missing (%d batches)", self.name, gap.first, gap.last, gap.count)

    def _replay_requested(self, request: RequestReplay) -> None:
        self._purpose = request.purpose
        self.replay_attempts[request.purpose] += 1
        if request.attempt > 1:
            logger.info("stream %s: replay again from seq %d (attempt %d)", self.name, request.start, request.attempt)

    def _replay_finished(self, finished: ReplayFinished) -> None:
        if self._purpose == "tail" and finished.outcome == "recovered" and finished.replayed == 0:
            # A quiet stream's tail probe that found nothing dropped: no recovery took place.
            logger.debug("stream %s: tail probe found nothing missing", self.name)
            return
        self.replay_requests[finished.outcome] += 1
        if finished.by_restart and finished.outcome != "recovered":
            # Routine: the engine restarted mid-recovery. What the old process still owed is logged
            # as a loss (reason restart) on its own line; the replay socket did not fail.
            logger.info(
                "stream %s: replay ended by the publisher's restart, %d batches replayed in %d attempt(s)",
                self.name,
                finished.replayed,
                finished.attempts,
            )
            return
        if self._purpose == "catch_up" and finished.outcome == "recovered":
            # The connect's read of the engine's buffer (or a restarted engine's): no batch was
            # missed, what it brought was published before the gateway read the stream. Counted
            # as replayed (it came from the replay socket), and said as what it is.
            logger.info(
                "stream %s: caught up: %s from the engine's buffer, published before the gateway "
                "read its stream (counted as replayed; nothing was missed)",
                self.name,
                "1 batch" if finished.replayed == 1 else f"{finished.replayed} batches",
            )
            return
        logger.log(
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
        self._reported = False
        logger.warning(
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
        self._reported = False
        logger.warning(
            "stream %s: the engine no longer holds its history before seq %d; the index lacks it until the "
            "next AllBlocksCleared or restart",
            self.name,
            first,
        )
        self._mark_stale("history_truncated", seq=first, detail=f"seqs 0..{first - 1} no longer buffered")

    def _restart(self, restart: Restart) -> None:
        self.status.counters["restarts"] += 1
        self._reported = False
        logger.warning(
            "stream %s: publisher restart (%s): seq %d after %d; its cache state was reset",
            self.name,
            restart.reason,
            restart.seq,
            restart.previous,
        )
        self._notice("restart", seq=restart.seq, previous=restart.previous, reason=restart.reason)  # resets the index

    # --- notices ----------------------------------------------------------------------------

    def _notice(self, kind: str, **fields: Any) -> None:
        self.staleness.notice(kind, fields)
        self._log.append(NoticeRecord(self.key, kind, fields))

    def _mark_stale(self, reason: str, *, seq: int | None = None, detail: str | None = None) -> None:
        """The index is incomplete: say so once per cause (a notice to every client)."""
        if self.staleness.reason == reason:
            return  # already said; a second loss of the same kind changes nothing for a client
        self._notice("stale", reason=reason, seq=seq, detail=detail)  # the index follows: now stale

    # --- views ------------------------------------------------------------------------------

    @property
    def events(self) -> dict[str, int]:
        """Events in delivered batches, by type (a type once its first event came)."""
        counts = {
            kind: count
            for kind, count in (
                (wire.STORED, self._stored),
                (wire.REMOVED, self._removed),
                (wire.CLEARED, self._cleared),
            )
            if count
        }
        for (kind, _medium, _tier), count in list(self._keyed.items()):
            counts[kind] = counts.get(kind, 0) + count
        return counts

    def export(self, families: StreamFamilies) -> None:
        """The stream's ingest figures as Prometheus samples (at scrape time); its status figures
        are the serving half's (:meth:`kvgateway.log.status.StreamStatus.export`)."""
        labels = self._labels
        add = families.add
        for kind, count in self.events.items():
            add("events_received", (*labels, kind), count)
        for outcome, count in self.replay_requests.items():
            add("replay_requests", (*labels, outcome), count)
        for purpose, count in self.replay_attempts.items():
            add("replay_attempts", (*labels, purpose), count)
        add("rank_mismatches", labels, self.rank_mismatches)
        add("ingest_queue_depth", labels, self.held)
        families.add_histogram("event_lag", labels, self.lag)
