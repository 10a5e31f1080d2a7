"""NAIVE BRIDGE: the benchmark's baseline, NOT part of kvgateway and not for use.

This is the bridge a user writes in an afternoon starting from vLLM's example subscriber: one SUB
socket, msgspec to decode the batch, a plain ``websockets`` server, ``json.dumps`` for each client
and ``websockets.broadcast`` to send. It has no ordering (no gap detection, no replay, no restart
handling), no index, no resume, no filters, no SSE, no metrics, no authentication, and no
protection against slow clients beyond what ``broadcast`` does (it skips nothing and buffers
without bound). It exists so that :mod:`bench.fanout` can put kvgateway's fan-out next to the
obvious alternative on the same harness.

Its messages carry the fields the harness reads (``seq`` and ``ts``), so the same clients
measure both. By default it runs on the event loop kvgateway runs on (uvloop when installed), so
the comparison is about the design and not the loop; ``--loop`` is there for experiments.

``python -m bench.naive_bridge --endpoint tcp://127.0.0.1:5557 --port 8765``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import msgspec
import websockets
import zmq
import zmq.asyncio
from websockets.asyncio.server import ServerConnection, serve

from bench.common import TOPIC


async def bridge(endpoint: str, topic: str, host: str, port: int) -> None:
    clients: set[ServerConnection] = set()

    async def handler(websocket: ServerConnection) -> None:
        clients.add(websocket)
        try:
            await websocket.wait_closed()
        finally:
            clients.discard(websocket)

    context = zmq.asyncio.Context()
    sub = context.socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    decoder = msgspec.msgpack.Decoder()
    loop_name = type(asyncio.get_running_loop()).__module__.split(".")[0]  # "uvloop" or "asyncio"
    print(f"naive bridge: {loop_name} loop, ws://{host}:{port}/", file=sys.stderr, flush=True)

    async with serve(handler, host, port):
        sys.stdout.write(f"naive bridge: listening on ws://{host}:{port}/\n")
        sys.stdout.flush()
        while True:
            _topic, seq_bytes, payload = await sub.recv_multipart()
            ts, events, *rest = decoder.decode(payload)
            message: dict[str, Any] = {
                "type": "batch",
                "seq": int.from_bytes(seq_bytes, "big"),
                "ts": ts,
                "dp_rank": rest[0] if rest else None,
                "events": events,
            }
            for websocket in list(clients):
                websockets.broadcast([websocket], json.dumps(message))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.naive_bridge", description="NAIVE bridge (baseline)")
    parser.add_argument("--endpoint", required=True, help="the engine's PUB endpoint")
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--loop", choices=("asyncio", "uvloop"), default=None, help="event loop (default: the one kvgateway uses)"
    )
    args = parser.parse_args(argv)
    if args.loop is None:
        from kvgateway.serve.server import loop_factory

        args.loop = "asyncio" if loop_factory() is None else "uvloop"
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(bridge(args.endpoint, args.topic, args.host, args.port))
    else:
        asyncio.run(bridge(args.endpoint, args.topic, args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
