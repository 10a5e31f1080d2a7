"""What the ordered log carries: a delivered batch (:class:`BatchRecord`) or a notice about a stream
(:class:`NoticeRecord`), as ingest appends them, and the entry each becomes at its offset
(:func:`make_entry`, as every log renders it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import msgspec

from kvgateway.engine import wire
from kvgateway.engine.wire import Stream
from kvgateway.log.entry import Entry
from kvgateway.log.status import StreamStatus
from kvgateway.protocol import messages, render
from kvgateway.protocol.filters import EventKey
from kvgateway.protocol.messages import EncodedEvents


class BatchRecord(msgspec.Struct, frozen=True, gc=False):
    """A batch delivered by a stream's sequencer: encoded for clients once, and as the index needs it.

    A Struct (built in C: a frozen dataclass's ``__init__`` cost 2 us a batch), untracked by the
    garbage collector like the batch it holds: nothing in it leads back to it."""

    stream: Stream
    seq: int
    batch: wire.Batch  # what the index applies
    received: float  # when the gateway received it (the index's rates)
    replayed: bool  # replayed history stays out of the index's rates
    events: EncodedEvents  # the events' JSON, encoded once
    keys: tuple[EventKey, ...]  # each event's filter key


@dataclass(frozen=True, slots=True)
class NoticeRecord:
    """Something happened to a stream (restart, unrecovered_gap, stale, degraded, up, down);
    ``fields`` are the kind's own (:func:`kvgateway.protocol.messages.encode_stream_notice`).

    One kind carries the ingest's whole view of the stream: ``status``
    (:meth:`kvgateway.log.status.StreamStatus.report`), appended whenever that view changes in a
    way batches and other notices do not say (a connection, a diagnosis, a counter). The serving
    half's status board takes it as it is; a client gets the stream's /v1/sources entry at that
    moment (a ``status`` notice)."""

    stream: Stream
    kind: str
    fields: dict[str, Any]


STATUS: Final = "status"
"""The notice kind that carries a stream's status through the log."""


Record: TypeAlias = BatchRecord | NoticeRecord


def batch_record(stream: Stream, seq: int, batch: wire.Batch, *, received: float, replayed: bool) -> BatchRecord:
    """The record of a delivered batch: its events' JSON and filter keys written here, once, in
    one pass (:func:`kvgateway.protocol.render.events_json`)."""
    events, keys = render.events_json(batch.events)
    return BatchRecord(stream, seq, batch, received, replayed, events, keys)


def make_entry(epoch: str, offset: int, record: Record) -> Entry:
    """``record``'s entry at ``offset`` of ``epoch``: its message rendered as every log renders it.

    Raises :class:`kvgateway.protocol.messages.NoticeError` for a wrong notice."""
    if type(record) is BatchRecord:
        encoded = render.batch_message(
            epoch, offset, record.stream, seq=record.seq, ts=record.batch.ts, events=record.events
        )
        message = encoded.message
        return Entry(offset, record.stream, message, encoded, record.keys, len(message.data), record)
    assert type(record) is NoticeRecord
    source, dp_rank = record.stream
    fields = record.fields
    if record.kind == STATUS:  # the client's form: the stream's /v1/sources entry at that moment
        status = StreamStatus.from_report(source, dp_rank, fields)
        stale_reason = fields["stale_reason"]
        fields = {"status": status.to_json(fields["at"], stale_reason is not None, stale_reason)}
    message = messages.encode_stream_notice(
        record.kind, epoch=epoch, offset=offset, source=source, dp_rank=dp_rank, fields=fields
    )
    return Entry(offset, record.stream, message, None, (), len(message.data), record)
