"""One truth in both modes: the same engines, read at the same time by one ``kvgateway serve`` and
by a cluster (``kvgateway ingest`` on a real nats-server, served by ``kvgateway edge``), give the
same /v1/sources, hello and /v1/occupancy: ``degraded`` with its losses, ``stale`` with its
reason, ``down`` with the reason the gateway found, and every counter.

The engines are chosen so that two independent readers must see exactly the same: no replay
races (one engine has no replay socket, the other starts publishing only after both readers
caught up with its empty buffer), faults the engine makes itself (seqs it never sends, an
undecodable payload), and an engine that is not there at all."""

from __future__ import annotations

from typing import Any

import pytest

from kvgateway.cluster.heartbeat import INGEST_SILENCE_SECONDS
from tests.support import (
    GatewayProcess,
    Start,
    free_ports,
    start_gateway,
    start_ingest_and_edge,
    start_sim,
    wait_until,
)
from tests.support.clients import WsCollector
from tests.support.nats import NatsServer

pytestmark = pytest.mark.timeout(120)

BATCHES = 60
SKIPPED = (20, 24)  # never sent live, and no replay socket to ask: lost for good (no_replay)
GARBAGE_AT = 40  # an undecodable payload in the order: the index is stale (undecodable)

TIMING = ("lag_seconds",)
"""What two readers of the same engine may see differently: when each batch reached it."""


def _without_timing(status: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in status.items() if key not in TIMING}


def _hello(gateway: GatewayProcess) -> dict[str, Any]:
    with WsCollector(gateway.ws_url) as ws:
        return ws.hello


def _streams(occupancy: dict[str, Any]) -> list[dict[str, Any]]:
    """Each stream's blocks and state, without its rates (a rate depends on when batches came)."""
    out = []
    for stream in occupancy["streams"]:
        mediums = {name: medium["blocks"] for name, medium in stream["mediums"].items()}
        out.append({"source": stream["source"], "dp_rank": stream["dp_rank"], "stale": stream["stale"], **mediums})
    return out


EMPTY_DIGEST = "0000000000000000"


def _blocks_digests(gateway: GatewayProcess) -> dict[tuple[str, int], str]:
    return {(s["source"], s["dp_rank"]): s["digest"] for s in gateway.get("/v1/blocks").json()["streams"]}


def _message_digests(gateway: GatewayProcess) -> dict[tuple[str, int], str]:
    """The first digest message of each stream on a ``digest=1`` connection."""
    with WsCollector(gateway.ws_url, query="digest=1") as ws:
        streams = {(s["source"], s["dp_rank"]) for s in ws.hello["sources"]}

        def first() -> dict[tuple[str, int], str] | None:
            found: dict[tuple[str, int], str] = {}
            for _, m in list(ws.messages):
                if m["type"] == "digest":
                    found.setdefault((m["source"], m["dp_rank"]), m["digest"])
            return found if set(found) == streams else None

        digests: dict[tuple[str, int], str] = wait_until(first, timeout=15, what="a digest of every stream")
        return digests


def test_one_process_and_an_edge_show_the_same_statuses_counters_and_index(
    procs: Start, nats_server: NatsServer
) -> None:
    http_single, http_edge, lossy_pub, garbled_pub, garbled_replay, gone_pub = free_ports(6, spacing=2)
    sources = [
        f"name=lossy,endpoint=tcp://127.0.0.1:{lossy_pub}",
        f"name=garbled,endpoint=tcp://127.0.0.1:{garbled_pub},replay=tcp://127.0.0.1:{garbled_replay}",
        f"name=gone,endpoint=tcp://127.0.0.1:{gone_pub}",  # nothing listens there
    ]
    single = start_gateway(procs, http_single, sources)
    _ingest, edge = start_ingest_and_edge(procs, nats_server.url, sources, http_edge)

    common = ["--rate=50", f"--batches={BATCHES}", "--linger=600", "--start-delay=2", "--seed=9"]
    start_sim(procs, "--endpoint", f"tcp://*:{lossy_pub}", f"--skip={SKIPPED[0]}-{SKIPPED[1]}", *common)
    start_sim(
        procs,
        "--endpoint",
        f"tcp://*:{garbled_pub}",
        "--replay-endpoint",
        f"tcp://*:{garbled_replay}",
        f"--garbage-at={GARBAGE_AT}",
        *common,
    )

    def settled(gateway: GatewayProcess) -> bool:
        by_source = {s["source"]: s for s in gateway.sources()["sources"]}
        return (
            by_source["lossy"]["last_seq"] == BATCHES - 1
            and by_source["garbled"]["last_seq"] == BATCHES - 1
            and by_source["gone"]["reason"] not in ("never connected", None)
            and "refused" in by_source["gone"]["reason"]
        )

    for gateway, name in ((single, "the single process"), (edge, "the edge")):
        wait_until(
            lambda gateway=gateway: settled(gateway), timeout=60, what=f"{name}: every engine read, gone diagnosed"
        )

    single_sources = [_without_timing(s) for s in single.sources()["sources"]]
    edge_sources = [_without_timing(s) for s in edge.sources()["sources"]]
    assert edge_sources == single_sources
    by_source = {s["source"]: s for s in single_sources}
    lossy, garbled, gone = by_source["lossy"], by_source["garbled"], by_source["gone"]
    count = SKIPPED[1] - SKIPPED[0] + 1
    assert (lossy["state"], lossy["stale"], lossy["stale_reason"]) == ("degraded", True, "unrecovered")
    assert lossy["unrecovered_by_reason"] == {"no_replay": count}
    counters = lossy["counters"]
    assert (counters["gaps"], counters["missed"], counters["unrecovered"]) == (1, count, count)
    assert (garbled["state"], garbled["stale_reason"]) == ("stale", "undecodable")
    assert garbled["counters"]["decode_errors"] == 1
    assert (gone["state"], gone["connected"]) == ("down", False) and "refused" in gone["reason"]

    # A hello lists what /v1/sources does, in each mode.
    for gateway in (single, edge):
        hello = _hello(gateway)
        assert [_without_timing(s) for s in hello["sources"]] == single_sources
    # The index: the same blocks per stream and medium, and the same stale flags.
    assert _streams(edge.get("/v1/occupancy").json()) == _streams(single.get("/v1/occupancy").json())
    # The state digest: the same per stream in both modes, in /v1/blocks and in digest messages
    # (the engines are done: the offsets differ, the states do not).
    digests = [_blocks_digests(gateway) for gateway in (single, edge)]
    assert digests[0] == digests[1]
    assert digests[0][("lossy", 0)] != EMPTY_DIGEST  # it holds blocks: the comparison means something
    for gateway in (single, edge):
        assert _message_digests(gateway) == digests[0]


def test_a_killed_ingest_shows_on_every_edge_as_ingest_unreachable_and_a_new_one_brings_the_streams_back(
    procs: Start, nats_server: NatsServer
) -> None:
    http_a, http_b, pub, replay = free_ports(4, spacing=2)
    flags = ["--source", f"name=sim,endpoint=tcp://127.0.0.1:{pub},replay=tcp://127.0.0.1:{replay}"]
    nats = ["--nats", nats_server.url]
    start_sim(procs, "--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{replay}", "--rate=20")
    ingest = procs("ingest", *flags, *nats, "--port", "0")
    ingest.wait_for("ingest publishing to", timeout=30)
    edges = []
    for port in (http_a, http_b):
        proc = procs("edge", *nats, "--host", "127.0.0.1", "--port", str(port))  # sources: as announced
        proc.wait_for("edge serving on", timeout=30)
        edges.append(GatewayProcess(proc, port))

    def state(edge: GatewayProcess) -> tuple[str, str | None]:
        (entry,) = edge.sources()["sources"]
        return entry["state"], entry["reason"]

    for edge in edges:
        wait_until(lambda edge=edge: state(edge) == ("up", None), timeout=30, what="the stream up on the edge")
        assert edge.get("/readyz").status_code == 200
    ingest.kill()
    for edge in edges:
        wait_until(
            lambda edge=edge: state(edge) == ("down", "ingest unreachable"),
            timeout=INGEST_SILENCE_SECONDS + 10,
            what="the stream down, ingest unreachable",
        )
        ready = edge.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["not_ready"] == [{"source": "sim", "dp_rank": 0, "reason": "ingest unreachable"}]
        assert edge.metric("kvgateway_source_up", source="sim", dp_rank="0") == 0
    again = procs("ingest", *flags, *nats, "--port", "0")
    again.wait_for("ingest publishing to", timeout=30)
    for edge in edges:
        wait_until(lambda edge=edge: state(edge) == ("up", None), timeout=30, what="the stream up again")
