"""``python -m bench.fleet --smoke`` runs and reports every figure (never a speed: smoke sizes mean nothing)."""

from __future__ import annotations

from pathlib import Path

from bench.fleet import PATHS, SLOWEST_TARGETS, TARGETS
from tests.support.bench_runs import smoke_result


def test_fleet_bench_smoke(tmp_path: Path) -> None:
    result = smoke_result("bench.fleet", tmp_path)
    assert (result["streams"], result["targets"]) == (2, {"slowest_s": SLOWEST_TARGETS, **TARGETS})
    (fleet,), (one,) = result["runs"]["fleet"], result["runs"]["one"]
    assert (fleet["streams"], one["streams"]) == (2, 1)
    for run in (fleet, one):
        assert set(run["slowest_s"]) == set(run["median_s"]) == set(PATHS)
        assert all(run["slowest_s"][path] >= run["median_s"][path] > 0 for path in PATHS)
        assert run["requests"] >= len(PATHS) and run["delivered"] > 0
        assert 0 <= run["late_share"] <= 1 and run["worst_lag_s"] >= 0
        assert run["rss_mb"] > 0 and run["exit_s"] > 0
    assert set(result["ratios"]) == {f"{kind} {path}" for kind in ("slowest", "median") for path in PATHS} | {"exit"}
    assert all(ratio is not None and ratio > 0 for ratio in result["ratios"].values())
    assert result["met"] in ([True], [False])
