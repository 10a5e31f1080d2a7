"""``python -m bench.path --smoke``: the whole per-batch path in process, a figure for every payload
variant (never a speed: smoke sizes mean nothing), and against a base tree, pairs alternating."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.bench_runs import run_bench, smoke_result
from tests.support.processes import REPO


def test_path_bench_smoke(tmp_path: Path) -> None:
    result = smoke_result("bench.path", tmp_path)
    assert set(result["us_per_batch"]) == {"map", "array", "bytes", "signed"}
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


def test_path_bench_attribution_pairs_run_the_same_tree_with_and_without_it(tmp_path: Path) -> None:
    printed = run_bench("bench.path", "--smoke", "--attribution", "--pairs", "2", "--results-dir", str(tmp_path))
    assert printed["base"] == "this tree without the prefill attribution"
    for figures in printed["ab"].values():
        first, second = figures["pairs"]
        assert list(first)[:2] == ["new", "base"] and list(second)[:2] == ["base", "new"]
        assert all(pair["new"] > 0 and pair["base"] > 0 for pair in (first, second))


def test_the_base_side_of_the_attribution_pairs_counts_nothing() -> None:
    """The off side is the gateway without the attribution: its account stays empty, the on side's
    does not, over the same batches."""
    from bench import path, payloads

    form, hashes = path.VARIANTS["map"]
    stream = payloads.load_or_generate(payloads.standard(30_000, form, hashes)).stream(0)[:300]
    messages = [[b"", path.wire.seq_bytes(seq), payload] for seq, payload in enumerate(stream)]
    tokens: dict[bool, int] = {}
    for attribution in (True, False):
        serving, outlet, sequencer, client = path._gateway(attribution)
        path._run(messages, outlet, sequencer, client)
        assert serving.index.resident_blocks() > 0
        tokens[attribution] = sum(serving.attribution.totals([("bench", 0)]))
    assert tokens[True] > 0 and tokens[False] == 0


def test_resident_fills_a_fleet_beside_the_flood_and_gives_the_index_its_observer_back() -> None:
    """``--resident``: the fleet's blocks held and learned over the other streams before the flood,
    the learner's ring full past them (the gone announcements at its front), the fill not
    attributed, and the flood's engine attributed as without a fleet."""
    from bench import path, payloads

    form, hashes = path.VARIANTS["map"]
    stream = payloads.load_or_generate(payloads.standard(30_000, form, hashes)).stream(0)[:200]
    messages = [[b"", path.wire.seq_bytes(seq), payload] for seq, payload in enumerate(stream)]
    resident = 8 * 64 * 6
    serving, outlet, sequencer, client = path._gateway(True, resident)
    assert serving.index.resident_blocks() == resident
    learner = serving.routers.learner
    assert learner.learned >= resident * (1 + path.FLEET_GONE)
    fleet = [("fleet", k) for k in range(path.FLEET_STREAMS)]
    assert sum(serving.attribution.totals(fleet)) == 0
    path._run(messages, outlet, sequencer, client)
    assert serving.index.resident_blocks() > resident
    assert sum(serving.attribution.totals([("bench", 0)])) > 0
