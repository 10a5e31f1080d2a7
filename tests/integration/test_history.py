"""GET /v1/history end to end: a real `kvgateway demo` (simulated engines, uvicorn), real HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from tests.support import REPO, Start, free_port, metric, start_half_fleet, wait_until

pytestmark = pytest.mark.timeout(60)


def test_history_route(procs: Start) -> None:
    port = free_port()
    demo = procs("demo", "--host", "127.0.0.1", "--port", str(port), "--rate", "20")
    base = demo.wait_for(r"dashboard at (http://\S+)", timeout=30).group(1).rstrip("/")
    schema = json.loads((REPO / "kvgateway" / "protocol" / "schema.json").read_text())
    validator = Draft202012Validator({**{k: v for k, v in schema.items() if k != "oneOf"}, "$ref": "#/$defs/history"})

    def history(query: str = "") -> Any:
        res = httpx.get(f"{base}/v1/history{query}", timeout=5)
        assert res.status_code == 200, res.text
        return res.json()

    # the sampler runs from the start: a point at once, then one every 5 s
    doc = wait_until(
        lambda: (d := history()) and all(len(s["points"]) >= 2 for s in d["streams"]) and d,
        timeout=20,
        what="two points per stream",
    )
    validator.validate(doc)
    sources = httpx.get(f"{base}/v1/sources", timeout=5).json()
    assert doc["epoch"] == sources["epoch"]
    assert doc["interval_seconds"] == 5 and doc["horizon_seconds"] == 3600
    assert [(s["source"], s["dp_rank"]) for s in doc["streams"]] == [
        (s["source"], s["dp_rank"]) for s in sources["sources"]
    ]
    for stream in doc["streams"]:
        times = [p["t"] for p in stream["points"]]
        assert times == sorted(times) and all(t % 5 == 0 for t in times)
        assert stream["points"][-1]["state"] == "up"
        assert sum(m["blocks"] for m in stream["points"][-1]["mediums"].values()) > 0

    # filters as on the stream, and polling with since
    one = doc["streams"][0]
    chosen = history(f"?source={one['source']}&dp_rank={one['dp_rank']}&medium=GPU")
    assert [(s["source"], s["dp_rank"]) for s in chosen["streams"]] == [(one["source"], one["dp_rank"])]
    assert all(set(p["mediums"]) <= {"GPU"} for p in chosen["streams"][0]["points"])
    last = max(p["t"] for s in doc["streams"] for p in s["points"])
    assert all(p["t"] > last for s in history(f"?since={last}")["streams"] for p in s["points"])

    for query, word in (
        ("?type=BlockStored", "type"),
        ("?step=3", "step"),
        ("?since=x", "since"),
        ("?source=nope", "source"),
        ("?since=1&since=2", "since: given more than once"),
        ("?step=10&step=10", "step: given more than once"),
    ):
        res = httpx.get(f"{base}/v1/history{query}", timeout=5)
        assert res.status_code == 400 and word in res.json()["error"], (query, res.text)
    assert metric(base, "kvgateway_history_bytes") > 0

    # the analytics of the same gateway: every stream listed, evictions seen once caches fill
    def analytics() -> Any:
        res = httpx.get(f"{base}/v1/analytics", timeout=5)
        assert res.status_code == 200, res.text
        return res.json()

    doc = wait_until(
        lambda: (
            (a := analytics()) and any(t["sampled_evictions"] for s in a["streams"] for t in s["tiers"].values()) and a
        ),
        timeout=30,
        what="sampled evictions",
    )
    assert doc["epoch"] == sources["epoch"] and doc["sample"] == 16
    Draft202012Validator({**{k: v for k, v in schema.items() if k != "oneOf"}, "$ref": "#/$defs/analytics"}).validate(
        doc
    )
    assert [(s["source"], s["dp_rank"]) for s in doc["streams"]] == [
        (s["source"], s["dp_rank"]) for s in sources["sources"]
    ]
    assert doc["prefixes"]["first_blocks"] > 0 and doc["prefixes"]["mean_engines"] >= 1
    assert metric(base, "kvgateway_sampled_evictions_total") > 0
    assert httpx.get(f"{base}/v1/analytics?x=1", timeout=5).status_code == 400


def test_prefix_spread_counts_only_the_engines_that_are_up(procs: Start) -> None:
    # two configured streams, one engine running: "of 2 engines" would count one that holds nothing
    gateway = start_half_fleet(procs)

    def spread() -> Any:
        doc = httpx.get(f"{gateway.base}/v1/analytics", timeout=5).json()
        return doc["prefixes"]["first_blocks"] > 0 and doc

    doc = wait_until(spread, timeout=30, what="first blocks counted")
    assert [(s["source"], s["dp_rank"]) for s in doc["streams"]] == [("gone", 0), ("up", 0)]
    assert doc["prefixes"]["engines"] == 1
    states = {s["source"]: s["state"] for s in gateway.sources()["sources"]}
    assert states == {"up": "up", "gone": "down"}
