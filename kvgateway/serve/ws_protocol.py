"""uvicorn's WebSocket protocol (``websockets-sansio``, as the gateway configures it) with one more
way to send a text frame: from the UTF-8 bytes it is made of, handed to the socket as they are.

Through ASGI a text frame is a ``str``: the writer decoded each message's JSON bytes to a ``str``
(kept on the message beside its bytes, so the resume ring held every message twice), joined them,
and uvicorn encoded the join back to bytes, which the websockets library copied into the frame,
four copies of every message on its way to the socket. Where the scope's extensions offer
:data:`UTF8_TEXT`, the session sends ``{"type": "websocket.send", UTF8_TEXT: parts}`` instead
(:func:`kvgateway.protocol.messages.ws_parts`), and the frame's head (2 to 10 bytes) and the parts
go to the transport in one ``writelines``: none of them copied in Python (uvloop writes them with
one ``writev``). The frame is the one uvicorn writes for ``{"type": "websocket.send", "text":
b"".join(parts).decode()}``, byte for byte (tests/unit/serve/test_ws_protocol.py); whatever is not
the plain case (the connection not open, closing or gone, an extension such as compression on the
frames, the websockets library logging frames at debug level) is sent that way, by uvicorn's own
code. The handshake, the close, pings and flow control are uvicorn's unchanged.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, cast

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import OPEN

from kvgateway.serve.sessions import UTF8_TEXT

_FIN_TEXT: Final = 0x81  # FIN, no RSV bit, opcode 1 (text); a server's frames are not masked

INTERNALS: Final = (
    "writable",
    "conn",
    "transport",
    "disconnected",
    "handshake_complete",
    "close_sent",
    "initial_response",
)
CONNECTION: Final = ("state", "expect_continuation_frame", "extensions", "debug", "data_to_send", "writes")
"""What the plain case reads of uvicorn's protocol and of its websockets connection, none of it
uvicorn's public API (pyproject admits any uvicorn from 0.30): a release without one of them gets
no extension, so every frame goes uvicorn's own way, as the str frame."""


_HEAD16: Final = struct.Struct("!BBH").pack
_HEAD64: Final = struct.Struct("!BBQ").pack


def frame_head(length: int) -> bytes:
    """The head of an unmasked, unfragmented text frame of ``length`` payload bytes (RFC 6455 5.2),
    as the websockets library serializes it."""
    if length < 126:
        return bytes((_FIN_TEXT, length))
    if length < 65536:
        return _HEAD16(_FIN_TEXT, 126, length)
    return _HEAD64(_FIN_TEXT, 127, length)


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol, offering :data:`UTF8_TEXT` to the app."""

    async def run_asgi(self) -> None:
        conn = getattr(self, "conn", None)
        if all(hasattr(self, name) for name in INTERNALS) and all(hasattr(conn, name) for name in CONNECTION):
            # with the send this protocol gives the app: the session's chunks skip the wrappers
            # between (Starlette's WebSocket and the middlewares pass a websocket.send on untouched)
            self.scope.setdefault("extensions", {})[UTF8_TEXT] = {"send": self.send, "send_now": self.send_now}
        await super().run_asgi()

    def _plain(self) -> bool:
        """Whether a frame may go the plain way: the connection open and nothing but text frames
        on it (else uvicorn's own send, with what it raises or logs there)."""
        conn = self.conn
        return not (
            self.disconnected
            or not self.handshake_complete
            or self.close_sent
            or self.initial_response is not None
            or conn.state is not OPEN
            or conn.expect_continuation_frame
            or conn.extensions
            or conn.debug
        )

    def _write_frame(self, parts: Sequence[bytes]) -> None:
        head = frame_head(sum(map(len, parts)))
        conn = self.conn
        if conn.writes:  # not so far: uvicorn writes what the library queues at once
            self.transport.writelines([*conn.data_to_send(), head, *parts])
        else:
            self.transport.writelines([head, *parts])

    async def send(self, message: ASGISendEvent) -> None:
        parts: Sequence[bytes] | None = cast("Mapping[str, Any]", message).get(UTF8_TEXT)
        if parts is None:
            await super().send(message)
            return
        await self.writable.wait()  # as uvicorn's send: flow control first
        if not self._plain():
            # not the plain case: uvicorn's send, with what it raises or logs there
            await super().send({"type": "websocket.send", "text": b"".join(parts).decode()})
            return
        self._write_frame(parts)

    def send_now(self, chunk: Callable[[], Sequence[bytes]]) -> bool:
        """The text frame of the parts ``chunk()`` returns, written without awaiting anything:
        only in the plain case and while flow control lets writes through (the transport's buffer
        below its high-water mark), else False and ``chunk`` is not called (the caller sends the
        frame by :meth:`send`, which waits)."""
        if not self.writable.is_set() or not self._plain():
            return False
        self._write_frame(chunk())
        return True
