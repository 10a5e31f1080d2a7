"""make bench compares like with like: the naive bridge runs on the gateway's event loop."""

from __future__ import annotations

import subprocess
import sys

from bench.common import gateway_loop, naive_loop
from tests.support import REPO, free_port


def test_the_naive_bridge_runs_on_the_gateways_loop() -> None:
    assert gateway_loop() == "uvloop"  # uvicorn[standard] is a dependency: the gateway runs on uvloop
    assert naive_loop() == gateway_loop()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.naive_bridge", "--endpoint", "tcp://127.0.0.1:9", "--port", str(free_port())],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(10)
    assert line.startswith(f"naive bridge: {gateway_loop()} loop"), line
