"""The sequencer: exact action lists for every rule, and properties against an adversarial publisher."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvgateway.sequencer import (
    Action,
    CancelReplay,
    Deliver,
    Duplicate,
    GapDetected,
    ReplayFinished,
    RequestReplay,
    Restart,
    Sequencer,
    Unrecovered,
)
from kvgateway.wire import AllBlocksCleared, Batch, BlockRemoved


def b(seq: int) -> Batch:
    """A distinct batch per seq (ts carries the seq so equality tells batches apart)."""
    return Batch(ts=float(seq), events=[BlockRemoved(block_hashes=[seq])])


def cleared(seq: int) -> Batch:
    return Batch(ts=float(seq), events=[AllBlocksCleared(), BlockRemoved(block_hashes=[seq])])


def d(seq: int, replayed: bool = False) -> Deliver:
    return Deliver(seq, b(seq), replayed)


def feed(s: Sequencer, *seqs: int) -> list[Action]:
    out: list[Action] = []
    for seq in seqs:
        out += s.on_live(seq, b(seq))
    return out


def replay(s: Sequencer, token: int, *seqs: int) -> list[Action]:
    out: list[Action] = []
    for seq in seqs:
        out += s.on_replay_item(token, seq, b(seq))
    return out


# --- construction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"restart_window": -1}, "restart_window"),
        ({"hold_limit": 0}, "hold_limit"),
        ({"jump_limit": 0}, "jump_limit"),
    ],
)
def test_bad_limits_are_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sequencer(has_replay=True, **kwargs)


def test_initial_state() -> None:
    s = Sequencer(has_replay=True)
    assert (s.cursor, s.held, s.replay_token) == (None, 0, None)


def test_counts_of_ranges() -> None:
    assert GapDetected(3, 7).count == 5
    assert Unrecovered(4, 4, "short").count == 1


# --- rule 1: fresh start and catch-up ------------------------------------------------------


def test_fresh_start_at_zero_delivers() -> None:
    s = Sequencer(has_replay=True)
    assert feed(s, 0, 1, 2) == [d(0), d(1), d(2)]
    assert s.cursor == 2


def test_fresh_start_without_replay_delivers_any_seq() -> None:
    s = Sequencer(has_replay=False)
    assert feed(s, 7, 8) == [d(7), d(8)]
    assert s.cursor == 8


def test_catch_up_asks_from_zero_and_holds() -> None:
    s = Sequencer(has_replay=True)
    assert feed(s, 5) == [RequestReplay(1, 0)]
    assert (s.cursor, s.held, s.replay_token) == (None, 1, 1)


def test_catch_up_full_replay() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 5)
    assert feed(s, 6) == []
    assert replay(s, 1, 0, 1, 2, 3) == [d(0, True), d(1, True), d(2, True), d(3, True)]
    assert replay(s, 1, 4) == [d(4, True), d(5), d(6)]
    assert s.held == 0
    assert replay(s, 1, 5, 6) == []  # overlap with live
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 5)]
    assert (s.cursor, s.replay_token) == (6, None)


def test_catch_up_history_before_first_replayed_is_not_counted() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 5)
    assert replay(s, 1, 3, 4) == [d(3, True), d(4, True), d(5)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 2)]


def test_catch_up_empty_reply_delivers_held_without_counting() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 5, 6)
    assert s.on_replay_end(1) == [d(5), d(6), ReplayFinished(1, "recovered", 0)]
    assert s.cursor == 6


def test_catch_up_holes_between_held_are_counted() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 5)
    assert feed(s, 8) == [GapDetected(6, 7)]
    assert s.on_replay_end(1) == [d(5), Unrecovered(6, 7, "short"), d(8), ReplayFinished(1, "failed", 0)]


def test_catch_up_short_reply_counts_the_rest() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 5)
    assert replay(s, 1, 1, 2) == [d(1, True), d(2, True)]
    assert s.on_replay_end(1) == [Unrecovered(3, 4, "short"), d(5), ReplayFinished(1, "partial", 2)]


def test_catch_up_timeout_with_nothing() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 5)
    assert s.on_replay_failed(1, "timeout") == [d(5), ReplayFinished(1, "timeout", 0)]


def test_catch_up_item_ahead_of_live_is_left_to_live() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 5)
    assert replay(s, 1, 7) == [d(5)]
    assert feed(s, 6) == [d(6)]
    assert replay(s, 1, 8) == []  # still ahead with a hole (7 is on its way live)
    assert feed(s, 7) == [d(7)]
    assert replay(s, 1, 8, 9) == [d(8, True), d(9, True)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 2)]
    assert feed(s, 8, 9, 10) == [Duplicate(8), Duplicate(9), d(10)]


def test_catch_up_older_live_batch_is_held_not_a_restart() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 50)
    assert feed(s, 30) == []
    assert s.held == 2
    assert s.on_replay_end(1) == [
        d(30),
        Unrecovered(31, 49, "short"),
        d(50),
        ReplayFinished(1, "failed", 0),
    ]


# --- rule 2: the next seq -----------------------------------------------------------------


def test_next_live_seq_is_delivered_during_a_replay() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0)
    assert feed(s, 3) == [GapDetected(1, 2), RequestReplay(1, 1)]
    assert replay(s, 1, 1, 2) == [d(1, True), d(2, True), d(3)]
    assert feed(s, 4) == [d(4)]  # contiguous: no need to wait for the end marker
    assert s.replay_token == 1
    assert replay(s, 1, 3, 4) == []
    assert replay(s, 1, 5) == [d(5, True)]
    assert feed(s, 5) == [Duplicate(5)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 3)]


def test_undecodable_batch_counts_as_received() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0)
    assert s.on_live(1, None) == [Deliver(1, None, False)]
    assert feed(s, 2) == [d(2)]


def test_undecodable_replay_item_is_delivered_as_replayed() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 2)
    assert s.on_replay_item(1, 1, None) == [Deliver(1, None, True), d(2)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 1)]


# --- rule 3: forward gap --------------------------------------------------------------------


def test_gap_with_replay_recovered() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 1, 2, 3)
    assert feed(s, 7) == [GapDetected(4, 6), RequestReplay(1, 4)]
    assert s.held == 1
    assert replay(s, 1, 2, 3) == []  # the replay begins before the gap: overlap
    assert replay(s, 1, 4, 5, 6, 7) == [d(4, True), d(5, True), d(6, True), d(7)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 3)]
    assert feed(s, 8) == [d(8)]


def test_gap_without_replay_is_unrecovered() -> None:
    s = Sequencer(has_replay=False)
    feed(s, 0)
    assert feed(s, 4) == [
        GapDetected(1, 3),
        Unrecovered(1, 3, "unavailable"),
        ReplayFinished(None, "unavailable", 0),
        d(4),
    ]
    assert s.cursor == 4


def test_tokens_increase_per_request() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 2)
    s.on_replay_end(1)
    assert feed(s, 4) == [GapDetected(3, 3), RequestReplay(2, 3)]
    assert s.on_replay_end(1) == []  # stale
    assert s.on_replay_end(2) == [Unrecovered(3, 3, "short"), d(4), ReplayFinished(2, "failed", 0)]


@pytest.mark.parametrize("has_replay", [True, False])
def test_huge_forward_jump_is_a_restart(has_replay: bool) -> None:
    s = Sequencer(has_replay=has_replay, jump_limit=100)
    feed(s, 0, 10)
    s.on_replay_end(1)
    # Fresh start without catch-up: what the new publisher sent before is not counted.
    assert feed(s, 111) == [Restart(111, 10, "jump"), d(111)]
    assert feed(s, 112) == [d(112)]


def test_jump_of_exactly_the_limit_is_a_gap() -> None:
    s = Sequencer(has_replay=False, jump_limit=100)
    feed(s, 10)
    assert feed(s, 110)[0] == GapDetected(11, 109)


def test_jump_during_a_replay_ends_it_first() -> None:
    s = Sequencer(has_replay=True, jump_limit=100)
    feed(s, 0, 5)
    assert feed(s, 1000) == [
        CancelReplay(1),
        Unrecovered(1, 4, "restart"),
        d(5),
        ReplayFinished(1, "failed", 0),
        Restart(1000, 5, "jump"),
        d(1000),
    ]
    assert replay(s, 1, 1) == []


def test_jump_during_catch_up() -> None:
    s = Sequencer(has_replay=True, jump_limit=100)
    feed(s, 50)
    assert feed(s, 500) == [CancelReplay(1), d(50), ReplayFinished(1, "failed", 0), Restart(500, 50, "jump"), d(500)]


# --- rule 4: live batches during a replay -----------------------------------------------------


def test_live_during_replay_is_held_with_gaps_and_duplicates() -> None:
    s = Sequencer(has_replay=True)
    feed(s, *range(11))
    assert feed(s, 13) == [GapDetected(11, 12), RequestReplay(1, 11)]
    assert feed(s, 14) == []
    assert feed(s, 14) == [Duplicate(14)]
    assert feed(s, 17) == [GapDetected(15, 16)]
    assert feed(s, 9) == [Duplicate(9)]
    assert s.held == 3
    assert replay(s, 1, 11, 12) == [d(11, True), d(12, True), d(13), d(14)]
    assert replay(s, 1, 13, 14) == []
    assert replay(s, 1, 15) == [d(15, True)]
    assert s.on_replay_end(1) == [Unrecovered(16, 16, "short"), d(17), ReplayFinished(1, "partial", 3)]
    assert s.held == 0


def test_hold_overflow_gives_the_replay_up() -> None:
    s = Sequencer(has_replay=True, hold_limit=2)
    feed(s, 0)
    assert feed(s, 3) == [GapDetected(1, 2), RequestReplay(1, 1)]
    assert feed(s, 4) == []
    assert s.held == 2
    assert feed(s, 6) == [
        GapDetected(5, 5),
        CancelReplay(1),
        Unrecovered(1, 2, "overflow"),
        d(3),
        d(4),
        Unrecovered(5, 5, "overflow"),
        d(6),
        ReplayFinished(1, "failed", 0),
    ]
    assert (s.held, s.replay_token, s.cursor) == (0, None, 6)
    assert replay(s, 1, 1) == []
    assert feed(s, 7) == [d(7)]


def test_hold_overflow_after_some_replayed_is_partial() -> None:
    s = Sequencer(has_replay=True, hold_limit=1)
    feed(s, 0, 3)
    assert replay(s, 1, 1) == [d(1, True)]
    assert feed(s, 4) == [
        CancelReplay(1),
        Unrecovered(2, 2, "overflow"),
        d(3),
        d(4),
        ReplayFinished(1, "partial", 1),
    ]


def test_hold_overflow_during_catch_up() -> None:
    s = Sequencer(has_replay=True, hold_limit=1)
    feed(s, 5)
    assert feed(s, 6) == [CancelReplay(1), d(5), d(6), ReplayFinished(1, "failed", 0)]


# --- rule 5: replay items ------------------------------------------------------------------


def test_replay_starting_late_counts_evicted() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 5)
    assert replay(s, 1, 3) == [Unrecovered(1, 2, "evicted"), d(3, True)]
    assert replay(s, 1, 4) == [d(4, True), d(5)]
    assert replay(s, 1, 5) == []
    assert s.on_replay_end(1) == [ReplayFinished(1, "partial", 2)]


def test_replayed_copy_of_a_held_batch_wins() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 3)
    replayed = Batch(ts=99.0, events=[])
    assert s.on_replay_item(1, 3, replayed) == [Unrecovered(1, 2, "evicted"), Deliver(3, replayed, True)]
    assert s.held == 0


def test_replay_item_past_held_batches_delivers_them_first() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 3, 5)
    assert replay(s, 1, 4) == [Unrecovered(1, 2, "evicted"), d(3), d(4, True), d(5)]


def test_replay_ahead_of_live_then_live_duplicates() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 3)
    # 3 was held: once contiguous it goes out; the replay's own copy is then an overlap.
    assert replay(s, 1, 1, 2, 3, 4, 5) == [d(1, True), d(2, True), d(3), d(4, True), d(5, True)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 4)]
    assert feed(s, 4, 5, 6) == [Duplicate(4), Duplicate(5), d(6)]


def test_replay_beginning_ahead_of_a_lagging_live_stream() -> None:
    """A deep SUB queue: the engine's buffer begins after everything live has brought so far."""
    s = Sequencer(has_replay=True)
    feed(s, 0, 3, 4)
    # 1 and 2 are gone for good; 5 and 6 still sit in the SUB queue and must not be counted lost.
    assert replay(s, 1, 7, 8) == [Unrecovered(1, 2, "evicted"), d(3), d(4)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "failed", 0)]
    assert feed(s, 5, 6, 7, 8) == [d(5), d(6), d(7), d(8)]


def test_replay_item_right_after_live_top_fills_the_hole_below() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 3)
    assert replay(s, 1, 4) == [Unrecovered(1, 2, "evicted"), d(3), d(4, True)]


def test_stale_tokens_are_ignored() -> None:
    s = Sequencer(has_replay=True)
    assert s.on_replay_item(1, 0, b(0)) == []
    assert s.on_replay_end(1) == []
    assert s.on_replay_failed(1, "timeout") == []
    feed(s, 0, 3)
    assert s.on_replay_item(2, 1, b(1)) == []
    assert s.on_replay_end(0) == []
    assert s.on_replay_failed(7, "failed") == []
    assert (s.held, s.replay_token) == (1, 1)


# --- rule 6: end and failure ----------------------------------------------------------------


def test_failure_with_nothing_replayed_keeps_its_outcome() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 3, 5)
    assert s.on_replay_failed(1, "timeout") == [
        Unrecovered(1, 2, "timeout"),
        d(3),
        Unrecovered(4, 4, "timeout"),
        d(5),
        ReplayFinished(1, "timeout", 0),
    ]


def test_failure_after_some_items_is_partial() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 4)
    replay(s, 1, 1)
    assert s.on_replay_failed(1, "failed") == [
        Unrecovered(2, 3, "failed"),
        d(4),
        ReplayFinished(1, "partial", 1),
    ]


def test_failure_after_everything_came_back_is_recovered() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 2)
    replay(s, 1, 1)
    assert s.on_replay_failed(1, "timeout") == [ReplayFinished(1, "recovered", 1)]


def test_end_with_nothing_replayed_is_failed() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 2)
    assert s.on_replay_end(1) == [Unrecovered(1, 1, "short"), d(2), ReplayFinished(1, "failed", 0)]


def test_unknown_failure_outcome_is_refused() -> None:
    s = Sequencer(has_replay=True)
    with pytest.raises(ValueError, match="timeout"):
        s.on_replay_failed(1, "boom")


# --- rule 7: restarts -------------------------------------------------------------------------


def test_seq_reset_to_zero() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 1, 2, 3, 4, 5)
    assert feed(s, 0) == [Restart(0, 5, "seq_reset"), d(0)]
    assert feed(s, 1) == [d(1)]


def test_seq_reset_to_one_without_replay() -> None:
    s = Sequencer(has_replay=False)
    feed(s, 0, 1, 2, 3, 4, 5)
    assert feed(s, 1) == [
        Restart(1, 5, "seq_reset"),
        GapDetected(0, 0),
        Unrecovered(0, 0, "unavailable"),
        ReplayFinished(None, "unavailable", 0),
        d(1),
    ]


def test_seq_reset_to_one_with_replay() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 1, 2, 3)
    assert feed(s, 1) == [Restart(1, 3, "seq_reset"), GapDetected(0, 0), RequestReplay(1, 0)]
    assert replay(s, 1, 0, 1) == [d(0, True), d(1)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 1)]


@pytest.mark.parametrize(("cursor", "seq"), [(0, 0), (1, 1), (2, 2), (5, 3)])
def test_small_step_back_is_a_duplicate(cursor: int, seq: int) -> None:
    s = Sequencer(has_replay=True)
    feed(s, *range(cursor + 1))
    assert feed(s, seq) == [Duplicate(seq)]
    assert s.cursor == cursor


def test_window() -> None:
    s = Sequencer(has_replay=False, restart_window=10)
    feed(s, 20)
    assert feed(s, 10) == [Duplicate(10)]  # exactly the window: still a duplicate
    assert feed(s, 9) == [
        Restart(9, 20, "window"),
        GapDetected(0, 8),
        Unrecovered(0, 8, "unavailable"),
        ReplayFinished(None, "unavailable", 0),
        d(9),
    ]


def test_reconnect_with_replay_counts_what_replay_cannot_give() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 20)
    s.on_replay_end(1)
    s.on_reconnect()
    assert feed(s, 5) == [Restart(5, 20, "reconnect"), GapDetected(0, 4), RequestReplay(2, 0)]
    assert replay(s, 2, 2, 3, 4) == [Unrecovered(0, 1, "evicted"), d(2, True), d(3, True), d(4, True), d(5)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "partial", 3)]


def test_reconnect_flag_is_consumed_by_the_next_live_batch() -> None:
    s = Sequencer(has_replay=False)
    feed(s, 0, 1, 2, 3)
    s.on_reconnect()
    assert feed(s, 4) == [d(4)]
    assert feed(s, 3) == [Duplicate(3)]


def test_cleared_batch_at_or_below_cursor_is_a_restart() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0)
    first = cleared(0)
    assert s.on_live(0, first) == [Restart(0, 0, "cleared"), Deliver(0, first, False)]


def test_cleared_batch_above_cursor_is_not_a_restart() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0)
    batch = cleared(1)
    assert s.on_live(1, batch) == [Deliver(1, batch, False)]


def test_restart_reason_priority() -> None:
    s = Sequencer(has_replay=False, restart_window=2)
    feed(s, 0, 1, 2, 3, 4, 5)
    s.on_reconnect()
    batch = cleared(0)
    assert s.on_live(0, batch)[0] == Restart(0, 5, "seq_reset")


def test_restart_during_a_replay_delivers_what_was_held() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 1, 2, 3, 4, 5)
    assert feed(s, 9) == [GapDetected(6, 8), RequestReplay(1, 6)]
    assert feed(s, 11) == [GapDetected(10, 10)]
    assert feed(s, 0) == [
        CancelReplay(1),
        Unrecovered(6, 8, "restart"),
        d(9),
        Unrecovered(10, 10, "restart"),
        d(11),
        ReplayFinished(1, "failed", 0),
        Restart(0, 11, "seq_reset"),
        d(0),
    ]
    assert replay(s, 1, 6) == []
    assert s.on_replay_end(1) == []
    assert (s.cursor, s.held, s.replay_token) == (0, 0, None)


def test_restart_during_catch_up() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 5)
    assert feed(s, 0) == [CancelReplay(1), d(5), ReplayFinished(1, "failed", 0), Restart(0, 5, "seq_reset"), d(0)]


def test_restart_into_a_new_replay_gets_a_new_token() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 1, 2, 3, 4, 5, 9)
    s.on_reconnect()
    out = feed(s, 3)
    assert out[-3:] == [Restart(3, 9, "reconnect"), GapDetected(0, 2), RequestReplay(2, 0)]
    assert s.replay_token == 2


def test_reconnect_during_a_replay() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 0, 1, 2, 3, 6)
    s.on_reconnect()
    assert feed(s, 2) == [
        CancelReplay(1),
        Unrecovered(4, 5, "restart"),
        d(6),
        ReplayFinished(1, "failed", 0),
        Restart(2, 6, "reconnect"),
        GapDetected(0, 1),
        RequestReplay(2, 0),
    ]


def test_duplicate_of_a_held_batch_during_catch_up() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 5)
    assert feed(s, 5) == [Duplicate(5)]
    assert s.held == 1


# --- properties against an adversarial publisher --------------------------------------------------


@dataclass
class Incarnation:
    """One publisher process: its batches by seq and the order it published them."""

    base: int
    batches: dict[int, Batch | None] = field(default_factory=dict)
    published: list[int] = field(default_factory=list)
    fed: set[int] = field(default_factory=set)  # seqs that reached the sequencer live

    @property
    def next(self) -> int:
        return self.published[-1] + 1 if self.published else self.base


@dataclass
class PendingReplay:
    token: int
    start: int
    dead: bool = False  # the publisher it was sent to has restarted
    items: list[int] | None = None  # snapshot of the engine's buffer when it starts answering


LOSS_REASONS = {"unavailable", "evicted", "short", "timeout", "failed", "overflow", "restart"}


class Auditor:
    """Checks every action as it comes, and each epoch as a whole when it ends."""

    def __init__(self, incarnations: list[Incarnation], has_replay: bool) -> None:
        self.incarnations = incarnations
        self.has_replay = has_replay
        self.epoch = 0
        self.last_token = 0
        self.restarts: list[Restart] = []
        self._new_epoch(None)

    def _new_epoch(self, frontier: int | None) -> None:
        self.frontier = frontier  # last seq delivered or accounted for
        self.delivered: dict[int, bool] = {}
        self.unrecovered: set[int] = set()
        self.exempt: set[int] = set()  # catch-up losses: not live gaps
        self.gaps: list[GapDetected] = []
        self.token: int | None = None
        self.catch_up = False
        self.replayed = 0
        self.lost = 0

    def check(self, actions: list[Action]) -> None:
        for action in actions:
            self._one(action)

    def _one(self, a: Action) -> None:
        if isinstance(a, Deliver):
            assert self.frontier is None or a.seq == self.frontier + 1, (a, self.frontier)
            expected = self.incarnations[self.epoch].batches[a.seq]
            assert a.batch is expected, (a, expected)
            self.delivered[a.seq] = a.replayed
            self.frontier = a.seq
            if a.replayed:
                assert self.token is not None
                self.replayed += 1
        elif isinstance(a, Unrecovered):
            assert a.reason in LOSS_REASONS
            assert self.frontier is not None and a.first == self.frontier + 1 and a.last >= a.first, (a, self.frontier)
            seqs = set(range(a.first, a.last + 1))
            self.unrecovered |= seqs
            if self.catch_up:
                self.exempt |= seqs
            if a.reason == "unavailable":
                assert not self.has_replay and self.token is None
            else:
                assert self.token is not None
                self.lost += len(seqs)
            self.frontier = a.last
        elif isinstance(a, GapDetected):
            assert a.last >= a.first
            assert self.frontier is None or a.first > self.frontier
            assert not self.gaps or a.first > self.gaps[-1].last
            self.gaps.append(a)
        elif isinstance(a, RequestReplay):
            assert self.has_replay and self.token is None and a.token == self.last_token + 1
            self.last_token = a.token
            self.catch_up = self.frontier is None
            assert a.start == (0 if self.frontier is None else self.frontier + 1)
            self.token, self.replayed, self.lost = a.token, 0, 0
        elif isinstance(a, CancelReplay):
            assert a.token == self.token
        elif isinstance(a, ReplayFinished):
            if a.token is None:
                assert a.outcome == "unavailable" and a.replayed == 0 and self.token is None
                return
            assert a.token == self.token and a.replayed == self.replayed
            if a.outcome == "recovered":
                assert self.lost == 0
            elif a.outcome == "partial":
                assert self.replayed > 0 and self.lost > 0
            else:
                assert a.outcome in ("failed", "timeout") and self.replayed == 0
            self.token, self.catch_up = None, False
        elif isinstance(a, Restart):
            assert self.token is None and a.previous == self.frontier
            self.end_epoch()
            self.restarts.append(a)
            self.epoch += 1
            self._new_epoch(None if a.reason == "jump" else -1)
        else:
            assert isinstance(a, Duplicate)  # checked against the publisher by the model

    def end_epoch(self) -> None:
        """Every live gap was either replayed or counted lost, and every loss outside a catch-up was a gap."""
        gap_seqs: set[int] = set()
        for gap in self.gaps:
            gap_seqs |= set(range(gap.first, gap.last + 1))
        replayed = {seq for seq, was in self.delivered.items() if was}
        assert sum(g.count for g in self.gaps) == len(gap_seqs & replayed) + len(gap_seqs & self.unrecovered)
        assert not gap_seqs & {seq for seq, was in self.delivered.items() if not was}
        assert self.unrecovered - self.exempt <= gap_seqs
        assert not self.unrecovered & set(self.delivered)
        # Nothing that arrived is lost: every live batch of this publisher was delivered (live or replayed copy).
        assert self.incarnations[self.epoch].fed <= set(self.delivered)


RESTART_WINDOW = 20
JUMP_LIMIT = 1000


class PublisherModel(RuleBasedStateMachine):
    """A publisher that drops, duplicates, delays, restarts, and answers replays badly."""

    @initialize(
        has_replay=st.booleans(),
        hold_limit=st.integers(1, 40),
        buffer=st.integers(1, 40),
    )
    def setup(self, has_replay: bool, hold_limit: int, buffer: int) -> None:
        self.seq = Sequencer(
            has_replay=has_replay, restart_window=RESTART_WINDOW, hold_limit=hold_limit, jump_limit=JUMP_LIMIT
        )
        self.hold_limit = hold_limit
        self.buffer = buffer
        self.incarnations = [Incarnation(base=0)]
        self.auditor = Auditor(self.incarnations, has_replay)
        self.queue: deque[int] = deque()  # live batches in flight (the SUB socket's queue)
        self.never_live: set[int] = set()  # seqs of the current incarnation that can no longer arrive live
        self.last_live: int | None = None
        self.force: int | None = None  # a restart's first seq, which must arrive for the restart to be seen
        self.restart_unseen = False
        self.pending: PendingReplay | None = None

    @property
    def current(self) -> Incarnation:
        return self.incarnations[-1]

    def apply(self, actions: list[Action]) -> None:
        self.auditor.check(actions)
        for action in actions:
            if isinstance(action, RequestReplay):
                assert self.pending is None or self.pending.dead or self.pending.token == self.seq.replay_token
                self.pending = PendingReplay(action.token, action.start)
            elif isinstance(action, CancelReplay | ReplayFinished) and (
                self.pending is not None and self.pending.token == action.token
            ):
                self.pending = None
        if self.restart_unseen and self.auditor.epoch == len(self.incarnations) - 1:
            self.restart_unseen = False

    def publish_one(self, drop: bool, undecodable: bool = False, first_cleared: bool = False) -> None:
        inc = self.current
        seq = inc.next
        batch = None if undecodable else (cleared(seq) if first_cleared else b(seq))
        inc.batches[seq] = batch
        inc.published.append(seq)
        if drop and seq != self.force:
            self.never_live.add(seq)
        else:
            self.queue.append(seq)

    def feed_live(self, seq: int) -> None:
        # A duplicate is exactly a batch that arrived live before or was delivered from a replay.
        seen = seq in self.current.fed or (not self.restart_unseen and seq in self.auditor.delivered)
        actions = self.seq.on_live(seq, self.current.batches[seq])
        assert any(isinstance(a, Duplicate) for a in actions) == seen, (seq, actions)
        self.current.fed.add(seq)
        self.apply(actions)
        self.last_live = seq

    @rule(kind=st.sampled_from(["ok", "ok", "ok", "drop", "undecodable"]))
    def publish(self, kind: str) -> None:
        self.publish_one(drop=kind == "drop", undecodable=kind == "undecodable")

    @rule(count=st.integers(1, 30))
    def publish_dropped_run(self, count: int) -> None:
        for _ in range(count):
            self.publish_one(drop=True)

    @rule(count=st.integers(1, 6))
    def deliver_live(self, count: int) -> None:
        for _ in range(min(count, len(self.queue))):
            self.feed_live(self.queue.popleft())

    @precondition(lambda self: self.last_live is not None)
    @rule()
    def duplicate_last(self) -> None:
        assert self.last_live is not None
        batch = self.current.batches[self.last_live]
        if batch is not None and isinstance(batch.events[0], AllBlocksCleared):
            return  # a repeated AllBlocksCleared really is indistinguishable from a restart
        self.feed_live(self.last_live)

    @precondition(lambda self: not self.restart_unseen)
    @rule()
    def reconnect_without_restart(self) -> None:
        # What was in flight is lost with the connection; the next batch is newer than anything seen.
        self.never_live.update(self.queue)
        self.queue.clear()
        self.last_live = None
        self.seq.on_reconnect()

    @precondition(
        lambda self: (
            not self.restart_unseen
            and (self.seq.cursor is not None or self.seq.replay_token is not None)
            and (self.seq.cursor is None or self.seq.cursor >= 0)
        )
    )
    @rule(kind=st.sampled_from(["reset", "reconnect", "cleared", "window", "jump"]), extra=st.integers(0, 50))
    def restart(self, kind: str, extra: int) -> None:
        cursor = self.seq.cursor
        if kind == "reset" and cursor is not None and cursor < 1:
            kind = "reconnect"
        if kind == "window" and (cursor is None or cursor <= RESTART_WINDOW + 5):
            kind = "jump"
        old_next = self.current.next
        self.queue.clear()
        self.last_live = None
        if self.pending is not None:
            self.pending.dead = True
        base = old_next + JUMP_LIMIT + 1 + extra if kind == "jump" else 0
        self.incarnations.append(Incarnation(base=base))
        self.never_live = set()
        self.restart_unseen = True
        if kind == "reconnect":
            self.seq.on_reconnect()
        if kind == "window":
            for _ in range(2 + extra % 4):
                self.publish_one(drop=True)
        self.force = self.current.next
        self.publish_one(drop=False, first_cleared=kind == "cleared")

    @precondition(lambda self: self.pending is not None and not self.pending.dead)
    @rule(count=st.integers(1, 8), late=st.integers(0, 3), short=st.integers(0, 3))
    def replay_items(self, count: int, late: int, short: int) -> None:
        pending = self.pending
        assert pending is not None
        if pending.items is None:
            window = [s for s in self.current.published[-self.buffer :] if s >= pending.start]
            pending.items = window[late : len(window) - short]
        for _ in range(min(count, len(pending.items))):
            seq = pending.items.pop(0)
            self.apply(self.seq.on_replay_item(pending.token, seq, self.current.batches[seq]))
            if self.pending is not pending:
                return  # given up (overflow) or finished

    @precondition(lambda self: self.pending is not None)
    @rule(kind=st.sampled_from(["end", "end", "timeout", "failed"]))
    def replay_finish(self, kind: str) -> None:
        pending = self.pending
        assert pending is not None
        if pending.dead and kind == "end":
            kind = "timeout"
        if kind == "end":
            self.apply(self.seq.on_replay_end(pending.token))
        else:
            self.apply(self.seq.on_replay_failed(pending.token, kind))
        assert self.pending is None and self.seq.replay_token is None and self.seq.held == 0

    @rule(token=st.integers(-2, 5), seq=st.integers(0, 100))
    def stale_replay(self, token: int, seq: int) -> None:
        current = self.seq.replay_token
        if current is not None:
            token = current - 1 - abs(token) if token % 2 else current + 1 + abs(token)
        assert self.seq.on_replay_item(token, seq, b(seq)) == []
        assert self.seq.on_replay_end(token) == []
        assert self.seq.on_replay_failed(token, "timeout") == []

    @invariant()
    def bounded(self) -> None:
        assert self.seq.held <= self.hold_limit
        assert (self.seq.held > 0) <= (self.seq.replay_token is not None)

    @invariant()
    def gaps_were_never_live(self) -> None:
        if self.auditor.epoch == len(self.incarnations) - 1:
            for gap in self.auditor.gaps:
                assert set(range(gap.first, gap.last + 1)) <= self.never_live

    def teardown(self) -> None:
        if not hasattr(self, "seq"):
            return
        self.deliver_live(len(self.queue))
        if self.pending is not None:
            if self.pending.dead:
                self.replay_finish("timeout")
            else:
                self.replay_items(10_000, 0, 0)
                if self.pending is not None:
                    self.replay_finish("end")
        assert self.seq.replay_token is None and self.seq.held == 0
        self.auditor.end_epoch()
        # Every restart was made detectable, so each shows up exactly once.
        assert len(self.auditor.restarts) == len(self.incarnations) - 1
        for restart, inc in zip(self.auditor.restarts, self.incarnations[1:], strict=True):
            assert restart.seq in inc.batches


PublisherModel.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPublisherModel = PublisherModel.TestCase


# --- generated scenarios: complete recovery, and exact accounting without replay --------------------


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(0, 5),
    drops=st.lists(st.booleans(), min_size=1, max_size=80),
    answer_after=st.integers(0, 5),
)
def test_full_replays_recover_everything(start: int, drops: list[bool], answer_after: int) -> None:
    """With a replay buffer that holds everything, every published seq is delivered exactly once, in order."""
    s = Sequencer(has_replay=True)
    published = list(range(start, start + len(drops)))
    live = [seq for seq, drop in zip(published, drops, strict=True) if not drop]
    delivered: list[int] = []
    outcomes: list[str] = []
    pending: tuple[int, int, int] | None = None  # token, start, live batches until it is answered

    def run(actions: list[Action]) -> None:
        nonlocal pending
        for a in actions:
            if isinstance(a, Deliver):
                delivered.append(a.seq)
            elif isinstance(a, RequestReplay):
                pending = (a.token, a.start, answer_after)
            elif isinstance(a, ReplayFinished):
                outcomes.append(a.outcome)
            else:
                assert isinstance(a, GapDetected), a

    def answer(up_to: int) -> None:
        nonlocal pending
        assert pending is not None
        token, first, _ = pending
        pending = None
        for seq in range(first, up_to + 1):
            run(s.on_replay_item(token, seq, b(seq)))
        run(s.on_replay_end(token))

    for seq in live:
        run(s.on_live(seq, b(seq)))
        if pending is not None:
            token, first, wait = pending
            if wait == 0:
                answer(seq)
            else:
                pending = (token, first, wait - 1)
    if pending is not None:
        answer(live[-1] if live else 0)
    if not live:
        assert delivered == []
        return
    # A catch-up (first live seq > 0) replays the history from 0 as well.
    assert delivered == list(range(live[-1] + 1))
    assert set(outcomes) <= {"recovered"}
    assert s.held == 0 and s.replay_token is None


@settings(max_examples=200, deadline=None)
@given(seqs=st.lists(st.integers(0, 200), min_size=1, max_size=60, unique=True).map(sorted))
def test_without_replay_losses_equal_gaps(seqs: list[int]) -> None:
    s = Sequencer(has_replay=False)
    actions: list[Action] = []
    for seq in seqs:
        actions += s.on_live(seq, b(seq))
    gaps = [(a.first, a.last) for a in actions if isinstance(a, GapDetected)]
    lost = [(a.first, a.last) for a in actions if isinstance(a, Unrecovered)]
    assert gaps == lost
    assert all(a.reason == "unavailable" for a in actions if isinstance(a, Unrecovered))
    assert [a.seq for a in actions if isinstance(a, Deliver)] == seqs
    expected_missing = seqs[-1] - seqs[0] + 1 - len(seqs)
    assert sum(last - first + 1 for first, last in gaps) == expected_missing
    assert sum(1 for a in actions if isinstance(a, ReplayFinished)) == len(gaps)
