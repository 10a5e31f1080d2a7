"""The tests' WebSocket clients: :class:`WsCollector` (a thread that keeps every message with its
arrival time) and :class:`ResumingClient` (asyncio; reconnects with the id of the last message it
got, as docs/protocol.md asks). Both are the ``websockets`` library over loopback."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.support.processes import Proc
from tests.support.seqs import read_message
from tests.support.waits import until, wait_until


class WsCollector:
    """A WebSocket client in a thread that keeps every message with its arrival time (time.time())."""

    def __init__(self, url: str, *, query: str = "", open_timeout: float = 10.0) -> None:
        full = f"{url}?{query}" if query else url
        self.url = full
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self.closed_error: BaseException | None = None
        # No pings of its own: the gateway pings its clients, and a test that stops the gateway
        # (SIGSTOP) on a loaded machine must not lose its client to a 20 s ping timeout.
        self._ws: ClientConnection = connect(
            full, max_size=None, open_timeout=open_timeout, ping_interval=None
        ).__enter__()
        first = self._ws.recv(timeout=open_timeout)
        assert isinstance(first, str)
        self.hello: dict[str, Any] = read_message(first)
        assert self.hello["type"] == "hello", self.hello
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for frame in self._ws:
                now = time.time()
                assert isinstance(frame, str)
                for line in frame.split("\n"):
                    self.messages.append((now, read_message(line)))
        except ConnectionClosed as exc:
            self.closed_error = exc
        except BaseException as exc:  # surfaced by the test through closed_error
            self.closed_error = exc

    def close(self) -> None:
        self._ws.close()
        self._thread.join(5)

    def __enter__(self) -> WsCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # views (each a fresh list: the reader thread keeps appending)

    def of(self, source: str, dp_rank: int) -> list[dict[str, Any]]:
        """Every message of one stream, in arrival order."""
        return [m for _, m in list(self.messages) if m.get("source") == source and m.get("dp_rank") == dp_rank]

    def seqs(self, source: str, dp_rank: int = 0) -> list[int]:
        """The seqs of the stream's batches, in arrival order."""
        return [m["seq"] for m in self.of(source, dp_rank) if m["type"] == "batch"]

    def last_seq(self, source: str, dp_rank: int = 0) -> int | None:
        seqs = self.seqs(source, dp_rank)
        return seqs[-1] if seqs else None

    def notices(self, source: str, dp_rank: int = 0, *kinds: str) -> list[dict[str, Any]]:
        return [
            m
            for m in self.of(source, dp_rank)
            if m["type"] == "notice" and m["kind"] not in ("up", "down", "status") and (not kinds or m["kind"] in kinds)
        ]


def closed_by_signal(proc: Proc, ws_url: str) -> tuple[int, str, int]:
    """A WebSocket client of ``proc``, then SIGTERM to ``proc``: the close code and reason the
    client got, and the process's exit code."""
    client = WsCollector(ws_url)
    exit_code = proc.stop(60)
    closed = wait_until(lambda: client.closed_error, timeout=30, what="the client's connection closed")
    assert isinstance(closed, ConnectionClosed) and closed.rcvd is not None, repr(closed)
    return closed.rcvd.code, closed.rcvd.reason, exit_code


@dataclass
class Session:
    """One connection of a :class:`ResumingClient`: its hello and the messages after it."""

    hello: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None


class ResumingClient:
    """A WebSocket client that reads everything and, when the connection drops, reconnects
    with the id of the last message it got (``last_event_id``), as docs/protocol.md asks."""

    def __init__(self, url: str, *, query: str = "", headers: dict[str, str] | None = None) -> None:
        self.url = url
        self.query = query
        self.headers = headers or {}
        self.sessions: list[Session] = []
        self.last_id: str | None = None
        self.connect_failures = 0
        self.stopped = False
        self._ws: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [m for s in self.sessions for m in s.messages]

    def _target(self) -> str:
        parts = [self.query] if self.query else []
        if self.last_id is not None:
            parts.append(f"last_event_id={self.last_id}")
        return self.url + ("?" + "&".join(parts) if parts else "")

    async def run(self, *, reconnect: bool = True, backoff: float = 0.1) -> None:
        while not self.stopped:
            try:
                async with websockets.connect(
                    self._target(), additional_headers=self.headers, max_size=None, open_timeout=10, proxy=None
                ) as ws:
                    self._ws = ws
                    session: Session | None = None
                    try:
                        async for frame in ws:
                            assert isinstance(frame, str)
                            for line in frame.split("\n"):
                                message = read_message(line)
                                if session is None:
                                    assert message["type"] == "hello", message
                                    session = Session(message)
                                    self.sessions.append(session)
                                    self.last_id = f"{message['epoch']}:{message['offset']}"
                                    continue
                                session.messages.append(message)
                                if "id" in message:
                                    self.last_id = message["id"]
                    except ConnectionClosed:
                        pass
                    if session is not None:
                        session.close_code = ws.close_code
            except (OSError, InvalidStatus, TimeoutError):
                self.connect_failures += 1
            finally:
                self._ws = None
            if not reconnect or self.stopped:
                return
            await asyncio.sleep(backoff)

    def connected_sessions(self) -> int:
        """How many connections got their hello, if the last one is still open; else 0."""
        return len(self.sessions) if self._ws is not None and self.sessions else 0

    async def drop(self) -> None:
        """Lose the connection abruptly (no closing handshake), as a network failure would."""
        ws = self._ws
        if ws is not None:
            ws.transport.abort()

    async def stop(self) -> None:
        """Close the connection and end :meth:`run` (the task of :meth:`start`, if any)."""
        self.stopped = True
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()
        task = self._task
        if task is not None:
            try:
                await asyncio.wait_for(task, 10)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise AssertionError("the client did not stop") from None

    async def start(self, *, reconnect: bool = False, within: float = 20.0) -> ResumingClient:
        """Run in a task; return once the first hello arrived."""
        self._task = asyncio.ensure_future(self.run(reconnect=reconnect))
        task = self._task
        await until(lambda: self.sessions or task.done(), within, "the hello")
        if not self.sessions:
            raise AssertionError(f"could not connect to {self._target()}")
        return self
