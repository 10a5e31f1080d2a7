"""A client that comes while the gateway is stopping (its hub closed, its port still open) is told
so, as the clients it had are: close 1012 `gateway shutting down` over WebSocket, HTTP 503 with
that error over SSE, each counted as a `shutdown` rejection. One process here; an edge in
tests/cluster/test_edge_refused_while_stopping.py."""

from __future__ import annotations

import asyncio

from kvgateway.gateway import OneProcess, one_process_app
from tests.support import free_port
from tests.support.command_line import serve_settings
from tests.support.stopping import check_refused, refused_while_stopping


def test_a_client_that_comes_while_the_gateway_stops_is_told_it_is_shutting_down() -> None:
    port = free_port()
    settings = serve_settings("--source", f"name=absent,endpoint=tcp://127.0.0.1:{free_port()}", "--port", str(port))
    gateway = OneProcess(settings)
    check_refused(asyncio.run(refused_while_stopping(port, gateway, gateway.serving, lambda: one_process_app(gateway))))
