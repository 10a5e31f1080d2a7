"""kvgateway.simulator.engine's pure parts: the faults a simulated engine injects, and its garbage payload."""

from __future__ import annotations

import pytest

from kvgateway.engine import wire
from kvgateway.simulator import MAX_SEQ, Faults, garbage_payload


def test_faults_validation_and_skip() -> None:
    faults = Faults(skip=((3, 5), (9, 9)))
    assert [s for s in range(12) if faults.skips(s)] == [3, 4, 5, 9]
    for bad in (
        {"skip": ((5, 3),)},
        {"restart_at": (-1,)},
        {"garbage_at": (-2,)},
        {"replay_delay": -0.1},
        {"start_seq": MAX_SEQ + 1},
        {"start_seq": -1},
    ):
        with pytest.raises(ValueError):
            Faults(**bad)


def test_garbage_payload_does_not_decode() -> None:
    with pytest.raises(wire.DecodeError):
        wire.decode_batch(garbage_payload(7))


def test_new_faults_validation() -> None:
    Faults(replay_drop=((3, 5, 1),), replay_cut=(0, 1), restart_down=0.0, lose_tail=2, drop_queue=((1, 1),))
    for bad in (
        {"replay_drop": ((5, 3, 1),)},
        {"replay_drop": ((3, 5, 0),)},
        {"replay_cut": (-1, 1)},
        {"replay_cut": (4, 0)},
        {"restart_down": -1.0},
        {"restart_down": float("inf")},
        {"lose_tail": -1},
        {"drop_queue": ((4, 2),)},
    ):
        with pytest.raises(ValueError):
            Faults(**bad)  # type: ignore[arg-type]
    assert [s for s in range(8) if Faults(drop_queue=((2, 3), (6, 6))).drops_queued(s)] == [2, 3, 6]
