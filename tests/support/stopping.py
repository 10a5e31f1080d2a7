"""A gateway whose hub is closed, as a signal's shutdown closes it first, while its port is still
open: what a client that comes then is told. The role (one process or an edge) runs in this
process, under a real uvicorn on a loopback port, with real clients."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import uvicorn
from starlette.applications import Starlette
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from kvgateway.serve.role import Role
from kvgateway.serve.serving import Serving
from tests.support.metrics import scrape, total


@dataclass
class Refused:
    closed: tuple[int, str]
    """The WebSocket's close code and reason."""
    sse: httpx.Response
    """The SSE request's answer."""
    counted: dict[str, float]
    """``kvgateway_client_rejections_total`` by reason (``shutdown``, ``too_many_clients``)."""


async def refused_while_stopping(port: int, role: Role, serving: Serving, app: Callable[[], Starlette]) -> Refused:
    """``app()`` served on ``port`` (its lifespan starts ``role``): a WebSocket client gets its hello,
    then ``serving``'s hub is closed and a WebSocket and an SSE client come."""
    config = uvicorn.Config(app(), host="127.0.0.1", port=port, log_config=None, lifespan="on")
    server = uvicorn.Server(config)
    served = asyncio.ensure_future(server.serve())
    base = f"http://127.0.0.1:{port}"
    try:
        while not server.started:  # uvicorn's Server has a flag to poll, no event
            if served.done():
                served.result()  # its start failed: say why
                raise AssertionError(f"uvicorn returned before it started ({role!r})")
            await asyncio.sleep(0.01)
        url = f"ws://127.0.0.1:{port}/v1/ws"
        async with connect(url) as before:  # a client while it runs gets its hello
            assert '"type":"hello"' in str(await asyncio.wait_for(before.recv(), 10))
        serving.hub.close()  # what a signal's shutdown does first
        async with connect(url) as late:
            with contextlib.suppress(ConnectionClosed):
                while True:
                    await asyncio.wait_for(late.recv(), 10)
            assert late.close_code is not None
            closed = (late.close_code, late.close_reason or "")
        async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
            sse = await http.get(f"{base}/v1/events")
        samples = await asyncio.to_thread(scrape, base)  # a blocking client, off the server's loop
        name = "kvgateway_client_rejections_total"
        counted = {why: total(samples, name, reason=why) for why in ("shutdown", "too_many_clients")}
        return Refused(closed, sse, counted)
    finally:
        server.should_exit = True
        await asyncio.wait_for(served, 30)


def check_refused(refused: Refused) -> None:
    """Told it is shutting down, over both transports, each counted as such."""
    assert refused.closed == (1012, "gateway shutting down"), refused.closed
    sse = refused.sse
    answer = (sse.status_code, sse.json(), sse.headers.get("retry-after"))
    assert answer == (503, {"error": "gateway shutting down"}, "5"), answer
    assert refused.counted == {"shutdown": 2.0, "too_many_clients": 0.0}, refused.counted  # a WebSocket, an SSE
