"""The compiled delivery (``_outlet_c.Delivery``) against its pure-Python reference
(``_outlet_py.Delivery``), driven side by side with the same actions: the same records appended
(stream, seq, the batch itself, when received, replayed, the events' bytes, ends and counts, the
filter keys), the same calls of the outlet (the other actions, a rank that differs, a report),
the same status figures, lags, histogram, event counts and held batches, after every call; for
delivered batches of every wire layout, live and replayed, lags of every sign and NaN, clocks and
``ts`` that are not floats, other ranks, a stale stream, the histogram's fold, and actions that
are not delivered batches among them.

Skipped where the compiled core was not built (an install without a C compiler)."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgateway.config import StreamConfig
from kvgateway.engine.sequencer import (
    Action,
    CancelReplay,
    Deliver,
    Duplicate,
    GapDetected,
    Restart,
)
from kvgateway.engine.wire import AllBlocksCleared, Batch, Event
from kvgateway.ingest import _outlet_py
from kvgateway.ingest.outlet import StreamOutlet
from kvgateway.log.records import BatchRecord, NoticeRecord
from kvgateway.log.staleness import Staleness
from kvgateway.log.status import StreamStatus
from kvgateway.runtime.metrics import FOLD_AT, LagHistogram
from tests.support.cores import compiled_twin
from tests.support.payloads import decode, encoded_event

CONFIG = StreamConfig("e", 1, "tcp://127.0.0.1:5557", None, "", False, {})
NOW = 1_789_095_810.0


def _compiled() -> ModuleType:
    """The compiled twin, where the gateway's outlets run it."""

    def runs(module: ModuleType) -> bool:
        return type(StreamOutlet(CONFIG, Log([]), clock=lambda: NOW)._delivery) is module.Delivery

    return compiled_twin("kvgateway.ingest._outlet_c", runs)


class Log:
    """What the outlet appends to, each record kept as what a follower could tell of it."""

    def __init__(self, calls: list[Any]) -> None:
        self.calls = calls

    def append(self, record: BatchRecord | NoticeRecord) -> None:
        assert type(record) is BatchRecord
        events = record.events
        self.calls.append(
            (
                "append",
                record.stream,
                record.seq,
                id(record.batch),
                repr(record.received),
                record.replayed,
                events.body,
                list(events.ends),
                events.counts,
                record.keys,
            )
        )


class Side:
    """A delivery of one core, and what it asks of its outlet and appends, in order."""

    def __init__(self, core: ModuleType) -> None:
        self.calls: list[Any] = []
        self.status = StreamStatus(CONFIG)
        self.staleness = Staleness()
        self.lag = LagHistogram()
        self.delivery = core.Delivery(
            CONFIG.key,
            CONFIG.dp_rank,
            self.status,
            self.staleness,
            self.lag,
            log=Log(self.calls),
            other=lambda action: self.calls.append(("other", action)),
            rank_mismatch=lambda seq, dp_rank: self.calls.append(("rank", seq, dp_rank)),
            report=self.report,
        )
        self.delivery.reported = True

    def report(self) -> None:
        self.calls.append(("report", self.delivery.shown_batches))
        self.delivery.shown_batches = self.status.counters["batches"]
        self.delivery.reported = True


def state(side: Side) -> tuple[Any, ...]:
    """Everything apply writes, NaN compared as itself (by repr)."""
    status, delivery = side.status, side.delivery
    return (
        side.calls,
        status.last_seq,
        repr(status.lag_seconds),
        dict(status.counters),
        [repr(v) for v in delivery.lags],
        list(side.lag._counts),
        repr(side.lag._total),
        delivery.shown_batches,
        (delivery.stored, delivery.removed, delivery.cleared),
        dict(delivery.keyed),
        delivery.held,
        delivery.reported,
        side.staleness.reason,
    )


time_st = st.one_of(
    st.floats(NOW - 5, NOW + 5),
    st.sampled_from([NOW, NOW + 1e-9, math.nan, math.inf, -math.inf, 0.0, -0.0]),
    st.integers(int(NOW) - 5, int(NOW) + 5),
)


@st.composite
def batch_st(draw: st.DrawFn) -> Batch:
    """A batch as the parser makes it (every layout), at a time, of a rank or none."""
    drawn = draw(st.lists(encoded_event(), max_size=4))
    batch = decode(*(value for value, _event, _core in drawn), tail=(draw(st.none() | st.integers(0, 2)),))
    ts = draw(time_st)
    if ts != batch.ts or type(ts) is not float:
        batch = Batch(ts=ts, events=batch.events, dp_rank=batch.dp_rank)
    return batch


@st.composite
def action_st(draw: st.DrawFn, seq: int) -> Action:
    kind = draw(st.sampled_from(["live", "live", "live", "replayed", "undecodable", "other"]))
    if kind == "undecodable":
        return Deliver(seq, None, draw(st.booleans()))
    if kind == "other":
        others: list[Action] = [Duplicate(seq), GapDetected(seq, seq + 1), CancelReplay(1)]
        others.append(Restart(seq, seq + 5, "seq_reset"))
        return draw(st.sampled_from(others))
    return Deliver(seq, draw(batch_st()), kind == "replayed")


@st.composite
def calls_st(draw: st.DrawFn) -> list[tuple[list[Action], Any, int, bool, bool]]:
    """Calls of apply: (actions, received, held, the stream stale before, the last report pending)."""
    calls = []
    seq = draw(st.integers(0, 2**64))
    for _ in range(draw(st.integers(1, 6))):
        actions = []
        for _ in range(draw(st.integers(0, 3))):
            actions.append(draw(action_st(seq)))
            seq += 1
        calls.append((actions, draw(time_st), draw(st.integers(0, 9)), draw(st.booleans()), draw(st.booleans())))
    return calls


def run(sides: list[Side], calls: list[tuple[list[Action], Any, int, bool, bool]]) -> None:
    for actions, received, held, stale, pending in calls:
        for side in sides:
            if stale and side.staleness.reason is None:
                side.staleness.mark("unrecovered")
            if pending:
                side.delivery.reported = False
            side.delivery.apply(actions, received, held)
        assert state(sides[0]) == state(sides[1])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls_st())
def test_the_same_records_calls_and_figures_for_any_actions(calls: list[Any]) -> None:
    compiled = _compiled()
    run([Side(_outlet_py), Side(compiled)], calls)


def test_a_clear_in_a_stale_streams_batch_lifts_its_staleness_alike() -> None:
    compiled = _compiled()
    cleared = Batch(ts=NOW, events=[AllBlocksCleared()], dp_rank=0)
    sides = [Side(_outlet_py), Side(compiled)]
    run(sides, [([Deliver(7, cleared, False)], NOW + 1, 0, True, False)])
    assert sides[1].staleness.reason is None  # not vacuous: staleness.batch ran


def test_the_histogram_folds_at_its_bound_alike() -> None:
    compiled = _compiled()
    batch = Batch(ts=NOW, events=[], dp_rank=0)
    sides = [Side(_outlet_py), Side(compiled)]
    run(sides, [([Deliver(seq, batch, False) for seq in range(FOLD_AT + 3)], NOW + 0.25, 0, False, False)])
    assert len(sides[1].delivery.lags) == 3 and sum(sides[1].lag._counts) == FOLD_AT


@pytest.mark.parametrize("make", [lambda: Side(_outlet_py), lambda: Side(_compiled())], ids=["pure", "compiled"])
def test_a_records_filter_keys_count_what_the_renderer_did_not(make: Callable[[], Side]) -> None:
    """Not vacuous: an unknown event leaves the counts to the keys, a known one to the counts."""
    delivery = make().delivery
    events: list[Event] = list(decode(["BlockMoved", 1], ["AllBlocksCleared"]).events)
    delivery.apply([Deliver(1, Batch(ts=NOW, events=events, dp_rank=1), True)], NOW, 0)
    delivery.apply([Deliver(2, Batch(ts=NOW, events=[AllBlocksCleared()], dp_rank=1), True)], NOW, 0)
    assert (delivery.stored, delivery.removed, delivery.cleared) == (0, 0, 1)
    assert sum(delivery.keyed.values()) == 2
