"""kvgateway.engine.sockets on real ZeroMQ sockets (inproc pairs): waiting and receiving whole messages."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator

import pytest
import zmq

from kvgateway.engine.sockets import Readiness, has_message, monitor_event, monitor_value, receiver

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
    assert monitor_value([frame, b"tcp://127.0.0.1:5557"]) == 100  # the retry's interval, in ms
    assert monitor_event([frame]) is None
    assert monitor_event([b"short", b"x"]) is None


def _read_until(reader: zmq.Socket[bytes], wanted: int, first_look: bool) -> list[bytes]:
    """The live reader's loop: receive until none, then wait for the descriptor alone."""

    async def scenario() -> list[bytes]:
        readiness = Readiness(reader, asyncio.get_running_loop())
        receive = receiver(reader)
        got: list[bytes] = []
        try:
            if first_look:
                await readiness.wait()
            while len(got) < wanted:
                while (frames := receive()) is not None:
                    got.append(frames[-1])
                if len(got) < wanted:
                    # generous: a lost wake-up would wait for ever, and fail here instead
                    await asyncio.wait_for(readiness.signalled(), 30.0)
        finally:
            readiness.close()
        return got

    return asyncio.run(scenario())


@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_waiting_on_the_descriptor_after_an_empty_receive_misses_no_message(transport: str) -> None:
    # The live reader waits for the descriptor alone once a receive found the socket empty: every
    # message sent after that (at any moment, from another thread, also between the empty receive
    # and the wait) must still wake it.
    import threading

    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    publisher, reader = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    try:
        if transport == "tcp":
            port = reader.bind_to_random_port("tcp://127.0.0.1")
            publisher.connect(f"tcp://127.0.0.1:{port}")
        else:
            reader.bind("inproc://signalled-test")
            publisher.connect("inproc://signalled-test")
        sent = [b"%d" % n for n in range(600)]

        def send_all() -> None:
            for n, payload in enumerate(sent):
                publisher.send_multipart([b"topic", payload])
                if n % 7 == 0:  # bursts and pauses, so that waits begin at every phase
                    threading.Event().wait(0.0005 * (n % 3))

        thread = threading.Thread(target=send_all)
        thread.start()
        got = _read_until(reader, len(sent), first_look=True)
        thread.join()
        assert got == sent
    finally:
        context.destroy(linger=0)


def test_a_wake_up_that_brings_no_message_leaves_the_reader_waiting_for_the_next(pair: Pair) -> None:
    sender, reader = pair
    assert receiver(reader)() is None  # empty, and its mailbox with it

    async def scenario() -> tuple[bool, bytes | None]:
        loop = asyncio.get_running_loop()
        readiness = Readiness(reader, loop)
        try:
            waiting = asyncio.ensure_future(readiness.signalled())
            await asyncio.sleep(0)  # waiting now
            readiness.wake()  # another caller of has_message passes a wake-up on
            await asyncio.wait_for(waiting, 30.0)
            spurious = receiver(reader)() is None
            loop.call_later(0.01, sender.send, b"next")
            await asyncio.wait_for(readiness.signalled(), 30.0)
            frames = receiver(reader)()
            return spurious, None if frames is None else frames[0]
        finally:
            readiness.close()

    assert asyncio.run(scenario()) == (True, b"next")
