"""The writers of the web layer: one per client, between its :class:`~kvgateway.serve.subscription.Subscription`
(I/O-free) and its socket. Here live the waiting (a future per wait, no task per chunk), the SSE
keepalive timer, the WebSocket close codes, and the marking of a chunk as in flight while it is
written, which is what the subscription's slow-client rule looks at."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Final

from starlette.websockets import WebSocket, WebSocketDisconnect

from kvgateway.protocol.messages import SSE_PING, OutMessage, sse_bytes, sse_preamble, ws_parts, ws_text
from kvgateway.serve.subscription import CHUNK_BYTES, Subscription

SSE_RETRY_MS = 2000

UTF8_TEXT: Final = "kvgateway.websocket.utf8_text"
"""An ASGI extension (in ``scope["extensions"]``) and the key of a ``websocket.send`` message whose
value is a sequence of bytes: one text frame whose payload is their concatenation, UTF-8 already.
The gateway's uvicorn protocol offers it (kvgateway.serve.ws_protocol, not imported here: uvicorn's
modules stay out of a process that only serves in process), with ``"send"``: the ASGI send it gives
the app, which a session's chunks take directly, not through Starlette's ``WebSocket.send`` and the
middlewares' wrappers (a state check and pass-throughs for a ``websocket.send``, about 1 us a chunk;
what they would make of an error, a WebSocketDisconnect from an OSError, ends the session alike)."""

WS_CLOSE: Final[dict[str, tuple[int, str]]] = {
    "slow_consumer": (1013, "slow consumer"),
    "too_many_clients": (1013, "too many clients"),
    "shutdown": (1012, "gateway shutting down"),
    "error": (1011, ""),  # the client's transport failed: a close is tried, the peer may be gone
}
"""WebSocket close code and reason for each way the gateway ends a connection (docs/protocol.md)."""


class Writers:
    """The WebSocket sessions still open, so that a shutdown can wait for each to send the
    gateway's own close (1012 and its reason) before uvicorn closes what is left with a bare 1012:
    on a loaded machine a session may still be writing its last chunk when the signal comes."""

    __slots__ = ("_idle", "_open")

    def __init__(self) -> None:
        self._open = 0
        self._idle: asyncio.Event | None = None

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        self._open += 1
        try:
            yield
        finally:
            self._open -= 1
            if self._open == 0 and self._idle is not None:
                self._idle.set()

    async def closed(self) -> None:
        """Returns once no session is open."""
        while self._open:
            self._idle = asyncio.Event()
            await self._idle.wait()


SendNow = Callable[[Callable[[], Sequence[bytes]]], bool]
"""The ``"send_now"`` of :data:`UTF8_TEXT`: writes the frame of the parts its argument returns
without awaiting, or returns False (and calls nothing) when it cannot (flow control, a close)."""


class Turns:
    """Which turn of an event loop it is, as far as a session's writes outside its writer's task
    need it, and the pumps whose chunk waits for the next turn. A pump writes at most one chunk a
    turn from the hub's push (:meth:`Pump.write_directly`); what it cannot write then waits for
    the next turn, where one callback writes every such pump's chunk (:meth:`Pump.flush`). A new
    turn is noticed by that callback, scheduled when the first write or wait of a turn claims it,
    which runs after every callback of this turn (the reader's whole burst among them). One a loop
    (:func:`turns`): a pump asks for it once, not at every push."""

    __slots__ = ("__weakref__", "_due", "_loop", "_scheduled", "turn")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.turn = 0
        self._scheduled = False
        self._loop = weakref.ref(loop)  # not kept alive by its entry in _TURNS
        self._due: list[Pump] = []

    def claim(self, last: int) -> int | None:
        """This turn's number, or None when it is ``last`` (the caller's previous claim)."""
        if self.turn == last:
            return None
        if not self._scheduled:
            self._schedule()
        return self.turn

    def defer(self, pump: Pump) -> None:
        """``pump`` writes its chunk at the start of the next turn (:meth:`Pump.flush`)."""
        self._due.append(pump)
        if not self._scheduled:
            self._schedule()

    def _schedule(self) -> None:
        loop = self._loop()
        if loop is not None:
            self._scheduled = True
            loop.call_soon(self._next)

    def _next(self) -> None:
        self.turn += 1
        self._scheduled = False
        due = self._due
        if due:
            self._due = []
            for pump in due:
                pump.flush()


_TURNS: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Turns]] = weakref.WeakKeyDictionary()


def turns() -> Turns:
    """The running loop's :class:`Turns` (tests run a loop each)."""
    loop = asyncio.get_running_loop()
    found = _TURNS.get(loop)
    if found is None:
        found = _TURNS[loop] = Turns(loop)
    return found


class Pump:
    """Waits on one subscription for its chunks."""

    __slots__ = ("_coalescing", "_send_now", "_taken", "_turn", "_turns", "_waiter", "subscription")

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self._waiter: asyncio.Future[None] | None = None
        self._send_now: SendNow | None = None
        self._turn = -1  # the turn of the last chunk written straight from the hub
        self._coalescing = False  # the last chunk held several messages: a burst, a flood
        self._taken = 0  # how many messages the chunk written last held
        self._turns: Turns | None = None  # the loop's, once the pump writes outside its writer
        subscription.wakeup = self._wake

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is None:
            return
        send_now, turns = self._send_now, self._turns
        if send_now is not None and turns is not None and self.subscription.closed_reason is None:
            if self._coalescing:
                turns.defer(self)
                return
            turn = turns.claim(self._turn)
            if turn is None:
                turns.defer(self)
                return
            self._turn = turn
            if self._send(send_now):
                return  # written: the writer goes on waiting
        self._release()

    def _release(self) -> None:
        """Wakes the writer."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _parts(self) -> Sequence[bytes]:
        chunk = self.subscription.take()
        self._taken = len(chunk)
        return ws_parts(chunk)

    def _send(self, send_now: SendNow) -> bool:
        """One chunk written with ``send_now``, or False (nothing taken, unless it raised)."""
        sub = self.subscription
        try:
            sent = send_now(self._parts)
        except Exception:  # a transport failing: this client ends, never the hub's push
            # closed after the push: closing edits the hub's clients, which it is iterating
            asyncio.get_running_loop().call_soon(sub.close, "error")
            return False
        if sent:
            sub.written()
            self._coalescing = self._taken > 1
        return sent

    def write_directly(self, send_now: SendNow) -> None:
        """From now on, a message queued while the writer waits is written with ``send_now``
        without waking the writer's task, which goes on waiting: at once, from the hub's push (no
        wait for the rest of the ingest's turn: the other followers of the log, the next batches
        of a burst), at most once a turn of the event loop; else at the start of the next turn, by
        :meth:`flush`, with whatever else came meanwhile as one chunk: a burst's later batches, and
        every batch of a flood while the last chunk held more than one (a write of each turn's
        first batch alone would double the writes). The writer is woken only when ``send_now``
        cannot write (flow control, not the plain case) or the subscription closes. Call it from
        the event loop's thread."""
        self._turns = turns()
        self._send_now = send_now

    def flush(self) -> None:
        """The chunks queued while the writer waits, written as it would write them, for
        :class:`Turns` at the start of the turn after a push that could not write."""
        send_now = self._send_now
        sub = self.subscription
        while self._waiter is not None and sub.pending and sub.closed_reason is None:
            if send_now is None or not self._send(send_now):
                self._release()  # the writer writes it, waiting for the transport as it must
                return

    async def next_chunk(self, max_bytes: int = CHUNK_BYTES, idle: float | None = None) -> list[OutMessage] | None:
        """Wait for at least one message, then take every queued one up to ``max_bytes``; the
        caller writes it and calls ``subscription.written()``.

        None once the subscription is closed (by the route, the hub's shutdown, or for
        slowness); a closed subscription's queue is dropped, not flushed. With ``idle``: an empty
        list when nothing came for that many seconds (the SSE keepalive).
        """
        sub = self.subscription
        while not sub.pending:
            if sub.closed_reason is not None:
                return None
            if self._waiter is not None:
                raise RuntimeError("next_chunk() is already being awaited")
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiter = waiter
            timer = None if idle is None else loop.call_later(idle, _wake_idle, waiter)
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
                if timer is not None:
                    timer.cancel()
            if idle is not None and not sub.pending and sub.closed_reason is None:
                return []
        chunk = sub.take(max_bytes)
        self._coalescing = len(chunk) > 1
        return chunk


def _wake_idle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _hello(subscription: Subscription) -> OutMessage:
    """The hello to send. Over SSE with a block snapshot it has no ``id:`` line (the last state
    message has it): an EventSource that drops mid-snapshot must not resume a partial state."""
    hello = subscription.hello_message
    if subscription.snapshot is not None and subscription.transport == "sse":
        return OutMessage(hello.data, hello.type)
    return hello


def _drop_state(subscription: Subscription) -> None:
    """A client that left before its state was sent frees its snapshot slot now."""
    snapshot, subscription.snapshot = subscription.snapshot, None
    if snapshot is not None:
        snapshot.release()


def _state(subscription: Subscription) -> Iterator[OutMessage]:
    """The ``state`` messages of a ``snapshot=blocks`` client, one chunk per step (the writer
    yields to the event loop between steps); stops early when the subscription is closed. Live
    messages wait in the queue meanwhile, which the hold bounds (:meth:`Subscription.hold`)."""
    snapshot = subscription.snapshot
    if snapshot is None:
        return
    try:
        for message in snapshot.messages():
            if subscription.closed_reason is not None:
                return
            yield message
    finally:
        snapshot.release()
        subscription.snapshot = None
        subscription.unhold()


def frame_writer(websocket: WebSocket) -> Callable[[Sequence[OutMessage]], Awaitable[None]]:
    """How a session writes a chunk as one text frame (its messages joined by newlines): the
    messages' own bytes, uncopied, where the server offers :data:`UTF8_TEXT` (the gateway's
    uvicorn protocol, kvgateway.serve.ws_protocol), through the send it offers with it; else as the
    ``str`` ASGI defines, through ``websocket.send``."""
    offered = (websocket.scope.get("extensions") or {}).get(UTF8_TEXT)
    if offered is not None:
        send_raw = offered.get("send", websocket.send)

        async def send_parts(chunk: Sequence[OutMessage]) -> None:
            await send_raw({"type": "websocket.send", UTF8_TEXT: ws_parts(chunk)})

        return send_parts

    send = websocket.send

    async def send_text(chunk: Sequence[OutMessage]) -> None:
        await send({"type": "websocket.send", "text": ws_text(chunk)})

    return send_text


def direct_sender(websocket: WebSocket) -> SendNow | None:
    """The ``send_now`` the server offers with :data:`UTF8_TEXT` (the gateway's uvicorn protocol), or None."""
    offered = (websocket.scope.get("extensions") or {}).get(UTF8_TEXT)
    return None if offered is None else offered.get("send_now")


async def ws_session(websocket: WebSocket, subscription: Subscription) -> None:
    await websocket.accept()
    pump = Pump(subscription)
    write = frame_writer(websocket)
    # The reader closes the subscription when the client leaves, which wakes the pump.
    reader = asyncio.ensure_future(_drain_inbound(websocket, subscription))
    live: asyncio.Future[None] | None = None
    try:
        await write((subscription.hello_message,))
        for state in _state(subscription):
            await write((state,))
            await asyncio.sleep(0)  # one chunk per turn: other clients keep their latency
        # The live chunks are written by a task of their own, for the session's life (not one per
        # chunk): each wake-up then resumes that task's two frames, not this coroutine's callers,
        # the ASGI app's dozen middlewares and routes, each resumed and suspended again per chunk.
        live = asyncio.ensure_future(_write_live(pump, write, direct_sender(websocket)))
        await live
        if not reader.done():  # cut by the gateway (slow, shutdown), not gone by itself
            code, reason = WS_CLOSE.get(subscription.closed_reason or "", (1000, ""))
            await websocket.close(code, reason)
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass
    finally:
        for task in (live, reader):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        subscription.close("closed")
        _drop_state(subscription)


async def _write_live(
    pump: Pump, write: Callable[[Sequence[OutMessage]], Awaitable[None]], send_now: SendNow | None = None
) -> None:
    """Every chunk the subscription hands out, until it is closed: awaits next_chunk() itself, with
    no task and no asyncio.wait() per chunk (they cost more than the write). With ``send_now``
    (the gateway's uvicorn protocol), the chunks are written by the pump while this waits, from
    the hub's push or at the next turn (:meth:`Pump.write_directly`); this writes those that must
    wait for the transport."""
    subscription = pump.subscription
    if send_now is not None:
        pump.write_directly(send_now)
    while True:
        chunk = await pump.next_chunk()
        if chunk is None:
            return
        # Several messages in one frame, newline-delimited: one frame per message would collapse
        # throughput under load.
        try:
            await write(chunk)
        finally:
            subscription.written()


async def _drain_inbound(websocket: WebSocket, subscription: Subscription) -> None:
    """Clients have nothing to say: what they send (at most 64 KiB a frame) is read and dropped,
    which is also how a departure is noticed: the subscription is closed, waking the pump."""
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
    finally:
        subscription.close("closed")


async def sse_stream(subscription: Subscription, keepalive: float) -> AsyncIterator[bytes]:
    pump = Pump(subscription)
    try:
        yield sse_preamble(SSE_RETRY_MS) + _hello(subscription).sse
        for state in _state(subscription):
            yield state.sse
            await asyncio.sleep(0)
        while True:
            # One timer per wait for the keepalive, none when messages are already queued.
            chunk = await pump.next_chunk(idle=keepalive)
            if chunk == []:
                yield SSE_PING  # nothing for `keepalive` seconds: keeps proxies from closing the stream
                continue
            if chunk is None:
                farewell = subscription.farewell()
                if farewell is not None:
                    yield farewell.sse
                return
            try:
                yield sse_bytes(chunk)
            finally:
                subscription.written()
    finally:
        subscription.close("closed")
        _drop_state(subscription)
