"""An edge's command line as a user meets it: a wrong URL or stream name is one line and quick, and
an edge whose NATS server is gone stops cleanly."""

from __future__ import annotations

import asyncio
import re
import time

import nats
import pytest
from nats.js import api as js_api

from kvgateway.cluster.edge import EPOCH_CHECK_SECONDS
from tests.cluster.test_cluster import edge, ingest, probe_port, sim
from tests.support import Proc, Start, free_port, source_spec
from tests.support.clients import closed_by_signal
from tests.support.nats import NatsServer

pytestmark = pytest.mark.timeout(120)


def _error_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if " ERROR " in line or "error:" in line]


def test_edge_stops_cleanly_after_nats_is_gone(procs: Start, nats_server: NatsServer) -> None:
    pub, rep, port = free_port(), free_port(), free_port()
    sim(procs, pub, rep, "--rate", "50", "--batches", "100000")
    publisher = ingest(procs, nats_server, source_spec("sim", pub, rep))
    # --port 0: the start-up line shows the probes' real port (it said 127.0.0.1:0 before the bind)
    started = publisher.wait_for(r"ingest started: probes http 127\.0\.0\.1:(\d+), streams: sim\[0\]=")
    assert started.group(1) == str(probe_port(publisher))
    # It says what it is: no client settings (it serves no clients), no "gateway started".
    assert not any("max clients" in line or "gateway started" in line for line in publisher.lines), publisher.output()
    follower = edge(procs, nats_server, None, port)
    nats_server.stop()
    follower.wait_for("nats: disconnected", timeout=20)
    # Not a synchronisation but the case itself: the edge's next epoch check, queued while NATS is
    # gone, is what nats-py's close used to write to the dead transport.
    time.sleep(EPOCH_CHECK_SECONDS * 1.5)
    assert follower.stop(20) == 0
    output = follower.output()
    assert "Traceback" not in output and "shutdown failed" not in output, output


def test_a_signal_closes_an_edges_clients_with_the_gateways_code(procs: Start, nats_server: NatsServer) -> None:
    """As in one process (tests/integration/test_startup.py): 1012 with the gateway's reason, exit 0."""
    port = free_port()
    ingest(procs, nats_server, source_spec("sim", free_port(), free_port()))
    follower = edge(procs, nats_server, None, port)
    ws_url = f"ws://127.0.0.1:{port}/v1/ws"
    assert closed_by_signal(follower, ws_url) == (1012, "gateway shutting down", 0), follower.output()


def test_edge_given_a_stream_that_does_not_exist_fails_fast(nats_server: NatsServer) -> None:
    """The server holds another stream: the name is wrong, said within seconds (not 30), in one line."""

    async def create() -> None:
        nc = await nats.connect(nats_server.url)
        await nc.jetstream().add_stream(js_api.StreamConfig(name="KVGATEWAY", subjects=["kvgateway.>"]))
        await nc.close()

    asyncio.run(create())
    began = time.monotonic()
    proc = Proc("edge", "--nats", nats_server.url, "--nats-stream", "NOPE", "--port", str(free_port()))
    lines = proc.finished_output(timeout=30)
    assert proc.popen.returncode == 1, lines
    assert time.monotonic() - began < 20, lines
    (error,) = _error_lines(lines)
    assert re.search(r"stream NOPE does not exist \(this server has KVGATEWAY; see --nats-stream\)", error), error


def test_edge_given_a_url_that_is_not_nats_says_so() -> None:
    proc = Proc("edge", "--nats", "http://127.0.0.1:4222", "--port", "0", stderr_apart=True)
    assert proc.popen.wait(30) == 2
    errors = proc.errors().strip().splitlines()
    assert len(errors) == 1 and "http:// is not NATS; give nats://HOST:PORT" in errors[0], errors
