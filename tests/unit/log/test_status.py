"""kvgateway.log.status: a stream's status as the ingest reports it and the status board rebuilds it
from the report and the batches after it; its state, its JSON and the one readiness rule."""

from __future__ import annotations

from typing import get_args

import pytest

from kvgateway.config import StreamConfig
from kvgateway.log.status import (
    DEGRADED_SECONDS,
    NEVER_CONNECTED,
    StreamStatus,
    connection_code,
    not_ready,
)
from kvgateway.protocol.messages import ConnectionCode

CONFIG = StreamConfig("vllm", 1, "tcp://10.0.0.1:5558", "tcp://10.0.0.1:5559", "", False, {})


def test_a_fresh_stream_was_never_connected_and_is_down() -> None:
    status = StreamStatus(CONFIG)
    assert (status.connected, status.down_reason, status.down_code) == (False, NEVER_CONNECTED, "never_connected")
    view = status.to_json(0.0, stale=False)
    assert (view["state"], view["reason"], view["reason_code"], view["last_seq"]) == (
        "down",
        NEVER_CONNECTED,
        "never_connected",
        None,
    )
    assert not_ready([(CONFIG.key, status)]) == [{"source": "vllm", "dp_rank": 1, "reason": NEVER_CONNECTED}]


def test_the_state_is_down_then_degraded_then_stale_then_up() -> None:
    status = StreamStatus(CONFIG, connected=True, last_loss_at=100.0)
    assert status.state(100.0 + DEGRADED_SECONDS - 1, stale=True) == "degraded"
    assert status.state(100.0 + DEGRADED_SECONDS, stale=True) == "stale"
    assert status.state(100.0 + DEGRADED_SECONDS, stale=False) == "up"
    status.connected = False
    assert status.state(100.0, stale=True) == "down"
    assert not_ready([(CONFIG.key, StreamStatus(CONFIG, connected=True))]) == []


def test_a_report_rebuilds_the_same_status() -> None:
    status = StreamStatus(CONFIG, connected=True, down_reason="connected", down_code="connected")
    status.last_seq, status.lag_seconds = 42, 0.25  # as the status board moves it on after two batches
    status.counters |= {"batches": 2, "replayed": 1}
    status.losses["evicted"] = 3
    report = status.report("unrecovered", at=50.0)
    assert report["at"] == 50.0 and report["stale_reason"] == "unrecovered"
    again = StreamStatus.from_report("vllm", 1, report)
    assert again.to_json(60.0, stale=True, stale_reason="unrecovered") == status.to_json(
        60.0, stale=True, stale_reason="unrecovered"
    )
    assert (again.last_seq, again.lag_seconds) == (42, 0.25)
    assert (again.counters["batches"], again.counters["replayed"]) == (2, 1)
    view = again.to_json(60.0, stale=False, stale_reason="unrecovered")
    assert (view["last_seq"], view["stale_reason"], view["counters"]["batches"]) == ("42", None, 2)


def test_a_report_without_a_code_gets_the_broadest_and_an_unknown_code_too() -> None:
    assert connection_code(None, connected=True) == "connected"
    assert connection_code(None, connected=False) == "disconnected"
    assert connection_code("no such code", connected=False) == "disconnected"
    for code in get_args(ConnectionCode):
        assert connection_code(code, connected=False) == code


@pytest.mark.parametrize("counter", ["gaps", "unknown"])
def test_a_report_keeps_only_the_known_counters(counter: str) -> None:
    report = StreamStatus(CONFIG).report(None, 0.0)
    report["counters"] = {counter: 5}
    status = StreamStatus.from_report("vllm", 1, report)
    assert set(status.counters) == set(StreamStatus(CONFIG).counters)
    assert status.counters.get(counter, 0) == (5 if counter == "gaps" else 0)
