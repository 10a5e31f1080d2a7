"""kvgateway.engine.sequencer continued after a seq (an ingest taking over a stream from the log):
it replays the gap or sees a restart."""

from __future__ import annotations

import pytest

from kvgateway.engine import wire
from tests.support.events import batch, stored


def test_a_sequencer_continued_after_a_seq_replays_the_gap_or_sees_a_restart() -> None:
    from kvgateway.engine.sequencer import Deliver, GapDetected, RequestReplay, Restart, Sequencer

    seq = Sequencer(has_replay=True)
    seq.resume_after(10)
    assert seq.on_connected() == []  # no catch-up from 0: the stream has everything up to 10
    actions = seq.on_live(14, stored_at(14))
    assert GapDetected(11, 13) in actions
    assert any(type(a) is RequestReplay and a.start == 11 for a in actions)
    assert seq.on_live(11, stored_at(11)) and seq.cursor == 11

    restarted = Sequencer(has_replay=False)
    restarted.resume_after(10)
    restarted.on_connected()
    actions = restarted.on_live(0, stored_at(0))
    assert any(type(a) is Restart for a in actions)
    assert any(type(a) is Deliver and a.seq == 0 for a in actions)
    with pytest.raises(ValueError, match="before the first connection"):
        restarted.resume_after(3)


def stored_at(seq: int) -> wire.Batch:
    return batch(stored(seq), ts=float(seq), dp_rank=None)
