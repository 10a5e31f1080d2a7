"""bench.cluster's ingest and fan-out modes run end to end on a real nats-server (figures, never speeds)."""

from __future__ import annotations

import subprocess
from typing import Any

from tests.support.bench_runs import run_bench
from tests.support.nats import nats_binary


def _run(*args: str) -> dict[str, Any]:
    nats_binary()  # skips without nats-server
    result: dict[str, Any] = run_bench("bench.cluster", *args, "--runs", "1")
    return result


def test_ingest_mode_counts_every_batch_of_one_and_two_ingest_processes() -> None:
    result = _run("--mode", "ingest", "--batches", "200", "--rate", "0")
    assert [run["stored"] for run in result["runs"]["1"]] == [200]
    assert [run["stored"] for run in result["runs"]["2"]] == [400]
    assert result["stream_rate_1"] > 0 and result["stream_rate_2"] > 0
    printed = subprocess.run([nats_binary(), "--version"], capture_output=True, text=True, check=True).stdout
    assert result["nats_server"].startswith("v2.") and printed.strip().endswith(" " + result["nats_server"])


def test_fanout_mode_measures_the_single_process_and_an_edge() -> None:
    result = _run("--mode", "fanout", "--clients", "2", "--batches", "200", "--rate", "50")
    (run,) = result["runs"]
    for side in ("single", "edge"):
        assert run[side]["complete"], run[side]["reasons"]
        assert run[side]["deliveries_per_cpu_second"] > 0
    assert result["ratio"] > 0
