"""Web clients for the fan-out scenarios: many WebSocket or SSE connections in one process.

``python -m bench.clients --url URL --transport ws|sse --connections N``

WebSocket connections are a small client of RFC 6455 (the handshake, the server's frames, a
pong for a ping, the close echoed) over a socket this process reads itself with ``recvmsg``, so
that each read comes with the kernel's receive time (``SO_TIMESTAMPNS``); SSE connections are a
small asyncio protocol reading the chunked ``text/event-stream`` response. Neither parses the
JSON: a batch message is recognised by its ``"seq":"N","ts":T`` pair (the gateway's compact
JSON, its seq a string; or ``json.dumps``' spaced form with an integer seq, for the naive
bridge), which is all the measurement needs: every batch counted per connection, and its
latency, ``ts`` being the publisher's ``time.time()`` at send (same machine, same clock), twice:

- **delivered**: the kernel's receive time of the read that brought the message (for a read of
  several segments, the last one's: never earlier than the message's own) minus ``ts``: when the
  server's write reached this client's socket, whatever this process was doing then. It is the
  server's latency: on a 2-core machine, this process's own wake-up and its parsing of nine
  other connections' copies first (0.2 to 0.5 ms at 1,000 batches/s to 10 connections) are not
  the server's. SSE has no receive time (asyncio's transports read with ``recv``): its
  delivered figure is its read figure;
- **read**: this process's ``time.time()`` when it read the message, as every figure was
  measured before (the ``websockets`` asyncio client then).

Driven by JSON lines on stdin, one reply line each on stdout:

- at start, after connecting: ``{"ready": n, "failed": k, "errors": [...]}``;
- ``{"cmd": "window", "first": a, "last": b}``: count seqs a..b from now on (resets the counts);
- ``{"cmd": "report"}``: per-connection completeness, order, notices, and the latency histograms
  (``hist``: delivered, ``hist_read``: read);
- ``{"cmd": "quit"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import socket
import struct
import sys
import time
from typing import Any, Final
from urllib.parse import urlsplit

from bench.common import LogHistogram

BATCH: Final = re.compile(rb'"seq": ?"?(\d+)"?, ?"ts": ?([-+0-9.eE]+)')  # the gateway's seq is a string
NOTICE: Final = re.compile(rb'"type": ?"notice"')
CONNECT_CONCURRENCY: Final = 32
SO_TIMESTAMPNS: Final = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's number where Python lacks the name
_STAMP_SPACE: Final = socket.CMSG_SPACE(16)
READ_BYTES: Final = 1 << 16
_READ_VIEW: Final = memoryview(bytearray(READ_BYTES))


class Stats:
    """The measurement window shared by every connection of this process."""

    def __init__(self) -> None:
        self.first = 0
        self.last = -1
        self.hist = LogHistogram()  # delivered: the kernel's receive time
        self.hist_read = LogHistogram()  # read: this process's time at the read

    def window(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.hist = LogHistogram()
        self.hist_read = LogHistogram()


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

    def feed(self, data: bytes, now: float, delivered: float | None = None) -> None:
        """The messages of ``data``, read at ``now``, delivered (the kernel's receive time) at
        ``delivered`` (None: unknown, taken as ``now``)."""
        stats = self.stats
        first, last, hist, hist_read = stats.first, stats.last, stats.hist, stats.hist_read
        if delivered is None:
            delivered = now
        for match in BATCH.finditer(data):
            seq = int(match[1])
            if seq <= self.last_seq:
                self.disorder += 1  # a duplicate or a reordering: never expected
            self.last_seq = seq
            if first <= seq <= last:
                self.count += 1
                ts = float(match[2])
                hist.add(delivered - ts)
                hist_read.add(now - ts)
        if b'"notice"' in data:
            self.notices += len(NOTICE.findall(data))


# --- WebSocket --------------------------------------------------------------------------------


class WSReader:
    """One WebSocket connection read straight from its socket: ``recvmsg`` with the kernel's
    receive time, and RFC 6455's client side kept to what the servers measured here need: the
    handshake, unmasked text frames from the server (whole messages, never fragmented by them),
    a pong for a ping and the close echoed (masked, as a client's frames must be)."""

    def __init__(self, url: str, conn: Conn, ready: asyncio.Future[None], done: asyncio.Future[None]) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.conn = conn
        self.ready = ready
        self.done = done
        self.key = base64.b64encode(os.urandom(16)).decode()
        self.request = (
            f"GET {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1\r\n"
            f"Host: {self.host}:{self.port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {self.key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        self.buffer = b""
        self.sock: socket.socket | None = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        sock = self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        await loop.sock_connect(sock, (self.host, self.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        await loop.sock_sendall(sock, self.request)
        loop.add_reader(sock.fileno(), self.readable)

    def readable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            # into a buffer kept for every read: a recvmsg of its own would allocate READ_BYTES a
            # read (mapped and unmapped by malloc each time: the CPU the client must not take)
            size, ancillary, _, _ = sock.recvmsg_into([_READ_VIEW[: self.wanted(sock)]], _STAMP_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            size, ancillary = 0, []
        now = time.time()
        data = _READ_VIEW[:size].tobytes()
        if not data:
            self.close()
            return
        delivered = None
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                seconds, nanoseconds = struct.unpack("qq", value[:16])
                delivered = seconds + nanoseconds * 1e-9
        buffer = self.buffer + data if self.buffer else data
        if not self.ready.done():
            buffer = self.handshake(buffer)
            if not self.ready.done():
                self.buffer = buffer
                return
        self.buffer = self.frames(buffer, now, delivered)

    def wanted(self, sock: socket.socket) -> int:
        """How much to read: up to the end of the next frame, so that each frame's receive time is
        its own (a read of several segments has the last one's: a batch written alone, then the
        next one, both read late, would take the second's time); as much as there is during the
        handshake or when the head is not in yet."""
        if not self.ready.done():
            return READ_BYTES
        # after a frame's beginning, its end (the servers' frames are a segment each); else a look
        head = self.buffer or sock.recv(10, socket.MSG_PEEK)
        if len(head) < 2:
            return READ_BYTES
        length = head[1] & 0x7F
        if length == 126:
            if len(head) < 4:
                return READ_BYTES
            size = 4 + struct.unpack_from("!H", head, 2)[0]
        elif length == 127:
            if len(head) < 10:
                return READ_BYTES
            size = 10 + struct.unpack_from("!Q", head, 2)[0]
        else:
            size = 2 + length
        return max(1, min(READ_BYTES, size - len(self.buffer)))

    def handshake(self, buffer: bytes) -> bytes:
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            return buffer
        status = buffer[: buffer.find(b"\r\n")]
        if status.split(b" ")[1:2] != [b"101"]:
            self.ready.set_exception(ConnectionError(status.decode(errors="replace")))
            self.close()
            return b""
        self.ready.set_result(None)
        return buffer[end + 4 :]

    def frames(self, buffer: bytes, now: float, delivered: float | None) -> bytes:
        """Every whole frame of ``buffer``; what is left of it (a frame's beginning)."""
        at, size = 0, len(buffer)
        while size - at >= 2:
            opcode, length = buffer[at] & 0x0F, buffer[at + 1] & 0x7F
            head = 2
            if length == 126:
                if size - at < 4:
                    break
                (length,), head = struct.unpack_from("!H", buffer, at + 2), 4
            elif length == 127:
                if size - at < 10:
                    break
                (length,), head = struct.unpack_from("!Q", buffer, at + 2), 10
            if size - at < head + length:
                break
            payload = buffer[at + head : at + head + length]
            at += head + length
            if opcode in (1, 2, 0):  # text, binary, continuation: the servers send whole messages
                self.conn.feed(payload, now, delivered)
            elif opcode == 9:  # ping: the pong (uvicorn's keepalive would close a silent client)
                self.send(10, payload)
            elif opcode == 8:  # close: its code, the close echoed, the socket closed
                self.conn.close_code = struct.unpack_from("!H", payload)[0] if len(payload) >= 2 else None
                self.send(8, payload[:2])
                self.close()
                return b""
        return buffer[at:]

    def send(self, opcode: int, payload: bytes) -> None:
        """A control frame (at most 125 bytes), masked."""
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        with contextlib.suppress(OSError):
            if self.sock is not None:
                self.sock.send(bytes((0x80 | opcode, 0x80 | len(payload))) + mask + masked)

    def close(self) -> None:
        self.conn.open = False
        if self.sock is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("closed before the handshake's answer"))
        if not self.done.done():
            self.done.set_result(None)


async def ws_client(url: str, conn: Conn, ready: asyncio.Future[None]) -> None:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    reader = WSReader(url, conn, ready, done)
    try:
        await reader.open()
        await done
    except Exception as exc:
        conn.open = False
        if not ready.done():
            ready.set_exception(exc)
    finally:
        reader.close()


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
                    "hist_read": stats.hist_read.to_json(),
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
