"""Helpers for talking to the simulator (or any vLLM-style publisher) from tests."""

from __future__ import annotations

import asyncio
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import zmq
import zmq.asyncio

from kvgateway import wire

ROOT = Path(__file__).resolve().parents[2]
READY_RE = re.compile(r"^simulate: rank (\d+) publishing (?:on|to) (\S+)(?: \(connect\))? replay (\S+)$")

Layout = Literal["topic", "plain"]


def free_port_block(count: int = 1, host: str = "") -> int:
    """A base port such that ``base .. base + count - 1`` are all free right now (all interfaces)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((host, 0))
            base = int(probe.getsockname()[1])
        if base + count > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no block of {count} free ports found")


def connectable(endpoint: str) -> str:
    """A bound endpoint as a client dials it (wildcard hosts become loopback)."""
    return endpoint.replace("tcp://0.0.0.0:", "tcp://127.0.0.1:").replace("tcp://*:", "tcp://127.0.0.1:")


def parse_replay_reply(frames: Sequence[bytes], layout: Layout) -> tuple[int, bytes]:
    """One replay reply as a DEALER sees it (leading empty frame included): (seq, payload).

    The end marker comes back as seq -1 (signed) with an empty payload.
    """
    assert frames[0] == b"", "DEALER replies start with the empty delimiter"
    body = list(frames[1:])
    if layout == "topic":
        assert len(body) == 3, f"topic layout has 3 frames after the delimiter, got {len(body)}"
        body = body[1:]
    else:
        assert len(body) == 2, f"plain layout has 2 frames after the delimiter, got {len(body)}"
    seq_frame, payload = body
    if seq_frame == wire.END_SEQ_BYTES:
        assert payload == b""
        return wire.END_SEQ, payload
    return wire.parse_seq(seq_frame), payload


def replay_sync(
    context: zmq.Context[zmq.Socket[bytes]], endpoint: str, start: int, layout: Layout, timeout: float = 10.0
) -> list[tuple[int, bytes]]:
    """Ask a replay from ``start`` with a DEALER; every (seq, payload) up to the end marker."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", wire.seq_bytes(start)])
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not dealer.poll(int(remaining * 1000)):
                raise AssertionError(f"replay from {start} on {endpoint}: no end marker within {timeout}s")
            seq, payload = parse_replay_reply(dealer.recv_multipart(), layout)
            if seq == wire.END_SEQ:
                return out
            out.append((seq, payload))
    finally:
        dealer.close(linger=0)


async def replay_async(
    context: zmq.asyncio.Context,
    endpoint: str,
    start: int,
    layout: Layout = "topic",
    *,
    within: float = 5.0,
) -> list[tuple[int, bytes]]:
    """Asyncio twin of :func:`replay_sync`; raises TimeoutError without an end marker ``within`` seconds."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        await dealer.send_multipart([b"", wire.seq_bytes(start)])
        out: list[tuple[int, bytes]] = []
        async with asyncio.timeout(within):
            while True:
                seq, payload = parse_replay_reply(await dealer.recv_multipart(), layout)
                if seq == wire.END_SEQ:
                    return out
                out.append((seq, payload))
    finally:
        dealer.close(linger=0)


class SimulatorProcess:
    """``python -m kvgateway simulate ARGS`` with its stdout read by a thread (lines in a queue)."""

    def __init__(self, args: Sequence[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvgateway", "simulate", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_ready(self, ranks: int, timeout: float = 20.0) -> list[tuple[int, str, str]]:
        """The (rank, publish endpoint, replay endpoint) of every rank, from the readiness lines."""
        found: list[tuple[int, str, str]] = []
        deadline = time.monotonic() + timeout
        while len(found) < ranks:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("simulator did not print its readiness lines in time") from None
            if line is None:
                raise AssertionError(f"simulator exited early ({self.proc.wait()}): {self.stderr()}")
            match = READY_RE.match(line)
            if match:
                found.append((int(match[1]), match[2], match[3]))
        return sorted(found)

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr is not None and self.proc.poll() is not None else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("simulator ignored the signal") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
