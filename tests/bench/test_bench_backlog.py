"""``python -m bench.backlog --smoke`` runs and reports every figure (never a speed: smoke sizes mean nothing)."""

from __future__ import annotations

from pathlib import Path

from tests.support.bench_runs import smoke_result


def test_backlog_bench_smoke(tmp_path: Path) -> None:
    result = smoke_result("bench.backlog", tmp_path)
    assert result["batches"] == 2_000
    (run,) = result["runs"]["this"]
    assert run["probes"] == run["healthz_ms"]["samples"] + run["metrics_ms"]["samples"] > 0
    assert run["read_seconds"] >= 0 and run["over_1s"] <= run["probes"]
    summary = result["summary"]["this"]
    assert summary["healthz_p99_ms"] is not None and summary["healthz_p99_ms"] >= 0
