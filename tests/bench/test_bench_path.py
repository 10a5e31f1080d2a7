"""``python -m bench.path --smoke``: the whole per-batch path in process, a figure for every payload
variant (never a speed: smoke sizes mean nothing), and against a base tree, pairs alternating."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.bench_runs import run_bench, smoke_result
from tests.support.processes import REPO


def test_path_bench_smoke(tmp_path: Path) -> None:
    result = smoke_result("bench.path", tmp_path)
    assert set(result["us_per_batch"]) == {"map", "array", "bytes"}
    assert all(figure > 0 for figure in result["us_per_batch"].values())


def test_path_bench_against_a_base_alternates_the_pairs(tmp_path: Path) -> None:
    printed = run_bench("bench.path", "--smoke", "--base", str(REPO), "--pairs", "2", "--results-dir", str(tmp_path))
    (path,) = tmp_path.glob("*-smoke.json")
    assert json.loads(path.read_text(encoding="utf-8")) == printed
    for figures in printed["ab"].values():
        first, second = figures["pairs"]
        assert list(first)[:2] == ["new", "base"] and list(second)[:2] == ["base", "new"]
        assert figures["ratio_low"] <= figures["ratio"] <= figures["ratio_high"]
        assert first["ratio"] == round(first["new"] / first["base"], 4)
