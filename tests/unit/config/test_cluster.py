"""kvgateway.config.cluster: the cluster's settings types, whose defaults a process runs with when
nothing is given."""

from __future__ import annotations

from kvgateway.config.cluster import NatsOptions, Workers


def test_nothing_given_is_one_process_and_no_nats_server() -> None:
    assert Workers().count is None and Workers().state_dir == "kvgateway-state"
    assert NatsOptions().servers == () and NatsOptions().leases and NatsOptions().checkpoint_seconds > 0
    assert NatsOptions().duplicate_window_seconds <= NatsOptions().retention_seconds
