"""The dashboard on a gateway whose engine endpoint is an HTTP port: the stream's card says that the
endpoint does not speak ZeroMQ, with the hint (issue 33 item 2), as /v1/sources gives it."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from tests.browser.test_dashboard import card, open_dashboard, tid, wait_until
from tests.support.fake_engine import HttpPort
from tests.support.gateway import NOT_ZEROMQ_HINT, source_status, start_gateway
from tests.support.ports import free_port
from tests.support.processes import Start
from tests.support.sources import source_spec


def test_a_card_says_the_endpoint_does_not_speak_zeromq(procs: Start, new_page: Callable[..., Any]) -> None:
    http = free_port()
    with HttpPort() as wrong:
        gateway = start_gateway(procs, http, [source_spec("wrongport", wrong.port)])
        page = new_page()
        open_dashboard(page, SimpleNamespace(url=f"{gateway.base}/"))  # type: ignore[arg-type]
        health = page.locator(f"{card('wrongport', 0)} {tid('health')}")
        wait_until(page, lambda: NOT_ZEROMQ_HINT in health.inner_text(), timeout=60, what="the card's reason")
        assert health.inner_text() == source_status(gateway.base, "wrongport")["reason"]
        said = page.evaluate("""async () => (await import("./reasons.js")).reasonText("down", "not_zeromq")""")
        assert said == "the endpoint does not speak ZeroMQ: is it the engine's HTTP port?"
