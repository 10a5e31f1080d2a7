"""kvgateway.serve.sessions: a route's pump takes chunks from its subscription, up to a byte cap,
and wakes on a publish or a close."""

from __future__ import annotations

import asyncio

import pytest

from kvgateway.protocol import messages
from kvgateway.protocol.filters import ClientFilter
from kvgateway.protocol.messages import OutMessage
from kvgateway.serve.hub import TooManyClients
from kvgateway.serve.query import ClientRequest
from kvgateway.serve.sessions import Writers
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
    with pytest.raises(TooManyClients):
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
