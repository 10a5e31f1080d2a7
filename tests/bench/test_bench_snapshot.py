"""``python -m bench.snapshot --smoke`` serves a block snapshot to a client while live clients listen,
and reports every figure (never a speed: smoke sizes mean nothing)."""

from __future__ import annotations

from pathlib import Path

from tests.support.bench_runs import smoke_result


def test_snapshot_bench_smoke(tmp_path: Path) -> None:
    result = smoke_result("bench.snapshot", tmp_path)
    snap = result["snapshot"]
    assert snap["blocks"] >= 8192 and snap["first_live_offset"] == snap["hello_offset"] + 1
    assert result["learned_blocks"] >= 8192
    for window in ("baseline", "during"):
        assert {"count", "p50_ms", "p99_ms", "max_ms"} <= set(result[window]), window
    assert result["p99_ratio_during_vs_baseline"] > 0
