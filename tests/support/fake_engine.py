"""A fake engine whose sockets the test drives (:class:`FakeEngine`), the batches it sends and
the replies its replay socket gives. Payloads are built with msgspec alone, no kvgateway code."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import zmq

END_SEQ = (2**64 - 1).to_bytes(8, "big")


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
        self.replied: list[tuple[int, int]] = []  # (start, items sent) of each request answered
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
                items = 0
                for reply in self.replies(start, snapshot):
                    items += is_item(reply)
                    self._router.send_multipart([identity, *reply])
                self.items_sent += items
                self.replied.append((start, items))
            except Exception as exc:  # reported by close(): the thread must go on serving
                self.errors.append(exc)

    def close(self, *, linger: int = 0) -> None:
        """Stop serving; raises what ``replies`` raised, if anything. ``linger`` (ms): how long the
        batches still queued in the PUB socket may take to reach the gateway before it goes."""
        self._stop.set()
        self._thread.join(5)
        self.context.destroy(linger=linger)
        if self.errors:
            raise AssertionError(f"the fake engine's replies failed: {self.errors!r}")


class HttpPort:
    """A real HTTP server on a free loopback port: what an engine's API port is, given by mistake
    where its ZeroMQ publisher's belongs (it accepts TCP, then waits for a request line).
    ``connections``: how many it accepted (each of ZeroMQ's attempts is one)."""

    def __init__(self) -> None:
        owner = self

        class Counting(SimpleHTTPRequestHandler):
            def setup(self) -> None:
                owner.connections += 1
                super().setup()

        self.connections = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HttpPort:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
