"""kvgateway.serve.sessions: a route's pump takes chunks from its subscription, up to a byte cap,
and wakes on a publish or a close."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from kvgateway.protocol import messages
from kvgateway.protocol.filters import ClientFilter
from kvgateway.protocol.messages import OutMessage
from kvgateway.serve.hub import ShuttingDown
from kvgateway.serve.query import ClientRequest
from kvgateway.serve.sessions import UTF8_TEXT, Pump, Turns, Writers, turns, ws_session
from tests.support.events import batch, stored
from tests.support.hub import make_hub, next_chunk, offsets, publish_batch, run, sample, subscribe, subscribe_request


def test_next_chunk_returns_everything_pending_up_to_the_byte_cap() -> None:
    hub = make_hub()
    sub = subscribe(hub)
    for seq in range(10):
        publish_batch(hub, "a", 0, seq, batch(stored(seq)))

    async def chunks() -> tuple[list[OutMessage], list[OutMessage], list[OutMessage]]:
        first = await next_chunk(sub, max_bytes=1)  # never less than one message
        assert first is not None
        size = len(sub._queue[0].data) * 3
        second = await next_chunk(sub, max_bytes=size)
        rest = await next_chunk(sub)
        assert second is not None
        assert rest is not None
        return first, second, rest

    first, second, rest = run(chunks())
    assert offsets(first) == [1]
    assert offsets(second) == [2, 3, 4]
    assert offsets(rest) == list(range(5, 11))
    assert sub.queued_bytes == 0
    frame = messages.ws_text(rest)
    assert frame.split("\n") == [m.text for m in rest]
    assert not frame.endswith("\n")
    assert messages.ws_text(rest[:1]) is rest[0].text
    sse = messages.sse_bytes(rest)
    assert sse.count(b"\n\n") == len(rest)
    assert sse.startswith(f"id: {hub.epoch}:5\nevent: batch\ndata: {{".encode())
    assert sample(hub, "kvgateway_messages_sent_total", transport="ws") == 10
    assert sample(hub, "kvgateway_client_queue_bytes_count") == 3


def test_next_chunk_waits_for_a_publish_and_close_wakes_it() -> None:
    hub = make_hub()

    async def scenario() -> None:
        sub = subscribe(hub)
        waiting = asyncio.ensure_future(next_chunk(sub))
        await asyncio.sleep(0)
        assert not waiting.done()
        with pytest.raises(RuntimeError, match="already"):
            await next_chunk(sub)
        publish_batch(hub, "a", 0, 1, batch(stored(1)))
        chunk = await asyncio.wait_for(waiting, 1)
        assert chunk is not None
        assert offsets(chunk) == [1]
        waiting = asyncio.ensure_future(next_chunk(sub))
        await asyncio.sleep(0)
        hub.close()
        assert await asyncio.wait_for(waiting, 1) is None
        assert sub.closed_reason == "shutdown"
        # a cancelled wait leaves the subscription usable
        other = make_hub()
        sub2 = subscribe_request(other, ClientRequest(ClientFilter()), "sse")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(next_chunk(sub2), 0.01)
        publish_batch(other, "a", 0, 1, batch())
        assert await asyncio.wait_for(next_chunk(sub2), 1) is not None

    run(scenario())
    assert sample(hub, "kvgateway_client_disconnects_total", transport="ws", reason="shutdown") == 1
    with pytest.raises(ShuttingDown):
        subscribe(hub)


def test_writers_closed_waits_for_every_open_session_and_no_longer() -> None:
    """A signal's shutdown waits on :meth:`Writers.closed` so that each WebSocket session sends
    the gateway's own close before uvicorn's bare 1012: it returns at once with none open, and
    otherwise only when the last one has returned."""

    async def scenario() -> list[str]:
        writers = Writers()
        await asyncio.wait_for(writers.closed(), 1)  # none open: at once
        said: list[str] = []
        first, second = writers.writing(), writers.writing()
        first.__enter__()
        second.__enter__()
        waiter = asyncio.ensure_future(writers.closed())
        for _ in range(5):
            await asyncio.sleep(0)
        said.append(f"two open, done={waiter.done()}")
        first.__exit__(None, None, None)
        for _ in range(5):
            await asyncio.sleep(0)
        said.append(f"one open, done={waiter.done()}")
        second.__exit__(None, None, None)
        await asyncio.wait_for(waiter, 1)
        said.append("none open, done=True")
        with writers.writing():  # a session that ends with an error still counts as closed
            pass
        await asyncio.wait_for(writers.closed(), 1)
        return said

    assert asyncio.run(scenario()) == ["two open, done=False", "one open, done=False", "none open, done=True"]


def _offsets_of(parts: Sequence[bytes]) -> list[int]:
    """The offsets of a frame's messages, from its parts (messages and the newlines between)."""
    return [json.loads(line)["offset"] for line in b"".join(parts).split(b"\n")]


def test_a_pump_writes_one_chunk_a_turn_from_the_push_and_the_rest_at_the_next_turn() -> None:
    """With ``write_directly``, a message queued while the writer waits is written by the push
    itself; a second in the same turn of the loop (a burst) waits for the next turn, where it and
    the rest go as one chunk, written by the pump: the writer is never woken. After a chunk of
    several messages the next turn's message waits for the turn after as well (a flood stays
    coalesced); once a chunk held one alone, the push writes directly again."""
    hub = make_hub()

    async def scenario() -> list[list[int]]:
        sub = subscribe(hub)
        pump = Pump(sub)
        written: list[list[int]] = []

        def send_now(chunk: Callable[[], Sequence[bytes]]) -> bool:
            written.append(_offsets_of(chunk()))
            return True

        pump.write_directly(send_now)
        waiting = asyncio.ensure_future(pump.next_chunk())
        await asyncio.sleep(0)
        publish_batch(hub, "a", 0, 0, batch(stored(0)))
        assert written == [[1]] and not sub.pending
        assert not sub._in_flight  # written: the bound applies as to an idle writer
        for seq in (1, 2):  # the same turn: queued for the next
            publish_batch(hub, "a", 0, seq, batch(stored(seq)))
        assert written == [[1]] and sub.pending
        await asyncio.sleep(0)
        assert written == [[1], [2, 3]] and not sub.pending and not sub._in_flight
        publish_batch(hub, "a", 0, 3, batch(stored(3)))  # after a chunk of two: the next turn
        assert written == [[1], [2, 3]]
        await asyncio.sleep(0)
        assert written == [[1], [2, 3], [4]]
        publish_batch(hub, "a", 0, 4, batch(stored(4)))  # after a chunk of one: from the push
        assert written == [[1], [2, 3], [4], [5]]
        await asyncio.sleep(0)
        assert not waiting.done()  # the writer was never woken
        hub.close()
        assert await asyncio.wait_for(waiting, 1) is None
        return written

    assert run(scenario()) == [[1], [2, 3], [4], [5]]
    assert sample(hub, "kvgateway_messages_sent_total", transport="ws") == 5


def test_a_pump_that_cannot_write_at_once_wakes_its_writer_and_a_failing_write_ends_the_client() -> None:
    """``send_now`` refusing (flow control), from the push or at the next turn, leaves the
    messages queued for the woken writer; one raising closes the subscription (reason error) and
    ends the writer's wait, never the push."""
    hub = make_hub()

    async def scenario() -> tuple[list[list[int]], list[list[int]], str | None]:
        sub = subscribe(hub)
        pump = Pump(sub)
        pump.write_directly(lambda chunk: False)
        woken: list[list[int]] = []
        waiting = asyncio.ensure_future(pump.next_chunk())
        await asyncio.sleep(0)
        publish_batch(hub, "a", 0, 0, batch(stored(0)))
        chunk = await asyncio.wait_for(waiting, 1)
        assert chunk is not None
        woken.append(offsets(chunk))
        sub.written()
        written: list[list[int]] = []

        def open_once(chunk: Callable[[], Sequence[bytes]]) -> bool:
            if written:
                return False  # the transport's buffer above its mark now
            written.append(_offsets_of(chunk()))
            return True

        pump.write_directly(open_once)
        waiting = asyncio.ensure_future(pump.next_chunk())
        await asyncio.sleep(0)
        for seq in (1, 2, 3):  # one turn: the first from the push, the rest refused at the next
            publish_batch(hub, "a", 0, seq, batch(stored(seq)))
        chunk = await asyncio.wait_for(waiting, 1)
        assert chunk is not None
        woken.append(offsets(chunk))
        sub.written()

        def failing(chunk: Callable[[], Sequence[bytes]]) -> bool:
            chunk()
            raise OSError("gone")

        pump.write_directly(failing)
        waiting = asyncio.ensure_future(pump.next_chunk())
        await asyncio.sleep(0)
        publish_batch(hub, "a", 0, 4, batch(stored(4)))  # the push returns: the hub goes on
        assert await asyncio.wait_for(waiting, 1) is None
        return written, woken, sub.closed_reason

    assert run(scenario()) == ([[2]], [[1], [3, 4]], "error")
    assert sample(hub, "kvgateway_client_disconnects_total", transport="ws", reason="error") == 1


def test_the_turns_of_a_loop_do_not_keep_it_alive() -> None:
    """Each loop has its own :class:`Turns` (a pump finds it once), and a closed loop is not kept
    by it: the tests run a loop each, and so could a process."""
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def scenario() -> Turns:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        found = turns()
        assert turns() is found and found.claim(-1) == 0 and found.claim(0) is None
        await asyncio.sleep(0)
        assert found.claim(0) == 1  # the next turn
        return found

    first, second = asyncio.run(scenario()), asyncio.run(scenario())
    assert first is not second
    del first, second
    gc.collect()
    assert [loop() for loop in loops] == [None, None]


class _BrokenSocket:
    """What :func:`ws_session` uses of a Starlette WebSocket, on a transport that fails: the frames
    the awaited send writes are kept, the ``send_now`` offered with :data:`UTF8_TEXT` raises (the
    peer is gone), the client says nothing, and the close the session sends is kept."""

    def __init__(self) -> None:
        self.sent: list[Mapping[str, Any]] = []
        self.closed: tuple[int, str] | None = None
        self.scope = {"type": "websocket", "extensions": {UTF8_TEXT: {"send": self.send, "send_now": self._fail}}}

    async def send(self, message: Mapping[str, Any]) -> None:
        self.sent.append(message)

    def _fail(self, chunk: Callable[[], Sequence[bytes]]) -> bool:
        raise OSError("connection reset")

    async def accept(self) -> None:
        pass

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()  # a client that never speaks (cancelled by the session)
        raise AssertionError("unreachable")

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


def test_a_session_whose_transport_fails_closes_with_1011() -> None:
    """A write that raises ends that client alone ("error"), and the session closes it with 1011,
    the internal error docs/protocol.md's table names (a close to a peer that may be gone)."""
    hub = make_hub()
    websocket = _BrokenSocket()

    async def scenario() -> str | None:
        sub = subscribe(hub)
        session = asyncio.ensure_future(ws_session(websocket, sub))  # type: ignore[arg-type]
        for _ in range(5):
            await asyncio.sleep(0)
        assert [m["type"] for m in websocket.sent] == ["websocket.send"]  # the hello, awaited
        publish_batch(hub, "a", 0, 0, batch(stored(0)))  # written from the push: the transport fails
        await asyncio.wait_for(session, 5)
        return sub.closed_reason

    assert run(scenario()) == "error"
    assert websocket.closed == (1011, "")
    assert sample(hub, "kvgateway_client_disconnects_total", transport="ws", reason="error") == 1
