"""bench.chaos: its checker catches what it must, and a 75-second soak of the cluster passes it."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from bench.chaos_view import ClientView, EngineProcess, compare, edge_blocks
from tests.support import REPO
from tests.support.nats import nats_binary

EPOCH = "e0"


def _batch(offset: int, seq: int, events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "type": "batch",
        "id": f"{EPOCH}:{offset}",
        "offset": offset,
        "source": "a",
        "dp_rank": 0,
        "seq": str(seq),  # engine seqs are decimal strings
        "events": events or [],
    }


def _notice(offset: int, kind: str, **fields: Any) -> dict[str, Any]:
    head = {"type": "notice", "kind": kind, "id": f"{EPOCH}:{offset}", "offset": offset}
    return {**head, "source": "a", "dp_rank": 0, **fields}


def _fresh(offset: int = 0) -> ClientView:
    view = ClientView("c")
    hello = {"type": "hello", "epoch": EPOCH, "offset": offset, "recovered": False, "sources": [], "occupancy": {}}
    view.hello(hello, None, "edge")
    return view


def test_a_seq_delivered_twice_or_neither_delivered_nor_lost_is_reported() -> None:
    assert EngineProcess([0, 1, 4], [(2, 3, "transit")]).problems(4) == []
    twice = EngineProcess([0, 1, 1, 2], []).problems(2)
    assert twice and "twice" in twice[0]
    overlap = EngineProcess([0, 1, 2], [(2, 3, "evicted")]).problems(3)
    assert overlap and "twice" in overlap[0]
    missing = EngineProcess([0, 2], []).problems(3)
    assert missing and "neither delivered nor counted lost" in missing[0] and "[1, 3]" in missing[0]


def test_a_restart_notice_starts_the_next_engine_process_and_empties_the_stream() -> None:
    view = _fresh()
    stored = {"type": "BlockStored", "block_hashes": ["7"], "medium": "gpu"}
    view.apply(_batch(1, 0, [stored]))
    view.apply(_batch(2, 1))
    view.apply(_notice(3, "restart", seq="0", previous="1", reason="identity"))
    view.apply(_notice(4, "unrecovered_gap", first="0", until="0", count=1, reason="restart"))
    view.apply(_batch(5, 1, [stored, {"type": "BlockStored", "block_hashes": ["7"], "group_idx": 1}]))
    first, second = view.processes[("a", 0)]
    assert first.seqs == [0, 1] and first.problems(1) == []
    assert second.seqs == [1] and second.problems(1) == []
    assert view.blocks[("a", 0)] == {("GPU", 0, "7"): 1, ("GPU", 1, "7"): 1}
    assert view.violations == []


def test_an_offset_gap_a_duplicate_and_an_unrecovered_resume_are_violations() -> None:
    view = _fresh(10)
    view.apply(_batch(11, 0))
    view.apply(_batch(13, 1))
    view.apply(_batch(13, 2))
    assert view.counts["offset_gaps"] == 1 and view.counts["offset_duplicates"] == 1
    resumed = {"type": "hello", "epoch": EPOCH, "offset": 13, "recovered": True, "sources": []}
    view.hello(resumed, f"{EPOCH}:13", "edge")
    assert len(view.violations) == 2
    lost = {"type": "hello", "epoch": EPOCH, "offset": 20, "recovered": False, "sources": []}
    view.hello(lost, f"{EPOCH}:13", "edge")
    assert len(view.violations) == 3 and "not recovered" in view.violations[-1]


def test_the_model_is_compared_with_an_edges_blocks_block_for_block_and_by_staleness() -> None:
    view = _fresh()
    view.apply(_batch(1, 0, [{"type": "BlockStored", "block_hashes": ["1", "2", "2"], "medium": None}]))
    view.apply(_batch(2, 1, [{"type": "BlockRemoved", "block_hashes": ["1", "9"], "medium": "GPU"}]))
    document = {
        "offset": 2,
        "streams": [
            {
                "source": "a",
                "dp_rank": 0,
                "stale": False,
                "blocks": [{"hash": "2", "refs": 2, "medium": "GPU", "group_idx": 0}],
            }
        ],
    }
    assert compare(view.snapshot(), edge_blocks(document)) == []
    document["streams"][0]["blocks"][0]["refs"] = 1
    assert compare(view.snapshot(), edge_blocks(document))
    document["streams"][0]["blocks"][0]["refs"] = 2
    view.apply(_notice(3, "stale", reason="unrecovered", seq="5", detail=""))
    assert compare(view.snapshot(), edge_blocks(document))


@pytest.mark.slow
def test_a_short_chaos_soak_is_exact_through_every_kind_of_fault() -> None:
    """75 s of traffic: gamma restarts at 25 s and 50 s (3 processes), and faults 12-17 s apart up
    to 20 s before the end (59 s) make at least 3, one of each kind (they come in shuffled rounds
    of the three). Each fault is healed before the next; the checks run once every edge shows
    every stream's last batch, or after 120 s, when an edge still short of one is a violation the
    failure names (both edges waited for at once, within the test's own timeout)."""
    nats_binary()  # skips without nats-server
    proc = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--minutes", "1.25", "--fault-every", "12-17", "--restart-every", "25"],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["ok"] and result["violation_count"] == 0, result["violations"][:10]
    assert all(result["faults"][kind] >= 1 for kind in ("kill_ingest", "kill_edge", "restart_nats")), result["faults"]
    assert result["resumes"] >= 1 and result["resumes_recovered"] == result["resumes"]
    assert all(client["gamma[0]"]["processes"] == 3 for client in result["deliveries"].values())  # 2 restarts seen
    assert result["index_checks"] and all(check["equal"] for check in result["index_checks"])
