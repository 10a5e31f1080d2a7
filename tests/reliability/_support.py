"""Helpers for the reliability tests: real gateway and engine processes, a fake engine whose
sockets the test controls, a reconnecting WebSocket client and readers of /proc.

Everything talks to real processes over loopback. Nothing here imports the gateway's own
decoding or indexing code: payloads are built with msgspec alone and checked against the
simulator's workload (the engine's own truth).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import websockets
import zmq
from websockets.exceptions import ConnectionClosed, InvalidStatus

from kvgateway.simulator import Workload

END_SEQ = (2**64 - 1).to_bytes(8, "big")

# --- processes ------------------------------------------------------------------------------


def source_spec(name: str, pub: int, replay: int | None = None) -> str:
    spec = f"name={name},endpoint=tcp://127.0.0.1:{pub}"
    return spec + (f",replay=tcp://127.0.0.1:{replay}" if replay is not None else "")


def sim_ports(pub: int, replay: int | None) -> list[str]:
    """``kvgateway simulate`` flags for fixed loopback ports."""
    # like vLLM, the simulator binds only a wildcard endpoint (a host name means "connect out")
    ports = ["--endpoint", f"tcp://*:{pub}"]
    if replay is not None:
        ports += ["--replay-endpoint", f"tcp://*:{replay}"]
    return ports


# --- the engine's truth -----------------------------------------------------------------------


class WorkloadOracle:
    """Resident GPU blocks of ``kvgateway simulate --seed SEED`` after each number of batches."""

    def __init__(self, seed: int, **options: Any) -> None:
        self._workload = Workload(seed, stream=0, **options)
        self._resident = [0]
        self._events: list[list[Any]] = []

    def _grow(self, batches: int) -> None:
        while len(self._resident) <= batches:
            batch = self._workload.next_batch(0.0, 0)
            self._events.append(batch.events)
            self._resident.append(len(self._workload.resident_counts("GPU")))

    def resident_after(self, batches: int) -> int:
        self._grow(batches)
        return self._resident[batches]

    def hashes_of(self, index: int) -> list[list[str]]:
        """The block hashes (as the gateway renders them: decimal strings) of each event of batch ``index``."""
        self._grow(index + 1)
        return [[str(h) for h in getattr(event, "block_hashes", [])] for event in self._events[index]]


def event_hashes(batch: dict[str, Any]) -> list[list[str]]:
    return [list(event.get("block_hashes", [])) for event in batch["events"]]


# --- a fake engine --------------------------------------------------------------------------


def payload(seq: int, *, tokens: int = 16) -> bytes:
    """A vLLM 0.26-style batch (map events) for ``seq``: one block stored and removed again, so
    the gateway's index stays small however many are sent. msgspec only, no kvgateway code."""
    block = 10**18 + seq
    stored = {
        "type": "BlockStored",
        "block_hashes": [block],
        "parent_block_hash": None,
        "token_ids": [(seq + i) % 150_000 for i in range(tokens)],
        "block_size": tokens,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    removed = {"type": "BlockRemoved", "block_hashes": [block], "medium": "GPU"}
    return msgspec.msgpack.encode([time.time(), [stored, removed], 0])


ReplyFn = Callable[[int, dict[int, bytes]], list[list[bytes]]]


def good_replies(start: int, history: dict[int, bytes]) -> list[list[bytes]]:
    """vLLM >= 0.26, as frames after the ROUTER's identity: [b"", topic, seq, payload] per buffered
    batch from ``start``, then the end marker [b"", b"", -1, b""]."""
    items = [[b"", b"kv", seq.to_bytes(8, "big"), history[seq]] for seq in sorted(history) if seq >= start]
    return [*items, [b"", b"", END_SEQ, b""]]


def is_item(reply: list[bytes]) -> bool:
    """A well-formed replayed batch (not the end marker)."""
    return len(reply) == 4 and reply[0] == b"" and len(reply[2]) == 8 and reply[2] != END_SEQ


class FakeEngine:
    """A vLLM-style publisher whose sockets the test drives: an XPUB (it tells when the gateway's
    subscription has arrived, so nothing is lost to the slow joiner) with a chosen send
    high-water mark, and a ROUTER replay socket answered by a thread with ``replies`` (the frames
    of each reply message after the requester's identity)."""

    def __init__(self, pub_port: int, replay_port: int, *, sndhwm: int = 1000, replies: ReplyFn = good_replies):
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.pub = self.context.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, sndhwm)
        self.pub.bind(f"tcp://127.0.0.1:{pub_port}")
        self._router = self.context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.SNDHWM, 0)
        self._router.bind(f"tcp://127.0.0.1:{replay_port}")
        self.replies = replies
        self.history: dict[int, bytes] = {}
        self.requests: list[int] = []
        self.items_sent = 0  # replayed batches sent (end markers and malformed replies excluded)
        self.errors: list[Exception] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def wait_subscribed(self, timeout: float = 30.0) -> None:
        if not self.pub.poll(int(timeout * 1000)):
            raise AssertionError("the gateway never subscribed")
        frame = self.pub.recv()
        assert frame[:1] == b"\x01", frame

    def publish(self, seq: int, body: bytes | None = None, *, live: bool = True, wait: float = 0.0) -> None:
        """Keep ``seq`` for replay and (unless ``live`` is False) send it live, waiting up to
        ``wait`` seconds for room in the socket's queue (raises ``zmq.Again`` when there is none)."""
        body = payload(seq) if body is None else body
        with self._lock:
            self.history[seq] = body
        if live:
            frames = [b"kv", seq.to_bytes(8, "big"), body]
            if wait > 0:
                self.pub.setsockopt(zmq.SNDTIMEO, int(wait * 1000))
                self.pub.send_multipart(frames)
            else:
                self.pub.send_multipart(frames, zmq.NOBLOCK)

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._router.poll(50):
                continue
            frames = self._router.recv_multipart()
            identity, start = frames[0], int.from_bytes(frames[-1], "big")
            with self._lock:
                self.requests.append(start)
                snapshot = dict(self.history)
            try:
                for reply in self.replies(start, snapshot):
                    self.items_sent += is_item(reply)
                    self._router.send_multipart([identity, *reply])
            except Exception as exc:  # reported by close(): the thread must go on serving
                self.errors.append(exc)

    def close(self) -> None:
        """Stop serving; raises what ``replies`` raised, if anything."""
        self._stop.set()
        self._thread.join(5)
        self.context.destroy(linger=0)
        if self.errors:
            raise AssertionError(f"the fake engine's replies failed: {self.errors!r}")


# --- a WebSocket client that reconnects ------------------------------------------------------


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
                                message = json.loads(line)
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
        await wait_for(lambda: self.sessions or task.done(), within, "the hello")
        if not self.sessions:
            raise AssertionError(f"could not connect to {self._target()}")
        return self


async def wait_for(predicate: Callable[[], Any], within: float, what: str) -> Any:
    """wait_until for coroutines: poll ``predicate`` every 20 ms."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}; last value {value!r}")
        await asyncio.sleep(0.02)


def run_async(coro: Any, timeout: float = 60.0) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())
