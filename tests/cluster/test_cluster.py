"""kvgateway on NATS JetStream with real processes: a real nats-server on loopback, simulated
engines, ingest and edge processes; clients are real WebSocket clients."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvgateway.cluster import nats_link, records
from kvgateway.cluster import publisher as publishing
from kvgateway.config.cluster import NatsOptions
from kvgateway.log.records import batch_record
from kvgateway.runtime.metrics import Metrics
from tests.support import (
    BIG_QUEUE,
    Proc,
    Start,
    arun,
    events,
    free_port,
    metric,
    sim_flags,
    source_spec,
    start_sim,
    until,
    wait_until,
)
from tests.support.clients import WsCollector
from tests.support.nats import NatsServer
from tests.support.simulator import EngineWatch

pytestmark = pytest.mark.timeout(300)  # the waits below are bounds for a loaded machine


def sim(start: Start, pub: int, rep: int, *more: str) -> Proc:
    return start_sim(start, *sim_flags(pub, rep), *more)


def ingest(start: Start, nats: NatsServer, spec: str) -> Proc:
    """An ingest process that reads every source it is given at once, whatever other processes do
    (``--nats-leases false``: a hot standby, or a replacement that does not wait for a lease to run
    out; test_shards.py covers the processes that share sources through leases). Its publishes wait
    at most 2 ms for company (``--nats-linger``, reported by its publisher in its start line)."""
    flags = ("--nats-leases", "false", "--nats-linger", "0.002")
    proc = start("ingest", "--source", spec, "--nats", nats.url, "--port", "0", *flags)
    proc.wait_for(r"ingest publishing to .* \(linger 2 ms\)", timeout=30)
    return proc


def probe_port(proc: Proc) -> int:
    return int(proc.wait_for(r"probes on http://127\.0\.0\.1:(\d+)/").group(1))


def edge(start: Start, nats: NatsServer, spec: str | None, port: int, *more: str) -> Proc:
    """An edge; without ``spec`` it lists the sources the ingest processes announced."""
    sources = [] if spec is None else ["--source", spec]
    proc = start(
        "edge", *sources, "--nats", nats.url, "--port", str(port),
        "--client-queue-bytes", str(BIG_QUEUE), *more,
    )  # fmt: skip
    proc.wait_for("edge serving on", timeout=30)
    return proc


def get(port: int, path: str) -> Any:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10).json()


def ready(port: int) -> bool:
    """The edge has caught up with the stream and reaches NATS. (Its /readyz also answers 503 while
    an engine is down, as one process's does: here the engines have finished and gone.)"""
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    except httpx.TransportError:
        return False
    edge_reasons = {"catching up with the stream", "NATS disconnected"}
    return answer.status_code == 200 or not {e["reason"] for e in answer.json()["not_ready"]} & edge_reasons


def ws(port: int, query: str = "") -> WsCollector:
    return WsCollector(f"ws://127.0.0.1:{port}/v1/ws", query=query)


def batches(collector: WsCollector) -> list[dict[str, Any]]:
    return [m for _, m in list(collector.messages) if m["type"] == "batch"]


def with_offsets(collector: WsCollector) -> list[dict[str, Any]]:
    return [m for _, m in list(collector.messages) if "offset" in m]


def lost_seqs(collector: WsCollector) -> set[int]:
    return {
        seq
        for _, m in list(collector.messages)
        if m["type"] == "notice" and m["kind"] == "unrecovered_gap"
        for seq in range(m["first"], m["until"] + 1)
    }


def occupancy_blocks(port: int) -> tuple[int, list[Any]]:
    """The offset and each stream's blocks and tokens per medium (rates depend on the process's start)."""
    doc = get(port, "/v1/occupancy")
    streams = [
        (s["source"], s["dp_rank"], {name: (m["blocks"], m["tokens"]) for name, m in s["mediums"].items()})
        for s in doc["streams"]
    ]
    return doc["offset"], streams


def test_resume_across_edges_every_batch_once_and_same_index(procs: Start, nats_server: NatsServer) -> None:
    """Two ingest processes read the same engine (every batch once in the stream); a client reads
    edge A, A is SIGKILLed, the client resumes on edge B whose ring no longer holds its position
    (served from JetStream): no gap, no duplicate. A late edge and the single process reach the
    same index."""
    total = 1500
    pub, rep, port_a, port_b, port_c, port_single = (free_port() for _ in range(6))
    spec = source_spec("sim", pub, rep)
    ingests = [ingest(procs, nats_server, spec), ingest(procs, nats_server, spec)]
    single = procs("serve", "--source", spec, "--port", str(port_single))
    edge_a = edge(procs, nats_server, spec, port_a)
    edge(procs, nats_server, spec, port_b, "--ring-messages", "50")
    single.wait_for("serving on", timeout=30)
    reader = ws(port_a)
    # The engine starts once the client reads edge A: on a loaded machine the processes above took
    # longer to start than the engine took to send everything, and a live client then saw nothing.
    sim(procs, pub, rep, "--rate", "300", "--batches", str(total), "--start-delay", "3")

    wait_until(lambda: len(batches(reader)) >= 300, timeout=120, what="300 batches on edge A")
    edge_a.popen.send_signal(signal.SIGKILL)
    edge_a.popen.wait(5)
    reader.close()
    seen = with_offsets(reader)
    wait_until(
        lambda: get(port_b, "/v1/sources")["offset"] > seen[-1]["offset"] + 50,
        timeout=30,
        what="more than B's ring of 50 messages past the client's position",
    )
    resumed = ws(port_b, f"last_event_id={seen[-1]['id']}")
    assert resumed.hello["recovered"] is True
    wait_until(lambda: batches(resumed) and batches(resumed)[-1]["seq"] == total - 1, timeout=120, what="the end")
    resumed.close()
    joined = seen + with_offsets(resumed)
    offsets = [m["offset"] for m in joined]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), "a gap or a duplicate across edges"
    seqs = [m["seq"] for m in joined if m["type"] == "batch"]
    assert seqs == list(range(seqs[0], total))

    # The whole stream, read back from JetStream through B: every batch of the engine once.
    epoch = reader.hello["epoch"]
    everything = ws(port_b, f"last_event_id={epoch}:0")
    assert everything.hello["recovered"] is True
    wait_until(lambda: len(batches(everything)) >= total, timeout=60, what="the whole stream")
    time.sleep(0.3)  # not a wait for something: a duplicate, were there one, would arrive meanwhile
    everything.close()
    assert [m["seq"] for m in batches(everything)] == list(range(total))
    # Both processes sent every batch: the stream stored one copy and dropped the other by id.
    stored = sum(metric(f"http://127.0.0.1:{probe_port(p)}", "kvgateway_jetstream_published_total") for p in ingests)
    dropped = sum(metric(f"http://127.0.0.1:{probe_port(p)}", "kvgateway_jetstream_duplicates_total") for p in ingests)
    assert stored >= total and dropped >= total - 10, (stored, dropped)
    assert metric(f"http://127.0.0.1:{port_b}", "kvgateway_jetstream_applied_offset") >= everything.hello["offset"]

    # A new edge, started after the traffic (and given no sources: the ingest announced them),
    # reaches the same index at the same offset.
    edge(procs, nats_server, None, port_c)
    wait_until(lambda: ready(port_c), timeout=30, what="the late edge ready")
    wait_until(lambda: occupancy_blocks(port_c) == occupancy_blocks(port_b), timeout=15, what="C's index = B's")
    wait_until(
        lambda: occupancy_blocks(port_single)[1] == occupancy_blocks(port_b)[1],
        timeout=15,
        what="the single process's index = the edges'",
    )
    assert get(port_c, "/healthz")["epoch"] == get(port_b, "/healthz")["epoch"] == epoch
    assert [s["source"] for s in get(port_c, "/v1/sources")["sources"]] == ["sim"]


def test_nats_restart_keeps_the_epoch_and_a_lost_store_is_a_new_one(procs: Start, nats_server: NatsServer) -> None:
    pub, rep, port_a, port_b = (free_port() for _ in range(4))
    spec = source_spec("sim", pub, rep)
    sim(procs, pub, rep, "--rate", "200", "--batches", "100000", "--start-delay", "1")
    ingest_port = probe_port(ingest(procs, nats_server, spec))
    edge_a = edge(procs, nats_server, spec, port_a)
    epoch = get(port_a, "/healthz")["epoch"]
    assert get(ingest_port, "/healthz")["epoch"] == epoch  # the stream's, as the ingest publishes to it
    reader = ws(port_a)
    wait_until(lambda: len(batches(reader)) >= 100, timeout=30, what="100 batches")

    nats_server.stop()
    time.sleep(1.0)  # the scenario: NATS stays down this long
    nats_server.start()
    before = len(batches(reader))
    wait_until(lambda: len(batches(reader)) >= before + 300, timeout=40, what="batches after the restart")
    assert get(port_a, "/healthz")["epoch"] == epoch
    seen = with_offsets(reader)
    offsets = [m["offset"] for m in seen]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    seqs = [m["seq"] for m in seen if m["type"] == "batch"]
    assert seqs == sorted(set(seqs)), "batches doubled or out of order across the restart"
    # A publish in the connection the server dropped may be lost while a later one got through:
    # it is then reported as lost (never stored out of order), with the exact seqs.
    assert set(range(seqs[0], seqs[-1] + 1)) - set(seqs) == lost_seqs(reader)
    again = ws(port_a, f"last_event_id={seen[-1]['id']}")
    assert again.hello["recovered"] is True
    again.close()
    reader.close()

    # A lost store: the stream is created anew, a new epoch; the edge of the old one exits.
    nats_server.stop()
    nats_server.wipe()
    nats_server.start()
    assert edge_a.popen.wait(30) == 1
    edge(procs, nats_server, None, port_b)  # the sources announced again with the new stream
    fresh = ws(port_b, f"last_event_id={seen[-1]['id']}")
    assert fresh.hello["recovered"] is False
    assert fresh.hello["epoch"] != epoch
    assert get(ingest_port, "/healthz")["epoch"] == fresh.hello["epoch"]  # it publishes to the new stream
    assert fresh.hello["occupancy"] is not None
    assert [s["source"] for s in fresh.hello["sources"]] == ["sim"]
    fresh.close()


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return False
        except OSError:
            continue
    return True


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_serve_workers_starts_serves_and_leaves_no_orphan(procs: Start, tmp_path: Path, how: str) -> None:
    from tests.support.nats import nats_binary

    nats_binary()
    pub, rep, port = free_port(), free_port(), free_port()
    spec = source_spec("sim", pub, rep)
    sim(procs, pub, rep, "--rate", "100", "--batches", "100000")
    parent = procs("serve", "--source", spec, "--port", str(port), "--workers", "2", "--state-dir", str(tmp_path))
    parent.wait_for("with 2 edge processes", timeout=30)
    wait_until(lambda: ready(port), timeout=40, what="an edge ready")
    kids = _children(parent.popen.pid)
    assert len(kids) == 4  # nats-server, ingest, 2 edges
    epochs = {ws(port).hello["epoch"] for _ in range(6)}
    assert len(epochs) == 1
    if how == "sigterm":
        # A crashed edge is started again.
        edge_pid = next(pid for pid in kids if b"\0edge\0" in Path(f"/proc/{pid}/cmdline").read_bytes())
        os.kill(edge_pid, signal.SIGKILL)
        wait_until(lambda: len(set(_children(parent.popen.pid)) - set(kids)) == 1, timeout=20, what="a new edge")
        kids = _children(parent.popen.pid)
        assert len(kids) == 4 and edge_pid not in kids
        wait_until(lambda: ready(port), timeout=30, what="ready again")
        assert parent.stop(20) == 0
    else:
        parent.popen.send_signal(signal.SIGKILL)
        parent.popen.wait(5)
    wait_until(lambda: _gone(kids), timeout=20, what="every child gone")
    # The roles stop cleanly even when nats-server went first (the kernel's SIGTERM reaches all at once).
    output = parent.finished_output()
    assert not any("Traceback" in line or "shutdown failed" in line for line in output), "\n".join(output)


def take_over(
    procs: Start,
    nats: NatsServer,
    spec: str,
    port: int,
    *,
    engine: Callable[[], object],
    after: int,
    outage: Callable[[], object],
) -> tuple[WsCollector, Proc]:
    """An ingest and an edge with a reader, then ``engine()`` started; once the reader has
    ``after`` batches the ingest is SIGKILLed and, once ``outage()`` returns, another one starts
    (returned with the reader). The engine starts once the reader reads: on a loaded machine the
    processes took longer to start than the engine took to send everything (at 400/s)."""
    first = ingest(procs, nats, spec)
    edge(procs, nats, spec, port)
    reader = ws(port)
    engine()
    wait_until(lambda: len(batches(reader)) >= after, timeout=120, what=f"{after} batches")
    first.popen.send_signal(signal.SIGKILL)
    first.popen.wait(5)
    outage()  # the scenario: no ingest process meanwhile
    return reader, ingest(procs, nats, spec)


def test_an_ingest_taken_over_after_sigkill_and_a_resume_ahead_of_a_new_edge(
    procs: Start, nats_server: NatsServer
) -> None:
    """SIGKILL the ingest process mid-stream, start another: it continues after the last batch
    the stream holds (a gap replay from the engine): every batch once, in order. A client whose id
    is ahead of a just-started edge waits for it and resumes exactly."""
    total = 2400
    pub, rep, port_a, port_b = (free_port() for _ in range(4))
    spec = source_spec("sim", pub, rep)

    def engine() -> None:
        # --linger -1: the engine answers replays until the test ends (by default it goes 2 s after
        # its last batch, before a new ingest process started on a loaded machine could ask it).
        sim(procs, pub, rep, "--rate", "400", "--batches", str(total), "--start-delay", "2", "--linger", "-1")

    reader, _ = take_over(procs, nats_server, spec, port_a, engine=engine, after=300, outage=lambda: time.sleep(0.5))
    wait_until(lambda: batches(reader) and batches(reader)[-1]["seq"] == total - 1, timeout=120, what="the end")
    time.sleep(0.5)  # not a wait for something: a duplicate, were there one, would arrive meanwhile
    seqs = [m["seq"] for m in batches(reader)]
    # The new process replays what it missed from the engine's ROUTER, which may drop some of it
    # under load (as vLLM's does): that is accounted for, exactly, never silently missing.
    lost = lost_seqs(reader)
    assert seqs == sorted(set(seqs)), "a duplicate or a batch out of order across the takeover"
    assert set(range(seqs[0], total)) - set(seqs) == lost, "a gap no notice accounts for"
    whole = ws(port_a, f"last_event_id={reader.hello['epoch']}:0")
    wait_until(lambda: len(batches(whole)) >= total, timeout=60, what="the whole stream")
    time.sleep(0.3)  # not a wait for something: a duplicate, were there one, would arrive meanwhile
    whole.close()
    assert [m["seq"] for m in batches(whole)] == sorted(set(range(total)) - lost)

    last = with_offsets(reader)[-1]
    reader.close()
    edge(procs, nats_server, spec, port_b)  # serves at once, catching up with the stream meanwhile
    ahead = ws(port_b, f"last_event_id={last['id']}")
    assert ahead.hello["recovered"] is True
    assert ahead.hello["offset"] == last["offset"]
    ahead.close()


def test_an_ingest_outage_longer_than_the_engine_buffer_is_one_exact_loss(
    procs: Start, nats_server: NatsServer
) -> None:
    """The new ingest process continues after the last batch the stream holds (not from seq 0):
    what the engine no longer holds is one ``unrecovered_gap`` with the exact count."""
    total = 1800
    pub, rep, port = free_port(), free_port(), free_port()
    spec = source_spec("sim", pub, rep)
    buffer = 200

    flags = ["--rate", "400", "--batches", str(total), "--buffer-steps", str(buffer), "--start-delay", "2"]
    flags += ["--linger", "-1"]  # answering replays until the test ends, however late the new process
    with EngineWatch(f"tcp://127.0.0.1:{pub}") as watch:

        def outage() -> None:
            # Until the engine has gone on by twice its buffer, counted from what a subscriber of
            # its own has read at the kill (the stream holds no more than the engine published
            # then): what the new process asks for has left the buffer. A time (1.5 s at 400/s)
            # was fewer batches than the buffer holds when the engine ran late on a loaded machine.
            watch.wait_past(watch.last_seq + 2 * buffer, timeout=120)

        reader, second = take_over(
            procs, nats_server, spec, port, engine=lambda: sim(procs, pub, rep, *flags), after=200, outage=outage
        )
    wait_until(lambda: batches(reader) and batches(reader)[-1]["seq"] == total - 1, timeout=120, what="the end")
    time.sleep(0.3)  # not a wait for something: a duplicate or a late notice would arrive meanwhile
    reader.close()
    seqs = [m["seq"] for m in batches(reader)]
    assert seqs == sorted(set(seqs))
    missing = sorted(set(range(seqs[0], total)) - set(seqs))
    losses = [m for _, m in list(reader.messages) if m["type"] == "notice" and m["kind"] == "unrecovered_gap"]
    assert len(losses) == 1, losses
    (loss,) = losses
    assert (loss["first"], loss["until"], loss["count"]) == (missing[0], missing[-1], len(missing)), loss
    assert loss["reason"] == "evicted"
    second.wait_for("continuing after seq")


def test_serve_workers_on_an_existing_nats_server(procs: Start, nats_server: NatsServer, tmp_path: Path) -> None:
    """With the NATS settings that ``serve`` has no flags for given in the file and the
    environment, as one configuration serves every process: the children use them (the stream
    the edge follows, the linger the ingest publishes with), not the defaults."""
    pub, rep, port = free_port(), free_port(), free_port()
    spec = source_spec("sim", pub, rep)
    sim(procs, pub, rep, "--rate", "100", "--batches", "100000")
    config = tmp_path / "kvgateway.toml"
    config.write_text('[cluster]\nnats_stream = "POOL_A"\n')
    parent = procs(
        *("serve", "--config", str(config), "--source", spec, "--port", str(port)),
        *("--workers", "1", "--nats", nats_server.url),
        env={"KVGATEWAY_NATS_LINGER": "0.01"},
    )
    parent.wait_for("(linger 10 ms)", timeout=40)
    parent.wait_for("edge following POOL_A", timeout=40)
    wait_until(lambda: ready(port), timeout=40, what="the edge ready")
    kids = _children(parent.popen.pid)
    assert len(kids) == 2  # ingest and one edge: no private nats-server
    assert all(b"nats-server" not in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in kids)
    # ready() lets an engine-side reason pass (the engine may still be starting): the connection is
    # awaited, as the edge hears of it through the ingest's status record
    wait_until(lambda: get(port, "/v1/sources")["sources"][0]["connected"] is True, timeout=40, what="connected")
    assert parent.stop(20) == 0
    wait_until(lambda: _gone(kids), timeout=20, what="every child gone")


def test_the_publish_linger_waits_only_where_company_can_come(nats_server: NatsServer) -> None:
    """The ingest's publisher, with a linger of an hour: the first record (nothing came before it)
    is published at once, and so are two queued together (company came already); one close behind
    them waits for company (a publish sent after it on the same connection is stored before it),
    and leaves, in order, with the rest once ``LINGER_BATCH`` are queued."""
    arun(_linger_story(nats_server.url))


async def _linger_story(url: str) -> None:
    options = NatsOptions(servers=(url,), stream="LINGER", subject_prefix="linger")
    nc = await nats_link.connect(options)
    js = nc.jetstream()
    await nats_link.ensure_stream(js, options)
    metrics = Metrics()
    publisher = publishing.Publisher(nc, js, options.subject_prefix, options.stream, metrics=metrics, linger=3600.0)
    publisher.start()

    def append(*seqs: int) -> None:
        for seq in seqs:
            publisher.append(batch_record(("s", 0), seq, events.batch(ts=float(seq)), received=0.0, replayed=False))

    last = publishing.LINGER_BATCH + 2  # 0, then 1 and 2, then 3 lingering until LINGER_BATCH are queued
    try:
        append(0)
        await until(lambda: publisher.stats.published == 1, what="the first record published without a linger")
        append(1, 2)
        await until(lambda: publisher.stats.published == 3, what="two queued together published without a linger")
        append(3)
        await until(lambda: publisher._full is not None, what="the next record lingering")
        await js.publish("linger.marker", b"after record 3")  # acknowledged once stored
        assert (await js.stream_info(options.stream)).state.messages == 4  # 0, 1, 2, the marker
        append(*range(4, last + 1))
        await until(lambda: publisher.stats.published == last + 1, what="the batch sent")
        stored = [await js.get_msg(options.stream, seq) for seq in range(1, last + 3)]
        assert stored[3].subject == "linger.marker"
        decoded = [records.decode(raw.data or b"") for raw in stored if raw.subject != "linger.marker"]
        assert [record.seq for record in decoded if isinstance(record, records.WireBatch)] == list(range(last + 1))
        # three writes: record 0 alone, then 1 and 2, then 3 with the LINGER_BATCH - 1 after it
        assert metrics.registry.get_sample_value("kvgateway_jetstream_writes_total") == 3
        assert metrics.registry.get_sample_value("kvgateway_jetstream_published_total") == last + 1
    finally:
        await publisher.stop()
        await nats_link.close(nc)
