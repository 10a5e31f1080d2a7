"""kvgateway.log.staleness: a stale notice makes a stream stale with its reason; a restart notice or
a batch that clears the cache makes it whole again; nothing else changes it."""

from __future__ import annotations

from kvgateway.log.staleness import Staleness
from tests.support.events import batch, cleared, removed, stored


def test_a_stale_notice_marks_the_stream_with_the_latest_reason() -> None:
    staleness = Staleness()
    assert not staleness.stale and staleness.reason is None
    staleness.notice("stale", {"reason": "unrecovered", "seq": 7, "detail": "3 batches lost"})
    assert staleness.stale and staleness.reason == "unrecovered"
    staleness.notice("stale", {"reason": "decode_error"})
    assert staleness.reason == "decode_error"


def test_a_clear_or_a_restart_makes_it_whole_and_nothing_else_does() -> None:
    staleness = Staleness()
    staleness.mark("history_truncated")
    for kind in ("up", "down", "degraded", "unrecovered_gap", "status"):
        staleness.notice(kind, {"reason": "x"})
    staleness.batch(batch(stored(1), removed(1)))
    assert staleness.reason == "history_truncated"
    staleness.batch(batch(stored(2), cleared()))
    assert not staleness.stale
    staleness.mark("unrecovered")
    staleness.notice("restart", {"seq": 0, "previous": 9, "reason": "seq_reset"})
    assert not staleness.stale
    staleness.batch(batch(cleared()))  # whole already: stays whole
    assert staleness.reason is None
