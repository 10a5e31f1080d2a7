"""``python -m bench.learner --smoke``: the learner against 9b2743e's in one run, every figure reported
(never a speed: smoke sizes mean nothing), and the same answers to lookups by tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.bench_runs import smoke_result


def number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def test_learner_bench_smoke(tmp_path: Path) -> None:
    result = smoke_result("bench.learner", tmp_path)
    assert result["previous"] == "9b2743e"
    fill = result["fill"]
    assert fill["same_answers"] == fill["queries"] > 0
    for kind in ("previous", "current"):
        assert number(fill["bytes_per_entry"][kind]) and fill["bytes_per_entry"][kind] > 0
        assert number(fill["learn_us_per_block"][kind])
        assert {"p50_ms", "p99_ms"} <= set(fill["lookups_by_tokens"][kind])
    # Memory is not a speed: the compact table is well under half the dict's, even at smoke size.
    assert fill["bytes_per_entry"]["current"] < fill["bytes_per_entry"]["previous"] / 2
    cap = result["at_cap"]
    assert cap["cap"] == int(1.25 * cap["resident_blocks"])
    for kind in ("previous", "current"):
        assert number(cap[kind]["learner_us_per_block"]) and cap[kind]["entries"] <= cap["cap"]
    current = cap["current"]
    assert current["slots"] == current["learner_cap"] <= cap["cap"]  # the ring grew to its cap, not beyond
    assert number(cap["ratio"])
