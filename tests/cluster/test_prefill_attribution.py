"""Where the prefill goes, in both modes: two real publishers (fake engines on real ZeroMQ sockets)
go through a scripted sequence, read at once by one ``kvgateway serve`` and by a cluster (ingest on
a real nats-server, an edge); each reader counts exactly the tokens expected per origin, every
origin at least once, one of them the same content under another hash family."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest
import zmq

from tests.support import (
    GatewayProcess,
    Start,
    free_ports,
    scrape,
    source_spec,
    start_gateway,
    start_ingest_and_edge,
    wait_until,
)
from tests.support.fake_engine import FakeEngine
from tests.support.metrics import total
from tests.support.nats import NatsServer

pytestmark = pytest.mark.timeout(180)

SIZE = 4
T0 = time.time()


def _stored(*hashes: int, tokens: list[int], parent: int | None = None, medium: str = "GPU") -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": SIZE,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
    }


def _removed(*hashes: int) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU"}


def _toks(first: int, blocks: int) -> list[int]:
    return list(range(first, first + blocks * SIZE))


PROMPT = _toks(100, 2)
SEED_PROBE = _toks(500, 1)
SHARED = _toks(700, 2)

# (engine, engine seconds after T0, events): applied one after the other by every reader
SCRIPT: list[tuple[str, float, list[dict[str, Any]]]] = [
    ("a", 0, [_stored(1, 2, tokens=PROMPT)]),  # new 8
    ("a", 1, [_stored(1, tokens=PROMPT[:SIZE])]),  # hit 4 (full report mode re-announces)
    ("a", 2, [_stored(3, tokens=_toks(300, 1), medium="CPU")]),  # a tier movement: not counted
    ("a", 3, [_stored(3, tokens=_toks(300, 1))]),  # offloaded 4
    ("a", 10, [_removed(2)]),
    ("a", 20, [_stored(2, parent=1, tokens=PROMPT[SIZE:])]),  # refetch 4 (10 s after its eviction)
    ("b", 21, [_stored(1, 9, tokens=PROMPT[:SIZE] + _toks(900, 1))]),  # elsewhere 4 (a holds 1), new 4
    ("a", 22, [_stored(50, tokens=SEED_PROBE)]),  # new 4
    ("b", 23, [_stored(60, tokens=SEED_PROBE)]),  # the same content, another hash: elsewhere 4
    ("a", 24, [_stored(70, 71, tokens=SHARED)]),  # new 8
    ("b", 25, [_stored(80, 81, tokens=SHARED)]),  # elsewhere 8 (by content)
]
EXPECTED = {
    "a": {"hit": 4, "offloaded": 4, "refetch": 4, "elsewhere": 0, "new": 20},
    "b": {"hit": 0, "offloaded": 0, "refetch": 0, "elsewhere": 16, "new": 4},
}


def _last_seq(gateway: GatewayProcess, source: str) -> int | None:
    (entry,) = [s for s in gateway.sources()["sources"] if s["source"] == source]
    return entry["last_seq"]  # type: ignore[no-any-return]


def _prefill(gateway: GatewayProcess) -> dict[str, dict[str, int]]:
    body = gateway.get("/v1/analytics").json()
    return {s["source"]: s["prefill"]["since_start"]["tokens"] for s in body["streams"]}


def test_every_origin_counted_exactly_by_one_process_and_by_an_edge(procs: Start, nats_server: NatsServer) -> None:
    http_single, http_edge, a_pub, a_rep, b_pub, b_rep = free_ports(6, spacing=2)
    engines = {"a": FakeEngine(a_pub, a_rep), "b": FakeEngine(b_pub, b_rep)}
    try:
        for engine in engines.values():
            engine.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every reader's subscription is reported
        sources = [source_spec("a", a_pub, a_rep), source_spec("b", b_pub, b_rep)]
        single = start_gateway(procs, http_single, sources)
        _ingest, edge = start_ingest_and_edge(procs, nats_server.url, sources, http_edge)
        for engine in engines.values():
            engine.wait_subscribed()  # the single process
            engine.wait_subscribed()  # the ingest
        seqs = {"a": 0, "b": 0}
        for source, seconds, events in SCRIPT:
            seq = seqs[source]
            engines[source].publish(seq, msgspec.msgpack.encode([T0 + seconds, events, 0]))
            seqs[source] += 1
            for gateway, name in ((single, "the single process"), (edge, "the edge")):
                wait_until(
                    lambda gateway=gateway, source=source, seq=seq: _last_seq(gateway, source) == seq,
                    timeout=60,
                    what=f"{name} applied {source} seq {seq}",
                )
        for gateway in (single, edge):
            assert _prefill(gateway) == EXPECTED
            samples = scrape(gateway.base)
            for source, origins in EXPECTED.items():
                for origin, tokens in origins.items():
                    counted = total(samples, "kvgateway_stored_tokens_total", source=source, origin=origin)
                    assert counted == tokens, (gateway.base, source, origin)
        fleet = single.get("/v1/analytics").json()["prefill"]
        assert fleet["compared_by"] == "hash and content"
        assert fleet["fleet"]["since_start"]["tokens"] == {
            "hit": 4,
            "offloaded": 4,
            "refetch": 4,
            "elsewhere": 16,
            "new": 24,
        }
        assert edge.get("/v1/analytics").json()["prefill"] == fleet  # the last 5 minutes hold every store
    finally:
        for engine in engines.values():
            engine.close()
