"""A client written from docs/protocol.md's "Writing a client" alone, against a real gateway.

The client (:class:`DocClient`) uses nothing of kvgateway: its own WebSocket reader (the
``websockets`` library), JSON, and the rules of that section: the block key, the order of hello,
state, batches and notices, staleness, and resume. Nor does the engine: a scripted vLLM publisher
(a PUB socket and a replay ROUTER in this process, msgpack map events, every seq chosen by the
test) drives the gateway through a clear, restarts
of every reason (``seq_reset``, ``cleared``, ``jump``, ``window``, ``identity``, ``reconnect``),
a loss (``unrecovered_gap``), a dropped connection resumed, and a gateway restart. The engine
holds still between steps, so the gateway's offset is paused; at each pause the client's blocks
and stale flags must equal ``GET /v1/blocks`` at the same offset, and so must its own state digest
("State digest": computed here from the doc's algorithm, no kvgateway code) equal the gateway's,
there and in every ``digest`` message (``digest=1``), at every offset one came at. A client model
corrupted on purpose (one block dropped) is caught by the next digest message.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from typing import Any

import httpx
import msgspec
import pytest
import zmq
from websockets.exceptions import WebSocketException
from websockets.sync.client import ClientConnection, connect

from tests.support import BIG_QUEUE, Start, free_ports, source_spec, start_gateway, wait_until

Stream = tuple[str, int]
Key = tuple[str, int, str]  # (medium, group_idx, hash)

DIGEST_SECONDS = 1


def element(key: Key) -> int:
    """docs/protocol.md, "State digest": FNV-1a 64 over ``medium\ngroup_idx\nhash``."""
    state = 0xCBF29CE484222325
    for byte in f"{key[0]}\n{key[1]}\n{key[2]}".encode():
        state = ((state ^ byte) * 0x100000001B3) % 2**64
    return state


def digest_of(held: dict[Key, int]) -> str:
    return f"{sum(element(key) for key in held) % 2**64:016x}"


# --- the client: docs/protocol.md, "Writing a client", and nothing else -----------------------


class DocClient:
    """Keeps every stream's blocks and stale flag from a ``snapshot=blocks`` WebSocket; reconnects
    with its last id on any disconnect."""

    def __init__(self, ws_url: str) -> None:
        self.ws_url = ws_url
        self.lock = threading.Lock()
        self.blocks: dict[Stream, dict[Key, int]] = {}
        self.stale: dict[Stream, bool] = {}
        self.last_id: str | None = None
        self.offset = -1  # the offset of the last message applied (the hello's at first)
        self.pending_id: str | None = None  # a fresh hello's id, adopted once the state is complete
        self.waiting: set[Stream] = set()
        self.building: tuple[dict[Stream, dict[Key, int]], dict[Stream, bool]] = ({}, {})
        """The new state of a fresh hello, built apart and swapped in once complete (the old one and
        its id stay until then: a drop during the state resumes them)."""
        self.hellos: list[bool] = []  # recovered, per hello
        self.notices: list[dict[str, Any]] = []
        self.digests: list[tuple[Stream, int, bool]] = []
        """Every ``digest`` message: (stream, offset, whether the client's own digest and block
        count equalled it when it came, and the client stood at its offset)."""
        self.field_types: dict[str, set[str]] = {}
        """The JSON types each message field came with (null aside): a client that decodes every
        message into one structure needs one per name (docs/protocol.md, "Deprecated fields")."""
        self._ws: ClientConnection | None = None
        self._go = threading.Event()
        self._go.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    # the connection

    def _run(self) -> None:
        while not self._stop.is_set():
            self._go.wait()
            if self._stop.is_set():
                return
            with self.lock:
                resume = "" if self.last_id is None else f"&last_event_id={self.last_id}"
            try:
                url = f"{self.ws_url}?snapshot=blocks&digest={DIGEST_SECONDS}{resume}"
                with connect(url, max_size=None, open_timeout=5) as ws:
                    self._ws = ws
                    for frame in ws:
                        for line in str(frame).split("\n"):  # a frame may hold several messages
                            with self.lock:
                                self._apply(json.loads(line))
            except (OSError, TimeoutError, WebSocketException):
                pass
            self._ws = None
            self._stop.wait(0.05)  # backoff before reconnecting

    def drop(self) -> None:
        """Cut the connection under the client's feet; it reconnects once :meth:`release` is called."""
        self._go.clear()
        ws = self._ws
        assert ws is not None
        ws.socket.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        self._go.set()

    def close(self) -> None:
        self._stop.set()
        self._go.set()
        ws = self._ws
        if ws is not None:
            ws.close()
        self._thread.join(10)

    # the messages

    def _apply(self, m: dict[str, Any]) -> None:
        for name, value in m.items():
            if value is not None:
                self.field_types.setdefault(name, set()).add(type(value).__name__)
        kind = m["type"]
        if kind == "hello":
            self.hellos.append(m["recovered"])
            self.offset = m["offset"]
            hello_id = f"{m['epoch']}:{m['offset']}"
            if m["recovered"]:
                self.last_id = hello_id
                return
            blocks: dict[Stream, dict[Key, int]] = {(s["source"], s["dp_rank"]): {} for s in m["sources"]}
            self.building = (blocks, {(s["source"], s["dp_rank"]): s["stale"] for s in m["sources"]})
            self.waiting = set(blocks)
            self.pending_id = hello_id
            return
        stream = (m["source"], m["dp_rank"]) if "source" in m else None
        if kind == "state":
            assert stream is not None
            held = self.building[0].setdefault(stream, {})
            for b in m["blocks"]:
                held[(b["medium"], b["group_idx"], b["hash"])] = b["refs"]
            self.building[1][stream] = m["stale"]
            if m["last"]:
                self.waiting.discard(stream)
                if not self.waiting:
                    self._state_complete()
            return
        if kind == "digest":
            assert stream is not None and self.pending_id is None  # after the whole state
            held = self.blocks.get(stream, {})
            same = (digest_of(held), len(held)) == (m["digest"], m["block_count"]) and m["offset"] == self.offset
            self.digests.append((stream, m["offset"], same))
            return
        if self.pending_id is not None:
            self._state_complete()  # the fallback: live messages come only after the whole state
        if kind == "batch":
            assert stream is not None
            for event in m["events"]:
                self._event(stream, event)
        elif kind == "notice":
            self.notices.append(m)
            if m["kind"] == "restart":
                assert stream is not None
                self.blocks[stream] = {}
                self.stale[stream] = False
            elif m["kind"] == "stale":
                assert stream is not None
                self.stale[stream] = True
        if "id" in m:
            self.last_id = m["id"]
            self.offset = m["offset"]

    def _state_complete(self) -> None:
        self.last_id, self.pending_id = self.pending_id, None
        (self.blocks, self.stale), self.building = self.building, ({}, {})
        self.waiting = set()

    def _event(self, stream: Stream, event: dict[str, Any]) -> None:
        held = self.blocks.setdefault(stream, {})
        if event["type"] == "AllBlocksCleared":
            held.clear()
            self.stale[stream] = False
            return
        if event["type"] not in ("BlockStored", "BlockRemoved"):
            return
        medium = event.get("medium")
        medium = medium.upper() if isinstance(medium, str) and medium else "GPU"
        group = event.get("group_idx")
        group = group if isinstance(group, int) else 0
        step = 1 if event["type"] == "BlockStored" else -1
        for block_hash in event["block_hashes"]:
            key = (medium, group, block_hash)
            count = held.get(key, 0) + step
            if count > 0:
                held[key] = count
            else:
                held.pop(key, None)  # a remove of a block not held is normal

    # what the test reads

    def view(self) -> tuple[int, bool, dict[Stream, dict[Key, int]], dict[Stream, bool]]:
        with self.lock:
            blocks = {s: dict(held) for s, held in self.blocks.items() if held}
            return self.offset, self.pending_id is None, blocks, dict(self.stale)

    def digest_mismatches(self) -> list[tuple[Stream, int]]:
        with self.lock:
            return [(stream, offset) for stream, offset, same in self.digests if not same]

    def restart_reasons(self) -> list[str]:
        with self.lock:
            return [n["reason"] for n in self.notices if n["kind"] == "restart"]

    def kinds(self) -> list[str]:
        with self.lock:
            return [n["kind"] for n in self.notices]


# --- the scripted engine -----------------------------------------------------------------------

TOPIC = b"kv-events"
MEDIUMS = [None, "GPU", "gpu", "CPU", "cpu_pinned"]
END = (-1).to_bytes(8, "big", signed=True)  # the replay's end marker
CLEARED: dict[str, Any] = {"type": "AllBlocksCleared"}


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


class ScriptedEngine:
    """vLLM's publisher with the seqs chosen by the test: a PUB socket and a replay ROUTER that
    answers from ``buffer`` (in a thread), rebound on the same ports for a new process."""

    def __init__(self, pub_port: int, replay_port: int, rng: random.Random) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.ports = (pub_port, replay_port)
        self.rng = rng
        self.pool = [rng.getrandbits(64) for _ in range(40)]
        self.buffer: dict[int, bytes] = {}
        self.lock = threading.Lock()
        self._bind()

    def _bind(self) -> None:
        self.pub = self._socket(zmq.PUB, self.ports[0])
        self.router = self._socket(zmq.ROUTER, self.ports[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._answer, daemon=True)
        self._thread.start()

    def _socket(self, kind: int, port: int) -> zmq.Socket[bytes]:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)

        def bound() -> bool:
            try:
                sock.bind(f"tcp://127.0.0.1:{port}")
            except zmq.ZMQError:  # the old process's port, still closing
                return False
            return True

        wait_until(bound, timeout=10, interval=0.05, what=f"port {port} free to bind")
        return sock

    def _answer(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(20):
                continue
            identity, empty, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            with self.lock:
                held = sorted((s, p) for s, p in self.buffer.items() if s >= first)
            for seq, payload in held:
                self.router.send_multipart([identity, empty, seq_bytes(seq), payload])
            self.router.send_multipart([identity, empty, END, b""])

    def events(self) -> list[dict[str, Any]]:
        """1-4 events as vLLM's map form has them: stores and removes over a pool of 40 hashes."""
        out: list[dict[str, Any]] = []
        for _ in range(self.rng.randint(1, 4)):
            event: dict[str, Any] = {"block_hashes": self.rng.sample(self.pool, self.rng.randint(1, 5))}
            if self.rng.random() < 0.6:
                if self.rng.random() < 0.2:
                    event["block_hashes"] += event["block_hashes"][:1]  # a hash twice in one event
                tokens = [1] * 16 * len(event["block_hashes"])
                event = {"type": "BlockStored", **event, "parent_block_hash": None, "token_ids": tokens}
                event |= {"block_size": 16, "lora_id": None, "lora_name": None}
            else:
                event = {"type": "BlockRemoved", **event}
            event["medium"] = self.rng.choice(MEDIUMS)
            if self.rng.random() < 0.3:
                event["group_idx"] = self.rng.choice([0, 1])
            out.append(event)
        return out

    def publish(
        self, seq: int, events: list[dict[str, Any]] | None = None, *, live: bool = True, held: bool = True
    ) -> None:
        body = [time.time(), self.events() if events is None else events, 0]  # [ts, events, dp_rank]
        payload = msgspec.msgpack.encode(body)
        if held:
            with self.lock:
                self.buffer[seq] = payload
        if live:
            self.pub.send_multipart([TOPIC, seq_bytes(seq), payload])

    def run(self, seqs: range) -> None:
        for seq in seqs:
            self.publish(seq)

    def new_process(self, *, down: bool) -> None:
        """Another process: an empty buffer; ``down``: the sockets close and bind again."""
        with self.lock:
            self.buffer.clear()
        if down:
            self._stop.set()
            self._thread.join(5)
            self.pub.close(linger=0)
            self.router.close(linger=0)
            self._bind()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.context.destroy(linger=0)


# --- the comparison ----------------------------------------------------------------------------


def _gateway_view(
    doc: dict[str, Any],
) -> tuple[dict[Stream, dict[Key, int]], dict[Stream, bool], dict[Stream, str]]:
    blocks = {
        (s["source"], s["dp_rank"]): {(b["medium"], b["group_idx"], b["hash"]): b["refs"] for b in s["blocks"]}
        for s in doc["streams"]
        if s["blocks"]
    }
    stale = {(s["source"], s["dp_rank"]): s["stale"] for s in doc["streams"]}
    return blocks, stale, {(s["source"], s["dp_rank"]): s["digest"] for s in doc["streams"]}


def check(client: DocClient, base: str, what: str) -> int:
    """The client equals ``GET /v1/blocks`` at the same offset, its digests too, and every digest
    message so far matched the client's own; that offset, once a digest message came at it."""

    def aligned() -> tuple[int, Any, Any] | None:
        doc = httpx.get(f"{base}/v1/blocks", timeout=10).json()
        offset, complete, blocks, stale = client.view()
        if not complete or offset != doc["offset"]:
            return None
        return offset, (blocks, stale), _gateway_view(doc)

    offset, mine, theirs = wait_until(
        aligned, timeout=20, interval=0.02, what=f"the client at the gateway's offset ({what})"
    )
    assert mine[1] == theirs[1], f"stale flags differ after {what}"
    assert mine[0] == theirs[0], f"blocks differ after {what}"
    own = {stream: digest_of(mine[0].get(stream, {})) for stream in theirs[2]}
    assert own == theirs[2], f"digests differ after {what}"
    wait_until(lambda: any(at == offset for _, at, _ in client.digests), timeout=20, what=f"a digest message ({what})")
    assert client.digest_mismatches() == [], f"a digest message differed by {what}"
    return int(offset)


def corrupt_and_catch(client: DocClient, stream: Stream) -> None:
    """Drop one block of the client's model: the next digest message of ``stream`` (at most one
    interval away) tells; then the block is put back (the engine holds still meanwhile)."""
    with client.lock:
        held = client.blocks[stream]
        key = next(iter(held))
        refs = held.pop(key)
        seen = len(client.digests)

    def next_digest() -> bool | None:
        with client.lock:
            later = [same for s, _, same in client.digests[seen:] if s == stream]
            return None if not later else later[0] is False

    assert wait_until(next_digest, timeout=DIGEST_SECONDS + 10, interval=0.02, what="the next digest message")
    with client.lock:
        client.blocks[stream][key] = refs
        client.digests = [entry for entry in client.digests if entry[0] != stream or entry[2]]


@pytest.mark.timeout(90)
def test_a_client_written_from_the_doc_follows_the_gateway_exactly(procs: Start) -> None:
    http, idle = free_ports(2)
    pub, rep = free_ports(2, spacing=2)
    specs = [
        source_spec("a", pub, rep),
        source_spec("b", idle),
    ]
    engine = ScriptedEngine(pub, rep, random.Random(25))
    gw = start_gateway(procs, http, specs, "--replay-timeout", "0.5", client_queue_bytes=BIG_QUEUE)
    base = f"http://127.0.0.1:{http}"
    client: DocClient | None = None
    try:

        def delivered(seq: int) -> None:
            def there() -> bool:
                status = httpx.get(f"{base}/v1/sources", timeout=10).json()["sources"][0]
                return bool(status["last_seq"] == str(seq))  # engine seqs are decimal strings

            wait_until(there, timeout=15, interval=0.02, what=f"seq {seq} delivered")

        # History before the client: it learns it from the state messages.
        wait_until(lambda: httpx.get(f"{base}/v1/sources", timeout=10).json()["sources"][0]["connected"], timeout=15)
        engine.run(range(0, 30))
        delivered(29)
        client = DocClient(f"ws://127.0.0.1:{http}/v1/ws")
        offsets = [check(client, base, "the snapshot")]
        corrupt_and_catch(client, ("a", 0))

        # A clear in the middle of a batch, then more churn.
        engine.run(range(30, 40))
        engine.publish(40, [*engine.events(), CLEARED, *engine.events()])
        engine.run(range(41, 50))
        delivered(49)
        offsets.append(check(client, base, "a clear"))

        # A loss: 50..52 neither sent nor held any more.
        for seq in range(50, 53):
            engine.publish(seq, live=False, held=False)
        engine.run(range(53, 56))
        wait_until(lambda: "unrecovered_gap" in client.kinds(), timeout=15, what="the loss")
        delivered(55)
        assert client.view()[3][("a", 0)] is True  # stale, from the stale notice
        offsets.append(check(client, base, "an unrecovered gap"))

        def restart(reason: str) -> None:
            wait_until(lambda: reason in client.restart_reasons(), timeout=15, what=f"a {reason} restart")

        # seq_reset: a new process in place, from 0.
        engine.new_process(down=False)
        engine.run(range(0, 10))
        restart("seq_reset")
        delivered(9)
        offsets.append(check(client, base, "seq_reset"))

        # cleared: back a few seqs, starting with AllBlocksCleared.
        engine.new_process(down=False)
        engine.publish(5, [CLEARED, *engine.events()])
        engine.run(range(6, 12))
        restart("cleared")
        delivered(11)
        offsets.append(check(client, base, "cleared"))

        # jump: far ahead (TensorRT-LLM's clock-seeded seqs).
        jump = 11 + 20_000_000
        engine.new_process(down=False)
        engine.run(range(jump, jump + 6))
        restart("jump")
        delivered(jump + 5)
        offsets.append(check(client, base, "jump"))

        # window: back further than the restart window.
        window = jump + 5 - 2000
        engine.new_process(down=False)
        engine.run(range(window, window + 6))
        restart("window")
        delivered(window + 5)
        offsets.append(check(client, base, "window"))

        # A forced drop: what the engine publishes meanwhile arrives on resume.
        hellos = len(client.hellos)
        client.drop()
        engine.run(range(window + 6, window + 12))
        delivered(window + 11)
        client.release()
        wait_until(lambda: len(client.hellos) > hellos, timeout=15, what="the reconnection")
        assert client.hellos[-1] is True  # recovered: nothing lost, no state sent
        offsets.append(check(client, base, "a resume"))

        # identity: a new process behind the same sockets holds nothing as old as the last seq.
        engine.new_process(down=True)
        for seq in range(0, 5):  # its history, only in its buffer: caught up by replay after the check
            engine.publish(seq, live=False)
        restart("identity")
        with client.lock:
            (notice,) = [n for n in client.notices if n["kind"] == "restart" and n["reason"] == "identity"]
        assert notice["seq"] == notice["previous"] == str(window + 11)  # what the doc says of identity
        delivered(4)
        engine.run(range(5, 10))
        delivered(9)
        offsets.append(check(client, base, "identity"))

        # reconnect: after a reconnection the engine cannot be verified (the last seq left its
        # buffer), then its live stream goes back.
        engine.new_process(down=True)
        for seq in range(10, 13):  # held above the last seq: the gateway cannot tell
            engine.publish(seq, live=False)
        delivered(12)
        engine.new_process(down=False)  # (the same sockets) what follows is the new process's
        engine.run(range(6, 9))
        restart("reconnect")
        delivered(8)
        offsets.append(check(client, base, "reconnect"))

        # A gateway restart: another epoch, so the client starts over from a fresh state.
        hellos = len(client.hellos)
        gw.proc.stop()
        gw = start_gateway(procs, http, specs, "--replay-timeout", "0.5", client_queue_bytes=BIG_QUEUE)
        wait_until(lambda: len(client.hellos) > hellos and client.view()[1], timeout=20, what="a fresh state")
        assert client.hellos[-1] is False
        engine.run(range(9, 15))
        delivered(14)
        fresh = check(client, base, "a gateway restart")
        assert client.view()[3][("a", 0)] is True  # the engine no longer holds seqs 0..5

        assert sorted(set(client.restart_reasons())) == [
            "cleared",
            "identity",
            "jump",
            "reconnect",
            "seq_reset",
            "window",
        ]
        assert offsets == sorted(offsets) and fresh < offsets[-1]
        # every field name came with one type, `last` included: the state's bool, never the gap's seq
        assert {name: types for name, types in client.field_types.items() if len(types) > 1} == {}
        assert client.field_types["last"] == {"bool"}
        # engine seqs are strings (exact in any JSON parser), the gateway's own numbers numbers
        seq_fields = ("seq", "previous", "first", "until")
        assert [client.field_types[name] for name in seq_fields] == [{"str"}] * len(seq_fields)
        assert client.field_types["offset"] == {"int"}
        assert len({offset for _, offset, _ in client.digests}) >= len(offsets)  # one at every pause at least
    finally:
        if client is not None:
            client.close()
        engine.close()
