"""An engine endpoint that is not ZeroMQ, read by a cluster: the ingest finds the handshake failing
and logs it once; the reason travels in the stream's status records, so an edge's /v1/sources and
/readyz give it as the single process does (tests/integration/test_not_zeromq.py)."""

from __future__ import annotations

import httpx
import pytest

from tests.support import Start, free_ports, start_ingest_and_edge, wait_until
from tests.support.fake_engine import HttpPort
from tests.support.gateway import NOT_ZEROMQ_HINT as HINT
from tests.support.gateway import down_lines, source_status
from tests.support.nats import NatsServer
from tests.support.sources import source_spec

pytestmark = pytest.mark.timeout(120)


def test_an_edge_shows_the_not_zeromq_reason_the_ingest_found(procs: Start, nats_server: NatsServer) -> None:
    (http_edge,) = free_ports(1)
    with HttpPort() as wrong:
        sources = [source_spec("wrongport", wrong.port)]
        ingest, edge = start_ingest_and_edge(procs, nats_server.url, sources, http_edge, "--log-format", "json")
        expected = f"tcp://127.0.0.1:{wrong.port} answers but {HINT}"
        wait_until(lambda: source_status(edge.base, "wrongport")["reason"] == expected, timeout=60, what="the reason")
        status = source_status(edge.base, "wrongport")
        assert (status["state"], status["connected"], status["reason_code"]) == ("down", False, "not_zeromq")
        body = httpx.get(f"{edge.base}/readyz", timeout=10).json()
        assert [(i["source"], i["reason"]) for i in body["not_ready"]] == [("wrongport", expected)]
        [line] = wait_until(lambda: down_lines(ingest, "wrongport"), what="the ingest's down line")
        assert line["level"] == "warning" and line["message"].endswith(f"({expected})")
        seen = wrong.connections
        wait_until(lambda: wrong.connections >= seen + 3, timeout=60, what="three more attempts")
        assert len(down_lines(ingest, "wrongport")) == 1
