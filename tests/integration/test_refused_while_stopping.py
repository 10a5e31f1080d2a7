"""A client that comes while the gateway is stopping (its hub closed, its port still open) is told
so, as the clients it had are: close 1012 `gateway shutting down` over WebSocket, HTTP 503 with
that error over SSE, each counted as a `shutdown` rejection. One process in this process, served
by a real uvicorn on a loopback port, real clients."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import uvicorn
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from kvgateway.gateway import OneProcess, one_process_app
from tests.support import free_port
from tests.support.command_line import serve_settings
from tests.support.metrics import scrape, total


async def _scenario(port: int, gateway: OneProcess) -> tuple[tuple[int, str], httpx.Response, dict[str, float]]:
    config = uvicorn.Config(one_process_app(gateway), host="127.0.0.1", port=port, log_config=None, lifespan="on")
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    base = f"http://127.0.0.1:{port}"
    try:
        while not server.started:  # uvicorn's Server has a flag to poll, no event
            if serving.done():
                serving.result()  # its start failed: say why
                raise AssertionError("uvicorn returned before it started")
            await asyncio.sleep(0.01)
        url = f"ws://127.0.0.1:{port}/v1/ws"
        async with connect(url) as before:  # a client while it runs gets its hello
            assert '"type":"hello"' in str(await asyncio.wait_for(before.recv(), 10))
        gateway.serving.hub.close()  # what a signal's shutdown does first
        async with connect(url) as late:
            with contextlib.suppress(ConnectionClosed):
                while True:
                    await asyncio.wait_for(late.recv(), 10)
            assert late.close_code is not None
            closed = (late.close_code, late.close_reason or "")
        async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
            refused = await http.get(f"{base}/v1/events")
        samples = await asyncio.to_thread(scrape, base)  # a blocking client, off the server's loop
        name = "kvgateway_client_rejections_total"
        counted = {why: total(samples, name, reason=why) for why in ("shutdown", "too_many_clients")}
        return closed, refused, counted
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)


def test_a_client_that_comes_while_the_gateway_stops_is_told_it_is_shutting_down() -> None:
    port = free_port()
    settings = serve_settings("--source", f"name=absent,endpoint=tcp://127.0.0.1:{free_port()}", "--port", str(port))
    closed, refused, counted = asyncio.run(_scenario(port, OneProcess(settings)))
    assert closed == (1012, "gateway shutting down")
    assert (refused.status_code, refused.json(), refused.headers["retry-after"]) == (
        503,
        {"error": "gateway shutting down"},
        "5",
    )
    assert counted == {"shutdown": 2.0, "too_many_clients": 0.0}  # one WebSocket, one SSE
