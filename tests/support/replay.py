"""A replay client for the tests: ask an engine's ROUTER (the simulator's, or any vLLM-style
publisher's) for its history with a DEALER, and parse its replies."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from itertools import pairwise
from typing import Literal

import zmq
import zmq.asyncio

from kvgateway.engine import wire

Layout = Literal["topic", "plain"]


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


def fetch_history(
    replay_endpoint: str, start: int = 0, timeout: float = 20.0, layout: Layout = "topic"
) -> list[tuple[int, bytes]]:
    """Every batch the engine's replay socket still holds from ``start``: (seq, raw payload).

    The engine sends its reply through a ROUTER that drops past its high-water mark, so a long
    reply can come back with holes or without its end marker: ask again from the first missing
    seq, as the gateway does, until a reply comes back whole, or brings nothing new (a hole the
    engine never buffered stays a hole)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    got: dict[int, bytes] = {}
    deadline = time.monotonic() + timeout
    try:
        ask = start
        while True:
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RCVHWM, 0)
            dealer.connect(replay_endpoint)
            ended = False
            before = len(got)
            try:
                dealer.send_multipart([b"", wire.seq_bytes(ask)])
                while not ended and dealer.poll(2000):
                    seq, payload = parse_replay_reply(dealer.recv_multipart(), layout)
                    if seq == wire.END_SEQ:
                        ended = True
                    else:
                        got.setdefault(seq, payload)
            finally:
                dealer.close(linger=0)
            seqs = sorted(s for s in got if s >= start)
            holes = [a + 1 for a, b in pairwise(seqs) if b != a + 1]
            if (ended and not holes) or (len(got) == before and ask != start):
                return [(seq, got[seq]) for seq in seqs]
            assert time.monotonic() < deadline, f"replay from {start} on {replay_endpoint}: incomplete"
            ask = holes[0] if holes else (seqs[-1] + 1 if seqs else start)
    finally:
        context.term()
