"""Index checkpoints on a real nats-server: an edge started after the stream's retention dropped
its beginning starts from the latest checkpoint and holds exactly what an edge that ran from the
start holds at the same offset; with checkpoints off it says, everywhere, that its index is
incomplete (``stale``, ``history_truncated``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.support import GatewayProcess, Start, free_ports, start_sim, wait_until
from tests.support.clients import WsCollector
from tests.support.nats import NatsServer

pytestmark = pytest.mark.timeout(300)  # the waits below are bounds for a loaded machine

RETENTION = 4.0  # seconds: the stream drops its beginning while the engine still publishes
RATE = 100
BATCHES = 1000


def _edge(procs: Start, nats: NatsServer, port: int, *flags: str, wait: bool = True) -> GatewayProcess:
    proc = procs("edge", "--nats", nats.url, "--host", "127.0.0.1", "--port", str(port), *flags)
    if wait:
        proc.wait_for("edge serving on", timeout=120)
    return GatewayProcess(proc, port)


def _same_offset(a: GatewayProcess, b: GatewayProcess, path: str, within: float = 120.0) -> tuple[Any, Any]:
    """``path`` of both edges, read until both answers are at the same offset (status heartbeats
    keep the stream moving a little after the engine stopped)."""
    found: list[tuple[Any, Any]] = []

    def same() -> bool:
        first, second = a.get(path).json(), b.get(path).json()
        if first["offset"] != second["offset"]:
            return False
        found.append((first, second))
        return True

    wait_until(same, timeout=within, interval=0.05, what=f"{path} of both edges at one offset")
    return found[-1]


def _blocks(document: dict[str, Any]) -> dict[str, Any]:
    """/v1/blocks with each stream's blocks as a sorted list: their order is a set's, which depends
    on how each process's set grew."""
    streams = [{**s, "blocks": sorted(json.dumps(b, sort_keys=True) for b in s["blocks"])} for s in document["streams"]]
    return {**document, "streams": streams}


def _without_rates(value: Any) -> Any:
    """A document without its per-second rates (each edge counts them since its own start) and the
    fleet facts (counted in the background, each edge at its own moment)."""
    if isinstance(value, dict):
        return {k: _without_rates(v) for k, v in value.items() if not k.endswith("_per_s") and k != "fleet"}
    if isinstance(value, list):
        return [_without_rates(v) for v in value]
    return value


def _hello(gateway: GatewayProcess) -> dict[str, Any]:
    with WsCollector(gateway.ws_url) as ws:
        return ws.hello


def test_a_late_edge_starts_from_the_checkpoint_and_one_without_checkpoints_says_it_is_stale(
    procs: Start, nats_server: NatsServer
) -> None:
    early_port, late_port, blind_port, pub, replay = free_ports(5, spacing=2)
    source = f"name=sim,endpoint=tcp://127.0.0.1:{pub},replay=tcp://127.0.0.1:{replay}"
    retention = ["--nats-retention", str(RETENTION), "--nats-duplicate-window", "1"]
    ingest = procs("ingest", "--source", source, "--nats", nats_server.url, "--port", "0", *retention)
    # The early edge starts beside the ingest and waits for its stream: started after it, on a
    # loaded machine it came up 20 s later, when the stream had dropped its first records (the
    # ingest's own) and it was history_truncated itself.
    early = _edge(procs, nats_server, early_port, "--nats-checkpoint", "0.5", wait=False)
    ingest.wait_for("ingest publishing to", timeout=120)
    early.proc.wait_for("edge serving on", timeout=120)
    start_sim(
        procs, "--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{replay}", f"--rate={RATE}",
        f"--batches={BATCHES}", "--linger=600", "--cpu-offload", "--seed=11",
    )  # fmt: skip
    # Once the stream has dropped its first records, and the early edge has written checkpoints:
    wait_until(
        lambda: early.metric("kvgateway_checkpoints_written_total") >= 2 and early.offset() > RATE * RETENTION * 1.5,
        timeout=120,  # a quiet machine: about 8 s (the engine's start and 1.5 retentions of batches)
        what="the early edge writing checkpoints past the retention",
    )
    late = _edge(procs, nats_server, late_port)
    blind = _edge(procs, nats_server, blind_port, "--nats-checkpoint", "0")
    # A quiet machine: within a second of the edge serving (the checkpoint is read as it starts).
    late.proc.wait_for(r"edge starts from the checkpoint at seq \d+", timeout=60)
    assert late.metric("kvgateway_checkpoint_loaded_offset") > 1

    # Both whole edges, at one offset after the engine's last batch: the same index, block for block.
    wait_until(lambda: late.sources()["sources"][0]["last_seq"] == BATCHES - 1, timeout=120, what="the last batch")
    blocks_early, blocks_late = _same_offset(early, late, "/v1/blocks")
    assert _blocks(blocks_late) == _blocks(blocks_early)
    assert sum(len(state["blocks"]) for state in blocks_late["streams"]) > 100, "the engine holds blocks"
    occupancy_early, occupancy_late = _same_offset(early, late, "/v1/occupancy")
    assert _without_rates(occupancy_late) == _without_rates(occupancy_early)
    assert all(not s["stale"] for s in occupancy_late["streams"])
    (status,) = late.sources()["sources"]
    assert (status["state"], status["stale"]) == ("up", False)

    # Without checkpoints the late edge cannot know what the dropped records did: it says so.
    (blind_status,) = blind.sources()["sources"]
    assert (blind_status["stale"], blind_status["stale_reason"]) == (True, "history_truncated")
    assert blind_status["state"] == "stale"
    (occupancy_stream,) = blind.get("/v1/occupancy").json()["streams"]
    assert (occupancy_stream["stale"], occupancy_stream["stale_reason"]) == (True, "history_truncated")
    (hello_status,) = _hello(blind)["sources"]
    assert hello_status["stale_reason"] == "history_truncated"
    answer = httpx.post(f"{blind.base}/v1/lookup", json={"block_hashes": ["1"]}, timeout=10).json()
    assert [s["stale"] for s in answer["streams"]] == [True]
    assert all(s["stale"] for s in blind.get("/v1/blocks").json()["streams"])
    assert blind.metric("kvgateway_index_stale", source="sim", dp_rank="0") == 1
    assert blind.metric("kvgateway_checkpoint_loaded_offset") == 0
    blind.proc.wait_for("no checkpoint covers them", timeout=60)


def test_one_writer_at_a_time_holds_the_lease_and_another_takes_it_once_it_lapses(nats_server: NatsServer) -> None:
    from kvgateway.cluster import nats_link
    from kvgateway.cluster.checkpoints import CheckpointStore
    from kvgateway.config.cluster import NatsOptions

    options = NatsOptions(servers=(nats_server.url,), stream="LEASES")

    async def scenario() -> None:
        nc = await nats_link.connect(options)
        try:
            js = nc.jetstream()
            first, second = (CheckpointStore(js, options, owner, lease_seconds=10) for owner in ("a", "b"))
            await first.open()
            await second.open()
            assert await first.hold_lease(now=100) and not await second.hold_lease(now=101)
            assert await first.hold_lease(now=105), "the holder renews"
            assert not await second.hold_lease(now=114.9), "renewed at 105: held until 115"
            assert await second.hold_lease(now=115.1) and not await first.hold_lease(now=116), "lapsed: taken over"
            assert await second.latest() is None
            await second.write("epoch", 41, b"one")
            await second.write("epoch", 42, b"two")
            found = await first.latest()
            assert found is not None and (found.pointer.offset, found.data) == (42, b"two")
        finally:
            await nats_link.close(nc)

    asyncio.run(scenario())


def test_a_checkpoint_whose_chunks_are_gone_is_left_for_its_successor_or_given_up(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race a slow edge met at start under load (it never served): the writer replaced the
    checkpoint and dropped the old one's chunks while the edge was reading them, and nats-py's read
    waits for a last chunk that never comes. The state that race leaves is made here for real (the
    object's meta still there, its chunks purged): the read moves to the successor once the pointer
    names it, and gives up after the bound when none comes."""
    from kvgateway.cluster import checkpoints, nats_link
    from kvgateway.cluster.checkpoints import CheckpointStore
    from kvgateway.config.cluster import NatsOptions

    options = NatsOptions(servers=(nats_server.url,), stream="HALFREAD")
    bucket = checkpoints.bucket_name(options)

    async def scenario() -> None:
        nc = await nats_link.connect(options)
        try:
            js = nc.jetstream()
            reader, writer = (CheckpointStore(js, options, owner, lease_seconds=10) for owner in ("r", "w"))
            await reader.open()
            await writer.open()
            await writer.write("epoch", 41, b"one" * 50_000)
            info = await (await js.object_store(bucket)).get_info("epoch-41")
            await js.purge_stream(f"OBJ_{bucket}", subject=f"$O.{bucket}.C.{info.nuid}")
            reading = asyncio.ensure_future(reader.latest())
            await asyncio.sleep(2 * checkpoints.POINTER_POLL_SECONDS)
            assert not reading.done(), "the purged object's read waits, as nats-py's does"
            await writer.write("epoch", 42, b"two")
            found = await asyncio.wait_for(reading, 120)
            assert found is not None and (found.pointer.offset, found.data) == (42, b"two")

            info = await (await js.object_store(bucket)).get_info("epoch-42")
            await js.purge_stream(f"OBJ_{bucket}", subject=f"$O.{bucket}.C.{info.nuid}")
            monkeypatch.setattr(checkpoints, "READ_SECONDS", 3.0)
            assert await asyncio.wait_for(reader.latest(), 120) is None, "no successor: started without"
        finally:
            await nats_link.close(nc)

    asyncio.run(scenario())
