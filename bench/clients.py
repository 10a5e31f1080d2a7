"""Web clients for the fan-out scenarios: many WebSocket or SSE connections in one process.

``python -m bench.clients --url URL --transport ws|sse --connections N``

WebSocket connections use the ``websockets`` library's asyncio client (no compression, as the
gateway offers none); SSE connections are a small asyncio protocol reading the chunked
``text/event-stream`` response. Neither parses the JSON: a batch message is recognised by its
``"seq":"N","ts":T`` pair (the gateway's compact JSON, its seq a string; or ``json.dumps``'
spaced form with an integer seq, for the naive bridge), which is all the measurement needs:
every batch counted per connection, and its latency ``receive time - ts`` (``ts`` is the
publisher's ``time.time()`` at send; same machine, same clock).

Driven by JSON lines on stdin, one reply line each on stdout:

- at start, after connecting: ``{"ready": n, "failed": k, "errors": [...]}``;
- ``{"cmd": "window", "first": a, "last": b}``: count seqs a..b from now on (resets the counts);
- ``{"cmd": "report"}``: per-connection completeness, order, notices, and the latency histogram;
- ``{"cmd": "quit"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
from typing import Any, Final
from urllib.parse import urlsplit

import websockets
from websockets.asyncio.client import ClientConnection, connect

from bench.common import LogHistogram

BATCH: Final = re.compile(rb'"seq": ?"?(\d+)"?, ?"ts": ?([-+0-9.eE]+)')  # the gateway's seq is a string
NOTICE: Final = re.compile(rb'"type": ?"notice"')
CONNECT_CONCURRENCY: Final = 32


class Stats:
    """The measurement window shared by every connection of this process."""

    def __init__(self) -> None:
        self.first = 0
        self.last = -1
        self.hist = LogHistogram()

    def window(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.hist = LogHistogram()


class Conn:
    __slots__ = ("close_code", "count", "disorder", "last_seq", "notices", "open", "stats")

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.count = 0
        self.last_seq = -1
        self.disorder = 0
        self.notices = 0
        self.open = True
        self.close_code: int | None = None

    def reset(self) -> None:
        self.count = 0
        self.disorder = 0

    def feed(self, data: bytes, now: float) -> None:
        stats = self.stats
        first, last, hist = stats.first, stats.last, stats.hist
        for match in BATCH.finditer(data):
            seq = int(match[1])
            if seq <= self.last_seq:
                self.disorder += 1  # a duplicate or a reordering: never expected
            self.last_seq = seq
            if first <= seq <= last:
                self.count += 1
                hist.add(now - float(match[2]))
        if b'"notice"' in data:
            self.notices += len(NOTICE.findall(data))


# --- WebSocket --------------------------------------------------------------------------------


async def ws_client(url: str, conn: Conn, ready: asyncio.Future[None]) -> None:
    ws: ClientConnection
    try:
        ws = await connect(url, compression=None, max_size=None, ping_interval=None, open_timeout=60, close_timeout=2)
    except Exception as exc:
        conn.open = False
        if not ready.done():
            ready.set_exception(exc)
        return
    if not ready.done():
        ready.set_result(None)
    try:
        while True:
            data = await ws.recv(decode=False)
            conn.feed(data if isinstance(data, bytes) else data.encode(), time.time())
    except websockets.ConnectionClosed as exc:
        conn.close_code = exc.rcvd.code if exc.rcvd is not None else None
    finally:
        conn.open = False
        with contextlib.suppress(Exception):
            await ws.close()


# --- SSE --------------------------------------------------------------------------------------


class SSEProtocol(asyncio.Protocol):
    """GET a text/event-stream and feed every complete event to its :class:`Conn`."""

    def __init__(self, conn: Conn, request: bytes, ready: asyncio.Future[None]) -> None:
        self.conn = conn
        self.request = request
        self.ready = ready
        self.head = b""
        self.buffer = b""
        self.in_body = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.request)  # type: ignore[attr-defined]  # uvloop's transport is no asyncio.Transport

    def data_received(self, data: bytes) -> None:
        now = time.time()
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            status = self.head.split(b"\r\n", 1)[0]
            if b" 200 " not in status + b" ":
                if not self.ready.done():
                    self.ready.set_exception(ConnectionError(status.decode(errors="replace")))
                return
            self.in_body = True
            data = self.head[end + 4 :]
            self.head = b""
            if not self.ready.done():
                self.ready.set_result(None)
        # Each chunk of the chunked body holds whole events: cut at the last event end.
        buffer = self.buffer + data if self.buffer else data
        cut = buffer.rfind(b"\n\n")
        if cut < 0:
            self.buffer = buffer
            return
        self.buffer = buffer[cut + 2 :]
        self.conn.feed(buffer[:cut], now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.open = False
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("closed before the response"))


async def sse_client(url: str, conn: Conn, ready: asyncio.Future[None]) -> None:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    try:
        await loop.create_connection(lambda: SSEProtocol(conn, request, ready), host, port)
    except OSError as exc:
        conn.open = False
        if not ready.done():
            ready.set_exception(exc)


# --- the process ------------------------------------------------------------------------------


def reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def amain(url: str, transport: str, count: int) -> None:
    stats = Stats()
    conns = [Conn(stats) for _ in range(count)]
    tasks: list[asyncio.Task[None]] = []
    errors: list[str] = []
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    loop = asyncio.get_running_loop()

    async def open_one(conn: Conn) -> bool:
        async with gate:
            ready: asyncio.Future[None] = loop.create_future()
            client = ws_client if transport == "ws" else sse_client
            tasks.append(asyncio.ensure_future(client(url, conn, ready)))
            try:
                await asyncio.wait_for(ready, 60)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                return False
            return True

    results = await asyncio.gather(*(open_one(conn) for conn in conns))
    reply({"ready": sum(results), "failed": len(results) - sum(results), "errors": errors[:5]})

    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            break
        command = json.loads(line)
        name = command.get("cmd")
        if name == "window":
            stats.window(int(command["first"]), int(command["last"]))
            for conn in conns:
                conn.reset()
            reply({"ok": True})
        elif name == "report":
            expected = stats.last - stats.first + 1
            counts = [conn.count for conn in conns]
            reply(
                {
                    "connections": count,
                    "open": sum(conn.open for conn in conns),
                    "complete": sum(c == expected for c in counts),
                    "expected_each": expected,
                    "received": sum(counts),
                    "min": min(counts) if counts else 0,
                    "max": max(counts) if counts else 0,
                    "disorder": sum(conn.disorder for conn in conns),
                    "notices": sum(conn.notices for conn in conns),
                    "close_codes": sorted({c.close_code for c in conns if c.close_code is not None}),
                    "hist": stats.hist.to_json(),
                }
            )
        elif name == "quit":
            break
        else:
            reply({"error": f"unknown command {name!r}"})
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.clients", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--transport", choices=("ws", "sse"), default="ws")
    parser.add_argument("--connections", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.run(amain(args.url, args.transport, args.connections))
    except ImportError:
        asyncio.run(amain(args.url, args.transport, args.connections))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
