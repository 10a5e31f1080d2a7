"""bench.clients' WebSocket reader: frames cut anywhere by the reads, every batch counted with its
delivered (kernel) and read times, a ping answered by a masked pong, a close echoed and its code kept."""

from __future__ import annotations

import asyncio
import socket
import struct

from bench.clients import Conn, Stats, WSReader


def _frame(opcode: int, payload: bytes) -> bytes:
    """A server's frame (unmasked), in each of the three length forms."""
    if len(payload) < 126:
        return bytes((0x80 | opcode, len(payload))) + payload
    if len(payload) < 65536:
        return struct.pack("!BBH", 0x80 | opcode, 126, len(payload)) + payload
    return struct.pack("!BBQ", 0x80 | opcode, 127, len(payload)) + payload


def _unmask(frame: bytes) -> tuple[int, bytes]:
    assert frame[1] & 0x80  # a client's frames are masked
    length, mask = frame[1] & 0x7F, frame[2:6]
    return frame[0] & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(frame[6 : 6 + length]))


def test_frames_cut_anywhere_are_counted_timed_and_control_frames_answered() -> None:
    async def scenario() -> tuple[Stats, Conn, list[tuple[int, bytes]]]:
        stats = Stats()
        stats.window(1, 3)
        conn = Conn(stats)
        loop = asyncio.get_running_loop()
        reader = WSReader("ws://127.0.0.1:1/v1/ws", conn, loop.create_future(), loop.create_future())
        ours, theirs = socket.socketpair()
        reader.sock = ours
        messages = [
            b'{"type":"batch","seq":"%d","ts":100.0,"pad":"%s"}' % (seq, b"x" * size)
            for seq, size in ((1, 10), (2, 300), (3, 70_000))
        ]
        wire = b"".join(_frame(1, m) for m in messages) + _frame(9, b"hi") + _frame(8, struct.pack("!H", 1013))
        rest = b""
        for cut in (1, 5, 200, 40_000, len(wire)):  # reads ending mid-head, mid-payload, between frames
            rest = reader.frames(rest + wire[:cut], now=100.5, delivered=100.25)
            wire = wire[cut:]
        theirs.setblocking(False)
        sent = theirs.recv(1000)
        answers = [_unmask(sent[:8]), _unmask(sent[8:])]
        theirs.close()
        return stats, conn, answers

    stats, conn, answers = asyncio.run(scenario())
    assert conn.count == 3 and conn.disorder == 0
    assert stats.hist.quantile(1.0) == stats.hist.quantile(0.0)  # every one delivered at 0.25 s
    assert abs((stats.hist.quantile(0.5) or 0) - 0.25) < 0.01
    assert abs((stats.hist_read.quantile(0.5) or 0) - 0.5) < 0.02
    assert answers == [(10, b"hi"), (8, struct.pack("!H", 1013))]
    assert conn.close_code == 1013 and not conn.open
