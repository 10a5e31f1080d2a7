"""The demo's roles (kvgateway/demo.py), sans I/O: their workloads through the gateway's own
prefill attribution on simulated time, as the demo runs them for its first minute and a half."""

from __future__ import annotations

from pathlib import Path

from kvgateway import demo
from tests.support.prefill import Feed, attribute, fleet_tokens, shares

SECONDS = 90.0
TALK, QUIET = 60.0, 30.0  # the demo's default --silence


def demo_feeds(seed: int) -> list[Feed]:
    sources = demo.demo_sources(Path("unused"))
    roles = demo.demo_roles(sources)
    feeds = []
    for index, source in enumerate(sources):
        for rank in range(source.dp_size):
            role = roles[(source.name, rank)]
            workload = demo.role_workload(source, rank, role, seed * 1000 + index, roles)
            talking = (lambda t: t % (TALK + QUIET) < TALK) if role.silent else (lambda t: True)
            feeds.append(Feed((source.name, rank), workload, demo.DEFAULT_RATE * role.rate_factor, talking))
    return feeds


def test_every_origin_is_a_visible_share_of_the_demo_and_each_engine_tells_its_own() -> None:
    tokens = attribute(demo_feeds(seed=1), SECONDS)
    fleet = shares(fleet_tokens(tokens))
    for origin in ("hit", "offloaded", "refetch", "elsewhere"):
        assert fleet[origin] >= 0.05, fleet
    assert fleet["new"] <= 0.7, fleet
    each = {stream: shares(counts) for stream, counts in tokens.items()}
    # the randomly routed pair: routing misses
    assert each[("vllm-a", 0)]["elsewhere"] > 0.1 and each[("vllm-a", 1)]["elsewhere"] > 0.1, each
    # the undersized engine with CPU offload: capacity misses, part of them loaded back
    assert each[("sglang-b", 0)]["refetch"] > 0.15 and each[("sglang-b", 0)]["offloaded"] > 0.1, each
    # full report mode: the reused prefix announced again
    assert each[(demo.SILENT_SOURCE, 0)]["hit"] > 0.3, each
    # and no engine shows another's story
    assert each[("vllm-a", 0)]["refetch"] < 0.05 and each[("sglang-b", 0)]["elsewhere"] == 0, each


def test_routed_ranks_are_weighted_by_their_rates() -> None:
    sources = demo.demo_sources(Path("unused"))
    roles = demo.demo_roles(sources)
    source = next(s for s in sources if s.name == "vllm-a")
    weights = [demo.role_workload(source, rank, roles[("vllm-a", rank)], 1, roles).route_weights for rank in (0, 1)]
    assert weights == [(1.0, 0.5), (1.0, 0.5)]
