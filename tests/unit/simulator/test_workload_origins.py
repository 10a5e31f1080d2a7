"""The workload options that reproduce each origin of the prefill attribution (``kvgateway
simulate --help`` names them), through the gateway's own attribution on simulated time:
``route_weights`` (elsewhere), ``conversations`` beyond the GPU pool (refetch), with
``cpu_offload`` (offloaded), ``report_hits`` (hit)."""

from __future__ import annotations

import pytest

from kvgateway.engine import wire
from kvgateway.simulator import Workload, encode
from tests.support.prefill import Feed, attribute, shares

RATE = 100.0
SECONDS = 6.0
"""600 batches a stream: the recipes show within that, as in the simulator's integration test."""


def one(workload: Workload) -> dict[str, float]:
    return shares(attribute([Feed(("s", 0), workload, RATE)], SECONDS)[("s", 0)])


def pair(**options: object) -> list[dict[str, float]]:
    tokens = attribute([Feed(("a", r), Workload(5, stream=r, **options), RATE) for r in range(2)], SECONDS)  # type: ignore[arg-type]
    return [shares(counts) for counts in tokens.values()]


def test_routed_ranks_recompute_each_others_conversations() -> None:
    """Ranks that share system prompts but have their own users hardly ever hold what the other
    computes; routed at random, a conversation's next turn often lands on the rank without its history."""
    for alone in pair():
        assert alone["elsewhere"] < 0.05, alone
    for routed in pair(route_weights=(1.0, 1.0)):
        assert routed["elsewhere"] > 0.15, routed


def test_a_routed_stream_does_not_depend_on_its_peers() -> None:
    """Every peer draws the whole shared sequence itself: a stream's batches are the same whether
    or not (and however often) its peers made theirs, so engines in other processes agree."""
    alone = Workload(9, stream=1, route_weights=(2.0, 1.0))
    peer, beside = Workload(9, stream=0, route_weights=(2.0, 1.0)), Workload(9, stream=1, route_weights=(2.0, 1.0))
    for i in range(150):
        peer.next_batch(float(i), 0)
        if i % 2:
            peer.next_batch(float(i), 0)
        assert encode.encode_batch(alone.next_batch(float(i), 1)) == encode.encode_batch(beside.next_batch(float(i), 1))


def test_routed_streams_split_the_requests_by_weight() -> None:
    """A stream of weight w serves its slice of the sequence per batch over w: at rates in
    proportion to the weights, each serves about as many requests per second."""
    served = []
    for stream in (0, 1):
        workload = Workload(4, stream=stream, route_weights=(3.0, 1.0))
        stored = 0
        for i in range(300):
            stored += sum(isinstance(e, wire.BlockStored) for e in workload.next_batch(float(i), stream).events)
        served.append(stored)
    assert 0.7 < served[0] / served[1] < 1.4, served


def test_more_conversations_than_the_gpu_holds_refetch() -> None:
    roomy = one(Workload(5, gpu_capacity_blocks=4096))
    crowded = one(Workload(5, gpu_capacity_blocks=1024, conversations=128))
    assert roomy["refetch"] < 0.02, roomy
    assert crowded["refetch"] > 0.3, crowded


def test_cpu_offload_turns_part_of_the_refetch_into_offloaded() -> None:
    offload = one(Workload(5, gpu_capacity_blocks=1024, conversations=128, cpu_offload=True, cpu_capacity_blocks=2048))
    assert offload["offloaded"] > 0.1 and offload["refetch"] > 0.1, offload


def test_report_hits_shows_the_reused_prefix() -> None:
    assert one(Workload(5))["hit"] < 0.02
    assert one(Workload(5, report_hits=True))["hit"] > 0.3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"conversations": 0},
        {"route_weights": (1.0,), "stream": 1},
        {"route_weights": (1.0, 0.0)},
        {"route_weights": (1.0, -1.0), "stream": 1},
    ],
)
def test_bad_routing_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Workload(0, **kwargs)  # type: ignore[arg-type]
