"""Cache analytics of vLLM's sha256 block hashes, in both modes: one real publisher (a fake engine
on real ZeroMQ sockets) stores, evicts and stores again chains of 32-byte hashes, read at once by
one ``kvgateway serve`` and by a cluster (ingest on a real nats-server, an edge), each process
under its own hash seed. Both follow the same chains (a byte hash is sampled by its first eight
bytes, not by its seeded ``hash()``), so both answer the same sampled lifetimes, evictions and
refetches, exactly the ones the sampling rule picks."""

from __future__ import annotations

import random
import time
from typing import Any

import msgspec
import pytest
import zmq

from kvgateway.state._analytics_py import SAMPLE, sample_key
from tests.support import (
    GatewayProcess,
    Start,
    free_ports,
    source_spec,
    start_gateway,
    start_ingest_and_edge,
    wait_until,
)
from tests.support.fake_engine import FakeEngine
from tests.support.nats import NatsServer

pytestmark = pytest.mark.timeout(180)

SIZE = 4
CHAINS = 192
AGAIN = 96  # the first chains stored again 10 s after their eviction: refetches where followed


def _stored(chain: list[bytes], first_token: int) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": chain,
        "parent_block_hash": None,
        "token_ids": list(range(first_token, first_token + SIZE * len(chain))),
        "block_size": SIZE,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def _removed(chain: list[bytes]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": chain, "medium": "GPU"}


def _last_seq(gateway: GatewayProcess) -> int | None:
    (entry,) = gateway.sources()["sources"]
    return entry["last_seq"]  # type: ignore[no-any-return]


def _tiers(gateway: GatewayProcess) -> dict[str, Any]:
    (stream,) = gateway.get("/v1/analytics").json()["streams"]
    return stream["tiers"]  # type: ignore[no-any-return]


def test_byte_hash_analytics_are_the_same_in_one_process_and_on_an_edge(
    procs: Start, nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    http_single, http_edge, pub, rep = free_ports(4, spacing=2)
    engine = FakeEngine(pub, rep)
    try:
        engine.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every reader's subscription is reported
        sources = [source_spec("a", pub, rep)]
        monkeypatch.setenv("PYTHONHASHSEED", "1")
        single = start_gateway(procs, http_single, sources)
        monkeypatch.setenv("PYTHONHASHSEED", "2")
        _ingest, edge = start_ingest_and_edge(procs, nats_server.url, sources, http_edge)
        engine.wait_subscribed()  # the single process
        engine.wait_subscribed()  # the ingest
        rng = random.Random(11)
        chains = [[rng.randbytes(32), rng.randbytes(32)] for _ in range(CHAINS)]
        t0 = time.time()
        script = [
            (t0, [_stored(chain, 1_000 * i) for i, chain in enumerate(chains)]),
            (t0 + 3, [_removed(chain) for chain in chains]),
            (t0 + 13, [_stored(chain, 1_000 * i) for i, chain in enumerate(chains[:AGAIN])]),
        ]
        seq = -1
        for ts, events in script:
            for start in range(0, len(events), 32):
                seq += 1
                engine.publish(seq, msgspec.msgpack.encode([ts, events[start : start + 32], 0]))
        for gateway, name in ((single, "the single process"), (edge, "the edge")):
            wait_until(lambda gateway=gateway: _last_seq(gateway) == seq, timeout=60, what=f"{name} applied seq {seq}")
        followed = [chain for chain in chains if sample_key(chain[0]) % SAMPLE == 0]
        again = [chain for chain in chains[:AGAIN] if sample_key(chain[0]) % SAMPLE == 0]
        assert followed and again  # the seeded chains follow some of each
        tiers = _tiers(single)
        assert tiers == _tiers(edge)
        gpu = tiers["GPU"]
        assert gpu["sampled_evictions"] == gpu["sampled_lifetimes"] == 2 * len(followed)
        assert gpu["refetches"] == 2 * len(again)
        assert gpu["lifetime_buckets"]["5.0"] == 2 * len(followed)  # 3 s each, by the engine's clock
    finally:
        engine.close()
