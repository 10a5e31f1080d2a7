"""kvgateway.cluster.heartbeat: an edge calls an ingest gone only after missing three beats."""

from __future__ import annotations

from kvgateway.cluster.heartbeat import HEARTBEAT_SECONDS, INGEST_SILENCE_SECONDS


def test_silence_is_three_missed_heartbeats() -> None:
    assert INGEST_SILENCE_SECONDS == 3 * HEARTBEAT_SECONDS > 0
