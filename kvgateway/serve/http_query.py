"""A request's query parameters read against its route's declaration
(:data:`kvgateway.serve.query.ROUTE_PARAMETERS`), and the 400 that answers a bad one: the same on every
``/v1/`` route that is not a stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import HTTPConnection
from starlette.responses import Response

from kvgateway.serve.errors import json_error
from kvgateway.serve.query import BadRequest, ClientRequest, parse_route_query

if TYPE_CHECKING:
    from kvgateway.serve.serving import Serving


def read_query(
    conn: HTTPConnection, route: str, *, last_event_id: str | None = None
) -> tuple[ClientRequest, dict[str, list[str]]]:
    """The stream filter (source, dp_rank, ...) of a request to ``route`` and the route's own
    parameters, against the configured streams (:func:`kvgateway.serve.query.parse_route_query`);
    raises :class:`BadRequest`."""
    serving: Serving = conn.app.state.serving
    hub = serving.hub
    return parse_route_query(
        route, conn.query_params, sources=hub.source_names, last_event_id=last_event_id, streams=hub.configured
    )


def bad_request(serving: Serving, exc: BadRequest) -> Response:
    """A 400 with the one-line reason, counted as a rejected HTTP request."""
    serving.metrics.client_rejections.labels("http", "bad_request").inc()
    return json_error(400, exc.message)
