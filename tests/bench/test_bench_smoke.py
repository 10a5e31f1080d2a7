"""The benchmark suite runs end to end: a tiny ``python -m bench --smoke`` of every scenario.

Each scenario runs as the real command (real gateway, publisher, client and baseline processes)
with tiny sizes, and must produce every one of its figures and its JSON file. Speed is never
asserted here: the figures of a smoke run mean nothing (docs/performance.md has the real ones).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.streams import streams_reached
from tests.support import REPO

SCENARIOS = ("ingest", "fanout", "naive", "latency", "memory", "catchup", "streams")


def run_bench(tmp_path: Path, *args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess[str], Path]:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--results-dir", str(tmp_path / "results"), *args],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    files = sorted((tmp_path / "results" / "runs").glob("*/results.json"))
    assert files, f"no results.json written; stderr:\n{proc.stderr[-3000:]}"
    return proc, files[-1]


def number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def check_ingest(r: dict[str, Any]) -> None:
    assert number(r["raw_rate"]) and r["raw_rate"] > 0
    assert number(r["gateway_rate"]) and r["gateway_rate"] > 0
    assert number(r["ratio"]) and r["ratio"] > 0
    assert len(r["runs"]) == 1
    assert {"decode", "index", "render", "json_encode", "sum"} <= set(r["breakdown_us"])
    assert set(r["variants"]) == {"map", "array", "bytes", "signed"}  # map, positional, byte hashes, signed
    for variant in r["variants"].values():
        for key in ("gateway_cpu_us_per_batch", "gateway_cold_cpu_us_per_batch", "floor_us", "floor_ratio"):
            assert number(variant[key]) and variant[key] > 0, key
        # the same gateway on the pure-Python core (the trial checks its build_info says so)
        assert number(variant["pure_cpu_us_per_batch"]) and variant["pure_cpu_us_per_batch"] > 0
        assert number(variant["pure_floor_ratio"]) and variant["pure_floor_ratio"] > 0
        # the gateway's fresh pages are counted in both floods (the first into a process just started)
        assert (
            number(variant["gateway_cold_page_faults_per_batch"]) and variant["gateway_cold_page_faults_per_batch"] > 0
        )
        assert number(variant["gateway_page_faults_per_batch"])


def check_fanout(r: dict[str, Any], target: str, transports: set[str]) -> None:
    configs = r["configs"]
    assert {c["transport"] for c in configs} == transports
    for config in configs:
        assert "error" not in config, config
        assert config["target"] == target
        assert config["steps"], config
        for key in ("max_rate", "deliveries_per_s", "target_cpu_cores", "target_rss_bytes", "p99_ms"):
            assert number(config[key]), (key, config)
        for step in config["steps"]:
            assert {"rate", "ok", "complete", "connections", "p99_ms", "target_cpu_cores"} <= set(step)


def check_latency(r: dict[str, Any]) -> None:
    for kind in ("kvgateway", "naive"):
        for key in ("p50_ms", "p99_ms", "p999_ms", "read_p50_ms", "read_p99_ms", "target_cpu_cores"):
            assert number(r[kind][key]), (kind, key)
        for run in r["runs"][kind]:  # a batch is in the client's socket before the client reads it
            assert run["p50_ms"] <= run["read_p50_ms"] and run["max_ms"] <= run["read_max_ms"], run
    assert set(r["ratio_to_naive"]) == {f"{x}{q}_ms" for x in ("", "read_") for q in ("p50", "p99", "p999")}


def check_memory(r: dict[str, Any]) -> None:
    assert r["resident_blocks"] > 0
    assert number(r["bytes_per_block"])
    assert number(r["tracemalloc"]["index_bytes_per_block"])
    assert number(r["tracemalloc"]["plain_set_bytes_per_block"])
    churn = r["churn"]
    assert number(churn["growth_ratio"]) and churn["samples"]
    assert churn["all_delivered"] is True  # correctness: every batch reached every client
    bounded = {row["name"]: row for row in churn["bounded"]}  # each bounded structure, early and end
    assert set(bounded) == {
        "resume ring (messages)",
        "learned token-chain entries",
        "cache analytics entries",
        "history bytes",
    }
    for row in bounded.values():
        assert number(row["start"]) and number(row["end"]) and row["end"] <= row["bound_end"], row


def check_catchup(r: dict[str, Any]) -> None:
    assert r["rebuilt_exactly"] is True  # correctness: the index equals the engine's state
    for key in (
        "gateway_total_seconds",
        "gateway_replay_phase_seconds",
        "gateway_gc_seconds",
        "raw_total_seconds",
        "ratio_total",
    ):
        assert number(r[key]), key


def check_streams(r: dict[str, Any]) -> None:
    (row,) = r["sizes"]
    assert row["streams"] == 40 and row["one_stream"]["streams"] == 1
    for key in ("start_seconds", "idle_cpu_cores", "rss_bytes", "descriptors", "metrics_seconds", "metrics_bytes"):
        assert number(row[key]), key
    assert number(row["idle_loop_cores"]) and number(row["idle_zeromq_io_cores"])  # split by thread, from /proc
    assert row["descriptors"] > row["one_stream"]["descriptors"]  # every stream holds its sockets
    assert set(row["per_stream"]) >= {"rss_bytes", "descriptors", "metrics_bytes"}
    assert [run["reached"] for run in row["runs"]] == [0]  # every port closed: nothing answered


def test_a_stream_that_reached_another_process_is_told_from_one_refused() -> None:
    down = {"connected": False, "last_seq": None, "reason_code": "refused"}
    assert streams_reached([down, {**down, "reason_code": "retrying"}]) == 0
    assert streams_reached([down, {**down, "connected": True, "reason_code": "connected"}]) == 1
    assert streams_reached([{**down, "last_seq": 29999, "reason_code": "disconnected"}, down]) == 1  # came and went
    assert streams_reached([{**down, "reason_code": "not_zeromq"}]) == 1  # something listens, no engine


CHECKS = {
    "ingest": check_ingest,
    "fanout": lambda r: check_fanout(r, "kvgateway", {"ws", "sse"}),
    "naive": lambda r: check_fanout(r, "naive", {"ws"}),
    "latency": check_latency,
    "memory": check_memory,
    "catchup": check_catchup,
    "streams": check_streams,
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_produces_its_figures(tmp_path: Path, scenario: str) -> None:
    proc, path = run_bench(tmp_path, "--scenario", scenario, "--no-docs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(path.read_text())
    assert data["mode"] == "smoke"
    assert {"cpus", "memory_bytes", "python"} <= set(data["machine"])
    entry = data["scenarios"][scenario]
    assert "error" not in entry, entry
    assert {"mode", "runs", "seconds", "machine_busy_fraction"} <= set(entry["meta"])
    CHECKS[scenario](entry["result"])
    assert "<!-- bench:results:begin -->" in proc.stdout  # the Markdown section is printed


def test_docs_section_is_replaced_between_markers(tmp_path: Path) -> None:
    doc = tmp_path / "performance.md"
    stale = "<!-- bench:results:begin -->\nSTALE-SECTION\n<!-- bench:results:end -->"
    doc.write_text(f"# Performance\n\nkept above\n\n{stale}\n\nkept below\n")
    proc, _ = run_bench(tmp_path, "--scenario", "catchup", "--docs", str(doc))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = doc.read_text()
    assert "kept above" in text and "kept below" in text and "STALE-SECTION" not in text
    assert text.count("<!-- bench:results:begin -->") == 1
    assert "### Machine" in text and "### 6. Catch-up from a replay" in text
