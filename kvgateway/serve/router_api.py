"""The routes for KV-aware routers: ``GET /v1/blocks`` (the resident blocks as one JSON document or
NDJSON, with the epoch and offset they reflect) and ``POST /v1/lookup`` (the resident prefix of a
chain per stream). Module-level Starlette functions, thin: the work is in kvgateway/state/blocks.py,
kvgateway/state/lookup.py and kvgateway/serve/router_state.py; the token is checked before them (middleware.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Final

import msgspec
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from kvgateway.serve.errors import json_error
from kvgateway.serve.http_query import bad_request, read_query
from kvgateway.serve.query import BadRequest, check_once
from kvgateway.serve.router_state import BlockSnapshot, TooManySnapshots, without_gc
from kvgateway.state import blocks
from kvgateway.state.lookup import DEFAULT_LIMITS, BadLookup, parse_request
from kvgateway.state.occupancy import StreamIndex

if TYPE_CHECKING:
    from kvgateway.serve.serving import Serving

NDJSON: Final = "application/x-ndjson"
FORMATS: Final = ("json", "ndjson")


def _serving(conn: HTTPConnection) -> Serving:
    serving: Serving = conn.app.state.serving
    return serving


def _streams(request: Request, serving: Serving, route: str) -> tuple[list[StreamIndex], dict[str, str]]:
    """The configured streams that ``source``/``dp_rank`` select, and the value of each of the
    route's own parameters; raises :class:`BadRequest` (what ``route`` accepts:
    :data:`kvgateway.serve.query.ROUTE_PARAMETERS`)."""
    client, own = read_query(request, route)
    found: dict[str, str] = {}
    for name, values in own.items():
        check_once(name, values)
        found[name] = values[0]
    return serving.routers.matching(serving.board.streams, client.filter), found


async def _paced(pieces: Iterator[bytes], snapshot: BlockSnapshot) -> AsyncIterator[bytes]:
    """One rendered piece per event-loop turn: a million blocks never hold the loop for long (a
    sync iterator would run in a thread and still take the GIL from the loop)."""
    try:
        for piece in without_gc(pieces):
            yield piece
            await asyncio.sleep(0)
    finally:
        snapshot.release()


async def blocks_endpoint(request: Request) -> Response:
    serving = _serving(request)
    try:
        streams, found = _streams(request, serving, "/v1/blocks")
        fmt = found.get("format") or ("ndjson" if NDJSON in request.headers.get("accept", "") else "json")
        if fmt not in FORMATS:
            raise BadRequest(f"format: expected json or ndjson, got {fmt[:64]!r}")
    except BadRequest as exc:
        return bad_request(serving, exc)
    routers = serving.routers
    try:
        routers.reserve()
    except TooManySnapshots as exc:
        serving.metrics.client_rejections.labels("http", "too_many_snapshots").inc()
        return json_error(503, str(exc), **{"Retry-After": "1"})
    # No await between reading the offset and freezing the streams: the state is the one after it.
    offset = serving.hub.offset
    snapshot = routers.capture(streams, offset, None, "blocks", digest=True)
    if fmt == "ndjson":
        pieces = blocks.iter_ndjson(serving.hub.epoch, offset, snapshot.streams)
    else:
        pieces = blocks.iter_document(serving.hub.epoch, offset, snapshot.streams)
    return StreamingResponse(
        _paced(pieces, snapshot),
        media_type=NDJSON if fmt == "ndjson" else "application/json",
        headers={"Cache-Control": "no-store"},
    )


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is longer than ``limit`` (never held beyond it)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            return None
    return bytes(body)


async def lookup_endpoint(request: Request) -> Response:
    serving = _serving(request)
    routers = serving.routers
    if not routers.allow_lookup():
        serving.metrics.client_rejections.labels("http", "rate_limited").inc()
        return json_error(429, "lookup rate limit reached (lookup_rate, lookup_burst)", **{"Retry-After": "1"})
    limit = DEFAULT_LIMITS.max_body_bytes
    body = await _read_body(request, limit)
    if body is None:
        serving.metrics.client_rejections.labels("http", "bad_request").inc()
        return json_error(413, f"body exceeds the {limit}-byte limit")
    try:
        streams, _ = _streams(request, serving, "/v1/lookup")
        query = parse_request(body, DEFAULT_LIMITS)
    except (BadRequest, BadLookup) as exc:
        serving.metrics.client_rejections.labels("http", "bad_request").inc()
        return json_error(400, str(exc))
    # Synchronous from here: the answer is the state after the offset it names.
    answer = routers.lookup(streams, query, serving.hub.offset)
    return Response(msgspec.json.encode(answer), media_type="application/json")


ROUTER_ROUTES: Final[list[Route]] = [
    Route("/v1/blocks", blocks_endpoint),
    Route("/v1/lookup", lookup_endpoint, methods=["POST"]),
]
