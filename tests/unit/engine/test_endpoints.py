"""kvgateway.engine.endpoints: a data-parallel rank's endpoint offset from the base, and vLLM's rule for
which endpoints a publisher binds."""

from __future__ import annotations

import pytest

from kvgateway.simulator import binds, offset_endpoint


def test_offset_endpoint() -> None:
    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint("tcp://10.0.0.1:5557", 1) == "tcp://10.0.0.1:5558"
    assert offset_endpoint("tcp://[::1]:5557", 2) == "tcp://[::1]:5559"
    assert offset_endpoint("inproc://cache", 2) == "inproc://cache_dp2"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
    assert offset_endpoint("tcp://127.0.0.1:*", 4) == "tcp://127.0.0.1:*"
    for bad in ("udp://x:1", "tcp://host", "tcp://host:port", "tcp://*:65535"):
        with pytest.raises(ValueError):
            offset_endpoint(bad, 1)


def test_bind_rule_like_vllm() -> None:
    assert binds("tcp://*:5557")
    assert binds("tcp://[::]:5557")
    assert binds("ipc:///tmp/x")
    assert binds("inproc://x")
    assert not binds("tcp://127.0.0.1:5557")
    assert not binds("tcp://gateway.local:5557")
