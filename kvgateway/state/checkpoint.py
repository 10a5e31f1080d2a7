"""A checkpoint of what the serving half derived from the log, at one offset: every stream's
resident blocks with their reference counts per medium and group, its cumulative counts and
staleness, and its status. A process that loads it and then applies the log after its offset holds
exactly what one that applied the log from the start holds at the same offset.

Not in it: the per-second rates (they restart from the batches after the offset, as after any
start), the learned token chains (rebuilt from the chains announced after the offset: a lookup by
tokens finds a prefix stored before it only once a store announces it again; lookups by hashes are
exact at once), and the resume ring (a client resumes from the offset on). ``extra`` carries what
the log itself needs to go on (an edge's order rule). Sans-I/O: bytes in, bytes out.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from kvgateway.engine.wire import Hash, Stream
from kvgateway.state.occupancy import OccupancyIndex
from kvgateway.state.status_board import StatusBoard

VERSION: Final = 1


class GroupState(msgspec.Struct, array_like=True, gc=False):
    medium: str
    group_idx: int
    blocks: list[Hash]
    extra: list[tuple[Hash, int]]  # hashes with more than one reference: (hash, extra references)


class MediumState(msgspec.Struct, array_like=True, gc=False):
    medium: str
    block_size: int
    stores: int
    removes: int


class StreamState(msgspec.Struct, array_like=True, gc=False):
    source: str
    dp_rank: int
    unknown_removes: int
    stale_reason: str | None
    mediums: list[MediumState]
    groups: list[GroupState]
    status: dict[str, Any] | None  # the board's status (kvgateway.log.status.StreamStatus.report)


class Checkpoint(msgspec.Struct, gc=False):
    version: int
    epoch: str
    offset: int  # the last offset applied
    written_at: float
    streams: list[StreamState]
    extra: dict[str, Any] = {}


class CheckpointError(ValueError):
    """Bytes that are not a checkpoint this version reads (one line)."""


_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(Checkpoint)


def capture(
    index: OccupancyIndex, board: StatusBoard, *, epoch: str, offset: int, now: float, extra: dict[str, Any]
) -> Checkpoint:
    """The state at ``offset``: call it synchronously, with nothing applied after ``offset`` yet.
    The blocks are frozen (copy on write), so encoding it later still writes this state."""
    streams = []
    for stream_index in index.streams():
        key: Stream = (stream_index.source, stream_index.dp_rank)
        status = board.status(key)
        groups = [
            GroupState(medium, group_idx, list(blocks), list(extra_refs.items()))
            for medium, group_idx, _, blocks, extra_refs in stream_index.block_groups(freeze=True)
        ]
        mediums = [MediumState(name, *counts) for name, counts in stream_index.medium_counts().items()]
        streams.append(
            StreamState(
                key[0],
                key[1],
                stream_index.unknown_removes,
                stream_index.stale_reason,
                mediums,
                groups,
                None if status is None else status.report(stream_index.stale_reason, now),
            )
        )
    return Checkpoint(VERSION, epoch, offset, now, streams, extra)


def encode(checkpoint: Checkpoint) -> bytes:
    return _encoder.encode(checkpoint)


def decode(data: bytes) -> Checkpoint:
    """Raises :class:`CheckpointError`."""
    try:
        checkpoint = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CheckpointError(f"not a kvgateway checkpoint: {exc}") from None
    if checkpoint.version != VERSION:
        raise CheckpointError(f"checkpoint version {checkpoint.version}, this gateway reads {VERSION}")
    return checkpoint


def restore(checkpoint: Checkpoint, index: OccupancyIndex, board: StatusBoard) -> None:
    """Into an index and a board that have applied nothing yet."""
    for state in checkpoint.streams:
        stream_index = index.stream(state.source, state.dp_rank)
        stream_index.unknown_removes = state.unknown_removes
        if state.stale_reason is not None:
            stream_index.mark_stale(state.stale_reason)
        for medium in state.mediums:
            stream_index.restore_medium(medium.medium, medium.block_size, medium.stores, medium.removes)
        for group in state.groups:
            stream_index.restore_group(group.medium, group.group_idx, set(group.blocks), dict(group.extra))
        if state.status is not None:
            board.restore((state.source, state.dp_rank), state.status)
