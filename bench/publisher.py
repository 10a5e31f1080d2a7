"""A fast engine stand-in: sends pre-encoded payloads at a given rate or flat out.

``python -m bench.publisher --payloads FILE --endpoint tcp://127.0.0.1:PORT [--replay ...]``

One XPUB socket per stream (DP rank ``r`` on port + r, vLLM's rule) sends ``[topic, seq, payload]``
exactly as vLLM's publisher does; XPUB rather than PUB only so that the harness can wait for a
subscriber instead of sleeping (the slow-joiner problem). With ``--replay`` each stream also has a
ROUTER answering vLLM's replay protocol from a buffer of the last ``--buffer-steps`` batches.
The send high-water marks are unlimited: a benchmark must never lose a batch at the publisher.
Each payload's ``ts`` is set to ``time.time()`` at send, so clients can measure latency.

Driven by JSON lines on stdin (one reply line on stdout per command):

- ``{"cmd": "send", "count": N, "rate": R, "when_subscribed": false}``: N batches per stream at R
  batches/s per stream (0: flat out), looping over the payload set; seqs continue across sends.
  Replies when done with the seqs, the wall-clock times of the first and last send and the ``ts``
  of the last batch. With ``"exact": true`` a stream stops at the end of its payloads instead of
  looping (streams of a set may differ in length).
- ``{"cmd": "wait_subscribers", "timeout": S}``: until every stream has a subscriber.
- ``{"cmd": "replays"}``: every replay request served so far, with times.
- ``{"cmd": "quit"}``.

Replay requests and subscriptions are handled while a send is in progress.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import zmq

from bench.common import TOPIC
from bench.payloads import PayloadSet, stamp
from kvgateway.engine import wire
from kvgateway.engine.endpoints import offset_endpoint

FLAT_OUT_SLICE = 256
"""Batches per stream sent flat out between two looks at the sockets and stdin."""
PACED_SLICE = 4096


@dataclass
class _Send:
    count: int
    rate: float
    when_subscribed: bool
    exact: bool = False
    sent: int = 0
    first_seq: list[int] = field(default_factory=list)
    t_start: float | None = None
    t_end: float | None = None
    ts_last: float = 0.0


class Publisher:
    def __init__(self, payloads: PayloadSet, endpoint: str, replay: str | None, buffer_steps: int) -> None:
        self.payloads = payloads.streams
        self.count = len(self.payloads)
        self.context = zmq.Context()
        self.topic = TOPIC.encode()
        self.pubs: list[zmq.Socket[bytes]] = []
        self.routers: list[zmq.Socket[bytes]] = []
        self.subscribers = [0] * self.count
        self.next_seq = [0] * self.count
        self.next_index = [0] * self.count
        self.buffers: list[deque[tuple[int, bytes | bytearray]]] = [
            deque(maxlen=buffer_steps) for _ in range(self.count)
        ]
        self.keep = buffer_steps > 0 and replay is not None
        self.replays: list[dict[str, Any]] = []
        for rank in range(self.count):
            pub = self.context.socket(zmq.XPUB)
            pub.setsockopt(zmq.LINGER, 0)
            pub.setsockopt(zmq.SNDHWM, 0)
            pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, not only a topic's first
            pub.bind(offset_endpoint(endpoint, rank))
            self.pubs.append(pub)
            if replay is not None:
                router = self.context.socket(zmq.ROUTER)
                router.setsockopt(zmq.LINGER, 0)
                router.setsockopt(zmq.SNDHWM, 0)
                router.bind(offset_endpoint(replay, rank))
                self.routers.append(router)
        self.poller = zmq.Poller()
        for sock in (*self.pubs, *self.routers):
            self.poller.register(sock, zmq.POLLIN)
        self.stdin = sys.stdin.fileno()
        self.poller.register(self.stdin, zmq.POLLIN)
        self._pending_input = b""
        self.commands: deque[dict[str, Any]] = deque()
        self.job: _Send | None = None
        self.waiting: tuple[float, dict[str, Any]] | None = None  # (deadline, command)
        self.quit = False

    # --- output ---------------------------------------------------------------------------

    @staticmethod
    def reply(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        self.reply({"ready": True, "streams": self.count, "batches": [len(p) for p in self.payloads]})
        while not self.quit:
            timeout = self._timeout()
            for sock, _ in self.poller.poll(timeout):
                if sock == self.stdin:
                    self._read_stdin()
                elif sock in self.routers:
                    self._serve_replay(self.routers.index(sock))
                else:
                    self._read_subscriptions(self.pubs.index(sock))
            self._progress()
        for sock in (*self.pubs, *self.routers):
            sock.close(linger=0)
        self.context.term()

    def _timeout(self) -> int:
        job = self.job
        if job is None or (job.when_subscribed and not all(self.subscribers)):
            return 50
        if job.rate == 0 or job.t_start is None:
            return 0
        wait = job.t_start + job.sent / job.rate - time.time()
        # at least 1 ms when nothing is due yet: never spin a core the gateway needs
        return 0 if wait <= 0 else max(1, math.ceil(wait * 1000))

    def _read_stdin(self) -> None:
        data = os.read(self.stdin, 65536)
        if not data:
            self.quit = True
            return
        self._pending_input += data
        *lines, self._pending_input = self._pending_input.split(b"\n")
        for line in lines:
            if line.strip():
                self.commands.append(json.loads(line))

    def _read_subscriptions(self, rank: int) -> None:
        pub = self.pubs[rank]
        while True:
            try:
                frame = pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frame[:1] == b"\x01":
                self.subscribers[rank] += 1
            elif frame[:1] == b"\x00":
                self.subscribers[rank] = max(0, self.subscribers[rank] - 1)

    def _serve_replay(self, rank: int) -> None:
        router = self.routers[rank]
        while True:
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            received = time.time()
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            items = 0
            first = None
            for seq, payload in list(self.buffers[rank]):
                if seq < start:
                    continue
                router.send_multipart([identity, b"", self.topic, wire.seq_bytes(seq), payload])
                first = seq if first is None else first
                items += 1
            router.send_multipart([identity, b"", b"", wire.END_SEQ_BYTES, b""])
            self.replays.append(
                {
                    "stream": rank,
                    "start": start,
                    "first": first,
                    "items": items,
                    "received": received,
                    "answered": time.time(),
                }
            )

    # --- commands and jobs ----------------------------------------------------------------

    def _progress(self) -> None:
        if self.waiting is not None:
            deadline, command = self.waiting
            if all(self.subscribers):
                self.waiting = None
                self.reply({"subscribers": self.subscribers})
            elif time.monotonic() > deadline:
                self.waiting = None
                self.reply({"error": f"no subscriber on every stream within {command.get('timeout')}s"})
            return
        if self.job is not None:
            self._step(self.job)
            return
        while self.commands and self.job is None and self.waiting is None and not self.quit:
            self._start(self.commands.popleft())

    def _start(self, command: dict[str, Any]) -> None:
        name = command.get("cmd")
        if name == "send":
            self.job = _Send(
                count=int(command["count"]),
                rate=float(command.get("rate", 0)),
                when_subscribed=bool(command.get("when_subscribed", False)),
                exact=bool(command.get("exact", False)),
                first_seq=list(self.next_seq),
            )
        elif name == "wait_subscribers":
            self.waiting = (time.monotonic() + float(command.get("timeout", 30)), command)
        elif name == "replays":
            self.reply({"replays": self.replays})
        elif name == "quit":
            self.quit = True
        else:
            self.reply({"error": f"unknown command {name!r}"})

    def _step(self, job: _Send) -> None:
        if job.when_subscribed and not all(self.subscribers):
            return
        if job.t_start is None:
            job.t_start = time.time()
        if job.rate == 0:
            todo = min(FLAT_OUT_SLICE, job.count - job.sent)
        else:
            due = int((time.time() - job.t_start) * job.rate) + 1
            todo = min(PACED_SLICE, due - job.sent, job.count - job.sent)
        for _ in range(todo):
            for rank in range(self.count):
                if job.exact and job.sent >= len(self.payloads[rank]):
                    continue  # this stream's set is exhausted: no wrap-around
                job.ts_last = self._send_one(rank)
            job.sent += 1
        if job.sent >= job.count:
            job.t_end = time.time()
            self.job = None
            self.reply(
                {
                    "sent": job.sent,
                    "first_seq": job.first_seq,
                    "last_seq": [s - 1 for s in self.next_seq],
                    "t_start": job.t_start,
                    "t_end": job.t_end,
                    "ts_last": job.ts_last,
                    "seconds": job.t_end - job.t_start,
                }
            )

    def _send_one(self, rank: int) -> float:
        payloads = self.payloads[rank]
        index = self.next_index[rank]
        buf = bytearray(payloads[index])
        self.next_index[rank] = index + 1 if index + 1 < len(payloads) else 0
        seq = self.next_seq[rank]
        self.next_seq[rank] = seq + 1
        ts = time.time()
        stamp(buf, ts)
        self.pubs[rank].send_multipart([self.topic, wire.seq_bytes(seq), buf])
        if self.keep:
            self.buffers[rank].append((seq, buf))  # a fresh buffer per send: never stamped again
        return ts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.publisher", description=__doc__.split("\n\n")[0])
    parser.add_argument("--payloads", required=True, type=Path, help="a payload set file (bench.payloads)")
    parser.add_argument("--endpoint", required=True, help="XPUB bind address of rank 0 (rank r: port + r)")
    parser.add_argument("--replay", help="ROUTER bind address of rank 0 (rank r: port + r)")
    parser.add_argument("--buffer-steps", type=int, default=10_000, help="batches kept for replay per stream")
    parser.add_argument("--streams", type=int, default=None, help="use only the first N streams of the set")
    args = parser.parse_args(argv)
    payloads = msgspec.msgpack.decode(args.payloads.read_bytes(), type=PayloadSet)
    if args.streams is not None:
        payloads.streams = payloads.streams[: args.streams]
    Publisher(payloads, args.endpoint, args.replay, args.buffer_steps).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
