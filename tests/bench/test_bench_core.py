"""``python -m bench.core --smoke``: both cores' render, learn and analytics stages in one run, every figure
reported (never a speed: smoke sizes mean nothing)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.support.bench_runs import smoke_result


def test_core_bench_smoke(tmp_path: Path) -> None:
    try:
        importlib.import_module("kvgateway.state._learner_c")
    except ImportError:
        pytest.skip("the compiled core is not built here")
    result = smoke_result("bench.core", tmp_path)
    assert set(result["variants"]) == {"map", "array", "bytes", "signed"}
    for figures in result["variants"].values():
        assert figures["batches"] > 0
        for stage in ("render", "learn", "analytics"):
            assert figures[stage]["pure"] > 0 and figures[stage]["compiled"] > 0
            assert figures[stage]["ratio"] == pytest.approx(
                figures[stage]["compiled"] / figures[stage]["pure"], rel=0.05
            )
