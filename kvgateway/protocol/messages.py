"""The JSON messages the gateway sends to web clients, and their encoding.

Four shapes, one JSON object each (docs/protocol.md, kvgateway/protocol/schema.json):

- ``hello``: first on every connection (epoch, offset, recovered, sources, occupancy);
- ``batch``: one engine batch, events as :func:`kvgateway.protocol.render.render_events` renders them;
- ``notice``: something happened to a stream (restart, unrecovered_gap, stale, degraded, up, down) or
  to this client (slow_consumer);
- ``state``: after the hello of a ``snapshot=blocks`` connection, the resident blocks
  (:mod:`kvgateway.state.blocks`, sent by :mod:`kvgateway.serve.sessions`).

Everything here is plain encoding without I/O. A batch is encoded once; its events are encoded
one by one into the same buffer, so a filtered variant is a join of slices of the full message
(:meth:`EncodedBatch.select`) rather than a second render and encode.
"""

from __future__ import annotations

import importlib.resources
import re
from array import array
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Final, Literal, TypeAlias

import msgspec

from kvgateway.engine.wire import Stream

ConnectionCode: TypeAlias = Literal[
    "connected",
    "disconnected",
    "retrying",
    "refused",
    "unresolved",
    "no_answer",
    "unreachable",
    "bind_failed",
    "not_zeromq",
    "never_connected",
    "ingest_unreachable",
]
"""Why a stream is up or down, for programs: the ``reason_code`` beside the one line ``reason`` of
``up`` / ``down`` notices and of a stream's status (docs/protocol.md lists what each means).
A closed vocabulary: a new code is a new release's."""

MessageType: TypeAlias = Literal["hello", "batch", "notice", "state", "digest"]

HELLO: Final = "hello"
BATCH: Final = "batch"
NOTICE: Final = "notice"
STATE: Final = "state"  # a snapshot=blocks connection's resident blocks (kvgateway/state/blocks.py)
DIGEST: Final = "digest"  # a digest=SECONDS connection's state digests (kvgateway/serve/digests.py)
SLOW_CONSUMER: Final = "slow_consumer"

SCHEMA_FILE: Final = "schema.json"

_encoder: Final = msgspec.json.Encoder()


# --- ids ----------------------------------------------------------------------------------

_ID_RE: Final = re.compile(r"([0-9A-Za-z_-]{1,64}):([0-9]{1,19})")


def message_id(epoch: str, offset: int) -> str:
    """The id of the message at ``offset``: ``"<epoch>:<offset>"`` (also the SSE ``id:`` line)."""
    return f"{epoch}:{offset}"


def parse_message_id(text: str) -> Stream | None:
    """``(epoch, offset)`` from a message id, or None when it is not one (never raises)."""
    match = _ID_RE.fullmatch(text)
    if match is None:
        return None
    return match.group(1), int(match.group(2))


# --- what goes out ------------------------------------------------------------------------


class OutMessage(msgspec.Struct, gc=False, eq=False):
    """One encoded message, shared by every client that receives it.

    ``data`` is the compact JSON (one line, no newline inside); ``id`` is ``"<epoch>:<offset>"``
    or None (a per-client notice). ``text`` and ``sse`` are derived once and cached, so a
    thousand clients on one transport share one object.

    Untracked by the garbage collector (``gc=False``): the resume ring holds ten thousand of them,
    and it refers to nothing that could lead back to it (:mod:`kvgateway.runtime.memory`).
    """

    data: bytes
    type: MessageType
    id: str | None = None
    _text: str | None = None
    _sse: bytes | None = None
    _deprecated: OutMessage | None = None  # with_deprecated_copies' answer, once asked
    _int_seqs: OutMessage | None = None  # with_int_seqs' answer, once asked

    @property
    def text(self) -> str:
        """``data`` as str, for an ASGI server that takes a text frame only as str (the gateway's
        own takes the bytes as they are: :func:`ws_parts`, kvgateway.serve.ws_protocol)."""
        if self._text is None:
            self._text = self.data.decode()
        return self._text

    @property
    def sse(self) -> bytes:
        """The SSE event: ``id:`` (when the message has one), ``event:``, ``data:``, blank line."""
        if self._sse is None:
            head = b"" if self.id is None else b"id: " + self.id.encode() + b"\n"
            self._sse = head + b"event: " + self.type.encode() + b"\ndata: " + self.data + b"\n\n"
        return self._sse

    def __repr__(self) -> str:
        return f"OutMessage(type={self.type!r}, id={self.id!r}, {len(self.data)} bytes)"


def ws_text(chunk: Sequence[OutMessage]) -> str:
    """One WebSocket text frame: the chunk's messages joined by ``"\\n"``, no trailing newline."""
    if len(chunk) == 1:
        return chunk[0].text  # the common case shares the cached str
    return "\n".join(message.text for message in chunk)


_NEWLINE: Final = b"\n"


def ws_parts(chunk: Sequence[OutMessage]) -> list[bytes]:
    """:func:`ws_text`'s frame as the UTF-8 bytes it is made of, in order: each message's own
    ``data`` and the newlines between them, for a writer that hands them to the socket as they are
    (kvgateway.serve.ws_protocol) instead of decoding, joining and encoding them again."""
    if len(chunk) == 1:
        return [chunk[0].data]
    parts = [_NEWLINE] * (2 * len(chunk) - 1)
    parts[::2] = [message.data for message in chunk]
    return parts


def sse_bytes(chunk: Sequence[OutMessage]) -> bytes:
    """The chunk as SSE events, for one write."""
    if len(chunk) == 1:
        return chunk[0].sse
    return b"".join(message.sse for message in chunk)


SSE_PING: Final = b": ping\n\n"


def sse_preamble(retry_ms: int) -> bytes:
    """The first bytes of an SSE response: the reconnect delay for EventSource."""
    return f"retry: {retry_ms}\n\n".encode()


# --- engine seqs ------------------------------------------------------------------------


def seq_text(seq: int) -> str:
    """An engine seq as every message and document carries it: a decimal string.

    Engine seqs are unsigned 64-bit (TensorRT-LLM's start at ``time_ns``, about 1.8e18), beyond
    the 2^53 up to which a JavaScript ``JSON.parse`` keeps integers exact; as strings, like
    hashes, they stay exact in every client. A client written against numbers asks for
    ``compat=int_seqs`` (:func:`with_int_seqs`)."""
    return str(seq)


# --- hello --------------------------------------------------------------------------------


class Hello(msgspec.Struct, kw_only=True, gc=False):
    type: Literal["hello"] = "hello"
    epoch: str
    offset: int
    recovered: bool
    sources: list[dict[str, Any]]
    occupancy: dict[str, Any] | None


def encode_hello(
    *, epoch: str, offset: int, recovered: bool, sources: list[dict[str, Any]], occupancy: dict[str, Any] | None
) -> OutMessage:
    """The hello; its id is the position the client is at, so an SSE reconnect right after resumes."""
    data = _encoder.encode(Hello(epoch=epoch, offset=offset, recovered=recovered, sources=sources, occupancy=occupancy))
    return OutMessage(data, HELLO, message_id(epoch, offset))


# --- batch --------------------------------------------------------------------------------


class _BatchHead(msgspec.Struct, gc=False):
    """Every batch field but ``events``, in wire order; ``events`` is spliced in after it."""

    type: str
    id: str
    offset: int
    source: str
    dp_rank: int
    seq: str  # seq_text
    ts: float


_EVENTS_OPEN: Final = b',"events":['
_EVENTS_CLOSE: Final = b"]}"


EventCounts: TypeAlias = tuple[int, int, int, int]
"""How many of a batch's events are a BlockStored, a BlockRemoved, an AllBlocksCleared, and of any
other type (an engine's own), as the renderer counts them while it writes them
(:func:`kvgateway.protocol.render.events_json`)."""


class EncodedEvents(msgspec.Struct, gc=False, eq=False):
    """A batch's events as JSON, each encoded once, joined by commas, with where each ends.

    Made once per batch on the ingest side (it needs no offset), it is what the ordered log
    carries; :func:`encode_batch` puts the message's head in front of it at its offset.
    """

    body: bytes
    ends: array[int]  # end of event i in body; event i+1 starts one comma later
    # the events by type (the ingest's metrics count them); None where they were not counted (a
    # record rebuilt from a cluster's wire)
    counts: EventCounts | None = None


def encode_events(events: Iterable[dict[str, Any]], counts: EventCounts | None = None) -> EncodedEvents:
    """Rendered events (``render.render_events``) as JSON, one by one into one buffer; ``counts``:
    the events by type, if counted."""
    # Encoded into one growing buffer: no bytes object per event, no join.
    buffer = bytearray()
    ends = array("q")
    encode_into = _encoder.encode_into
    for event in events:
        if ends:
            buffer += b","
        encode_into(event, buffer, -1)
        ends.append(len(buffer))
    return EncodedEvents(bytes(buffer), ends, counts)


class EncodedBatch(msgspec.Struct, gc=False, eq=False):
    """A batch message encoded once, with the position of each event in it.

    ``message`` holds the whole batch. ``select(indices)`` builds the same message with only the
    chosen events by joining slices of those bytes: no event is rendered or encoded twice.
    Untracked by the garbage collector, as :class:`OutMessage`; the event ends are kept as the
    bytes of an ``array("q")`` because an array object is tracked.
    """

    message: OutMessage
    _prefix: int  # bytes up to and including '"events":['
    _ends: bytes  # int64 end of event i after the prefix; event i+1 starts one comma later

    def select(self, indices: Sequence[int]) -> OutMessage:
        """The batch with only the events at ``indices`` (increasing); the same id and type."""
        ends = memoryview(self._ends).cast("q")
        if len(indices) == len(ends):
            return self.message
        view = memoryview(self.message.data)
        prefix = self._prefix
        events = b",".join(view[prefix + (0 if i == 0 else ends[i - 1] + 1) : prefix + ends[i]] for i in indices)
        return OutMessage(b"".join((view[:prefix], events, _EVENTS_CLOSE)), BATCH, self.message.id)


def encode_batch(
    *, epoch: str, offset: int, source: str, dp_rank: int, seq: int, ts: float, events: EncodedEvents
) -> EncodedBatch:
    """A batch message at ``offset``: the head, then the events encoded once (:func:`encode_events`)."""
    msg_id = message_id(epoch, offset)
    head = _encoder.encode(_BatchHead(BATCH, msg_id, offset, source, dp_rank, seq_text(seq), ts))
    data = b"".join((head[:-1], _EVENTS_OPEN, events.body, _EVENTS_CLOSE))
    return EncodedBatch(OutMessage(data, BATCH, msg_id), len(head) - 1 + len(_EVENTS_OPEN), events.ends.tobytes())


# --- notices ------------------------------------------------------------------------------

_Seq = Annotated[int, msgspec.Meta(ge=0)]
_Reason = Annotated[str, msgspec.Meta(max_length=1000)]


class _RestartFields(msgspec.Struct, forbid_unknown_fields=True):
    # The seq at which the gateway saw the restart: the new process's batch that went back or
    # leapt (seq_reset, window, reconnect, cleared, jump), or, for identity, the seq whose payload
    # differed or that the new process no longer held (then equal to ``previous``).
    seq: _Seq
    # the last one delivered before it; -1 (the sequencer's word) or None: none since an earlier
    # restart or the start, sent as null (compat=int_seqs: -1, as 0.1 sent it)
    previous: Annotated[int, msgspec.Meta(ge=-1)] | None
    reason: _Reason


class _GapFields(msgspec.Struct, forbid_unknown_fields=True):
    first: _Seq  # the lost range, inclusive
    until: _Seq
    count: _Seq
    reason: _Reason


class _UpFields(msgspec.Struct, forbid_unknown_fields=True):
    reason: _Reason  # one line for people
    reason_code: ConnectionCode = "connected"  # the same, for programs (kvgateway.log.status)


class _DownFields(msgspec.Struct, forbid_unknown_fields=True):
    reason: _Reason
    # a record from an ingest older than reason_code (a cluster's log) gets the broadest code
    reason_code: ConnectionCode = "disconnected"


DegradedCode: TypeAlias = Literal["evicted", "transit", "no_answer", "no_replay", "not_sent", "overflow"]
"""``degraded``'s ``reason_code``: the reason of the ``unrecovered_gap`` that began the losses
(every loss reason but ``restart``, which does not degrade a stream)."""


class _DegradedFields(msgspec.Struct, forbid_unknown_fields=True):
    reason: _Reason  # one line for people
    reason_code: DegradedCode  # the same, for programs


DEPRECATED_COPIES: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    # unrecovered_gap's `last` (an integer) is `until` under its old name, until 0.2.0. Only to a
    # client that asks (compat=gap_last): `last` is also the boolean of state messages, which a
    # client decoding every message into one struct cannot hold (docs/protocol.md, "Deprecated
    # fields"), so the default output, and the schema, have one type per name.
    "unrecovered_gap": (("last", "until"),),
}
"""Per notice kind, ``(old name, field)``: fields a client that asks also gets under a deprecated
name (:func:`with_deprecated_copies`)."""


class _StaleFields(msgspec.Struct, forbid_unknown_fields=True):
    reason: _Reason  # history_truncated, unrecovered, undecodable
    # history_truncated: the first seq the engine still held; unrecovered: the first lost; undecodable: its seq
    seq: _Seq
    detail: _Reason  # one line for people


class _StatusFields(msgspec.Struct, forbid_unknown_fields=True):
    status: dict[str, Any]  # the stream's /v1/sources entry (kvgateway.log.status.StreamStatus.to_json)


SEQ_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "restart": ("seq", "previous"),
    "unrecovered_gap": ("first", "until"),
    "stale": ("seq",),
}
"""Per notice kind, its fields that hold an engine seq: integers in the log's records, decimal
strings (:func:`seq_text`) in the messages. A status notice's is ``status.last_seq``, a
string already (:meth:`kvgateway.log.status.StreamStatus.to_json`)."""


def _seqs_as_text(body: dict[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        value = body[name]
        # restart.previous: -1 or None, nothing delivered since an earlier restart or the start
        body[name] = None if value is None or value < 0 else seq_text(value)


_NOTICE_FIELDS: Final[dict[str, type[msgspec.Struct]]] = {
    "status": _StatusFields,
    "restart": _RestartFields,
    "unrecovered_gap": _GapFields,
    "degraded": _DegradedFields,
    "stale": _StaleFields,
    "up": _UpFields,
    "down": _DownFields,
}


class NoticeError(ValueError):
    """A stream notice with an unknown kind or wrong fields (a bug in the caller)."""


def encode_stream_notice(
    kind: str, *, epoch: str, offset: int, source: str, dp_rank: int, fields: dict[str, Any]
) -> OutMessage:
    """A notice about a stream; it has an offset and id like a batch.

    ``fields`` must be exactly the kind's own fields (restart: seq, previous, reason;
    unrecovered_gap: first, until, count, reason; stale: reason, seq, detail; degraded: reason,
    reason_code; up, down: reason, reason_code), seqs as integers (sent as strings:
    :data:`SEQ_FIELDS`). Deprecated copies (:data:`DEPRECATED_COPIES`) are not added
    here: :func:`with_deprecated_copies` makes them for the clients that ask.
    """
    spec = _NOTICE_FIELDS.get(kind)
    if spec is None:
        raise NoticeError(f"unknown stream notice kind {kind!r}")
    try:
        checked = msgspec.convert(fields, spec)
    except msgspec.ValidationError as exc:
        raise NoticeError(f"{kind} notice: {exc}") from None
    msg_id = message_id(epoch, offset)
    body: dict[str, Any] = {
        "type": NOTICE,
        "kind": kind,
        "id": msg_id,
        "offset": offset,
        "source": source,
        "dp_rank": dp_rank,
    }
    body.update(msgspec.structs.asdict(checked))
    _seqs_as_text(body, SEQ_FIELDS.get(kind, ()))
    return OutMessage(_encoder.encode(body), NOTICE, msg_id)


_AS_IS: Final = OutMessage(b"", NOTICE)
"""A message's cached answer when it has no deprecated copies: it is sent as it is."""


def with_deprecated_copies(message: OutMessage) -> OutMessage:
    """``message`` as a client that reads deprecated names (``compat=gap_last``) gets it: a notice
    of a kind in :data:`DEPRECATED_COPIES` with its copies, anything else itself.

    Made on first demand and cached on ``message`` (shared, as the message is, by every such
    client, live or resuming from the ring), so a gateway whose clients never ask encodes nothing
    more. Only notices are looked at, and they are rare: a batch costs one comparison.
    """
    if message.type != NOTICE:
        return message
    variant = message._deprecated
    if variant is None:
        body = msgspec.json.decode(message.data)
        copies = DEPRECATED_COPIES.get(body.get("kind"), ())
        if copies:
            for old, name in copies:
                body[old] = body[name]
            # its own answer is itself: no cycle back to message (neither is tracked by the GC)
            variant = OutMessage(_encoder.encode(body), NOTICE, message.id, _deprecated=_AS_IS)
        else:
            variant = _AS_IS
        message._deprecated = variant
    return message if variant is _AS_IS else variant


_SEQ_KEY: Final = b',"seq":"'
"""Where a batch's seq begins: its head is ours, and a quote inside a JSON string is escaped, so
the first match is the head's field."""


def with_int_seqs(message: OutMessage) -> OutMessage:
    """``message`` as a client written against integer seqs (``compat=int_seqs``, until 0.2.0)
    gets it: every engine seq a number, ``restart.previous`` -1 for none; anything else itself.

    Made on first demand and cached on ``message``, as :func:`with_deprecated_copies` does, so a
    gateway whose clients never ask encodes nothing more. A batch's seq is unquoted in place (its
    events are not decoded again); a hello or a notice, rare, is decoded and encoded again."""
    variant = message._int_seqs
    if variant is None:
        data = message.data
        at = data.find(_SEQ_KEY) if message.type == BATCH else -1
        if at >= 0:
            start = at + len(_SEQ_KEY)
            end = data.index(b'"', start)
            data = b"".join((data[: start - 1], data[start:end], data[end + 1 :]))
        elif message.type not in (NOTICE, HELLO):
            data = b""  # no seq in it (state, digest, ...): sent as it is
        else:
            body = msgspec.json.decode(data)
            changed = _encoder.encode(int_seqs_body(body))
            data = b"" if changed == data else changed  # up, down, degraded: no seq, sent as they are
        # its own answer is itself, and its gap_last copies are made before it (with_compat)
        variant = OutMessage(data, message.type, message.id, _deprecated=_AS_IS, _int_seqs=_AS_IS) if data else _AS_IS
        message._int_seqs = variant
    return message if variant is _AS_IS else variant


def int_seqs_body(body: dict[str, Any]) -> dict[str, Any]:
    """A decoded hello, notice or /v1/sources document with integer seqs (changed in place)."""
    for status in body.get("sources", ()):
        int_seqs_status(status)
    if body.get("type") == NOTICE:
        kind = str(body.get("kind"))
        if kind == "status":
            int_seqs_status(body["status"])
        for name in SEQ_FIELDS.get(kind, ()) + (("last",) if "last" in body else ()):
            value = body[name]
            body[name] = -1 if value is None else int(value)
    return body


def int_seqs_status(status: dict[str, Any]) -> dict[str, Any]:
    """A stream's status (its /v1/sources entry) with ``last_seq`` a number (changed in place)."""
    last_seq = status.get("last_seq")
    if last_seq is not None:
        status["last_seq"] = int(last_seq)
    return status


def with_compat(message: OutMessage, *, gap_last: bool, int_seqs: bool) -> OutMessage:
    """``message`` for a client that asked for deprecated forms (``compat``): each variant made
    once and shared, the int seqs one on top of the gap_last one."""
    if gap_last:
        message = with_deprecated_copies(message)
    if int_seqs:
        message = with_int_seqs(message)
    return message


def encode_digest(source: str, dp_rank: int, offset: int, digest: str, blocks: int) -> OutMessage:
    """A stream's state digest at ``offset`` (kvgateway/state/digest.py): per client, no ``id``
    (not a point to resume from)."""
    body = {
        "type": DIGEST,
        "source": source,
        "dp_rank": dp_rank,
        "offset": offset,
        "digest": digest,
        "block_count": blocks,
    }
    return OutMessage(_encoder.encode(body), DIGEST)


def encode_slow_consumer(limit_bytes: int) -> OutMessage:
    """The last message a slow SSE client gets: per client, so no offset, no id, no stream."""
    body = {"type": NOTICE, "kind": SLOW_CONSUMER, "reason": f"more than {limit_bytes} bytes queued for this client"}
    return OutMessage(_encoder.encode(body), NOTICE)


# --- the schema ---------------------------------------------------------------------------


def schema_bytes() -> bytes:
    """The JSON Schema of every message (served at GET /v1/schema)."""
    return importlib.resources.files("kvgateway.protocol").joinpath(SCHEMA_FILE).read_bytes()
