"""kvgateway.serve.http_query: a request's parameters read against its route and the configured
streams, and the 400 for a bad one, counted as a rejected HTTP request."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from starlette.requests import Request

from kvgateway.config import Settings, SourceConfig
from kvgateway.runtime.metrics import Metrics
from kvgateway.serve.http_query import bad_request, read_query
from kvgateway.serve.query import BadRequest
from kvgateway.serve.serving import Serving


def request_to(serving: Serving, path: str, query: str) -> Request:
    app = SimpleNamespace(state=SimpleNamespace(serving=serving))
    scope = {"type": "http", "method": "GET", "path": path, "query_string": query.encode(), "headers": [], "app": app}
    return Request(scope)


@pytest.fixture
def serving() -> Serving:
    sources = (SourceConfig(name="a", endpoint="tcp://127.0.0.1:1", dp_size=2),)
    return Serving(Settings(sources=sources), Metrics())


def test_the_stream_filter_and_the_routes_own_parameters(serving: Serving) -> None:
    request, own = read_query(request_to(serving, "/v1/history", "source=a&dp_rank=1&step=10"), "/v1/history")
    assert (request.filter.sources, request.filter.dp_ranks, own) == (
        frozenset({"a"}),
        frozenset({1}),
        {"step": ["10"]},
    )


@pytest.mark.parametrize("query", ["source=b", "dp_rank=2", "type=BlockStored", "nonsense=1"])
def test_what_the_route_or_the_configuration_does_not_have_is_a_counted_400(serving: Serving, query: str) -> None:
    with pytest.raises(BadRequest) as caught:
        read_query(request_to(serving, "/v1/occupancy", query), "/v1/occupancy")
    response = bad_request(serving, caught.value)
    assert response.status_code == 400
    assert json.loads(response.body) == {"error": caught.value.message}
    assert len(caught.value.message.splitlines()) == 1
    rejected = serving.metrics.registry.get_sample_value(
        "kvgateway_client_rejections_total", {"transport": "http", "reason": "bad_request"}
    )
    assert rejected == 1
