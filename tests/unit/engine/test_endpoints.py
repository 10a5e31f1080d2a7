"""kvgateway.engine.endpoints: a data-parallel rank's endpoint offset from the base, and vLLM's rule for
which endpoints a publisher binds."""

from __future__ import annotations

import pytest

from kvgateway.engine.endpoints import endpoint_problem, rank_endpoints
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


# --- validity, and each rank's endpoints (from the configuration's tests) ----------------------


@pytest.mark.parametrize(
    ("value", "wildcard_port", "problem"),
    [
        ("tcp://127.0.0.1:5557", False, None),
        ("tcp://[fd00::5]:5557", False, None),
        ("tcp://*:5557", False, None),
        ("tcp://*:*", True, None),
        ("tcp://*:0", True, None),
        ("tcp://*:*", False, "is not tcp://HOST:PORT"),
        ("tcp://*:0", False, "port 0 is not in 1-65535"),
        ("tcp://x:65536", True, "port 65536 is not in 1-65535"),
        ("tcp://x", False, "is not tcp://HOST:PORT"),
        ("tcp://::1:5557", False, "is not tcp://HOST:PORT"),
        ("ipc:///tmp/kv", False, None),
        ("inproc://kv", False, None),
        ("ipc://", False, "must start with tcp://, ipc:// or inproc://"),
        ("http://x:1", True, "must start with tcp://, ipc:// or inproc://"),
    ],
)
def test_one_endpoint_rule(value: str, wildcard_port: bool, problem: str | None) -> None:
    assert endpoint_problem(value, wildcard_port=wildcard_port) == problem


def test_rank_endpoints_expand_each_rank_once() -> None:
    assert rank_endpoints("tcp://h:5557", "tcp://h:5657", 2) == [
        (0, "tcp://h:5557", "tcp://h:5657"),
        (1, "tcp://h:5558", "tcp://h:5658"),
    ]
    assert rank_endpoints("ipc:///tmp/kv", None, 2) == [(0, "ipc:///tmp/kv", None), (1, "ipc:///tmp/kv_dp1", None)]
