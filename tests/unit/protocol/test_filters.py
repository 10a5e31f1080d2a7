"""kvgateway.protocol.filters: which events and streams a client's filter passes, through a hub and on its own."""

from __future__ import annotations

import json

import pytest
from starlette.datastructures import QueryParams

from kvgateway.engine import wire
from kvgateway.protocol import render
from kvgateway.protocol.filters import ClientFilter, event_key, select
from kvgateway.serve.query import parse_query
from kvgateway.state.occupancy import OccupancyIndex
from tests.support.events import MIXED, batch, removed, stored
from tests.support.hub import decode, drain, make_hub, offsets, publish_batch, publish_notice, subscribe


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", [0, 1, 2, 3, 4, 5, 6]),
        ("medium=GPU", [0, 1, 4]),
        ("medium=gpu", [0, 1, 4]),
        ("medium=CPU", [2, 3, 4]),
        ("medium=Disk", [4, 5]),
        ("medium=GPU&medium=disk", [0, 1, 4, 5]),
        ("type=BlockStored", [0, 1, 2]),
        ("type=BlockRemoved&type=AllBlocksCleared", [3, 4]),
        ("type=Offloaded", [5, 6]),
        ("type=Offloaded&medium=DISK", [5]),
        ("type=BlockStored&medium=cpu", [2]),
        ("type=AllBlocksCleared&medium=nowhere", [4]),
        ("type=Nothing", None),
        ("type=BlockRemoved&medium=GPU", None),
    ],
)
def test_event_filters(query: str, expected: list[int] | None) -> None:
    hub = make_hub()
    sub = subscribe(hub, query)
    publish_batch(hub, "a", 0, 1, batch(*MIXED))
    got = drain(sub)
    rendered = render.render_events(MIXED)
    if expected is None:
        assert got == []
    else:
        assert [decode(m)["events"] for m in got] == [json.loads(json.dumps([rendered[i] for i in expected]))]
    request = parse_query(QueryParams(query), sources=hub.source_names)
    assert passing(request.filter, MIXED) == [MIXED[i] for i in expected or []]


TIERED: list[wire.Event] = [
    stored(1, medium="GPU"),  # 0
    stored(2),  # 1: no medium: GPU
    stored(3, medium=""),  # 2: empty: GPU, as the occupancy index counts it
    stored(4, medium="CPU"),  # 3
    stored(5, medium="cpu_pinned"),  # 4
    removed(6, medium="CPU_PINNED"),  # 5
    stored(7, medium="STORAGE"),  # 6
    stored(8, medium="disk"),  # 7
    stored(9, medium="EXTERNAL"),  # 8
    removed(10, medium="lmcache"),  # 9
    wire.AllBlocksCleared(),  # 10: every medium
    wire.UnknownEvent(type="Offloaded", body={"type": "Offloaded", "medium": "Cpu_Pinned"}),  # 11
]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("medium=GPU", [0, 1, 2, 10]),  # a tier name: the whole tier
        ("medium=CPU", [3, 4, 5, 10, 11]),  # CPU and CPU_PINNED
        ("medium=cpu_pinned", [4, 5, 10, 11]),  # a medium name: only that medium
        ("medium=CPU_PINNED&type=BlockStored", [4]),
        ("medium=DISK", [6, 7, 10]),  # DISK and STORAGE
        ("medium=storage", [6, 10]),
        ("medium=EXTERNAL", [8, 9, 10]),  # anything the tier table does not name
        ("medium=LMCACHE", [9, 10]),
        ("medium=STORAGE&medium=EXTERNAL", [6, 8, 9, 10]),
        ("medium=nowhere", [10]),
    ],
)
def test_medium_filter_takes_a_medium_name_or_a_tier_name(query: str, expected: list[int]) -> None:
    hub = make_hub()
    sub = subscribe(hub, query)
    publish_batch(hub, "a", 0, 1, batch(*TIERED))
    (message,) = drain(sub)
    rendered = render.render_events(TIERED)
    assert decode(message)["events"] == json.loads(json.dumps([rendered[i] for i in expected]))
    request = parse_query(QueryParams(query), sources=hub.source_names)
    assert passing(request.filter, TIERED) == [TIERED[i] for i in expected]


def passing(client_filter: ClientFilter, events: list[wire.Event]) -> list[wire.Event]:
    """The events of a batch ``client_filter`` passes, in order, by the keys the log keeps."""
    return [events[i] for i in select([event_key(e) for e in events], client_filter.types, client_filter.mediums)]


def test_medium_filter_and_occupancy_index_agree_on_every_event() -> None:
    """One normaliser: an event passes ``medium=M`` exactly when the index counts it under M (or M's tier)."""
    from kvgateway.engine.mediums import TIERS

    blocks = [e for e in TIERED if isinstance(e, wire.BlockStored)]
    index = OccupancyIndex()
    for event in blocks:
        index.apply("a", 0, batch(event), 0.0)
    (entry,) = index.snapshot(1, 0.0)["streams"]
    for name, stats in entry["mediums"].items():
        if name in TIERS:  # a tier name filters the whole tier: checked below
            continue
        assert len(passing(parse_query({"medium": [name]}).filter, blocks)) == stats["blocks"], name
    for tier in TIERS:
        counted = entry["tiers"].get(tier, {"blocks": 0})["blocks"]
        assert len(passing(parse_query({"medium": [tier]}).filter, blocks)) == counted, tier


def test_stream_filters_and_notices_pass_event_filters() -> None:
    hub = make_hub()
    a = subscribe(hub, "source=a")
    rank1 = subscribe(hub, "dp_rank=1")
    b_stored = subscribe(hub, "source=b&type=BlockStored")
    publish_batch(hub, "a", 0, 1, batch(stored(1)))  # 1
    publish_batch(hub, "a", 1, 1, batch(stored(1)))  # 2
    publish_batch(hub, "b", 0, 1, batch(removed(1)))  # 3
    publish_notice(hub, "down", "b", 0, reason="socket closed")  # 4
    publish_notice(hub, "up", "a", 1, reason="connected")  # 5
    assert offsets(drain(a)) == [1, 2, 5]
    assert offsets(drain(rank1)) == [2, 5]
    assert offsets(drain(b_stored)) == [4]
    f = ClientFilter(sources=frozenset({"a"}), dp_ranks=frozenset({1}))
    assert f.matches_stream("a", 1)
    assert not f.matches_stream("a", 0)
    assert not f.matches_stream("b", 1)
    assert ClientFilter().matches_stream("anything", 99)
