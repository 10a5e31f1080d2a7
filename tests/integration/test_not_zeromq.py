"""An engine endpoint that is not ZeroMQ (an engine's HTTP port given by mistake): TCP connects,
ZeroMQ's handshake fails, and the gateway says so once in its log, in /readyz and /v1/sources,
with the hint, instead of "never connected" (issue 33 item 2). The cluster's edge:
tests/cluster/test_not_zeromq.py."""

from __future__ import annotations

import httpx

from tests.support.fake_engine import HttpPort
from tests.support.gateway import NOT_ZEROMQ_HINT as HINT
from tests.support.gateway import down_lines, source_status
from tests.support.ports import free_port
from tests.support.processes import Start
from tests.support.sources import source_spec
from tests.support.waits import wait_until


def test_an_http_port_as_the_engine_endpoint_is_named_not_zeromq(procs: Start) -> None:
    http = free_port()
    with HttpPort() as wrong:
        spec = source_spec("wrongport", wrong.port)
        gateway = procs("serve", "--port", str(http), "--log-format", "json", "--source", spec)
        gateway.wait_for(r"serving on")
        base = f"http://127.0.0.1:{http}"
        wait_until(lambda: HINT in source_status(base, "wrongport")["reason"], timeout=60, what="the reason")
        status = source_status(base, "wrongport")
        assert (status["state"], status["connected"], status["reason_code"]) == ("down", False, "not_zeromq")
        assert status["reason"] == f"tcp://127.0.0.1:{wrong.port} answers but {HINT}"
        body = httpx.get(f"{base}/readyz", timeout=10).json()
        assert [(i["source"], i["reason"]) for i in body["not_ready"]] == [("wrongport", status["reason"])]
        [line] = wait_until(lambda: down_lines(gateway, "wrongport"), what="the down line")
        assert line["level"] == "warning" and line["message"].endswith(f"({status['reason']})")
        # ZeroMQ tries again and again (each attempt a connection that fails its handshake): the
        # line is not repeated, and the reason stays.
        seen = wrong.connections
        wait_until(lambda: wrong.connections >= seen + 3, timeout=60, what="three more attempts")
        assert len(down_lines(gateway, "wrongport")) == 1
        assert source_status(base, "wrongport")["reason"] == status["reason"]
        assert source_status(base, "wrongport")["reason_code"] == "not_zeromq"  # the diagnosis kept it
