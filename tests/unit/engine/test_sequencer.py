"""The sequencer: exact action lists for every rule, and properties against an adversarial publisher."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgateway.engine.sequencer import (
    Action,
    CancelReplay,
    Deliver,
    Duplicate,
    GapDetected,
    HistoryTruncated,
    ReplayFinished,
    RequestReplay,
    Restart,
    Sequencer,
    Unrecovered,
    clock_seeded,
)
from kvgateway.engine.wire import Batch
from tests.support import events

CLOCK = 1_700_000_000_000_000_000  # a TensorRT-LLM seq: time.time_ns() at start


def b(seq: int) -> Batch:
    """A distinct batch per seq (ts carries the seq so equality tells batches apart)."""
    return events.batch(events.removed(seq), ts=float(seq), dp_rank=None)


def cleared(seq: int) -> Batch:
    return events.batch(events.cleared(), events.removed(seq), ts=float(seq), dp_rank=None)


def raw(seq: int, proc: int = 0) -> bytes:
    """The payload of ``seq`` as process ``proc`` published it (two processes never share one)."""
    return f"{proc}:{seq}".encode()


def d(seq: int, replayed: bool = False) -> Deliver:
    return Deliver(seq, b(seq), replayed)


def dr(*seqs: int) -> list[Action]:
    return [d(seq, True) for seq in seqs]


def dl(*seqs: int) -> list[Action]:
    return [d(seq) for seq in seqs]


def feed(s: Sequencer, *seqs: int, proc: int = 0) -> list[Action]:
    out: list[Action] = []
    for seq in seqs:
        out += s.on_live(seq, b(seq), raw(seq, proc))
    return out


def replay(s: Sequencer, token: int, *seqs: int, proc: int = 0) -> list[Action]:
    out: list[Action] = []
    for seq in seqs:
        out += s.on_replay_item(token, seq, b(seq), raw(seq, proc))
    return out


def rr(token: int, start: int, purpose: str = "gap", attempt: int = 1) -> RequestReplay:
    return RequestReplay(token, start, purpose, attempt)  # type: ignore[arg-type]


def running(*seqs: int, has_replay: bool = True, **kwargs: int) -> Sequencer:
    """A sequencer connected to an engine that published ``seqs`` live (its catch-up answered empty)."""
    s = Sequencer(has_replay=has_replay, **kwargs)
    s.on_connected()
    feed(s, *seqs)
    if has_replay:
        s.on_replay_end(1)
    assert s.replay_token is None and s.held == 0
    return s


# --- construction and views ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"restart_window": -1}, "restart_window"),
        ({"hold_limit": 0}, "hold_limit"),
        ({"jump_limit": 0}, "jump_limit"),
        ({"max_attempts": 0}, "max_attempts"),
    ],
)
def test_bad_limits_are_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sequencer(has_replay=True, **kwargs)


def test_zero_restart_window_is_allowed() -> None:
    s = running(0, 1, 2, 3, restart_window=0, has_replay=False)
    assert feed(s, 3) == [Duplicate(3)]
    assert feed(s, 2)[0] == Restart(2, 3, "window")


def test_initial_state() -> None:
    s = Sequencer(has_replay=True)
    assert (s.cursor, s.held, s.replay_token, s.waiting_for_live) == (None, 0, None, False)


def test_counts_of_ranges() -> None:
    assert GapDetected(3, 7).count == 5
    assert Unrecovered(4, 4, "transit").count == 1


def test_clock_seeded() -> None:
    assert clock_seeded(CLOCK) and not clock_seeded(10**9)


def test_unknown_failure_outcome_is_refused() -> None:
    s = Sequencer(has_replay=True)
    with pytest.raises(ValueError, match="timeout"):
        s.on_replay_failed(1, "boom")


# --- rules 1-2: connect and catch-up ---------------------------------------------------------


def test_connect_asks_for_the_whole_buffer() -> None:
    s = Sequencer(has_replay=True)
    assert s.on_connected() == [rr(1, 0, "catch_up")]
    assert (s.cursor, s.replay_token) == (None, 1)


def test_catch_up_full() -> None:
    s = Sequencer(has_replay=True)
    s.on_connected()
    assert feed(s, 5, 6) == []
    assert s.held == 2
    assert replay(s, 1, 0, 1, 2, 3) == dr(0, 1, 2, 3)
    assert replay(s, 1, 4) == [*dr(4), *dl(5, 6)]
    assert replay(s, 1, 5, 6) == []  # overlap with live
    assert replay(s, 1, 7) == dr(7)  # ahead of the live stream
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 6)]
    assert (s.cursor, s.held, s.replay_token) == (7, 0, None)
    assert feed(s, 7, 8) == [Duplicate(7), d(8)]


def test_catch_up_of_an_idle_engine_delivers_its_buffer_at_once() -> None:
    s = Sequencer(has_replay=True)
    s.on_connected()
    assert replay(s, 1, 0, 1, 2) == dr(0, 1, 2)
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 3)]
    assert feed(s, 3) == [d(3)]


def test_catch_up_truncated_history() -> None:
    s = Sequencer(has_replay=True)
    s.on_connected()
    feed(s, 5)
    assert replay(s, 1, 3, 4) == [HistoryTruncated(3), *dr(3, 4), d(5)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 2)]


def test_catch_up_starting_with_a_clear_is_not_truncated() -> None:
    s = Sequencer(has_replay=True)
    s.on_connected()
    first = cleared(3)
    assert s.on_replay_item(1, 3, first, raw(3)) == [Deliver(3, first, True)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 1)]


def test_catch_up_of_clock_seeded_seqs_is_not_truncated() -> None:
    s = Sequencer(has_replay=True)
    s.on_connected()
    feed(s, CLOCK + 5)
    assert replay(s, 1, CLOCK + 3, CLOCK + 4) == [*dr(CLOCK + 3, CLOCK + 4), d(CLOCK + 5)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 2)]


def test_catch_up_empty_reply() -> None:
    s = Sequencer(has_replay=True)
    s.on_connected()
    feed(s, 5, 6)
    assert s.on_replay_end(1) == [HistoryTruncated(5), d(5), d(6), ReplayFinished(1, "recovered", 0)]
    assert s.cursor == 6


def test_catch_up_empty_reply_from_zero() -> None:
    s = Sequencer(has_replay=True)
    s.on_connected()
    feed(s, 0, 1)
    assert s.on_replay_end(1) == [d(0), d(1), ReplayFinished(1, "recovered", 0)]


def test_catch_up_no_answer() -> None:
    s = Sequencer(has_replay=True)
    s.on_connected()
    feed(s, 5)
    assert s.on_replay_failed(1, "timeout") == [rr(2, 0, "catch_up", 2)]  # one silence is asked again
    # Nothing said seqs 0..4 are gone (issue 32, item 6): they are lost no_answer, not a truncated history.
    assert s.on_replay_failed(2, "timeout") == [
        Unrecovered(0, 4, "no_answer"),
        d(5),
        ReplayFinished(2, "failed", 0, 2),
    ]
    assert feed(s, 6) == [d(6)]


def test_catch_up_malformed_reply_is_no_answer() -> None:
    """A reply with nothing usable (a ROUTER that answers garbage) is no answer either."""
    s = Sequencer(has_replay=True)
    s.on_connected()
    feed(s, 3)
    assert s.on_replay_failed(1, "failed") == [Unrecovered(0, 2, "no_answer"), d(3), ReplayFinished(1, "failed", 0)]


def test_catch_up_no_answer_before_a_clear_loses_nothing() -> None:
    """The first live batch starts with AllBlocksCleared: what came before it does not matter."""
    s = Sequencer(has_replay=True)
    s.on_connected()
    first = cleared(5)
    s.on_live(5, first, raw(5))
    s.on_replay_failed(1, "timeout")
    assert s.on_replay_failed(2, "timeout") == [Deliver(5, first, False), ReplayFinished(2, "failed", 0, 2)]


def test_catch_up_with_nothing_anywhere_waits_for_live() -> None:
    s = Sequencer(has_replay=True)
    s.on_connected()
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 0)]
    assert s.cursor is None
    # The first batch of the (idle until now) engine: nothing precedes seq 0.
    assert feed(s, 0, 1) == [d(0), d(1)]
    s = Sequencer(has_replay=True)
    s.on_connected()
    s.on_replay_end(1)
    # Above 0: the engine's buffer is asked for again.
    assert feed(s, 2) == [rr(2, 0, "catch_up")]
    assert replay(s, 2, 1, 2) == [HistoryTruncated(1), d(1, True), d(2)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 1)]


def test_live_arriving_before_the_connect_starts_the_catch_up() -> None:
    s = Sequencer(has_replay=True)
    assert feed(s, 5) == [rr(1, 0, "catch_up")]
    assert replay(s, 1, 0, 1, 2, 3, 4) == [*dr(0, 1, 2, 3, 4), d(5)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 5)]


def test_connect_during_a_catch_up_asks_again() -> None:
    s = Sequencer(has_replay=True)
    feed(s, 5)
    assert s.on_connected() == [CancelReplay(1), rr(2, 0, "catch_up", 2)]
    assert replay(s, 1, 0) == []
    assert replay(s, 2, 4) == [HistoryTruncated(4), d(4, True), d(5)]


def test_catch_up_older_live_batch_is_held_not_a_restart() -> None:
    s = Sequencer(has_replay=True)
    s.on_connected()
    feed(s, 50)
    assert feed(s, 30) == []
    assert s.held == 2
    assert replay(s, 1, 30) == [HistoryTruncated(30), d(30)]
    assert replay(s, 1, 31, 32) == dr(31, 32)
    assert s.on_replay_end(1) == [rr(2, 32, "catch_up", 2)]
    assert replay(s, 2, 33, *range(34, 50)) == [*dr(*range(33, 50)), d(50)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 19, 2)]


def test_catch_up_holes_between_live_batches_are_asked_again_then_transit() -> None:
    s = Sequencer(has_replay=True)
    s.on_connected()
    feed(s, 5)
    assert feed(s, 8) == [GapDetected(6, 7)]
    assert replay(s, 1, 0, 1, 2, 3, 4, 5, 7) == [*dr(0, 1, 2, 3, 4), d(5)]
    assert s.on_replay_end(1) == [rr(2, 5, "catch_up", 2)]
    assert replay(s, 2, 6, 7) == [*dr(6, 7), d(8)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 7, 2)]


# --- rule 3: the next seq ----------------------------------------------------------------------


def test_next_live_seq_is_delivered() -> None:
    s = running(0, 1)
    assert feed(s, 2, 3) == dl(2, 3)
    assert s.cursor == 3


def test_next_live_seq_is_delivered_during_a_gap_replay() -> None:
    s = running(0)
    assert feed(s, 3) == [GapDetected(1, 2), rr(2, 0)]
    assert replay(s, 2, 1, 2) == [*dr(1, 2), d(3)]
    assert feed(s, 4) == [d(4)]  # contiguous: no need to wait for the end marker
    assert s.replay_token == 2
    assert replay(s, 2, 3, 4) == []
    assert replay(s, 2, 5) == dr(5)
    assert feed(s, 5) == [Duplicate(5)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 3)]


def test_undecodable_batches_count_as_received() -> None:
    s = running(0)
    assert s.on_live(1, None) == [Deliver(1, None, False)]
    assert feed(s, 3) == [GapDetected(2, 2), rr(2, 1)]
    assert s.on_replay_item(2, 2, None) == [Deliver(2, None, True), d(3)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 1)]


# --- rule 4: forward gap -------------------------------------------------------------------------


def test_gap_recovered_by_one_reply() -> None:
    s = running(0, 1, 2, 3)
    assert feed(s, 7) == [GapDetected(4, 6), rr(2, 3)]
    assert s.held == 1
    assert replay(s, 2, 4, 5, 6, 7) == [*dr(4, 5, 6), d(7)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 3)]
    assert feed(s, 8) == [d(8)]


def test_live_during_a_gap_replay_is_held_with_gaps_and_duplicates() -> None:
    s = running(*range(11))
    assert feed(s, 13) == [GapDetected(11, 12), rr(2, 10)]
    assert feed(s, 14) == []
    assert feed(s, 14) == [Duplicate(14)]
    assert feed(s, 17) == [GapDetected(15, 16)]
    assert feed(s, 9) == [Duplicate(9)]
    assert s.held == 3
    assert replay(s, 2, 11, 12) == [*dr(11, 12), d(13), d(14)]
    assert replay(s, 2, 15, 16) == [*dr(15, 16), d(17)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 4)]


def test_gap_report_skips_what_a_reply_already_brought() -> None:
    s = running(0)
    feed(s, 2)
    assert replay(s, 2, 1, 2, 3, 5) == [d(1, True), d(2), d(3, True)]
    assert feed(s, 7) == [GapDetected(4, 4), GapDetected(6, 6)]


def test_gap_without_replay_is_no_replay() -> None:
    s = running(0, has_replay=False)
    assert feed(s, 4) == [
        GapDetected(1, 3),
        Unrecovered(1, 3, "no_replay"),
        ReplayFinished(None, "unavailable", 0),
        d(4),
    ]
    assert s.cursor == 4


def test_gap_without_replay_fenced_by_a_clear_is_not_sent() -> None:
    s = running(0, has_replay=False)
    fence = cleared(4)
    assert s.on_live(4, fence, raw(4)) == [
        GapDetected(1, 3),
        Unrecovered(1, 3, "not_sent"),
        ReplayFinished(None, "unavailable", 0),
        Deliver(4, fence, False),
    ]


def test_gap_fenced_by_a_clear_that_no_reply_fills_is_not_sent() -> None:
    """TensorRT-LLM dropped batches on queue overflow and then sent AllBlocksCleared."""
    s = running(0, 1)
    fence = cleared(5)
    assert s.on_live(5, fence, raw(5)) == [GapDetected(2, 4), rr(2, 1)]
    assert s.on_replay_item(2, 5, fence, raw(5)) == []
    assert s.on_replay_end(2) == [
        Unrecovered(2, 4, "not_sent"),
        Deliver(5, fence, False),
        ReplayFinished(2, "failed", 0),
    ]


def test_first_live_without_replay_starts_the_epoch() -> None:
    s = Sequencer(has_replay=False)
    assert s.on_connected() == []
    assert feed(s, 7, 8) == [HistoryTruncated(7), d(7), d(8)]
    s = Sequencer(has_replay=False)
    assert feed(s, 0) == [d(0)]
    s = Sequencer(has_replay=False)
    assert feed(s, CLOCK) == [d(CLOCK)]


@pytest.mark.parametrize("has_replay", [True, False])
def test_jump_of_exactly_the_limit_is_a_gap(has_replay: bool) -> None:
    s = running(10, has_replay=has_replay, jump_limit=100)
    assert feed(s, 110)[0] == GapDetected(11, 109)


# --- rule 5: replay items --------------------------------------------------------------------


def test_replay_items_at_or_below_the_cursor_or_pending_are_ignored() -> None:
    s = running(0, 1, 2)
    feed(s, 5)
    assert replay(s, 2, 2, 1, 2, 5) == []  # the anchor first (rule 11), then seqs already known
    assert replay(s, 2, 3, 3) == dr(3)
    assert s.on_replay_end(2) == [rr(3, 3, "gap", 2)]


def test_replay_ahead_of_a_lagging_live_stream_is_kept() -> None:
    """The issue's case: buffer 50, live at 2029, the reply to 2000 is 5970-6019."""
    s = running(*range(2000))
    assert feed(s, 2028) == [GapDetected(2000, 2027), rr(2, 1999)]
    assert feed(s, 2029) == []
    assert replay(s, 2, *range(5970, 6020)) == []
    assert s.held == 52
    assert s.on_replay_end(2) == [
        Unrecovered(2000, 2027, "evicted"),
        d(2028),
        d(2029),
        ReplayFinished(2, "partial", 50),
    ]
    assert (s.held, s.replay_token, s.waiting_for_live) == (50, None, True)
    assert feed(s, *range(2030, 5970)) == [*dl(*range(2030, 5970)), *dr(*range(5970, 6020))]
    assert feed(s, *range(5970, 6020)) == [Duplicate(seq) for seq in range(5970, 6020)]
    assert feed(s, 6020) == [d(6020)]
    assert (s.held, s.waiting_for_live) == (0, False)


def test_evicted_holes_above_live_top_are_deferred_to_live() -> None:
    s = running(0)
    feed(s, 3)
    assert replay(s, 2, 6, 7) == []
    assert s.on_replay_end(2) == [Unrecovered(1, 2, "evicted"), d(3), ReplayFinished(2, "partial", 2)]
    assert feed(s, 4, 5) == [d(4), d(5), d(6, True), d(7, True)]


def test_live_gap_over_a_deferred_hole_settles_it() -> None:
    s = running(0)
    feed(s, 3)
    replay(s, 2, 6, 7)
    s.on_replay_end(2)
    # The live stream skips 4-5 (dropped at the PUB socket): that is a new gap replay.
    assert feed(s, 8) == [GapDetected(4, 5), rr(3, 3)]
    assert replay(s, 3, 6, 7, 8) == []
    assert s.on_replay_end(3) == [
        Unrecovered(4, 5, "evicted"),
        *dr(6, 7),
        d(8),
        ReplayFinished(3, "failed", 0),
    ]


def test_replay_item_ahead_beyond_the_hold_limit_is_not_kept() -> None:
    s = running(0, hold_limit=2)
    feed(s, 3)
    assert replay(s, 2, 5) == []
    assert s.held == 2
    assert replay(s, 2, 6) == []
    assert s.held == 2
    assert replay(s, 2, 1, 2) == [*dr(1, 2), d(3)]
    # 4 is above everything live brought: the live stream is behind and will bring it.
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 3)]
    assert s.waiting_for_live
    assert feed(s, 4) == [d(4), d(5, True)]


def test_replayed_copy_then_live_copy_is_a_duplicate() -> None:
    s = running(0)
    feed(s, 2)
    assert replay(s, 2, 1, 2, 3, 4) == [d(1, True), d(2), *dr(3, 4)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 3)]
    assert feed(s, 3, 4, 5) == [Duplicate(3), Duplicate(4), d(5)]


def test_stale_tokens_are_ignored() -> None:
    s = Sequencer(has_replay=True)
    assert s.on_replay_item(1, 0, b(0)) == []
    assert s.on_replay_end(1) == []
    assert s.on_replay_failed(1, "timeout") == []
    s = running(0)
    feed(s, 3)
    for token in (0, 1, 3, -1):
        assert s.on_replay_item(token, 1, b(1)) == []
        assert s.on_replay_end(token) == []
        assert s.on_replay_failed(token, "failed") == []
    assert (s.held, s.replay_token, s.cursor) == (1, 2, 0)


# --- rule 6: end of an attempt -------------------------------------------------------------


def test_transit_holes_are_asked_again_until_recovered() -> None:
    s = running(0, 1)
    assert feed(s, 10) == [GapDetected(2, 9), rr(2, 1)]
    assert replay(s, 2, 2, 3, 5, 6, 8) == dr(2, 3)  # 4 and 7 dropped by the ROUTER, tail lost
    assert s.on_replay_end(2) == [rr(3, 3, "gap", 2)]
    assert replay(s, 3, 4, 5, 6, 7) == dr(4, 5, 6, 7, 8)
    assert s.on_replay_failed(3, "timeout") == [rr(4, 8, "gap", 3)]  # the end marker was lost too
    assert replay(s, 4, 9, 10) == [d(9, True), d(10)]
    assert s.on_replay_end(4) == [ReplayFinished(4, "recovered", 8, 3)]


def test_transit_hole_without_progress_is_transit() -> None:
    s = running(0, 1)
    feed(s, 6)
    assert replay(s, 2, 2, 3, 5) == dr(2, 3)
    assert s.on_replay_end(2) == [rr(3, 3, "gap", 2)]
    assert replay(s, 3, 4) == [*dr(4, 5), d(6)]
    s = running(0, 1)
    feed(s, 6)
    replay(s, 2, 2, 3, 5)
    s.on_replay_end(2)
    # The second attempt brings nothing new (and neither does the one more a silence earns).
    assert s.on_replay_failed(3, "timeout") == [rr(4, 3, "gap", 3)]
    assert s.on_replay_failed(4, "timeout") == [
        Unrecovered(4, 4, "transit"),
        d(5, True),
        d(6),
        ReplayFinished(4, "partial", 3, 3),
    ]


def test_later_attempt_starting_above_its_start_proves_eviction() -> None:
    s = running(0, 1)
    feed(s, 6)
    replay(s, 2, 2, 3, 5)
    assert s.on_replay_end(2) == [rr(3, 3, "gap", 2)]
    assert replay(s, 3, 5) == []
    assert s.on_replay_end(3) == [
        Unrecovered(4, 4, "evicted"),
        d(5, True),
        d(6),
        ReplayFinished(3, "partial", 3, 2),
    ]


def test_reply_with_holes_and_no_progress_settles_every_hole() -> None:
    s = running(0)
    feed(s, 9)
    assert replay(s, 2, 1, 3, 5) == dr(1)
    assert s.on_replay_end(2) == [rr(3, 1, "gap", 2)]
    assert replay(s, 3, 1) == []  # only the anchor (rule 11): nothing new
    assert s.on_replay_end(3) == [
        Unrecovered(2, 2, "transit"),
        d(3, True),
        Unrecovered(4, 4, "transit"),
        d(5, True),
        Unrecovered(6, 8, "transit"),
        d(9),
        ReplayFinished(3, "partial", 3, 2),
    ]


def test_no_answer() -> None:
    s = running(0)
    feed(s, 3, 5)
    assert s.on_replay_failed(2, "timeout") == [rr(3, 0, "gap", 2)]  # one silence is asked again
    assert s.on_replay_failed(3, "timeout") == [
        Unrecovered(1, 2, "no_answer"),
        d(3),
        Unrecovered(4, 4, "no_answer"),
        d(5),
        ReplayFinished(3, "failed", 0, 2),
    ]


def test_malformed_reply_after_some_items_is_asked_again() -> None:
    s = running(0)
    feed(s, 4)
    replay(s, 2, 1)
    assert s.on_replay_failed(2, "failed") == [rr(3, 1, "gap", 2)]
    assert s.on_replay_failed(3, "failed") == [
        Unrecovered(2, 3, "transit"),
        d(4),
        ReplayFinished(3, "partial", 1, 2),
    ]


def test_evicted_below_live_top() -> None:
    s = running(0)
    feed(s, 5)
    assert replay(s, 2, 3, 4) == []
    assert s.on_replay_end(2) == [
        Unrecovered(1, 2, "evicted"),
        *dr(3, 4),
        d(5),
        ReplayFinished(2, "partial", 2),
    ]


def test_evicted_everything_the_reply_starts_after() -> None:
    s = running(0)
    feed(s, 3, 5)
    assert replay(s, 2, 6) == []
    assert s.on_replay_end(2) == [
        Unrecovered(1, 2, "evicted"),
        d(3),
        Unrecovered(4, 4, "evicted"),
        d(5),
        d(6, True),
        ReplayFinished(2, "partial", 1),
    ]


def test_evicted_and_transit_holes_in_one_reply() -> None:
    s = running(0)
    feed(s, 9)
    assert replay(s, 2, 3, 4, 6, 7) == []
    assert s.on_replay_end(2) == [Unrecovered(1, 2, "evicted"), *dr(3, 4), rr(3, 4, "gap", 2)]
    assert replay(s, 3, 4) == []  # only the anchor: nothing new
    assert s.on_replay_end(3) == [
        Unrecovered(5, 5, "transit"),
        *dr(6, 7),
        Unrecovered(8, 8, "transit"),
        d(9),
        ReplayFinished(3, "partial", 4, 2),
    ]


def test_max_attempts_bounds_a_recovery() -> None:
    s = running(0, max_attempts=2)
    feed(s, 9)
    assert replay(s, 2, 1, 3) == dr(1)
    assert s.on_replay_end(2) == [rr(3, 1, "gap", 2)]
    assert replay(s, 3, 2, 4, 6) == dr(2, 3, 4)
    # Progress again, but the recovery has had its two attempts.
    assert s.on_replay_end(3) == [
        Unrecovered(5, 5, "transit"),
        d(6, True),
        Unrecovered(7, 8, "transit"),
        d(9),
        ReplayFinished(3, "partial", 5, 2),
    ]


def test_max_attempts_of_one() -> None:
    s = running(0, max_attempts=1)
    feed(s, 3)
    replay(s, 2, 1)
    assert s.on_replay_end(2) == [Unrecovered(2, 2, "transit"), d(3), ReplayFinished(2, "partial", 1)]


def test_end_with_everything_is_recovered() -> None:
    s = running(0)
    feed(s, 2)
    replay(s, 2, 1)
    # No end marker: the reply may have lost its tail too, so the rest is asked for once more.
    assert s.on_replay_failed(2, "timeout") == [rr(3, 2, "gap", 2)]
    assert replay(s, 3, 2) == []  # only the anchor: nothing new
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 1, 2)]


def test_a_reply_cut_after_its_last_item_is_asked_again_from_the_cursor() -> None:
    """SGLang's reply can stop partway with no end marker, and nothing above it is known yet (an
    idle engine): the tail is asked for again, until an attempt ends or brings nothing."""
    s2 = Sequencer(has_replay=True)
    assert s2.on_connected() == [rr(1, 0, "catch_up")]
    assert replay(s2, 1, 0, 1, 2) == dr(0, 1, 2)
    assert s2.on_replay_failed(1, "timeout") == [rr(2, 2, "catch_up", 2)]
    assert replay(s2, 2, 3, 4) == dr(3, 4)
    assert s2.on_replay_failed(2, "timeout") == [rr(3, 4, "catch_up", 3)]
    assert s2.on_replay_failed(3, "timeout") == [rr(4, 4, "catch_up", 4)]  # one silence is asked again
    assert s2.on_replay_failed(4, "timeout") == [ReplayFinished(4, "recovered", 5, 4)]  # nothing more there


# --- on_quiet ----------------------------------------------------------------------------------


def test_quiet_live_stream_settles_a_deferred_hole() -> None:
    s = running(0)
    feed(s, 3)
    replay(s, 2, 6, 7)
    s.on_replay_end(2)
    assert s.waiting_for_live
    assert s.on_quiet() == [rr(3, 3)]
    assert not s.waiting_for_live
    assert replay(s, 3, 6) == []
    assert s.on_replay_end(3) == [Unrecovered(4, 5, "evicted"), *dr(6, 7), ReplayFinished(3, "failed", 0)]


def test_quiet_after_a_burst_probes_the_tail_once() -> None:
    """Rule 10: the PUB socket may have dropped the end of a burst, and an idle engine publishes
    nothing that would show it: after the burst, one tail replay from the cursor."""
    s = running(0, 1)
    assert s.on_quiet() == [rr(2, 1, "tail")]
    assert replay(s, 2, 1, 2, 3) == dr(2, 3)  # the anchor, then the burst's dropped tail
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 2)]
    assert s.on_quiet() == []  # nothing live since: no second probe
    assert feed(s, 4) == [d(4)]
    assert s.on_quiet() == [rr(3, 4, "tail")]
    assert replay(s, 3, 4) == []  # only the anchor: nothing new
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 0)]  # nothing was dropped
    assert s.on_quiet() == []


def test_quiet_does_nothing_while_a_replay_is_in_flight() -> None:
    s = running(0, 1)
    feed(s, 4)
    assert s.on_quiet() == []  # a replay is in flight
    assert s.replay_token == 2


def test_quiet_without_a_replay_endpoint_probes_nothing() -> None:
    s = running(0, 1, has_replay=False)
    assert s.on_quiet() == []


def test_quiet_without_replay() -> None:
    s = Sequencer(has_replay=False)
    assert s.on_quiet() == []


# --- rule 1: verification on reconnect ----------------------------------------------------------


def reconnected(*seqs: int, **kwargs: int) -> Sequencer:
    """Delivered ``seqs``, then the SUB socket dropped and came back: a verification from the last one."""
    s = running(*seqs, **kwargs)
    s.on_disconnected()
    assert s.on_connected() == [rr(2, seqs[-1], "verify")]
    return s


def test_verify_same_engine_goes_on_as_a_gap_replay() -> None:
    s = reconnected(0, 1, 2, 3, 4)
    assert feed(s, 3, 7) == [GapDetected(5, 6)]  # nothing is delivered while verifying
    assert s.held == 2
    assert replay(s, 2, 4, 5) == [Duplicate(3), d(5, True)]
    assert replay(s, 2, 6) == [d(6, True), d(7)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 2)]
    assert feed(s, 8) == [d(8)]


def test_verify_same_engine_then_a_low_live_batch_is_a_duplicate() -> None:
    s = reconnected(0, 1, 2, 3, 4)
    replay(s, 2, 4)
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 0)]
    assert feed(s, 3) == [Duplicate(3)]


def test_verify_other_payload_is_an_identity_restart() -> None:
    """The issue's case: 0-4 delivered, the engine went down and came back fast; first live 513."""
    s = reconnected(0, 1, 2, 3, 4)
    assert feed(s, 513, proc=1) == [GapDetected(5, 512)]
    assert replay(s, 2, 4, proc=1) == [
        CancelReplay(2),
        ReplayFinished(2, "recovered", 0),
        Restart(4, 4, "identity"),
        rr(3, 0, "catch_up"),
    ]
    assert s.cursor is None
    # The catch-up is the new process's buffer after 513 came: 513 in it too (same bytes: its own).
    assert replay(s, 3, *range(514), proc=1) == [*dr(*range(513)), d(513)]
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 513)]
    assert feed(s, 514, proc=1) == [d(514)]


def test_verify_reply_below_the_anchor_is_an_identity_restart() -> None:
    s = reconnected(0, 1, 2, 3, 4)
    assert replay(s, 2, 2, proc=1)[2] == Restart(2, 4, "identity")


def test_the_item_that_reveals_a_restart_is_kept_for_the_new_epoch() -> None:
    """Found by the adversarial model: the item was dropped, and if the engine evicted it before
    the catch-up asked again, the new process's batch was counted lost though it had arrived."""
    s = reconnected(0, 1, 2, 3, 4)
    assert replay(s, 2, 2, proc=1)[2:] == [Restart(2, 4, "identity"), rr(3, 0, "catch_up")]
    assert s.held == 1
    assert replay(s, 3, 0, 1, 3, proc=1) == dr(0, 1, 2, 3)  # 2 from the verify reply
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 4)]  # counted by the catch-up


def test_a_live_seq_pending_from_the_old_connection_with_other_bytes_is_a_restart() -> None:
    """Found by the adversarial model: the new process's live 2 was taken for a copy of the old
    process's 2 (pending above a hole when the connection dropped) and lost."""
    s = running(0)
    assert feed(s, 2) == [GapDetected(1, 1), rr(2, 0)]
    s.on_disconnected()
    assert s.on_connected() == [CancelReplay(2), rr(3, 0, "verify", 2)]
    assert feed(s, 2, proc=1) == [
        CancelReplay(3),
        Unrecovered(1, 1, "restart"),
        d(2),  # the old process's 2
        ReplayFinished(3, "failed", 0, 2),
        Restart(2, 2, "identity"),
        rr(4, 0, "catch_up"),
    ]
    assert replay(s, 4, 0, 1, proc=1) == [*dr(0, 1), d(2)]  # the new process's 2, live
    s2 = running(0)
    feed(s2, 2)
    s2.on_disconnected()
    s2.on_connected()
    assert feed(s2, 2) == [Duplicate(2)]  # the same bytes: the same process


def test_a_live_batch_below_a_replayed_one_is_no_restart_during_a_catch_up() -> None:
    """A reply runs ahead of a lagging live stream: a live clear fence just below the catch-up's
    pending item (here the item that revealed a clock-seeded restart) is the same process's."""
    s = running(CLOCK, jump_limit=1000)
    s.on_disconnected()
    assert s.on_connected() == [rr(2, CLOCK, "verify")]
    assert replay(s, 2, CLOCK + 2000, proc=1)[2:] == [Restart(CLOCK + 2000, CLOCK, "jump"), rr(3, 0, "catch_up")]
    fence = cleared(CLOCK + 1999)
    assert s.on_live(CLOCK + 1999, fence, raw(CLOCK + 1999, 1)) == []
    assert replay(s, 3, CLOCK + 2000, proc=1) == [Deliver(CLOCK + 1999, fence, False), d(CLOCK + 2000, True)]


def test_verify_empty_reply_is_an_identity_restart() -> None:
    s = reconnected(0, 1, 2, 3, 4)
    assert feed(s, 1, 2, proc=1) == []
    assert s.on_replay_end(2) == [
        CancelReplay(2),
        ReplayFinished(2, "recovered", 0),
        Restart(4, 4, "identity"),
        rr(3, 0, "catch_up"),
    ]
    # The live batches held while verifying are the new process's.
    assert s.held == 2
    assert replay(s, 3, 0, 1, 2, proc=1) == [d(0, True), d(1), d(2)]
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 1)]


def test_verify_reply_far_above_the_anchor_is_a_jump_restart() -> None:
    s = reconnected(CLOCK, CLOCK + 1, jump_limit=100)
    new = CLOCK + 10**9
    assert replay(s, 2, new, proc=1) == [
        CancelReplay(2),
        ReplayFinished(2, "recovered", 0),
        Restart(new, CLOCK + 1, "jump"),
        rr(3, 0, "catch_up"),
    ]
    assert replay(s, 3, new, new + 1, proc=1) == dr(new, new + 1)


def test_verify_no_answer_then_a_low_live_batch_is_a_reconnect_restart() -> None:
    s = reconnected(0, 1, 2, 3, 4)
    assert s.on_replay_failed(2, "timeout") == [rr(3, 4, "verify", 2)]  # one silence is asked again
    assert s.on_replay_failed(3, "timeout") == [ReplayFinished(3, "failed", 0, 2)]
    assert feed(s, 3, proc=1) == [Restart(3, 4, "reconnect"), rr(4, 0, "catch_up")]
    assert replay(s, 4, 0, 1, 2, proc=1) == [*dr(0, 1, 2), d(3)]


def test_verify_no_answer_with_a_low_live_batch_held() -> None:
    s = reconnected(0, 1, 2, 3, 4)
    assert feed(s, 2, proc=1) == []
    assert s.on_replay_failed(2, "timeout") == [rr(3, 4, "verify", 2)]
    assert s.on_replay_failed(3, "timeout") == [
        CancelReplay(3),
        ReplayFinished(3, "failed", 0, 2),
        Restart(2, 4, "reconnect"),
        rr(4, 0, "catch_up"),
    ]
    assert replay(s, 4, 0, 1, proc=1) == [*dr(0, 1), d(2)]


def test_verify_no_answer_then_a_higher_live_batch_continues() -> None:
    s = reconnected(0, 1, 2, 3, 4)
    assert feed(s, 6) == [GapDetected(5, 5)]
    assert s.on_replay_failed(2, "timeout") == [rr(3, 4, "verify", 2)]
    assert s.on_replay_failed(3, "timeout") == [
        Unrecovered(5, 5, "no_answer"),
        d(6),
        ReplayFinished(3, "failed", 0, 2),
    ]
    assert feed(s, 5) == [Duplicate(5)]


def test_verify_anchor_evicted_falls_back_on_the_heuristic() -> None:
    s = reconnected(0, 1, 2, 3, 4)
    assert replay(s, 2, 7, 8) == []
    assert feed(s, 9) == [GapDetected(5, 6)]
    assert s.on_replay_end(2) == [
        Unrecovered(5, 6, "evicted"),
        *dr(7, 8),
        d(9),
        ReplayFinished(2, "partial", 2),
    ]


def test_verify_anchor_evicted_then_a_low_live_batch_is_a_restart() -> None:
    """A young restart whose seqs passed the cursor: the reply is the new process's, not the old's."""
    s = reconnected(0, 1, 2, 3, 4)
    assert replay(s, 2, 7, 8, proc=1) == []
    assert feed(s, 2, proc=1) == [
        CancelReplay(2),
        ReplayFinished(2, "recovered", 2),
        Restart(2, 4, "reconnect"),
        rr(3, 0, "catch_up"),
    ]
    # 7 and 8 wait for the catch-up to bring them back: with late connection events, the restart may
    # have come after the verification's reply (rule 11's suspects).
    assert replay(s, 3, 2, 3, 4, 5, 6, proc=1) == [Unrecovered(0, 1, "restart"), d(2), *dr(3, 4, 5, 6)]
    assert replay(s, 3, 7, 8, proc=1) == dr(7, 8)


def test_reconnect_before_anything_delivered_uses_the_heuristic() -> None:
    s = Sequencer(has_replay=True)
    s.on_connected()
    s.on_replay_end(1)
    s.on_disconnected()
    assert s.on_connected() == [rr(2, 0, "catch_up")]


def test_reconnect_during_a_gap_replay_verifies() -> None:
    s = running(0, 1, 2)
    feed(s, 5)
    s.on_disconnected()
    assert s.on_connected() == [CancelReplay(2), rr(3, 2, "verify", 2)]
    assert replay(s, 2, 3) == []
    assert replay(s, 3, 2, 3, 4) == [*dr(3, 4), d(5)]
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 2, 2)]


def test_reconnect_without_replay_uses_the_heuristic() -> None:
    s = running(0, 1, 2, 3, 4, has_replay=False)
    s.on_disconnected()
    assert s.on_connected() == []
    assert feed(s, 3, proc=1) == [Restart(3, 4, "reconnect"), Unrecovered(0, 2, "restart"), d(3)]
    s = running(0, 1, 2, 3, 4, has_replay=False)
    s.on_disconnected()
    s.on_connected()
    assert feed(s, 5, 3) == [d(5), Duplicate(3)]  # the heuristic is for the first batch only


# --- rule 7: live at or below the cursor --------------------------------------------------------


@pytest.mark.parametrize(("cursor", "seq"), [(0, 0), (1, 1), (2, 2), (5, 3), (1, 0)])
def test_small_step_back_is_a_duplicate_or_a_reset(cursor: int, seq: int) -> None:
    s = running(*range(cursor + 1))
    out = feed(s, seq)
    if seq <= 1 and seq < cursor:
        assert out[0] == Restart(seq, cursor, "seq_reset")
    else:
        assert out == [Duplicate(seq)]
        assert s.cursor == cursor


def test_seq_reset_to_zero_catches_the_new_process_up() -> None:
    s = running(0, 1, 2, 3, 4, 5)
    # A live seq 0 is the new process's first batch: nothing to catch up.
    assert feed(s, 0, proc=1) == [Restart(0, 5, "seq_reset"), d(0)]
    assert feed(s, 1, proc=1) == [d(1)]


def test_seq_reset_to_one_catches_the_new_process_up() -> None:
    s = running(0, 1, 2, 3, 4, 5)
    assert feed(s, 1, proc=1) == [Restart(1, 5, "seq_reset"), rr(2, 0, "catch_up")]
    assert replay(s, 2, 0, proc=1) == [d(0, True), d(1)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 1)]


def test_seq_reset_without_replay() -> None:
    s = running(0, 1, 2, 3, 4, 5, has_replay=False)
    assert feed(s, 1, proc=1) == [Restart(1, 5, "seq_reset"), Unrecovered(0, 0, "restart"), d(1)]


def test_window() -> None:
    s = running(20, has_replay=False, restart_window=10)
    assert feed(s, 10) == [Duplicate(10)]  # exactly the window: still a duplicate
    assert feed(s, 9, proc=1) == [Restart(9, 20, "window"), Unrecovered(0, 8, "restart"), d(9)]


def test_restart_of_a_counting_publisher_whose_catch_up_starts_above_zero() -> None:
    s = running(*range(1000), restart_window=100)
    assert feed(s, 300, proc=1) == [Restart(300, 999, "window"), rr(2, 0, "catch_up")]
    assert replay(s, 2, 200, 201, proc=1) == [Unrecovered(0, 199, "restart"), *dr(200, 201)]
    assert replay(s, 2, *range(202, 301), proc=1) == [*dr(*range(202, 300)), d(300)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "partial", 100)]


def test_cleared_batch_at_or_below_the_cursor_is_a_restart() -> None:
    s = running(0, 1, 2)
    fence = cleared(2)
    assert s.on_live(2, fence, raw(2, 1)) == [Restart(2, 2, "cleared"), rr(2, 0, "catch_up")]


def test_cleared_batch_above_the_cursor_is_not_a_restart() -> None:
    s = running(0)
    fence = cleared(1)
    assert s.on_live(1, fence, raw(1)) == [Deliver(1, fence, False)]


def test_restart_reason_priority() -> None:
    s = running(0, 1, 2, 3, 4, 5, has_replay=False, restart_window=2)
    s.on_disconnected()
    s.on_connected()
    assert s.on_live(0, cleared(0), raw(0, 1))[0] == Restart(0, 5, "seq_reset")
    s = running(0, 1, 2, 3, 4, 5, has_replay=False, restart_window=2)
    s.on_disconnected()
    s.on_connected()
    assert s.on_live(2, cleared(2), raw(2, 1))[0] == Restart(2, 5, "window")
    s = running(0, 1, 2, 3, 4, 5, has_replay=False, restart_window=2)
    s.on_disconnected()
    s.on_connected()
    assert s.on_live(4, cleared(4), raw(4, 1))[0] == Restart(4, 5, "reconnect")


def test_sglang_restart_first_batch_is_cleared() -> None:
    s = running(0, 1, 2, 3)
    first = cleared(0)
    assert s.on_live(0, first, raw(0, 1)) == [Restart(0, 3, "seq_reset"), Deliver(0, first, False)]


# --- rule 4/8: jump restarts (TensorRT-LLM) ----------------------------------------------------


def test_jump_restart_catches_the_new_process_up_without_loss() -> None:
    s = running(CLOCK, CLOCK + 1, jump_limit=1000)
    new = CLOCK + 10**9
    assert feed(s, new + 3, proc=1) == [Restart(new + 3, CLOCK + 1, "jump"), rr(2, 0, "catch_up")]
    assert replay(s, 2, new, new + 1, new + 2, proc=1) == [*dr(new, new + 1, new + 2), d(new + 3)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 3)]


def test_jump_restart_without_replay() -> None:
    s = running(CLOCK, has_replay=False, jump_limit=1000)
    new = CLOCK + 10**9
    assert feed(s, new) == [Restart(new, CLOCK, "jump"), d(new)]


def test_jump_during_a_gap_replay_ends_it_first() -> None:
    s = running(0, jump_limit=100)
    feed(s, 5)
    assert feed(s, 1000, proc=1) == [
        CancelReplay(2),
        Unrecovered(1, 4, "restart"),
        d(5),
        ReplayFinished(2, "failed", 0),
        Restart(1000, 5, "jump"),
        rr(3, 0, "catch_up"),
    ]
    assert replay(s, 2, 1) == []


# --- rule 8: restart during a replay -------------------------------------------------------------


def test_restart_during_a_gap_replay_delivers_what_was_held() -> None:
    s = running(0, 1, 2, 3, 4, 5)
    assert feed(s, 9) == [GapDetected(6, 8), rr(2, 5)]
    assert feed(s, 11) == [GapDetected(10, 10)]
    assert feed(s, 0, proc=1) == [
        CancelReplay(2),
        Unrecovered(6, 8, "restart"),
        d(9),
        Unrecovered(10, 10, "restart"),
        d(11),
        ReplayFinished(2, "failed", 0),
        Restart(0, 11, "seq_reset"),
        d(0),
    ]
    assert replay(s, 2, 6) == []
    assert s.on_replay_end(2) == []
    assert (s.cursor, s.held, s.replay_token) == (0, 0, None)


# --- rule 9: hold overflow ------------------------------------------------------------------------


def test_hold_overflow_gives_the_replay_up() -> None:
    s = running(0, hold_limit=2)
    assert feed(s, 3) == [GapDetected(1, 2), rr(2, 0)]
    assert feed(s, 4) == []
    assert s.held == 2
    assert feed(s, 6) == [
        GapDetected(5, 5),
        CancelReplay(2),
        Unrecovered(1, 2, "overflow"),
        d(3),
        d(4),
        Unrecovered(5, 5, "overflow"),
        d(6),
        ReplayFinished(2, "failed", 0),
    ]
    assert (s.held, s.replay_token, s.cursor) == (0, None, 6)
    assert replay(s, 2, 1) == []
    assert feed(s, 7) == [d(7)]


def test_hold_overflow_after_some_replayed_is_partial() -> None:
    s = running(0, hold_limit=1)
    feed(s, 3)
    assert replay(s, 2, 1) == [d(1, True)]
    assert feed(s, 4) == [CancelReplay(2), Unrecovered(2, 2, "overflow"), d(3), d(4), ReplayFinished(2, "partial", 1)]


def test_hold_overflow_during_a_catch_up() -> None:
    s = Sequencer(has_replay=True, hold_limit=1)
    s.on_connected()
    feed(s, 5)
    assert feed(s, 6) == [CancelReplay(1), HistoryTruncated(5), d(5), d(6), ReplayFinished(1, "failed", 0)]


# --- generated scenarios ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    drops=st.lists(st.booleans(), min_size=1, max_size=80),
    transit=st.lists(st.booleans(), max_size=80),
    tail=st.integers(0, 5),
    answer_after=st.integers(0, 5),
)
def test_full_replays_with_transit_holes_recover_everything(
    drops: list[bool], transit: list[bool], tail: int, answer_after: int
) -> None:
    """The engine holds everything; its replies lose items in the middle, and their tails with the end
    marker, never the first: asking again from the first missing seq gets everything, in order,
    nothing lost."""
    s = Sequencer(has_replay=True, max_attempts=1000)
    published = list(range(len(drops)))
    live = [seq for seq, drop in zip(published, drops, strict=True) if not drop]
    delivered: list[int] = []
    outcomes: list[str] = []
    pending: list[tuple[int, int, int]] = []  # token, start, live batches until it is answered
    drop_at = iter(transit * 50)

    def run(actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Deliver):
                delivered.append(a.seq)
            elif isinstance(a, RequestReplay):
                pending[:] = [(a.token, a.start, answer_after)]
            elif isinstance(a, ReplayFinished):
                outcomes.append(a.outcome)
            else:
                assert isinstance(a, GapDetected | Duplicate), a

    seen_top = -1

    def answer(up_to: int) -> None:
        nonlocal seen_top
        token, first, _ = pending.pop()
        items = list(range(first, up_to + 1))
        if not items:  # the end marker is the reply's first message: never lost
            run(s.on_replay_end(token))
            return
        # The first new item is never lost either: a request asks from the anchor (rule 11), so the
        # reply's first message is a batch already delivered.
        protected = 2 if delivered and first == delivered[-1] else 1
        items = items[: max(protected, len(items) - tail)]
        seen_top = max(seen_top, items[-1])
        for i, seq in enumerate(items):
            # Holes in the middle; a lost tail takes the end marker with it (the ``tail`` cut).
            if protected <= i < len(items) - 1 and next(drop_at, False):
                continue
            run(s.on_replay_item(token, seq, b(seq)))
        if tail == 0:
            run(s.on_replay_end(token))
        else:
            run(s.on_replay_failed(token, "timeout"))

    run(s.on_connected())
    for seq in live:
        run(s.on_live(seq, b(seq)))
        seen_top = max(seen_top, seq)
        while pending and pending[0][2] == 0:
            answer(seq)  # the engine has published up to the live batch just seen
        if pending:
            token, first, wait = pending[0]
            pending[0] = (token, first, wait - 1)
    while pending:
        answer(len(drops) - 1)
    if s.waiting_for_live:  # replayed batches wait above a hole the live stream will not bring
        run(s.on_quiet())
        while pending:
            answer(len(drops) - 1)
    assert s.held == 0 and s.replay_token is None
    assert delivered == list(range(seen_top + 1))
    assert set(outcomes) <= {"recovered"}


# --- regressions found by the publisher model (test_sequencer_model.py) ---------------------------


def test_fence_after_a_hole_the_engine_may_still_hold_is_not_not_sent() -> None:
    """TensorRT-LLM: C+1 published (lost live), C+2 dropped by its queue, C+3 its fence. The reply that
    would have brought C+1 is malformed: the hole is ``no_answer``, not ``not_sent`` (C+1 was sent)."""
    s = Sequencer(has_replay=True)
    s.on_connected()
    assert replay(s, 1, CLOCK) == [d(CLOCK, True)]
    assert s.on_replay_failed(1, "timeout") == [rr(2, CLOCK, "catch_up", 2)]  # its tail may be cut
    assert replay(s, 2, CLOCK) == []  # only the anchor: nothing new
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 1, 2)]
    fence = cleared(CLOCK + 3)
    assert s.on_live(CLOCK + 3, fence, raw(CLOCK + 3)) == [rr(3, CLOCK)]
    assert s.on_replay_failed(3, "failed") == [
        Unrecovered(CLOCK + 1, CLOCK + 2, "no_answer"),
        Deliver(CLOCK + 3, fence, False),
        ReplayFinished(3, "failed", 0),
    ]


def test_restart_after_an_epoch_delivered_by_replay_alone_is_seen_by_the_heuristic() -> None:
    """The catch-up delivered seq 0 (no live batch yet); the engine restarts, the verification gets a
    malformed reply: the new process's live seq 0 is at the cursor, not the live copy of a replay."""
    s = Sequencer(has_replay=True)
    s.on_connected()
    assert replay(s, 1, 0) == [d(0, True)]
    assert s.on_replay_end(1) == [ReplayFinished(1, "recovered", 1)]
    s.on_disconnected()
    assert s.on_connected() == [rr(2, 0, "verify")]
    assert s.on_replay_failed(2, "failed") == [ReplayFinished(2, "failed", 0)]
    assert feed(s, 0, proc=1) == [Restart(0, 0, "reconnect"), Deliver(0, b(0), False)]


def test_a_silence_before_a_reconnect_does_not_count_against_the_new_verification() -> None:
    """The old process missed one verification and then restarted: the new one gets its own retry."""
    s = reconnected(0, 1, 2, 3, 4)
    assert s.on_replay_failed(2, "timeout") == [rr(3, 4, "verify", 2)]
    s.on_disconnected()
    assert s.on_connected() == [CancelReplay(3), rr(4, 4, "verify", 3)]
    assert s.on_replay_failed(4, "timeout") == [rr(5, 4, "verify", 4)]
    assert replay(s, 5, 4, proc=1) == [
        CancelReplay(5),
        ReplayFinished(5, "recovered", 0, 4),
        Restart(4, 4, "identity"),
        rr(6, 0, "catch_up"),
    ]


def test_a_gap_reply_far_above_the_cursor_is_a_clock_seeded_restart() -> None:
    """TensorRT-LLM restarted behind the replay socket before its live stream showed it: the gap's
    reply begins a jump above the cursor, which is the same restart rule 4 finds on live seqs."""
    s = Sequencer(has_replay=True, jump_limit=1000)
    s.on_connected()
    s.on_replay_end(1)
    feed(s, CLOCK)  # the first live batch: a catch-up (token 2) that finds just it
    replay(s, 2, CLOCK)
    s.on_replay_end(2)
    assert feed(s, CLOCK + 1, CLOCK + 3)[-1] == rr(3, CLOCK + 1)  # a gap: token 3
    new = CLOCK + 50_000
    assert s.on_replay_item(3, new, b(new), raw(new, 1)) == [
        CancelReplay(3),
        Unrecovered(CLOCK + 2, CLOCK + 2, "restart"),  # the old process's hole, lost with it
        d(CLOCK + 3),  # what the old process sent is delivered
        ReplayFinished(3, "failed", 0, 1),
        Restart(new, CLOCK + 3, "jump"),
        rr(4, 0, "catch_up"),
    ]


def test_a_recovery_ended_by_a_restart_says_so() -> None:
    """A gap's replay in flight when the publisher restarts: what it owed is lost (reason restart)
    and the recovery ends marked by_restart (its log line is routine, not a replay failure)."""
    s = running(0, 1)
    assert feed(s, 5) == [GapDetected(2, 4), rr(2, 1)]  # asked from the anchor (rule 11)
    out = s.on_live(0, b(0), raw(0, proc=1))
    assert CancelReplay(2) in out and Unrecovered(2, 4, "restart") in out
    (finished,) = [a for a in out if isinstance(a, ReplayFinished)]
    assert finished == ReplayFinished(2, "failed", 0, 1) and finished.by_restart
    assert not any(isinstance(a, ReplayFinished) and a.by_restart for a in s.on_replay_end(3))


# --- rule 11: any reply may come from another process; connection events may come late -----------


def test_a_tail_probe_answered_by_a_new_process_before_the_reconnect_is_a_restart() -> None:
    """vLLM, young restart: the old process published 0-4 and died; the quiet stream's tail probe
    reaches the new process (its DEALER connects to whoever binds the port) before the monitor
    reports anything. It asks from the anchor, 4, and the new process's 4 has other bytes."""
    s = running(0, 1, 2, 3, 4)
    assert s.on_quiet() == [rr(2, 4, "tail")]
    assert replay(s, 2, 4, 5, 6, proc=1) == [
        CancelReplay(2),
        ReplayFinished(2, "recovered", 0),
        Restart(4, 4, "identity"),
        rr(3, 0, "catch_up"),
    ]
    # The new process's 5 and 6 (old token) are ignored; its catch-up brings it from 0.
    assert replay(s, 3, 0, 1, 2, 3, 4, 5, 6, proc=1) == dr(0, 1, 2, 3, 4, 5, 6)
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 7)]


def test_an_empty_reply_to_a_request_from_the_anchor_is_a_restart() -> None:
    """The process read holds its anchor, or later batches once it evicted it: a reply with nothing
    comes from a younger process that has not published that far."""
    s = running(0, 1, 2, 3, 4)
    assert s.on_quiet() == [rr(2, 4, "tail")]
    assert s.on_replay_end(2) == [
        CancelReplay(2),
        ReplayFinished(2, "recovered", 0),
        Restart(4, 4, "identity"),
        rr(3, 0, "catch_up"),
    ]


def test_live_batches_of_a_new_process_before_the_connection_events_are_its_own() -> None:
    """TensorRT-LLM's native publisher with the gateway paused: the new process's live 7 and 8 come
    before the monitor's disconnect and connect. The gap replay asks from the anchor, 3: another
    batch, a restart; 7 and 8 stay pending for the new epoch, whose catch-up delivers 0-6 before
    them. The late connection events then verify the new process against its own anchor."""
    s = running(0, 1, 2, 3)
    assert feed(s, 7, 8, proc=1) == [GapDetected(4, 6), rr(2, 3)]
    assert replay(s, 2, 3, 4, proc=1) == [
        CancelReplay(2),
        ReplayFinished(2, "recovered", 0),
        Restart(3, 3, "identity"),
        rr(3, 0, "catch_up"),
    ]
    assert replay(s, 3, *range(9), proc=1) == [*dr(*range(7)), *dl(7, 8)]
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 7)]
    s.on_disconnected()
    assert s.on_connected() == [rr(4, 8, "verify")]
    assert replay(s, 4, 8, 9, proc=1) == dr(9)


def test_a_reply_from_the_same_process_starting_with_the_anchor_goes_on() -> None:
    """The check costs one batch: the anchor comes back first, with the same bytes, and is skipped."""
    s = running(0, 1, 2)
    assert feed(s, 5) == [GapDetected(3, 4), rr(2, 2)]
    assert replay(s, 2, 2, 3, 4) == [*dr(3, 4), d(5)]
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 2)]


def test_an_old_live_batch_pending_when_a_reply_reveals_the_restart_gives_way_to_the_new_ones() -> None:
    """The old process's live 5 waits above a hole when a gap reply from the new process reveals the
    restart, before any connection event: the current connection's batches are kept for the new
    epoch, but only as suspects. The new process's catch-up brings its own 5 (other bytes): that
    one is delivered, replayed, and the old one is gone."""
    s = running(0, 1, 2, 3)
    assert feed(s, 5) == [GapDetected(4, 4), rr(2, 3)]
    assert replay(s, 2, 3, proc=1)[2:] == [Restart(3, 3, "identity"), rr(3, 0, "catch_up")]
    assert replay(s, 3, 0, 1, 2, 3, 4, 5, proc=1) == dr(0, 1, 2, 3, 4, 5)
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 6)]


def test_an_old_live_batch_above_the_new_process_buffer_is_dropped() -> None:
    """The new process's catch-up, asked after the suspect came, ends below it: the new process had
    not published that seq, so the batch was the old one's."""
    s = running(0, 1, 2, 3)
    feed(s, 5)
    replay(s, 2, 3, proc=1)
    assert replay(s, 3, 0, 1, 2, proc=1) == dr(0, 1, 2, 3)  # 3: the reply item that revealed it
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 4)]
    assert s.held == 0


def test_a_hole_right_after_the_anchor_is_proved_unheld_by_the_next_item() -> None:
    """A reply asked from the anchor begins with it; its next item above the anchor's next seq proves
    the engine does not hold those between (TensorRT-LLM dropped them from its queue and fenced the
    gap with a clear): ``not_sent``, as when a reply began above the seq asked for."""
    s = running(CLOCK)
    fence = cleared(CLOCK + 3)
    assert s.on_live(CLOCK + 3, fence, raw(CLOCK + 3)) == [GapDetected(CLOCK + 1, CLOCK + 2), rr(2, CLOCK)]
    assert s.on_replay_item(2, CLOCK, b(CLOCK), raw(CLOCK)) == []
    assert s.on_replay_item(2, CLOCK + 3, fence, raw(CLOCK + 3)) == []
    assert s.on_replay_end(2) == [
        Unrecovered(CLOCK + 1, CLOCK + 2, "not_sent"),
        Deliver(CLOCK + 3, fence, False),
        ReplayFinished(2, "failed", 0),
    ]


def test_a_live_batch_an_old_reply_brought_back_stays_with_the_old_process() -> None:
    """The old process's live 4 waits above a hole that its gap reply (the anchor matched) left: the
    reply brought 4 back with the live one's bytes, so 4 is the old process's. When the retry's
    empty reply (the engine restarted, connection events still to come) reveals the restart, 4 is
    delivered in the old epoch, the hole counted ``restart``: not held as the new process's."""
    s = running(0, 1)
    assert feed(s, 4) == [GapDetected(2, 3), rr(2, 1)]
    assert replay(s, 2, 1, 2, 4) == dr(2)  # 3 lost at the ROUTER
    assert s.on_replay_end(2) == [rr(3, 2, attempt=2)]
    assert s.on_replay_end(3) == [
        CancelReplay(3),
        Unrecovered(3, 3, "restart"),
        d(4),
        ReplayFinished(3, "partial", 1, 2),
        Restart(2, 4, "identity"),
        rr(4, 0, "catch_up"),
    ]
    assert s.held == 0


def test_live_batches_after_a_verification_found_the_restart_are_the_new_process_s() -> None:
    """The live batches at or below the cursor that came while the verification was in flight are
    the new process's (rule 7 would have taken them for a restart): not suspects waiting for the
    catch-up to confirm them one by one."""
    s = running(0, 1, 2)
    s.on_disconnected()
    assert s.on_connected() == [rr(2, 2, "verify")]
    assert feed(s, 0, 1, proc=1) == []  # held while verifying
    assert replay(s, 2, 2, proc=1)[-2:] == [Restart(2, 2, "identity"), rr(3, 0, "catch_up")]
    # The catch-up begins: the live 0 and 1 and the reply's 2 go on at once.
    assert replay(s, 3, 0, proc=1) == [d(0), d(1), d(2, True)]


def test_a_dropped_suspect_does_not_raise_the_live_top() -> None:
    """The old process's live 5 was a suspect, dropped when the new process's catch-up ended below it:
    the new process's live stream is not past 5, so its lagging live copies of the batches its
    catch-up delivered are duplicates, not a reset to 0."""
    s = running(0, 1, 2, 3)
    assert feed(s, 5) == [GapDetected(4, 4), rr(2, 3)]
    assert s.on_replay_end(2)[-2:] == [Restart(3, 3, "identity"), rr(3, 0, "catch_up")]
    assert replay(s, 3, 0, 1, proc=1) == dr(0, 1)
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 2)]
    assert feed(s, 0, 1, 2, proc=1) == [Duplicate(0), Duplicate(1), d(2)]


def test_a_jump_leaves_the_batches_near_the_old_cursor_to_the_old_process() -> None:
    """TensorRT-LLM: after a reconnection, the old process sent live CLOCK + 2 and died; the monitor
    reports nothing yet, and the verification's retry reaches the new process, whose buffer begins
    at its own clock, far above. CLOCK + 2 came on the current connection, but a clock-seeded
    process never publishes near the one before it: it is the old process's, delivered in its epoch."""
    s = running(CLOCK, jump_limit=1000)
    s.on_disconnected()
    assert s.on_connected() == [rr(2, CLOCK, "verify")]
    assert s.on_live(CLOCK + 2, b(CLOCK + 2), raw(CLOCK + 2)) == [GapDetected(CLOCK + 1, CLOCK + 1)]
    assert s.on_replay_failed(2, "timeout") == [rr(3, CLOCK, "verify", 2)]
    new = CLOCK + 50_000
    assert s.on_replay_item(3, new, b(new), raw(new, 1)) == [
        CancelReplay(3),
        Unrecovered(CLOCK + 1, CLOCK + 1, "restart"),
        d(CLOCK + 2),
        ReplayFinished(3, "failed", 0, 2),
        Restart(new, CLOCK + 2, "jump"),
        rr(4, 0, "catch_up"),
    ]
    assert s.held == 1  # only the new process's batch, for its epoch


def test_the_last_delivered_seq_live_again_with_other_bytes_is_a_restart() -> None:
    """vLLM, young restart, connection events late: the new process's live 2 comes at the cursor. A
    live copy of the last delivered batch would carry its bytes; other bytes under that seq are
    another process's, whatever the monitor has reported yet."""
    s = running(0, 1, 2)
    assert feed(s, 2) == [Duplicate(2)]  # the same process's copy
    assert feed(s, 2, proc=1) == [Restart(2, 2, "identity"), rr(2, 0, "catch_up")]
    assert replay(s, 2, 0, 1, 2, proc=1) == dr(0, 1) + dl(2)


def test_a_reply_before_a_late_restart_found_by_the_heuristic_is_a_suspect() -> None:
    """The verification after a reconnection cannot tell (the anchor, 0, has left the buffer; its
    reply brings the old process's 2). The old process then dies, the connection events come late,
    and the new process's live 0 reveals the restart by rule 7's heuristic. Whether 2 came from the
    new process (a restart before the reconnection) or the old one, the new process's catch-up
    tells: here it ends at 1, so 2 was the old process's and is dropped, not delivered as the new's."""
    s = running(0)
    s.on_disconnected()
    assert s.on_connected() == [rr(2, 0, "verify")]
    assert replay(s, 2, 2) == []
    assert s.on_replay_end(2) == [ReplayFinished(2, "recovered", 1)]
    assert feed(s, 0, proc=1) == [Restart(0, 0, "reconnect"), rr(3, 0, "catch_up")]
    assert replay(s, 3, 0, 1, proc=1) == [d(0), d(1, True)]
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 1)]
    assert s.held == 0


def test_a_reply_bringing_a_pending_seq_with_other_bytes_is_a_restart_on_the_same_connection() -> None:
    """The old process's live 5 waits above a hole; the gap request reaches a new process (connection
    events late) whose buffer no longer holds the anchor: its reply begins at 4, then brings 5 with
    other bytes. Two payloads under one seq: two processes, whatever the monitor has reported. The
    live 5 the reply contradicts is the old process's, delivered in its epoch; the reply's 4 is the
    new process's (the same reply), kept for its epoch with the revealing 5."""
    s = running(0, 1)
    assert feed(s, 5) == [GapDetected(2, 4), rr(2, 1)]
    assert replay(s, 2, 4, proc=1) == []  # above the anchor: the engine cannot be told yet
    assert replay(s, 2, 5, proc=1) == [
        CancelReplay(2),
        Unrecovered(2, 4, "restart"),
        d(5),
        ReplayFinished(2, "partial", 1),
        Restart(5, 5, "identity"),
        rr(3, 0, "catch_up"),
    ]
    assert replay(s, 3, 0, 1, 2, 3, proc=1) == dr(0, 1, 2, 3, 4, 5)
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 5)]  # with the revealing 5


def test_a_gap_opened_after_an_attempt_was_asked_gets_its_own_attempt() -> None:
    """A live batch skips 3 and 4 while the attempt for 1 is in flight; that attempt fails. 3 and 4
    were never asked for: one more attempt, not a give-up (with late connection events, it may be
    the one that reaches the new process, and its check tells)."""
    s = running(0)
    assert feed(s, 2) == [GapDetected(1, 1), rr(2, 0)]
    assert feed(s, 5, proc=1) == [GapDetected(3, 4)]
    assert s.on_replay_failed(2, "failed") == [rr(3, 0, attempt=2)]
    assert replay(s, 3, 0, proc=1)[-2:] == [Restart(0, 0, "identity"), rr(4, 0, "catch_up")]


def test_a_live_batch_contradicting_a_replayed_one_leaves_the_replies_to_the_old_process() -> None:
    """A tail probe brought the old process's 5 and 6 (its 4 lost at the ROUTER); before any
    connection event the new process's live 5 comes with other bytes. Whoever sent the reply is not
    this live stream's process, so what the replies brought is the old process's, delivered in its
    epoch, not held for the new one."""
    s = running(0, 1, 2, 3)
    assert s.on_quiet() == [rr(2, 3, "tail")]
    assert replay(s, 2, 3, 5, 6) == []
    assert s.on_replay_failed(2, "timeout") == [rr(3, 3, "tail", 2)]
    assert feed(s, 5, proc=1) == [
        CancelReplay(3),
        Unrecovered(4, 4, "restart"),
        *dr(5, 6),
        ReplayFinished(3, "partial", 2, 2),
        Restart(5, 6, "identity"),
        rr(4, 0, "catch_up"),
    ]
    assert replay(s, 4, 0, 1, 2, 3, 4, proc=1) == [*dr(0, 1, 2, 3, 4), d(5)]


def test_a_live_batch_after_a_verification_s_connect_may_be_a_process_gone_since() -> None:
    """Two restarts: the reconnection reached a process that sent its live 1 and died too, the next
    connection events still to come. The verification's retry reaches the newest process, which
    holds nothing: a restart, and 1 is a suspect, not the newest process's own. Its catch-up ends at
    0, so 1 was not its: dropped, not delivered in its epoch."""
    s = running(0)
    s.on_disconnected()
    assert s.on_connected() == [rr(2, 0, "verify")]
    assert feed(s, 1, proc=1) == []
    assert s.on_replay_failed(2, "timeout") == [rr(3, 0, "verify", 2)]
    assert s.on_replay_end(3)[-2:] == [Restart(0, 0, "identity"), rr(4, 0, "catch_up")]
    assert s.suspects == {1}
    assert replay(s, 4, 0, proc=2) == [d(0, True)]
    assert s.on_replay_end(4) == [ReplayFinished(4, "recovered", 1)]
    assert s.held == 0


def test_live_batches_before_and_above_the_live_batch_that_revealed_a_restart_are_the_old_s() -> None:
    """The old process's live 5 and 6 wait above a hole; the new process's live 5 comes with other
    bytes before any connection event. 6 came before it on the same stream, and a process's live
    stream goes up: 6 is the old process's too. Both are delivered in the old epoch, not held."""
    s = running(0, 1, 2)
    assert feed(s, 5, 6) == [GapDetected(3, 4), rr(2, 2)]
    assert feed(s, 5, proc=1) == [
        CancelReplay(2),
        Unrecovered(3, 4, "restart"),
        *dl(5, 6),
        ReplayFinished(2, "failed", 0),
        Restart(5, 6, "identity"),
        rr(3, 0, "catch_up"),
    ]
    assert replay(s, 3, 0, 1, 2, 3, 4, proc=1) == [*dr(0, 1, 2, 3, 4), d(5)]


def test_a_suspect_below_the_new_process_s_first_buffered_batch_is_dropped() -> None:
    """The old process's live 5 is a suspect when a gap reply reveals the restart; the new process's
    catch-up begins at 6: it no longer holds 5, or never sent it. Nothing tells which, so 5 is
    dropped rather than delivered as the new process's; 4 and 5 are then evicted in its epoch."""
    s = running(0, 1, 2, 3)
    assert feed(s, 5) == [GapDetected(4, 4), rr(2, 3)]
    assert replay(s, 2, 3, proc=1)[-2:] == [Restart(3, 3, "identity"), rr(3, 0, "catch_up")]
    assert replay(s, 3, 6, 7, proc=1) == [Unrecovered(0, 2, "restart"), d(3, True)]
    assert s.on_replay_end(3) == [ReplayFinished(3, "partial", 3)]
    assert s.held == 2  # 6 and 7: 5 is gone
    assert s.on_quiet() == [rr(4, 3)]
    assert replay(s, 4, 6, 7, proc=1) == []
    assert s.on_replay_end(4) == [Unrecovered(4, 5, "evicted"), *dr(6, 7), ReplayFinished(4, "failed", 0)]


def test_a_repeated_request_asks_from_the_anchor_the_cursor_reached_since() -> None:
    """A tail probe asked from 0 gets no answer; live 1 is delivered meanwhile. The repeated request
    asks from 1, the last delivered seq, so its reply is checked against 1: a new process's 1 is a
    restart, not an unchecked reply whose 2 would pass for the old process's next."""
    s = running(0)
    assert s.on_quiet() == [rr(2, 0, "tail")]
    assert feed(s, 1) == [d(1)]
    assert s.on_replay_failed(2, "timeout") == [rr(3, 1, "tail", 2)]
    assert replay(s, 3, 1, 2, proc=1)[-2:] == [Restart(1, 1, "identity"), rr(4, 0, "catch_up")]


def test_a_suspect_no_reply_told_yet_is_dropped_at_the_next_restart() -> None:
    """The old process's live 5 is a suspect of the new epoch (a gap reply revealed the restart) and
    its catch-up has not told whose it is when a third process restarts at 0: 5 is neither known to
    be the second process's nor the first's, so it is dropped, not delivered in the second's run."""
    s = running(0, 1, 2, 3)
    assert feed(s, 5) == [GapDetected(4, 4), rr(2, 3)]
    assert replay(s, 2, 3, proc=1)[-2:] == [Restart(3, 3, "identity"), rr(3, 0, "catch_up")]
    assert replay(s, 3, 0, 1, 2, proc=1) == dr(0, 1, 2, 3)
    assert feed(s, 4, proc=1) == [d(4)]
    assert s.suspects == {5}
    assert feed(s, 0, proc=2) == [
        CancelReplay(3),
        ReplayFinished(3, "recovered", 4, 1),
        Restart(0, 4, "seq_reset"),
        d(0),
    ]
    assert s.held == 0


def test_a_suspect_in_a_hole_of_the_new_process_s_catch_up_is_not_taken_for_its_own() -> None:
    """The old process's live 5 is a suspect; the new process's catch-up brings 0-6 but its 5 is
    lost at the ROUTER. The reply's end does not make the old 5 the new process's: it is dropped,
    and the next attempt brings the new process's own 5."""
    s = running(0, 1, 2, 3)
    assert feed(s, 5) == [GapDetected(4, 4), rr(2, 3)]
    assert replay(s, 2, 3, proc=1)[-2:] == [Restart(3, 3, "identity"), rr(3, 0, "catch_up")]
    assert replay(s, 3, 0, 1, 2, 4, 6, proc=1) == dr(0, 1, 2, 3, 4)
    assert s.on_replay_end(3) == [rr(4, 4, "catch_up", 2)]
    assert replay(s, 4, 4, 5, 6, proc=1) == dr(5, 6)
    assert s.on_replay_end(4) == [ReplayFinished(4, "recovered", 7, 2)]


def test_the_epoch_s_first_live_batch_skipping_seqs_during_an_attempt_gets_one_more() -> None:
    """The catch-up delivered 0 and its retry gets no answer; meanwhile the first live batch, 2,
    skips 1. No attempt was asked knowing of it: one more is (with late connection events, the one
    that reaches a new process, whose check tells), not a give-up taking 2 for the next."""
    s = Sequencer(has_replay=True)
    s.on_connected()
    assert replay(s, 1, 0) == [d(0, True)]
    assert s.on_replay_failed(1, "timeout") == [rr(2, 0, "catch_up", 2)]
    assert s.on_replay_failed(2, "timeout") == [rr(3, 0, "catch_up", 3)]
    assert feed(s, 2, proc=1) == []
    assert s.on_replay_failed(3, "timeout") == [rr(4, 0, "catch_up", 4)]
    assert replay(s, 4, 0, proc=1)[-2:] == [Restart(0, 0, "identity"), rr(5, 0, "catch_up")]


def test_a_verification_s_first_item_contradicting_a_held_live_batch_is_a_restart() -> None:
    """While verifying, live 2 is held. The reply begins at 2 (above the anchor 1: the engine no
    longer holds it, which alone cannot tell) with other bytes than the held 2: two processes. Found
    before the fallback delivers the held 2 as the next."""
    s = running(0, 1)
    s.on_disconnected()
    assert s.on_connected() == [rr(2, 1, "verify")]
    assert feed(s, 2) == []
    assert replay(s, 2, 2, proc=1)[-2:] == [Restart(2, 2, "identity"), rr(3, 0, "catch_up")]


def test_a_suspect_below_the_catch_up_s_first_item_does_not_start_the_epoch() -> None:
    """TensorRT-LLM: the old process's live CLOCK + 1 is a suspect when an empty reply reveals the
    restart; the new process's catch-up begins at its own clock, far above. The epoch starts there,
    not at the suspect (which is dropped), so the new process's next live batch is its next, not a
    jump from the old seq."""
    s = Sequencer(has_replay=True, jump_limit=1000)
    s.on_connected()
    assert replay(s, 1, CLOCK) == [d(CLOCK, True)]
    feed(s, CLOCK + 2)  # pending above a hole
    assert s.on_replay_failed(1, "timeout") == [rr(2, CLOCK, "catch_up", 2)]
    assert s.on_replay_end(2)[-2:] == [Restart(CLOCK, CLOCK, "identity"), rr(3, 0, "catch_up")]
    new = CLOCK + 5000
    assert s.on_replay_item(3, new, b(new), raw(new, 1)) == [d(new, True)]
    assert s.on_replay_end(3) == [ReplayFinished(3, "recovered", 1)]
    assert s.on_live(new + 1, b(new + 1), raw(new + 1, 1)) == [d(new + 1)]
