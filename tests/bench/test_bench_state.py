"""``python -m bench.state --smoke``: the serving side's state path per batch, against the commit
before the prefill attribution, on both cores, every figure reported (never a speed: smoke sizes
mean nothing)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.support.bench_runs import smoke_result


def test_state_bench_smoke(tmp_path: Path) -> None:
    try:
        importlib.import_module("kvgateway.state._apply_c")
    except ImportError:
        pytest.skip("the compiled core is not built here")
    result = smoke_result("bench.state", tmp_path)
    assert result["base"] == "8a83c3d"
    figures = result["variants"]["map"]
    assert figures["batches"] > 0 and figures["before"]["base"] > 0
    for stage in ("index", "attributed", "digest", "learner"):
        assert figures[stage]["pure"] > 0 and figures[stage]["compiled"] > 0
    assert "previous" not in figures and "attributed_over_previous" not in figures  # only with --previous
    assert figures["attributed_over_before"]["compiled"] == pytest.approx(
        figures["attributed"]["compiled"] / figures["before"]["base"], rel=0.05
    )
    memory = figures["bytes_per_resident_block"]
    assert memory["resident_blocks"] > 0
    for name in ("before", "index_pure", "index_compiled", "attributed_pure", "attributed_compiled"):
        assert memory[name] > 0
    # Memory is not a speed: the fleet's holders add a set of every resident hash, never less, to
    # the pure-Python core's sets; the compiled core's C tables (8 bytes a slot, no int kept per
    # hash) hold both in less than the sets alone.
    assert memory["index_pure"] > memory["before"]
    assert memory["index_compiled"] < memory["index_pure"]
    # With the hashes' ints counted the index costs more than without, on either core.
    hashed = memory["with_hashes"]
    for core in ("pure", "compiled"):
        assert hashed[f"index_{core}"] > memory[f"index_{core}"]
        assert hashed[f"attributed_{core}"] >= hashed[f"index_{core}"]
    assert figures["ingest_path"]["sum_us"] > 0
