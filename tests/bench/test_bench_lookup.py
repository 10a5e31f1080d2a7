"""``python -m bench.lookup --smoke`` runs and reports every figure (never a speed: smoke sizes mean nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.bench_runs import smoke_result


def number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def test_lookup_bench_smoke(tmp_path: Path) -> None:
    result = smoke_result("bench.lookup", tmp_path)
    assert result["workload"]["resident_blocks"] > 0
    lookup = result["lookup"]
    for kind in ("by_hashes", "by_hashes_with_parsing", "by_tokens", "baseline_by_hashes", "baseline_by_tokens"):
        assert {"p50_ms", "p99_ms", "max_ms", "per_s"} <= set(lookup[kind]), kind
        assert all(number(v) for v in lookup[kind].values()), kind
    memory = result["memory"]
    assert memory["learned_blocks"] == result["workload"]["resident_blocks"]  # the learner's cap was not reached
    for key in ("index_bytes_per_resident_block", "learner_bytes_per_learned_block"):
        assert number(memory[key]) and memory[key] > 0, key
    assert memory["bytes_per_resident_block_learning_on"] > memory["bytes_per_resident_block_learning_off"]
    assert number(result["learn_us_per_block"])
    snapshot = result["snapshot"]
    assert snapshot["blocks"] == result["workload"]["resident_blocks"]
    assert snapshot["chunks"] >= snapshot["blocks"] / snapshot["chunk_blocks"]
    for key in ("capture_ms", "render_s", "chunk_max_ms", "copy_on_write_first_apply_ms"):
        assert number(snapshot[key]), key
    assert result["fleet"]["facts"]["distinct_blocks"] >= result["workload"]["resident_blocks"]
    assert number(result["fleet"]["from_holders_ms"])  # the bench checked it gives the same facts
