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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

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
from kvgateway.ingest import _outlet_py
from kvgateway.log.ordered import Appender
from kvgateway.log.records import STATUS, NoticeRecord
from kvgateway.log.staleness import Staleness
from kvgateway.log.status import QUIET_LOSSES, StreamStatus
from kvgateway.protocol.messages import ConnectionCode
from kvgateway.runtime.extensions import load
from kvgateway.runtime.metrics import REPLAY_OUTCOMES, REPLAY_PURPOSES, LagHistogram, StreamFamilies

logger = logging.getLogger("kvgateway")

if TYPE_CHECKING:  # one API: the reference's
    from kvgateway.ingest._outlet_py import Delivery
else:
    _compiled = load("kvgateway.ingest._outlet_c")
    Delivery = _outlet_py.Delivery if _compiled is None else _compiled.Delivery

MAX_EVENT_TYPES: Final = 16
"""Event types a stream's ``kvgateway_events_received_total`` names (the three known ones always,
once seen); the other types past it, in the order of their first event, are summed under
:data:`OTHER_TYPES`: a type is a name from the wire, and a faulty engine would otherwise add a
series per name."""
OTHER_TYPES: Final = "other"
_KNOWN_TYPES: Final = (wire.STORED, wire.REMOVED, wire.CLEARED)  # never summed into OTHER_TYPES

ConnectionHook = Callable[["StreamOutlet", bool, bool, str, ConnectionCode], None]
"""Called with (outlet, connected, changed, reason, its code) after each connection report."""


class StreamOutlet:
    """Everything downstream of one stream's sequencer (a delivered batch: its :class:`Delivery`,
    compiled where the core is)."""

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
        self._log = log
        self._clock = clock
        self._on_connection = on_connection
        self._purpose: Purpose = "gap"  # the purpose of the recovery in progress (one at a time)
        # Figures that only metrics show (the status counters are the others).
        self._labels = (config.source, str(config.dp_rank))
        self.replay_requests: dict[Outcome, int] = dict.fromkeys(REPLAY_OUTCOMES, 0)
        self.replay_attempts: dict[Purpose, int] = dict.fromkeys(REPLAY_PURPOSES, 0)
        self.rank_mismatches = 0
        self._diagnosed = False  # the down reason came from a diagnosis (see diagnosed)
        self.lag = LagHistogram()
        self._delivery = Delivery(
            self.key,
            config.dp_rank,
            self.status,
            self.staleness,
            self.lag,
            log=log,
            other=self._act,
            rank_mismatch=self._rank_mismatch,
            report=self.report,
        )
        # The reader's call a batch goes to the delivery itself: no Python frame of the outlet's.
        self.apply = self._delivery.apply
        """The sequencer's actions, in order; ``held``: what it holds after them."""

    @property
    def held(self) -> int:
        """Batches the sequencer holds (the ingest queue depth)."""
        return self._delivery.held

    # --- what the reader reports --------------------------------------------------------------

    def received(self, count: int = 1) -> None:
        self.status.counters["batches"] += count

    def decode_error(self, seq: int | None, reason: str) -> None:
        self.status.counters["decode_errors"] += 1
        self._delivery.reported = False
        where = "" if seq is None else f" seq {seq}"
        logger.warning("stream %s:%s skipped undecodable message: %s", self.name, where, reason[:300])
        self.report()

    def heartbeat(self) -> None:
        """A ``status`` notice even if nothing changed: in a cluster, the proof that this stream is
        still read (and a late edge's first word of it)."""
        self._delivery.reported = False
        self.report()

    def report(self) -> None:
        """A ``status`` notice, when the status changed since the last one in a way that the
        batches do not say (a delivered batch's seq, lag and count the serving half and a client
        take from the batch itself)."""
        if not self._delivery.reported:
            self._delivery.reported = True
            status = self.status
            report = status.report(self.staleness.reason, self._clock())
            self._delivery.shown_batches = status.counters["batches"]
            self._log.append(NoticeRecord(self.key, STATUS, report))

    def settle(self) -> None:
        """The reader's burst (or replay reply) is applied and counted: when the serving half's
        count of received batches is off (a message received that delivered nothing, or was held),
        a status notice sets it right; when every message delivered a batch, nothing is appended."""
        if self._delivery.shown_batches != self.status.counters["batches"]:
            self._delivery.reported = False
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
            self._delivery.reported = False
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
                self._delivery.reported = False
                self.report()

    # --- the actions ------------------------------------------------------------------------

    def _act(self, action: Action) -> None:
        """An action other than a delivered batch (:meth:`apply` delivers those)."""
        match action:
            case Deliver(seq=seq):  # its batch could not be decoded
                self._skipped(seq)
            case Duplicate():
                self.status.counters["duplicates"] += 1
                self._delivery.reported = False
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
        self._delivery.reported = False
        self._mark_stale("undecodable", seq=seq, detail="the batch could not be decoded; see the log")

    def _gap(self, gap: GapDetected) -> None:
        counters = self.status.counters
        counters["gaps"] += 1
        counters["missed"] += gap.count
        self._delivery.reported = False
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
        self._delivery.reported = False
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
        self._delivery.reported = False
        logger.warning(
            "stream %s: the engine no longer holds its history before seq %d; the index lacks it until the "
            "next AllBlocksCleared or restart",
            self.name,
            first,
        )
        self._mark_stale("history_truncated", seq=first, detail=f"seqs 0..{first - 1} no longer buffered")

    def _restart(self, restart: Restart) -> None:
        self.status.counters["restarts"] += 1
        self._delivery.reported = False
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
        """Events in delivered batches, by type (a type once its first event came): as the renderer
        counted each batch's, and by filter key where it did not (each key interned by the renderer)."""
        delivery = self._delivery
        counts = {
            kind: count
            for kind, count in (
                (wire.STORED, delivery.stored),
                (wire.REMOVED, delivery.removed),
                (wire.CLEARED, delivery.cleared),
            )
            if count
        }
        for (kind, _medium, _tier), count in list(delivery.keyed.items()):
            if kind not in counts and kind not in _KNOWN_TYPES and len(counts) >= MAX_EVENT_TYPES - 1:
                kind = OTHER_TYPES  # noqa: PLW2901 - the label it is counted under
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
