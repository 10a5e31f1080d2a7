"""An edge tells a client that comes while it is stopping what one process tells it
(tests/integration/test_refused_while_stopping.py): close 1012 or HTTP 503 `gateway shutting down`,
counted as a `shutdown` rejection. The edge runs in this process, on a real nats-server, after an
ingest process created the stream."""

from __future__ import annotations

import asyncio

from kvgateway.cluster.commands import EDGE
from kvgateway.cluster.edge import EdgeRole, edge_app
from tests.support import Start, free_port, source_spec
from tests.support.command_line import load_command
from tests.support.nats import NatsServer
from tests.support.stopping import check_refused, refused_while_stopping


def test_an_edge_tells_a_client_that_comes_while_it_stops_that_it_is_shutting_down(
    procs: Start, nats_server: NatsServer
) -> None:
    spec = source_spec("absent", free_port())
    ingest = procs("ingest", "--source", spec, "--nats", nats_server.url, "--port", "0", "--nats-leases", "false")
    ingest.wait_for("ingest publishing to", timeout=30)  # the stream exists
    port = free_port()
    loaded = load_command(EDGE, "--source", spec, "--nats", nats_server.url, "--port", str(port))
    edge = EdgeRole(loaded.settings, loaded.nats)
    check_refused(asyncio.run(refused_while_stopping(port, edge, edge.serving, lambda: edge_app(edge))))
