"""How a log record travels through JetStream: compact msgpack, without I/O.

A batch carries its events already rendered and encoded for clients (an edge never renders an
event) plus, per event, only what the occupancy index reads (hashes, block size, medium, group):
an edge rebuilds the same index and the same message bytes as the single process, at the offset
JetStream assigned. A notice carries its kind and fields.

The ``Nats-Msg-Id`` of a record names it independently of which ingest process sent it, so two
processes reading the same engines (a hot standby, a split brain, a takeover replaying the
engine's buffer) store each batch once within the stream's duplicate window.
"""

from __future__ import annotations

import hashlib
import re
from array import array
from typing import Any, Final, TypeAlias

import msgspec

from kvgateway.engine import wire
from kvgateway.engine.wire import Stream
from kvgateway.log.records import BatchRecord, NoticeRecord, Record
from kvgateway.protocol.filters import EventKey
from kvgateway.protocol.messages import EncodedEvents

_STORE: Final = 0
_REMOVE: Final = 1
_CLEAR: Final = 2
_NO_EXTRA: Final[dict[str, Any]] = {}  # shared: the index never writes to an event's extra


class _Op(msgspec.Struct, array_like=True, gc=False):
    """One event as the index applies it (unknown events are not carried: the index ignores them)."""

    kind: int
    hashes: list[wire.Hash]
    block_size: int
    medium: str | None
    group_idx: int | None
    # A store's content, for the edge's chain learner and prefill attribution (records written
    # before these fields decode with the defaults: hashes only).
    parent: wire.Hash | None = None
    tokens: list[int] = []
    lora_name: str | None = None


class WireBatch(msgspec.Struct, array_like=True, tag=0, gc=False):
    source: str
    dp_rank: int
    generation: int
    seq: int
    ts: float
    received: float
    replayed: bool
    body: bytes  # the events' JSON, comma-joined (messages.EncodedEvents)
    ends: list[int]
    keys: list[tuple[str, str | None, str | None]]
    ops: list[_Op]


class WireNotice(msgspec.Struct, array_like=True, tag=1, gc=False):
    source: str
    dp_rank: int
    generation: int
    kind: str
    fields: dict[str, Any]
    after_seq: int = -1  # the stream's last batch seq before it (where a takeover continues)


WireRecord: TypeAlias = WireBatch | WireNotice

_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(WireRecord)


class RecordError(ValueError):
    """A message in the stream is not a record of this format."""


def _op(event: wire.Event) -> _Op | None:
    if type(event) is wire.BlockStored or type(event) is wire.BlockRemoved:
        group = event.extra.get("group_idx") if event.extra else None
        group = group if type(group) is int else None
        if type(event) is wire.BlockStored:
            return _Op(
                _STORE,
                event.block_hashes,
                event.block_size,
                event.medium,
                group,
                event.parent_block_hash,
                event.token_ids,
                event.lora_name,
            )
        return _Op(_REMOVE, event.block_hashes, 0, event.medium, group)
    if type(event) is wire.AllBlocksCleared:
        return _Op(_CLEAR, [], 0, None, None)
    return None


def encode_record(record: Record, generation: int, after_seq: int = -1) -> bytes:
    """The bytes stored in the stream for ``record`` of the engine's ``generation`` (a notice
    also carries ``after_seq``, the last batch seq before it)."""
    source, dp_rank = record.stream
    if type(record) is BatchRecord:
        ops = [op for op in map(_op, record.batch.events) if op is not None]
        return _encoder.encode(
            WireBatch(
                source,
                dp_rank,
                generation,
                record.seq,
                record.batch.ts,
                record.received,
                record.replayed,
                record.events.body,
                record.events.ends.tolist(),
                list(record.keys),
                ops,
            )
        )
    assert type(record) is NoticeRecord
    return _encoder.encode(WireNotice(source, dp_rank, generation, record.kind, record.fields, after_seq))


def _event(op: _Op) -> wire.Event:
    extra = _NO_EXTRA if op.group_idx is None else {"group_idx": op.group_idx}
    if op.kind == _STORE:
        return wire.BlockStored(
            op.hashes, op.parent, op.tokens, op.block_size, medium=op.medium, lora_name=op.lora_name, extra=extra
        )
    if op.kind == _REMOVE:
        return wire.BlockRemoved(op.hashes, medium=op.medium, extra=extra)
    return wire.AllBlocksCleared()


def decode(data: bytes) -> WireRecord:
    """Raises :class:`RecordError` (one line)."""
    try:
        decoded: WireRecord = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RecordError(f"not a kvgateway record: {exc}") from None
    return decoded


def to_record(wire_record: WireRecord) -> Record:
    """The log record an edge appends (what the single process would have appended)."""
    stream: Stream = (wire_record.source, wire_record.dp_rank)
    if type(wire_record) is WireNotice:
        return NoticeRecord(stream, wire_record.kind, wire_record.fields)
    assert type(wire_record) is WireBatch
    keys: tuple[EventKey, ...] = tuple(wire_record.keys)
    return BatchRecord(
        stream,
        wire_record.seq,
        wire.Batch(wire_record.ts, [_event(op) for op in wire_record.ops]),
        wire_record.received,
        wire_record.replayed,
        EncodedEvents(wire_record.body, array("q", wire_record.ends)),
        keys,
    )


# --- names ---------------------------------------------------------------------------------

_TOKEN_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def subject_token(source: str) -> str:
    """A source name as one subject token: itself when safe, else a stable hex digest."""
    if _TOKEN_RE.fullmatch(source):
        return source
    return "x" + hashlib.sha256(source.encode()).hexdigest()[:16]


def subject(prefix: str, stream: Stream) -> str:
    return f"{prefix}.{subject_token(stream[0])}.{stream[1]}"


def msg_id(record: Record, generation: int, after_seq: int) -> str:
    """The record's ``Nats-Msg-Id``: a batch by (stream, engine generation, seq); a notice by its
    content and the last seq published before it on its stream (``after_seq``, -1 before any)."""
    source, dp_rank = record.stream
    head = f"{subject_token(source)}.{dp_rank}.{generation}"
    if type(record) is BatchRecord:
        return f"{head}.{record.seq}"
    assert type(record) is NoticeRecord
    digest = hashlib.sha256(_encoder.encode(sorted(record.fields.items()))).hexdigest()[:12]
    return f"{head}.n{after_seq}.{record.kind}.{digest}"


def epoch_of(stream_name: str, created: str) -> str:
    """The epoch of a stream: its name and creation time. It changes exactly when the stream is
    recreated (a lost store, a deleted stream), which is when its sequences could be reused."""
    return hashlib.sha256(f"{stream_name}\0{created}".encode()).hexdigest()[:16]
