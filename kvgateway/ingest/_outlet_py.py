"""What a stream's outlet does with each of the sequencer's actions, a delivered batch in line
(:class:`Delivery`, held by :class:`kvgateway.ingest.outlet.StreamOutlet`): the pure-Python
reference of the compiled ``_outlet_c.pyx``, which the gateway runs where it was built (the same
API, the same records, figures and calls: tests/unit/ingest/test_outlet_differential.py).

Every batch the gateway delivers passes here once, between the sequencer and the log: its status
figures, its lag, its record and its events' counts. Interpreted, that was about 170 opcodes a
batch; compiled, its attributes are C fields and a Struct's fields are read from their
slots (docs/performance.md, round twenty). Everything else an outlet does (the other actions,
notices, reports, views) is :class:`~kvgateway.ingest.outlet.StreamOutlet`'s, in Python.
"""

from __future__ import annotations

from collections import _count_elements  # type: ignore[attr-defined]  # Counter's counting loop, in C
from collections.abc import Callable, Iterable

from kvgateway.engine.sequencer import Action, Deliver
from kvgateway.engine.wire import Stream
from kvgateway.log.ordered import Appender
from kvgateway.log.records import batch_record
from kvgateway.log.staleness import Staleness
from kvgateway.log.status import StreamStatus
from kvgateway.protocol.filters import EventKey
from kvgateway.runtime.metrics import FOLD_AT, LagHistogram


class Delivery:
    """One stream's delivered batches (its outlet's :meth:`apply`): each moves the stream's status
    on (its seq, its lag or a replayed count), its lag is observed, its record appended to the log
    and its events counted by type; every other action goes to ``other``, a batch of another
    data-parallel rank is told to ``rank_mismatch``, and a changed status to ``report``."""

    def __init__(
        self,
        key: Stream,
        dp_rank: int,
        status: StreamStatus,
        staleness: Staleness,
        lag: LagHistogram,
        *,
        log: Appender,
        other: Callable[[Action], None],
        rank_mismatch: Callable[[int, int], None],
        report: Callable[[], None],
    ) -> None:
        self.key = key
        self.dp_rank = dp_rank
        self.status = status
        self.staleness = staleness
        self.lag = lag
        self.lags = lag.values  # the lags not yet bucketed
        self.log = log
        self.other = other
        self.rank_mismatch = rank_mismatch
        self.report = report
        self.held = 0
        """Batches the sequencer holds (the ingest queue depth)."""
        self.reported = False
        """False: the status changed since the last status notice (the outlet's to set)."""
        self.shown_batches = 0
        """The batches the serving half counts: those of the last status notice (the outlet's to set),
        plus one for each batch delivered since."""
        # Delivered events by type, as the renderer counted them in each batch (its EventCounts):
        # BlockStored, BlockRemoved, AllBlocksCleared. A batch with events of another type (or not
        # counted) is counted by its filter keys (type, medium, tier) instead.
        self.stored = self.removed = self.cleared = 0
        self.keyed: dict[EventKey, int] = {}

    def apply(self, actions: Iterable[Action], received: float, held: int) -> None:
        """The sequencer's actions, in order; ``held``: what it holds after them."""
        for action in actions:
            # The common action, a delivered batch, in line: without the match of the others (its
            # class patterns cost a type test and attribute reads per case tried, about 0.5 us a
            # batch) and without a Python call of its own.
            if type(action) is not Deliver or action.batch is None:
                self.other(action)
                continue
            seq, batch = action.seq, action.batch
            status = self.status
            status.last_seq = seq
            if batch.dp_rank is not None and batch.dp_rank != self.dp_rank:
                self.rank_mismatch(seq, batch.dp_rank)
            replayed = action.replayed
            if replayed:
                status.counters["replayed"] += 1
            else:
                lag = received - batch.ts
                status.lag_seconds = lag
                lags = self.lags  # observed as the histogram's plain list: no Python call a batch
                lags.append(0.0 if lag < 0.0 else lag)  # max(lag, 0.0), NaN kept, without the call
                if len(lags) >= FOLD_AT:
                    self.lag.fold()
            if self.staleness.reason is not None:  # a call per batch only while the stream is stale
                self.staleness.batch(batch)
            self.shown_batches += 1
            record = batch_record(self.key, seq, batch, received=received, replayed=replayed)
            # Counted as the renderer counted them (docs/performance.md, round fourteen): counting
            # the record's filter keys, even in C, cost 4,200 instructions a batch.
            counts = record.events.counts
            if counts is not None and not counts[3]:
                stored, removed, cleared, _others = counts
                self.stored += stored
                self.removed += removed
                self.cleared += cleared
            else:
                _count_elements(self.keyed, record.keys)
            # The serving half follows the log: it has applied the batch when append returns.
            self.log.append(record)
        self.held = held
        if not self.reported:  # the test in line: a delivered batch leaves nothing to report
            self.report()
