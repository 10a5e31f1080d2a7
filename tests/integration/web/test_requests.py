"""What a request may ask, end to end: the token on every /v1 endpoint (never logged), the Origin
allow-list, the client limit, each route's parameters and its one-line 400s, per-stream filters on
every route, the answers' rounding, the inbound message limit, the schema served (and this suite's
check against it), and the garbage collector's pauses on /metrics."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.support import GatewayProcess, arun, metric_values, wait_until
from tests.support.web import (
    ALLOWED_ORIGIN,
    BODY_WITHIN,
    SCHEMA_FILE,
    TEST_WITHIN,
    TOKEN,
    WITHIN,
    Clients,
    SchemaCheck,
    assert_contiguous,
    check_fresh_hello,
    check_sse_framing,
)

pytestmark = pytest.mark.timeout(TEST_WITHIN)


def test_the_schema_check_rejects_what_the_schema_forbids() -> None:
    """The check every test relies on is not vacuous (and its shortcuts keep the verdicts)."""
    event = {
        "type": "BlockStored",
        "block_hashes": ["15760518052499183552"],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "tier": "GPU",
        "lora_name": None,
        "group_idx": 0,
    }
    batch = {
        "type": "batch",
        "id": "00000000000000ab:7",
        "offset": 7,
        "source": "s",
        "dp_rank": 0,
        "seq": "3",
        "ts": 1.5,
    }
    bad_events = [
        {**event, "block_hashes": [15760518052499183552]},  # a hash as a number
        {**event, "token_ids": [1, "2"]},
        {**event, "token_ids": [1, True]},
        {k: v for k, v in event.items() if k != "medium"},
        {"type": "BlockRemoved", "block_hashes": ["AB"], "medium": "GPU", "tier": "GPU"},  # hex is lowercase
        {"type": "BlockRemoved", "block_hashes": ["ab"], "medium": "GPU"},  # no tier
        {**event, "tier": "SSD"},  # not a tier
    ]
    bad_messages = [
        {**batch, "events": [], "extra": 1},  # envelopes are closed
        {**batch, "events": [], "id": "ab-7"},
        {**batch, "events": [], "seq": 3},  # an engine seq is a decimal string
        {**batch, "events": [], "seq": "1.5e18"},
        {"type": "notice", "kind": "slow_consumer", "reason": "x", "offset": 3},
        {"type": "hello", "epoch": "ab", "offset": 1, "recovered": True, "sources": [], "occupancy": {}},
    ]
    fresh = SchemaCheck(json.loads(SCHEMA_FILE.read_bytes()))
    fresh.collect(json.dumps({**batch, "events": [event, {"type": "AllBlocksCleared"}, {"type": "Other", "x": [1]}]}))
    assert fresh.flush() == 1
    for index, bad in enumerate(bad_events):
        fresh.collect(json.dumps({**batch, "offset": 100 + index, "events": [event, bad]}))
        with pytest.raises(AssertionError, match="does not follow the schema"):
            fresh.flush()
    for bad in bad_messages:
        fresh.collect(json.dumps(bad))
        with pytest.raises(AssertionError, match="does not follow the schema"):
            fresh.flush()


async def refused_ws(gateway: GatewayProcess, query: str = "", **kwargs: Any) -> Any:
    """The HTTP response that refused a WebSocket handshake."""
    url = gateway.ws_url + (f"?{query}" if query else "")
    with pytest.raises(InvalidStatus) as refused:
        ws = await connect(url, proxy=None, open_timeout=15, **kwargs)
        await ws.close()
    return refused.value.response


def rejections(gateway: GatewayProcess) -> Counter[tuple[str, str]]:
    """kvgateway_client_rejections_total by (transport, reason)."""
    samples = metric_values(gateway.base, "kvgateway_client_rejections_total")
    return Counter({(dict(labels)["transport"], dict(labels)["reason"]): int(v) for labels, v in samples.items()})


def test_a_token_is_required_on_every_v1_endpoint_and_never_logged(guarded: GatewayProcess) -> None:
    unauthorized = {"error": "missing or invalid token"}
    before = rejections(guarded)
    wrong = [
        ({}, ""),  # no token at all
        ({"Authorization": "Bearer not-the-token"}, ""),
        ({}, "token=not-the-token"),
    ]

    async def body() -> None:
        for headers, query in wrong:
            response = await refused_ws(guarded, query, additional_headers=headers)
            assert response.status_code == 401
            assert json.loads(response.body) == unauthorized
            assert response.headers["WWW-Authenticate"] == 'Bearer realm="kvgateway"'
        async with httpx.AsyncClient(base_url=guarded.base, timeout=10, trust_env=False) as http:
            for headers, query in wrong:
                for path in ("/v1/events", "/v1/sources", "/v1/occupancy", "/v1/schema"):
                    response = await http.get(path + (f"?{query}" if query else ""), headers=headers)
                    assert (response.status_code, response.json()) == (401, unauthorized), path
                    assert response.headers["www-authenticate"] == 'Bearer realm="kvgateway"'
            for path in ("/healthz", "/metrics"):  # open: probes and Prometheus carry no token
                assert (await http.get(path)).status_code == 200
            for headers, query in [({"Authorization": f"Bearer {TOKEN}"}, ""), ({}, f"token={TOKEN}")]:
                suffix = f"?{query}" if query else ""
                sources = await http.get("/v1/sources" + suffix, headers=headers)
                assert (sources.status_code, sources.json()["epoch"]) == (200, guarded.epoch())
                occupancy = await http.get("/v1/occupancy" + suffix, headers=headers)
                assert occupancy.status_code == 200
                assert [(s["source"], s["dp_rank"]) for s in occupancy.json()["streams"]] == [("llama", 0)]
                schema = await http.get("/v1/schema" + suffix, headers=headers)
                assert (schema.status_code, schema.content) == (200, SCHEMA_FILE.read_bytes())
        async with Clients(guarded) as clients:
            by_header, _ = await clients.ws()
            by_query, _ = await clients.ws(f"token={TOKEN}", token=False)
            for conn in (by_header, by_query):
                check_fresh_hello(conn, guarded.epoch(), 0)
                await conn.wait_messages(2)
                assert conn.close is not None
                await conn.close()
            await guarded.wait_clients(0)
            sse_by_header = await clients.sse()
            sse_by_query = await clients.sse(f"token={TOKEN}", token=False)
            for conn in (sse_by_header, sse_by_query):
                check_fresh_hello(conn, guarded.epoch(), 0)
                await conn.wait_messages(2)
                check_sse_framing(conn)
                assert conn.close is not None
                await conn.close()
            await guarded.wait_clients(0)

    arun(body(), BODY_WITHIN)
    after = rejections(guarded)
    assert after[("ws", "unauthorized")] - before[("ws", "unauthorized")] == 3
    assert after[("sse", "unauthorized")] - before[("sse", "unauthorized")] == 3
    assert after[("http", "unauthorized")] - before[("http", "unauthorized")] == 9
    log = guarded.proc.output()
    assert TOKEN not in log
    assert "token=[redacted]" in log  # the WebSocket access line was written, without the token


def test_origin_allow_list(guarded: GatewayProcess, live: GatewayProcess) -> None:
    """WebSocket Origin: the allow-list and the gateway's own origin (its dashboard); no Origin
    (not a browser) is fine; anything else is 403 before the upgrade, before the token is looked at."""
    forbidden = {"error": "origin not allowed"}
    before = {gateway.port: rejections(gateway) for gateway in (guarded, live)}

    async def body() -> None:
        cases = [
            (guarded, ALLOWED_ORIGIN, True),
            (guarded, None, True),
            (guarded, guarded.origin, True),  # the allow-list adds to the gateway's own origin
            (guarded, "http://evil.example", False),
            (live, live.origin, True),
            (live, None, True),
            (live, "http://evil.example", False),
            (live, f"http://127.0.0.1:{live.port + 1}", False),
            (live, "null", False),
        ]
        for gateway, origin, allowed in cases:
            async with Clients(gateway) as clients:
                if allowed:
                    conn, _ = await clients.ws(origin=origin)
                    check_fresh_hello(conn, gateway.epoch(), 0)
                else:
                    headers = gateway.headers()
                    response = await refused_ws(gateway, origin=origin, additional_headers=headers)
                    assert (response.status_code, json.loads(response.body)) == (403, forbidden), origin
            await gateway.wait_clients(0)
        # the origin is checked first: a foreign page is refused even without a token
        response = await refused_ws(guarded, origin="http://evil.example")
        assert response.status_code == 403

    arun(body(), BODY_WITHIN)
    after = {gateway.port: rejections(gateway) for gateway in (guarded, live)}
    assert after[guarded.port][("ws", "forbidden_origin")] - before[guarded.port][("ws", "forbidden_origin")] == 2
    assert after[live.port][("ws", "forbidden_origin")] - before[live.port][("ws", "forbidden_origin")] == 3
    assert after[guarded.port][("ws", "unauthorized")] == before[guarded.port][("ws", "unauthorized")]


def test_max_clients(guarded: GatewayProcess) -> None:
    """--max-clients 2: a third SSE client gets 503, a third WebSocket is closed with 1013."""
    before = rejections(guarded)

    async def body() -> None:
        await guarded.wait_clients(0)
        async with Clients(guarded) as clients:
            first_sse = await clients.sse()
            first_ws, _ = await clients.ws()
            async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
                response = await http.get(f"{guarded.base}/v1/events", headers=guarded.headers())
            assert (response.status_code, response.json()) == (503, {"error": "too many clients"})
            assert response.headers["retry-after"] == "5"
            third, _ = await clients.ws(wait_hello=False)
            await third.wait_ended()
            assert (third.close_code, third.close_reason, third.messages) == (1013, "too many clients", [])
            # a place frees up: the next client gets in
            assert first_ws.close is not None
            await first_ws.close()
            await guarded.wait_clients(1)
            again, _ = await clients.ws()
            check_fresh_hello(again, guarded.epoch(), first_ws.last_offset)
            await first_sse.wait_messages(2)
            check_sse_framing(first_sse)
        await guarded.wait_clients(0)

    arun(body(), BODY_WITHIN)
    after = rejections(guarded)
    assert after[("sse", "too_many_clients")] - before[("sse", "too_many_clients")] == 1
    assert after[("ws", "too_many_clients")] - before[("ws", "too_many_clients")] == 1


_ACCEPTED = "(accepted: source, dp_rank, type, medium, last_event_id, snapshot, compat, digest, token)"


BAD_QUERIES = [
    ("sources=llama", f"unknown query parameter 'sources' {_ACCEPTED}"),
    ("Source=llama", f"unknown query parameter 'Source' {_ACCEPTED}"),
    ("dp_rank=-1", "dp_rank: expected a non-negative integer, got '-1'"),
    ("dp_rank=0&dp_rank=one", "dp_rank: expected a non-negative integer, got 'one'"),
    ("source=llama&source=mistral", "source: unknown source 'mistral'"),
    ("dp_rank=0&dp_rank=99", "dp_rank: no configured stream has rank 99 (ranks: 0-1)"),
    ("source=qwen&dp_rank=1", "dp_rank: no configured stream of source 'qwen' has rank 1 (ranks: 0)"),
    ("medium=", "medium: expected a medium name (letters, digits, _.:-), got ''"),
    ("type=Block%20Stored", "type: expected an event type name (letters, digits, _.:-), got 'Block Stored'"),
    ("last_event_id=a:1&last_event_id=a:2", "last_event_id: given more than once"),
    ("compat=gap_until", "compat: expected gap_last or int_seqs, got 'gap_until'"),
]


def test_invalid_query_parameters_are_a_400_before_any_stream(live: GatewayProcess) -> None:
    before = rejections(live)

    async def body() -> None:
        async with httpx.AsyncClient(base_url=live.base, timeout=10, trust_env=False) as http:
            for query, error in BAD_QUERIES:
                response = await http.get(f"/v1/events?{query}")
                assert (response.status_code, response.json()) == (400, {"error": error}), query
                assert response.headers["content-type"] == "application/json"
                ws_response = await refused_ws(live, query)
                assert (ws_response.status_code, json.loads(ws_response.body)) == (400, {"error": error}), query

    arun(body(), BODY_WITHIN)
    after = rejections(live)
    assert after[("sse", "bad_request")] - before[("sse", "bad_request")] == len(BAD_QUERIES)
    assert after[("ws", "bad_request")] - before[("ws", "bad_request")] == len(BAD_QUERIES)


ROUTES_ACCEPT = {
    "/v1/events": "source, dp_rank, type, medium, last_event_id, snapshot, compat, digest, token",
    "/v1/sources": "source, dp_rank, compat, token",
    "/v1/occupancy": "source, dp_rank, token",
    "/v1/analytics": "source, dp_rank, token",
    "/v1/history": "source, dp_rank, medium, since, step, token",
    "/v1/blocks": "source, dp_rank, format, token",
    "/v1/lookup": "source, dp_rank, token",
    "/v1/schema": "token",
}

"""What each route's 400 lists as accepted: exactly what that route takes (docs/protocol.md)."""


async def _ask(http: httpx.AsyncClient, route: str, query: str) -> httpx.Response:
    if route == "/v1/lookup":
        return await http.post(f"{route}?{query}", json={"block_hashes": ["1"]})
    return await http.get(f"{route}?{query}")


def test_every_route_refuses_a_parameter_it_does_not_take_and_lists_what_it_takes(live: GatewayProcess) -> None:
    before = rejections(live)
    refused = 0

    async def body() -> None:
        nonlocal refused
        async with httpx.AsyncClient(base_url=live.base, timeout=10, trust_env=False) as http:
            for route, accepted in ROUTES_ACCEPT.items():
                response = await _ask(http, route, "sources=llama")
                expected = {"error": f"unknown query parameter 'sources' (accepted: {accepted})"}
                assert (response.status_code, response.json()) == (400, expected), route
                refused += 1
                # a name of the stream that this route does not take is unknown here too
                for name in ("type", "medium", "last_event_id", "snapshot", "compat", "since", "format"):
                    if name in accepted.split(", "):
                        continue
                    response = await _ask(http, route, f"{name}=x")
                    expected = {"error": f"unknown query parameter '{name}' (accepted: {accepted})"}
                    assert (response.status_code, response.json()) == (400, expected), (route, name)
                    refused += 1
                # a bad value of a parameter the route does take names it
                if "dp_rank" in accepted:
                    response = await _ask(http, route, "dp_rank=-1")
                    assert response.json() == {"error": "dp_rank: expected a non-negative integer, got '-1'"}, route
                    refused += 1

    arun(body(), BODY_WITHIN)
    after = rejections(live)
    counted = sum(after[(t, "bad_request")] - before[(t, "bad_request")] for t in ("http", "sse"))
    assert counted == refused


def test_sources_gives_last_seq_as_a_string_and_as_a_number_only_with_compat_int_seqs(live: GatewayProcess) -> None:
    live.wait_last_seq("qwen", 1)
    plain, numbers = live.get("/v1/sources").json(), live.get("/v1/sources?compat=int_seqs").json()
    assert {type(s["last_seq"]) for s in plain["sources"]} == {str}
    assert all(s["last_seq"].isdigit() for s in plain["sources"])
    assert {type(s["last_seq"]) for s in numbers["sources"]} == {int}
    assert _keys(numbers["sources"]) == _keys(plain["sources"])
    refused = live.get("/v1/sources?compat=ints")
    assert (refused.status_code, refused.json()) == (
        400,
        {"error": "compat: expected gap_last or int_seqs, got 'ints'"},
    )


def test_a_filter_that_names_what_is_not_configured_is_a_400_on_every_route(live: GatewayProcess) -> None:
    """One rule for source and dp_rank (docs/protocol.md): each value must name what the
    configuration has, on the REST routes as on the streams (issue 33, item 8: ``dp_rank=99``
    was a 200 with no streams, ``source=nope`` a 400)."""
    refusals = {
        "source=nope": "source: unknown source 'nope'",
        "dp_rank=99": "dp_rank: no configured stream has rank 99 (ranks: 0-1)",
        "source=qwen&dp_rank=1": "dp_rank: no configured stream of source 'qwen' has rank 1 (ranks: 0)",
    }

    async def body() -> None:
        async with httpx.AsyncClient(base_url=live.base, timeout=10, trust_env=False) as http:
            for route, accepted in ROUTES_ACCEPT.items():
                if "dp_rank" not in accepted:
                    continue
                for query, error in refusals.items():
                    response = await _ask(http, route, query)
                    assert (response.status_code, response.json()) == (400, {"error": error}), (route, query)
            for query, error in refusals.items():
                ws_response = await refused_ws(live, query)
                assert (ws_response.status_code, json.loads(ws_response.body)) == (400, {"error": error}), query

    arun(body(), BODY_WITHIN)


def _keys(entries: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(entry["source"], entry["dp_rank"]) for entry in entries]


def test_every_per_stream_route_applies_the_streams_source_and_dp_rank(live: GatewayProcess) -> None:
    every = [("llama", 0), ("llama", 1), ("qwen", 0)]
    selections = {
        "": every,
        "source=qwen": [("qwen", 0)],
        "source=llama&dp_rank=1": [("llama", 1)],
        "dp_rank=0": [("llama", 0), ("qwen", 0)],
        "source=llama&source=qwen&dp_rank=1": [("llama", 1)],
    }

    async def body() -> None:
        async with httpx.AsyncClient(base_url=live.base, timeout=10, trust_env=False) as http:
            for query, expected in selections.items():
                sources = (await http.get(f"/v1/sources?{query}")).json()["sources"]
                assert sorted(_keys(sources)) == expected, query
                occupancy = (await http.get(f"/v1/occupancy?{query}")).json()
                assert _keys(occupancy["streams"]) == expected, query
                # the sums are over the streams listed
                blocks = sum(s["tiers"]["GPU"]["blocks"] for s in occupancy["streams"] if "GPU" in s["tiers"])
                assert occupancy["tiers"].get("GPU", {"blocks": 0})["blocks"] == blocks, query
                assert occupancy["tiers"].get("GPU", {"streams": 0})["streams"] == len(expected), query
                analytics = (await http.get(f"/v1/analytics?{query}")).json()
                assert _keys(analytics["streams"]) == expected, query
                assert analytics["prefixes"]["engines"] == len(expected), query  # every one is up
                history = (await http.get(f"/v1/history?{query}")).json()
                assert _keys(history["streams"]) == expected, query
                blocks_doc = (await http.get(f"/v1/blocks?{query}")).json()
                assert _keys(blocks_doc["streams"]) == expected, query
                lookup = (await http.post(f"/v1/lookup?{query}", json={"block_hashes": ["1"]})).json()
                assert sorted(_keys(lookup["streams"])) == expected, query

    arun(body(), BODY_WITHIN)


_RATE = re.compile(rb'"(stores|removes)_per_s":(-?[0-9.e+-]+)')


def test_rates_are_rounded_to_thousandths_in_the_occupancy_snapshot(live: GatewayProcess) -> None:
    # the rates are sums of per-second counts over a window: as floats they print as 1185.1999999999998
    raw = httpx.get(f"{live.base}/v1/occupancy", timeout=10, trust_env=False).content
    rates = [float(m.group(2)) for m in _RATE.finditer(raw)]
    assert len(rates) >= 20 and any(r > 0 for r in rates)
    too_long = [m.group(0) for m in _RATE.finditer(raw) if len(m.group(2).partition(b".")[2]) > 3]
    assert not too_long, too_long[:5]


def test_an_inbound_websocket_message_above_64_kib_closes_with_1009(live: GatewayProcess) -> None:
    async def body() -> None:
        async with Clients(live) as clients:
            conn, ws = await clients.ws()
            await conn.wait_messages(2)
            await ws.send("x" * 65536)  # at the limit: read and ignored
            await asyncio.wait_for(await ws.ping(), 10)  # the gateway read past it and is still there
            received = len(conn.messages)
            await conn.wait_messages(received + 2)
            assert not conn.ended
            await ws.send("x" * 65537)
            await conn.wait_ended()
            assert conn.close_code == 1009
            assert_contiguous(conn, conn.hello["offset"] + 1)

    arun(body(), BODY_WITHIN)


def test_the_schema_endpoint_serves_the_packaged_json_schema(live: GatewayProcess) -> None:
    response = httpx.get(f"{live.base}/v1/schema", timeout=10, trust_env=False)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/schema+json"
    assert response.content == SCHEMA_FILE.read_bytes()
    schema = response.json()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    assert {"hello", "batch", "notice", "BlockStored", "BlockRemoved", "AllBlocksCleared"} <= set(schema["$defs"])


def test_the_garbage_collectors_pauses_are_timed_from_the_start(live: GatewayProcess) -> None:
    """kvgateway_gc_pause_seconds: every generation from the start, and a fed gateway's young
    collections timed. The full collection that freezes start-up's heap comes before the streams
    open (kvgateway.serve.server.start_up_built), before the timer: no client or batch waits on it."""

    def counts() -> dict[str, float]:
        samples = metric_values(live.base, "kvgateway_gc_pause_seconds_count")
        return {dict(labels)["generation"]: value for labels, value in samples.items()}

    assert set(counts()) == {"0", "1", "2"}
    wait_until(lambda: counts()["0"] > 0, timeout=WITHIN, what="a young collection while batches flow")
    total = sum(metric_values(live.base, "kvgateway_gc_pause_seconds_sum").values())
    assert 0 < total < 5  # seconds: the whole module's collections, not one pause of that size
