"""The compiled receive (kvgateway/engine/_receive_c.pyx) against its pure-Python reference
(_receive_py.py) and pyzmq's own ``recv_multipart``, on real ZeroMQ sockets: the same generated
messages (1 to 6 frames, empty frames, frames larger than pyzmq's copy threshold) queued on three
socket pairs, each taken by one of the three until none is left: the same frames in the same
order, then None from both receives, again and again; and the same error on a closed socket.
Skipped where the compiled core was not built."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgateway.engine import _receive_py, sockets
from kvgateway.ingest import reader
from kvgateway.runtime import extensions
from tests.support.cores import compiled_twin

Receive = Callable[[], list[bytes] | None]
Pair = tuple[zmq.Socket[bytes], zmq.Socket[bytes]]


def _compiled() -> ModuleType:
    return compiled_twin("kvgateway.engine._receive_c")


@pytest.fixture(scope="module")
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


_pairs = iter(range(1_000_000))


def _pair(context: zmq.Context[zmq.Socket[bytes]]) -> Pair:
    address = f"inproc://receive-differential-{next(_pairs)}"
    reader, sender = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    reader.setsockopt(zmq.RCVHWM, 0)
    sender.setsockopt(zmq.SNDHWM, 0)
    reader.bind(address)
    sender.connect(address)
    return sender, reader


def _drain(receive: Receive) -> list[list[bytes]]:
    got = []
    while (frames := receive()) is not None:
        got.append(frames)
    return got


FRAME = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b"kv@engine", (7).to_bytes(8, "big")]),
    # above pyzmq's copy threshold (its Frames then hold the message without a copy)
    st.builds(lambda byte, size: bytes([byte]) * size, st.integers(0, 255), st.integers(65_536, 70_000)),
)
MESSAGES = st.lists(st.lists(FRAME, min_size=1, max_size=6), max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=MESSAGES)
def test_the_compiled_receive_takes_the_messages_the_reference_and_pyzmq_take(
    context: zmq.Context[zmq.Socket[bytes]], messages: list[list[bytes]]
) -> None:
    compiled = _compiled()
    sockets = [_pair(context) for _ in range(3)]
    try:
        for sender, _ in sockets:
            for message in messages:
                sender.send_multipart(message)
        readers = [reader for _, reader in sockets]
        receives: list[Receive] = [
            _receive_py.receiver(readers[0]),
            compiled.receiver(readers[1]),
            lambda: readers[2].recv_multipart(zmq.NOBLOCK) if readers[2].poll(0) else None,
        ]
        reference, twin, pyzmq = (_drain(receive) for receive in receives)
        assert reference == messages
        assert twin == reference
        assert pyzmq == reference
        assert [receives[0](), receives[1](), receives[0](), receives[1]()] == [None] * 4
    finally:
        for sender, reader in sockets:
            sender.close(linger=0)
            reader.close(linger=0)


def test_a_message_sent_after_an_empty_look_is_taken_whole(context: zmq.Context[zmq.Socket[bytes]]) -> None:
    compiled = _compiled()
    for make in (_receive_py.receiver, compiled.receiver):
        sender, reader = _pair(context)
        receive = make(reader)
        assert receive() is None
        sender.send_multipart([b"topic", b"\x00" * 8, b"payload"])
        assert reader.poll(1000)  # inproc: queued once the pipe is attached
        assert receive() == [b"topic", b"\x00" * 8, b"payload"]
        assert receive() is None
        sender.close(linger=0)
        reader.close(linger=0)


def test_a_closed_socket_raises_the_same_error(context: zmq.Context[zmq.Socket[bytes]]) -> None:
    compiled = _compiled()
    errors = []
    for make in (_receive_py.receiver, compiled.receiver):
        sender, reader = _pair(context)
        receive = make(reader)
        reader.close(linger=0)
        sender.close(linger=0)
        with pytest.raises(zmq.ZMQError) as raised:
            receive()
        errors.append((type(raised.value), raised.value.errno))
    assert errors[0] == errors[1] == (zmq.ZMQError, zmq.ENOTSOCK)


def test_the_reader_takes_the_compiled_receive_unless_the_pure_core_is_forced() -> None:
    compiled = _compiled()
    assert "kvgateway.engine._receive_c" in extensions.COMPILED_MODULES  # kvgateway --version names it
    assert reader.receiver is (sockets.receiver if extensions.forced_pure() else compiled.receiver)
