"""kvgateway.serve.query: the client's query parameters and each route's, refused with one line naming the parameter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import QueryParams

from kvgateway.protocol.filters import ClientFilter
from kvgateway.serve.query import (
    MAX_VALUES,
    PARAMETERS,
    ROUTE_PARAMETERS,
    BadRequest,
    ClientRequest,
    parse_query,
    parse_route_query,
)


def test_parse_query_accepts_repeated_values_and_normalizes() -> None:
    request = parse_query(
        QueryParams("source=a&source=b&dp_rank=0&dp_rank=01&type=BlockStored&medium=cpu&medium=CPU&token=x"),
        sources=["a", "b"],
    )
    assert request == ClientRequest(
        ClientFilter(
            sources=frozenset({"a", "b"}),
            dp_ranks=frozenset({0, 1}),
            types=frozenset({"BlockStored"}),
            mediums=frozenset({"CPU"}),
        ),
        None,
    )
    assert parse_query({"source": ["a"], "last_event_id": ["e:1"]}, sources=["a"]).last_event_id == "e:1"
    assert parse_query({"last_event_id": ["e:1"]}, last_event_id="e:2").last_event_id == "e:2"
    assert parse_query({"last_event_id": ["e:1"]}, last_event_id="").last_event_id == "e:1"
    assert parse_query({}).filter == ClientFilter()
    assert parse_query({"source": ["anything"]}).filter.sources == frozenset({"anything"})


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("sources=a", "sources"),
        ("Source=a", "Source"),
        ("source=c", "source"),
        ("source=", "source"),
        ("dp_rank=-1", "dp_rank"),
        ("dp_rank=x", "dp_rank"),
        ("dp_rank=1_0", "dp_rank"),
        ("dp_rank=%201", "dp_rank"),
        ("dp_rank=1234567890", "dp_rank"),
        ("type=", "type"),
        ("type=Block%20Stored", "type"),
        ("medium=gpu%0A", "medium"),
        ("last_event_id=a&last_event_id=b", "last_event_id"),
        ("compat=last", "compat"),
        ("compat=", "compat"),
        ("digest=0", "digest"),
        ("digest=3601", "digest"),
        ("digest=1.5", "digest"),
        ("digest=", "digest"),
        ("digest=5&digest=5", "digest"),
        ("digest=5&type=BlockStored", "digest"),
        ("=x", "''"),
    ],
)
def test_parse_query_rejects_with_one_line_naming_the_parameter(query: str, parameter: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_query(QueryParams(query), sources=["a", "b"])
    message = caught.value.message
    assert str(caught.value) == message
    assert parameter in message
    assert len(message.splitlines()) == 1


def test_an_unknown_compat_value_says_which_there_are() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_query(QueryParams("compat=gap_until"))
    assert caught.value.message == "compat: expected gap_last or int_seqs, got 'gap_until'"


def test_parse_query_limits_distinct_values() -> None:
    many = [f"T{i}" for i in range(MAX_VALUES + 1)]
    assert parse_query({"type": many[:MAX_VALUES]}).filter.types is not None
    with pytest.raises(BadRequest, match="type: more than"):
        parse_query({"type": many})


_names = st.one_of(st.sampled_from(PARAMETERS), st.text(max_size=12))
_values = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["a", "b", "0", "7", "-1", "BlockStored", "gpu", "CPU", "x:1", ""]),
    st.integers(-5, 10**12).map(str),
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_names, st.lists(_values, max_size=4), max_size=6), st.none() | st.text(max_size=10))
def test_parse_query_returns_a_valid_request_or_bad_request(params: dict[str, list[str]], header: str | None) -> None:
    try:
        request = parse_query(params, sources=["a", "b"], last_event_id=header)
    except BadRequest as exc:
        assert exc.message
        assert len(exc.message.splitlines()) == 1
        return
    assert {name for name, values in params.items() if values} <= set(PARAMETERS)  # a name without values is absent
    f = request.filter
    for name, got in (("source", f.sources), ("dp_rank", f.dp_ranks), ("type", f.types), ("medium", f.mediums)):
        assert (got is None) == (not params.get(name))
    assert f.sources is None or f.sources <= {"a", "b"}
    assert f.dp_ranks is None or all(r >= 0 for r in f.dp_ranks)
    assert f.mediums is None or all(m == m.upper() for m in f.mediums)
    assert request.last_event_id != ""
    if header:
        assert request.last_event_id == header


def test_every_v1_route_declares_what_it_accepts_and_its_400_lists_exactly_that() -> None:
    from kvgateway.serve.app import ROUTES

    assert {route.path for route in ROUTES if route.path.startswith("/v1/")} == set(ROUTE_PARAMETERS)
    for route, accepted in ROUTE_PARAMETERS.items():
        assert "token" in accepted
        with pytest.raises(BadRequest) as info:
            parse_route_query(route, [("x", "1")])
        assert info.value.message == f"unknown query parameter 'x' (accepted: {', '.join(accepted)})"
    client, own = parse_route_query("/v1/history", [("source", "a"), ("step", "10"), ("since", "1"), ("step", "5")])
    assert client.filter.sources == frozenset({"a"}) and own == {"step": ["10", "5"], "since": ["1"]}
    with pytest.raises(BadRequest, match=r"^unknown query parameter 'type' "):
        parse_route_query("/v1/occupancy", {"type": ["BlockStored"]})


def test_snapshot_query_parameter() -> None:
    assert parse_query({"snapshot": ["blocks"]}).snapshot == "blocks"
    assert parse_query({}).snapshot is None
    for bad, fragment in (({"snapshot": ["all"]}, "snapshot: expected blocks"), ({"snapshot": ["blocks"] * 2}, "more")):
        with pytest.raises(BadRequest, match=fragment):
            parse_query(bad)
