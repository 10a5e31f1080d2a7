"""kvgateway.engine.sockets on real ZeroMQ sockets (inproc pairs): waiting and receiving whole messages."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator

import pytest
import zmq

from kvgateway.engine.sockets import Readiness, has_message, monitor_event, receiver

Pair = tuple[zmq.Socket[bytes], zmq.Socket[bytes]]


@pytest.fixture
def pair() -> Iterator[Pair]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sender, reader = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    reader.bind("inproc://zsocket-test")
    sender.connect("inproc://zsocket-test")
    yield sender, reader
    context.destroy(linger=0)


def test_the_receiver_returns_whole_messages_of_any_frame_count_then_none(pair: Pair) -> None:
    sender, reader = pair
    messages = [[b"topic", b"\x00" * 8, b"payload"], [b"one"], [b"a", b"", b"c", b"d"]]
    for message in messages:
        sender.send_multipart(message)
    assert has_message(reader)  # inproc: queued at once
    receive = receiver(reader)
    got = []
    while (frames := receive()) is not None:
        got.append(frames)
    assert got == messages
    assert receive() is None


def test_the_receiver_takes_each_frame_count_past_the_three_it_reads_without_a_loop(pair: Pair) -> None:
    sender, reader = pair
    messages = [[b"seq", b"payload"], [b"t", b"s", b"p"], [b""], [b"1", b"2", b"3", b"4", b"5"], [b"x", b""]]
    for message in messages:
        sender.send_multipart(message)
    receive = receiver(reader)
    assert [receive() for _ in messages] == messages
    assert receive() is None


def test_readiness_waits_for_a_message_and_times_out_without_one(pair: Pair) -> None:
    sender, reader = pair

    async def scenario() -> tuple[bool, bool, bool, bool]:
        loop = asyncio.get_running_loop()
        readiness = Readiness(reader, loop)
        try:
            empty = await readiness.wait(0.05)
            loop.call_later(0.05, sender.send, b"late")
            late = await readiness.wait(2.0)
            received = reader.recv(zmq.NOBLOCK) == b"late"
            sender.send(b"queued")
            queued = await readiness.wait(0.0)  # already there: no waiting at all
            return empty, late, received, queued
        finally:
            readiness.close()

    assert asyncio.run(scenario()) == (False, True, True, True)


def test_a_monitor_message_gives_its_event_number() -> None:
    frame = struct.pack("<HI", int(zmq.EVENT_CONNECT_RETRIED), 100)
    assert monitor_event([frame, b"tcp://127.0.0.1:5557"]) == zmq.EVENT_CONNECT_RETRIED
    assert monitor_event([frame]) is None
    assert monitor_event([b"short", b"x"]) is None
