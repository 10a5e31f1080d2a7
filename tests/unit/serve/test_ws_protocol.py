"""kvgateway.serve.ws_protocol: a text frame sent from its UTF-8 parts is the frame uvicorn's own
protocol writes for the same text, byte for byte, written as the parts themselves (no copy); what is
not the plain case (the client gone, a close sent) goes the way uvicorn's send goes. The protocols
run in process over a recording transport, a real handshake fed to them."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.frames import Frame, Opcode

from kvgateway.protocol import messages
from kvgateway.protocol.messages import OutMessage
from kvgateway.serve.sessions import UTF8_TEXT, Pump, _write_live, direct_sender, frame_writer
from kvgateway.serve.ws_protocol import WebSocketProtocol, frame_head
from tests.support.events import batch, stored
from tests.support.hub import make_hub, publish_batch, sample, subscribe

HANDSHAKE = (
    b"GET /v1/ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)

Send = Callable[[Mapping[str, Any]], Awaitable[None]]
Protocol = WebSocketsSansIOProtocol


class RecordingTransport(asyncio.Transport):
    """What the protocol writes, call by call: each ``write`` or ``writelines`` with its buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[Any]]] = []
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: Any) -> None:
        self.calls.append(("write", [data]))

    def writelines(self, list_of_data: Iterable[Any]) -> None:
        self.calls.append(("writelines", list(list_of_data)))

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def written(self) -> bytes:
        return b"".join(bytes(buffer) for _, buffers in self.calls for buffer in buffers)


async def serve(
    protocol_class: type[Protocol], session: Callable[[Protocol, dict[str, Any], Send], Awaitable[None]]
) -> tuple[Protocol, RecordingTransport]:
    """A handshake fed to a fresh ``protocol_class``; the app accepts and runs ``session(protocol,
    scope, send)``. Returns once the app has returned, the handshake's answer dropped from the record."""
    done = asyncio.get_running_loop().create_future()

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        try:
            assert (await receive())["type"] == "websocket.connect"
            await send({"type": "websocket.accept"})
            await session(protocol, scope, send)
        except BaseException as exc:
            done.set_exception(exc)
            raise
        done.set_result(None)

    config = Config(app=app, ws=protocol_class, ws_per_message_deflate=False, log_config=None, lifespan="off")
    config.load()
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = RecordingTransport()
    protocol.connection_made(transport)
    protocol.data_received(HANDSHAKE)
    await done
    assert transport.calls[0][1][0].startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    del transport.calls[0]
    return protocol, transport


CHUNKS = [
    [b""],
    [b"{}"],
    [b"x" * 125],
    [b"x" * 126],
    [b"x" * 65535],
    [b"x" * 65536],
    [b'{"type":"batch"}', b"\n", '{"source":"caf\u00e9"}'.encode(), b"\n", b"y" * 70_000],
    [b"a" * 60, b"\n", b"b" * 65],  # 126 bytes in three parts
]
"""Payloads around the frame head's three length forms (7 bits, 16, 64), whole and in parts,
non-ASCII UTF-8 among them."""


def test_a_frame_from_parts_is_uvicorns_frame_for_the_same_text_and_the_parts_are_written_as_they_are() -> None:
    async def by_text(protocol: Protocol, scope: dict[str, Any], send: Send) -> None:
        assert UTF8_TEXT not in scope.get("extensions", {})  # uvicorn's own protocol offers nothing new
        for parts in CHUNKS:
            await send({"type": "websocket.send", "text": b"".join(parts).decode()})

    async def by_parts(protocol: Protocol, scope: dict[str, Any], send: Send) -> None:
        offered = scope["extensions"][UTF8_TEXT]
        assert offered["send"] == send  # the ASGI send the app was given, offered to the session
        for parts in CHUNKS:
            await offered["send"]({"type": "websocket.send", UTF8_TEXT: parts})

    async def scenario() -> tuple[RecordingTransport, RecordingTransport]:
        _, uvicorns = await serve(WebSocketsSansIOProtocol, by_text)
        _, ours = await serve(WebSocketProtocol, by_parts)
        return uvicorns, ours

    uvicorns, ours = asyncio.run(scenario())
    assert ours.written() == uvicorns.written()
    expected = b"".join(Frame(Opcode.TEXT, b"".join(parts)).serialize(mask=False) for parts in CHUNKS)
    assert ours.written() == expected
    assert len(ours.calls) == len(CHUNKS)
    for (kind, buffers), parts in zip(ours.calls, CHUNKS, strict=True):
        assert kind == "writelines" and buffers[0] == frame_head(len(b"".join(parts)))
        assert len(buffers) == len(parts) + 1 and all(a is b for a, b in zip(buffers[1:], parts, strict=True))


@pytest.mark.parametrize("names", ["INTERNALS", "CONNECTION"])
def test_a_uvicorn_without_what_the_plain_case_reads_gets_no_extension_and_uvicorns_frames(
    monkeypatch: pytest.MonkeyPatch, names: str
) -> None:
    """As if a uvicorn release had dropped an attribute the plain case reads (of the protocol or of
    its connection): the extension is not offered, and the session's frames are uvicorn's."""
    from kvgateway.serve import ws_protocol

    monkeypatch.setattr(ws_protocol, names, (*getattr(ws_protocol, names), "attribute_of_another_release"))
    chunk = [OutMessage(b'{"n":1}', "batch"), OutMessage('{"s":"\u00e9"}'.encode(), "batch")]

    async def session(protocol: Protocol, scope: dict[str, Any], send: Send) -> None:
        assert UTF8_TEXT not in scope.get("extensions", {})
        websocket = FakeWebSocket(scope.get("extensions"))
        await frame_writer(websocket)(chunk)  # type: ignore[arg-type]
        for message in websocket.sent:
            await send(message)

    _, transport = asyncio.run(serve(WebSocketProtocol, session))
    assert transport.written() == Frame(Opcode.TEXT, messages.ws_text(chunk).encode()).serialize(mask=False)
    assert [kind for kind, _ in transport.calls] == ["write"]  # uvicorn's write, not the parts' writelines


def test_frame_head_has_each_length_form_at_its_bounds() -> None:
    for length in (0, 1, 125, 126, 127, 65535, 65536, 2**32):
        assert frame_head(length) == Frame(Opcode.TEXT, b"").serialize(mask=False)[:1] + _length_field(length)


def _length_field(length: int) -> bytes:
    if length < 126:
        return bytes((length,))
    if length < 65536:
        return bytes((126,)) + length.to_bytes(2, "big")
    return bytes((127,)) + length.to_bytes(8, "big")


def test_not_the_plain_case_goes_uvicorns_way() -> None:
    """After the client is gone, the send raises what uvicorn's raises (ClientDisconnected, an
    OSError the session ends on); after a close is sent, uvicorn's RuntimeError. Nothing is written."""
    said: list[str] = []

    async def after_close(protocol: Protocol, scope: dict[str, Any], send: Send) -> None:
        await send({"type": "websocket.close", "code": 1013, "reason": "slow consumer"})
        with pytest.raises(RuntimeError, match=r"after sending 'websocket\.close'"):
            await send({"type": "websocket.send", UTF8_TEXT: [b"late"]})
        said.append("refused after the close")

    async def gone(protocol: Protocol, scope: dict[str, Any], send: Send) -> None:
        await send({"type": "websocket.send", UTF8_TEXT: [b"first"]})
        protocol.connection_lost(None)
        with pytest.raises(ClientDisconnected):
            await send({"type": "websocket.send", UTF8_TEXT: [b"second"]})
        said.append("client disconnected")

    async def scenario() -> tuple[RecordingTransport, RecordingTransport]:
        _, closed = await serve(WebSocketProtocol, after_close)
        _, lost = await serve(WebSocketProtocol, gone)
        return closed, lost

    closed, lost = asyncio.run(scenario())
    assert said == ["refused after the close", "client disconnected"]
    assert closed.written() == Frame(Opcode.CLOSE, b"\x03\xf5slow consumer").serialize(mask=False)  # nothing after it
    assert lost.written() == Frame(Opcode.TEXT, b"first").serialize(mask=False)


class FakeWebSocket:
    """What :func:`frame_writer` reads of a Starlette WebSocket: its scope and its ``send``."""

    def __init__(self, extensions: dict[str, Any] | None) -> None:
        self.scope: dict[str, Any] = {"type": "websocket"} if extensions is None else {"extensions": extensions}
        self.sent: list[Mapping[str, Any]] = []

    async def send(self, message: Mapping[str, Any]) -> None:
        self.sent.append(message)


def test_a_session_writes_parts_through_the_send_the_server_offers_with_them() -> None:
    """The chunk goes to the send offered with the extension, not through the WebSocket's."""
    chunk = [OutMessage(b'{"n":1}', "batch"), OutMessage(b'{"n":2}', "batch")]
    direct: list[Mapping[str, Any]] = []

    async def offered_send(message: Mapping[str, Any]) -> None:
        direct.append(message)

    websocket = FakeWebSocket({UTF8_TEXT: {"send": offered_send}})
    asyncio.run(frame_writer(websocket)(chunk))  # type: ignore[arg-type]
    assert websocket.sent == []
    (parts,) = direct
    assert parts["type"] == "websocket.send" and b"".join(parts[UTF8_TEXT]) == b'{"n":1}\n{"n":2}'


def test_a_session_writes_parts_where_the_server_offers_them_and_text_elsewhere() -> None:
    chunk = [OutMessage(b'{"n":1}', "batch"), OutMessage('{"s":"\u00e9"}'.encode(), "batch")]
    offered, plain, no_extension = FakeWebSocket({UTF8_TEXT: {}}), FakeWebSocket({}), FakeWebSocket(None)

    async def scenario() -> None:
        for websocket in (offered, plain, no_extension):
            await frame_writer(websocket)(chunk)  # type: ignore[arg-type]

    asyncio.run(scenario())
    (parts,) = offered.sent
    assert parts["type"] == "websocket.send" and b"".join(parts[UTF8_TEXT]).decode() == messages.ws_text(chunk)
    assert [p for p in parts[UTF8_TEXT] if p != b"\n"] == [m.data for m in chunk]
    for websocket in (plain, no_extension):
        assert websocket.sent == [{"type": "websocket.send", "text": messages.ws_text(chunk)}]


def test_send_now_writes_the_frame_send_writes_and_only_while_it_need_not_wait() -> None:
    """``send_now`` (offered with the extension) writes the same frame as the awaited send, the
    parts as they are; while flow control holds writes (``pause_writing``), or after a close is
    sent, it writes nothing, asks nothing of its argument and says False."""
    asked: list[str] = []

    def chunk(name: str, parts: list[bytes]) -> Callable[[], list[bytes]]:
        def parts_of() -> list[bytes]:
            asked.append(name)
            return parts

        return parts_of

    async def session(protocol: Protocol, scope: dict[str, Any], send: Send) -> None:
        send_now = scope["extensions"][UTF8_TEXT]["send_now"]
        assert send_now(chunk("first", CHUNKS[6]))
        protocol.pause_writing()
        assert not send_now(chunk("paused", [b"no"]))
        protocol.resume_writing()
        assert send_now(chunk("resumed", CHUNKS[7]))
        await send({"type": "websocket.close", "code": 1000})
        assert not send_now(chunk("closed", [b"no"]))

    _, transport = asyncio.run(serve(WebSocketProtocol, session))
    assert asked == ["first", "resumed"]
    frames = [Frame(Opcode.TEXT, b"".join(parts)).serialize(mask=False) for parts in (CHUNKS[6], CHUNKS[7])]
    assert transport.written() == b"".join(frames) + Frame(Opcode.CLOSE, b"\x03\xe8").serialize(mask=False)
    kind, buffers = transport.calls[0]
    assert kind == "writelines" and all(a is b for a, b in zip(buffers[1:], CHUNKS[6], strict=True))


class FillingTransport(RecordingTransport):
    """A transport whose buffer fills now and then: a write pauses its protocol's writing, as
    uvloop's does above the high-water mark, until the test resumes it at a later turn."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self.protocol: WebSocketProtocol | None = None
        self.filling = True

    def writelines(self, list_of_data: Iterable[Any]) -> None:
        super().writelines(list_of_data)
        if self.filling and self.protocol is not None and self.rng.random() < 0.1:
            self.protocol.pause_writing()

    def offsets(self) -> list[int]:
        """The offsets of the batches in the text frames written after the handshake's answer."""
        data, found = self.written(), []
        at = data.index(b"\r\n\r\n") + 4
        while at < len(data):
            length, at = data[at + 1] & 0x7F, at + 2
            if length >= 126:
                size = 2 if length == 126 else 8
                length, at = int.from_bytes(data[at : at + size], "big"), at + size
            found += [json.loads(line)["offset"] for line in data[at : at + length].split(b"\n")]
            at += length
        return found


def test_live_sessions_get_every_batch_once_and_in_order_through_bursts_and_full_buffers() -> None:
    """Sessions on real protocols, as the gateway runs them: the hub pushes bursts of 0 to 7
    batches a turn while writes now and then fill a transport's buffer (resumed at a later turn).
    Written from the push, at the next turn or by the woken writer, each client's frames carry
    every batch once, in order."""
    rng = random.Random(29)
    hub = make_hub(client_queue_bytes=2**30)

    async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        websocket = FakeWebSocket(scope["extensions"])
        await _write_live(Pump(subscribe(hub)), frame_writer(websocket), direct_sender(websocket))  # type: ignore[arg-type]

    async def scenario() -> tuple[int, list[FillingTransport]]:
        config = Config(app=app, ws=WebSocketProtocol, ws_per_message_deflate=False, log_config=None, lifespan="off")
        config.load()
        transports = [FillingTransport(rng) for _ in range(8)]
        for transport in transports:
            transport.protocol = WebSocketProtocol(config=config, server_state=ServerState(), app_state={})
            transport.protocol.connection_made(transport)
            transport.protocol.data_received(HANDSHAKE)
        for _ in range(10):  # the handshakes' apps accept and subscribe
            await asyncio.sleep(0)
        assert len(hub._clients) == len(transports)
        seq = 0
        for _ in range(300):
            for transport in transports:
                if transport.protocol is not None and rng.random() < 0.3:
                    transport.protocol.resume_writing()
            for _ in range(rng.choice((0, 1, 1, 1, 2, 3, 7))):
                publish_batch(hub, "a", 0, seq, batch(stored(seq)))
                seq += 1
            await asyncio.sleep(0)
        for transport in transports:
            transport.filling = False
            assert transport.protocol is not None
            transport.protocol.resume_writing()
        for _ in range(5):
            await asyncio.sleep(0)
        hub.close()
        return seq, transports

    count, transports = asyncio.run(scenario())
    assert count > 300
    for transport in transports:
        assert transport.offsets() == list(range(1, count + 1))
    assert sample(hub, "kvgateway_messages_sent_total", transport="ws") == count * len(transports)
