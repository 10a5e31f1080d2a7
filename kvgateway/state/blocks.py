"""The resident blocks of each stream, rendered for routers: ``state`` messages and ``GET /v1/blocks``.

Sans-I/O. A router that keeps its own index starts from the gateway's: after the ``hello`` of a
``snapshot=blocks`` connection it receives every resident block of every matching stream as it was
at the hello's offset, then the live stream from offset + 1. This module renders that state; the
web layer decides when to send it (see docs/design/routers-wiring.md).

Two steps, so that the event loop never waits for a big snapshot:

1. :func:`capture` freezes the streams, synchronously, at the offset being served. It costs
   O(streams x groups): nothing is copied now; the index copies a group before its next change
   (copy on write, :meth:`kvgateway.state.occupancy.StreamIndex.block_groups`).
2. :func:`state_messages` (WebSocket/SSE), :func:`iter_document` and :func:`iter_ndjson`
   (``/v1/blocks``) render the frozen state lazily, at most ``chunk_blocks`` blocks per step: the
   caller sends one chunk, yields to the event loop, and goes on.

A block renders as::

    {"hash": "15760518052499183552", "refs": 2, "medium": "GPU", "tier": "GPU", "group_idx": 0, "block_size": 16}

- ``hash`` exactly as the stream renders it (:func:`kvgateway.protocol.render.hash_text`: decimal with its
  sign for integer hashes, lowercase hex for bytes);
- ``refs`` the reference count (physical copies announced and not yet removed, at least 1);
- ``medium`` the upper-cased medium name as in ``/v1/occupancy`` (no medium: ``GPU``), ``tier`` its tier;
- ``group_idx`` the KV-cache group: an int, ``0`` for events that carried none (the index files
  an absent group_idx under group 0, as a BlockRemoved without one removes from group 0);
- ``block_size`` tokens per block, the medium's last announced block size, or ``null`` when the
  medium only ever had placeholder events (``block_size`` 0).

Blocks come in no particular order (hash sets are unordered; sorting a million hashes would cost
a second). Within a stream they come medium by medium (sorted by name), group by group.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from kvgateway.engine.mediums import medium_tier
from kvgateway.engine.wire import Hash
from kvgateway.protocol.render import hash_text
from kvgateway.state.digest import hex_digest
from kvgateway.state.occupancy import BlockGroup, StreamIndex

__all__ = [
    "DEFAULT_CHUNK_BLOCKS",
    "StreamBlocks",
    "block_json",
    "blocks_document",
    "capture",
    "encoded_state_messages",
    "iter_document",
    "iter_ndjson",
    "state_messages",
]

DEFAULT_CHUNK_BLOCKS: Final = 1000
"""Blocks per ``state`` message / rendering step: about 90 KB of JSON and 0.5 ms of CPU."""

_json: Final = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class StreamBlocks:
    """One stream's resident blocks, frozen by :func:`capture`."""

    source: str
    dp_rank: int
    stale: bool
    groups: tuple[BlockGroup, ...]
    digest: str | None = None
    """The state digest of every medium at the offset captured (kvgateway/state/digest.py), or None
    when it was not asked for."""

    @property
    def block_sizes(self) -> dict[str, int]:
        """Every medium's last announced block size (mediums with none known left out), also of
        mediums with no block now: a router needs them to count tokens as the gateway does."""
        return {medium: size for medium, _, size, _, _ in self.groups if size > 0}

    @property
    def count(self) -> int:
        """Resident blocks (every medium and group)."""
        return sum(len(blocks) for _, _, _, blocks, _ in self.groups)


def capture(indexes: Iterable[StreamIndex], *, digest: bool = False) -> list[StreamBlocks]:
    """Freeze the resident blocks of these streams as they are now (call it at the offset served).

    O(streams x groups), no copy (see the module's docstring). What it returns never changes,
    however the index moves on; a stream with no block is kept (it still gets its one chunk).
    ``digest``: with each stream's state digest (the first ask turns its upkeep on:
    :meth:`~kvgateway.state.occupancy.StreamIndex.digest`).
    """
    return [
        StreamBlocks(
            index.source,
            index.dp_rank,
            index.stale,
            tuple(index.block_groups(freeze=True)),
            hex_digest(index.digest()[0]) if digest else None,
        )
        for index in indexes
    ]


def block_json(block_hash: Hash, refs: int, medium: str, group_idx: int, block_size: int) -> dict[str, Any]:
    """One block as rendered in ``state`` messages and ``/v1/blocks`` (``block_size`` 0: unknown)."""
    return {
        "hash": hash_text(block_hash),
        "refs": refs,
        "medium": medium,
        "tier": medium_tier(medium),
        "group_idx": group_idx,
        "block_size": block_size or None,
    }


def _chunks(stream: StreamBlocks, chunk_blocks: int) -> Iterator[list[dict[str, Any]]]:
    """The stream's block dicts, ``chunk_blocks`` at a time; nothing for a stream with no block."""
    if chunk_blocks < 1:
        raise ValueError(f"chunk_blocks must be at least 1, got {chunk_blocks}")
    chunk: list[dict[str, Any]] = []
    for medium, group_idx, block_size, blocks, extra in stream.groups:
        tier = medium_tier(medium)
        size = block_size or None
        for block_hash in blocks:
            chunk.append(
                {
                    "hash": str(block_hash) if type(block_hash) is int else block_hash.hex(),  # type: ignore[union-attr]
                    "refs": 1 + extra.get(block_hash, 0),
                    "medium": medium,
                    "tier": tier,
                    "group_idx": group_idx,
                    "block_size": size,
                }
            )
            if len(chunk) == chunk_blocks:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _marked(stream: StreamBlocks, chunk_blocks: int) -> Iterator[tuple[list[dict[str, Any]], bool]]:
    """``(blocks, last)`` pairs: every block once, the last pair marked; one empty pair for no block.

    No chunk is rendered ahead (the frozen stream's count says which one is last), so a caller
    that encodes a chunk and clears its list leaves nothing of it alive between steps.
    """
    if chunk_blocks < 1:
        raise ValueError(f"chunk_blocks must be at least 1, got {chunk_blocks}")
    count = max(1, -(-stream.count // chunk_blocks))
    chunks = _chunks(stream, chunk_blocks)
    for n in range(count):
        yield next(chunks, []), n == count - 1


def state_messages(
    streams: Iterable[StreamBlocks], offset: int, chunk_blocks: int = DEFAULT_CHUNK_BLOCKS
) -> Iterator[dict[str, Any]]:
    """The ``state`` messages of a ``snapshot=blocks`` connection, stream after stream.

    ``{"type": "state", "offset": N, "source": ..., "dp_rank": ..., "stale": bool, "blocks": [...],
    "last": bool}`` with at most ``chunk_blocks`` blocks each (``stale``: the stream's index was
    incomplete at ``offset``, as ``hello.sources`` says); a stream's last chunk has ``"last": true``,
    ``"block_sizes"`` (:attr:`StreamBlocks.block_sizes`) and, when captured with it, ``"digest"``;
    a stream with no block still sends one (empty) chunk. Lazy: each step renders one chunk.
    """
    for stream in streams:
        for blocks, last in _marked(stream, chunk_blocks):
            message = {
                "type": "state",
                "offset": offset,
                "source": stream.source,
                "dp_rank": stream.dp_rank,
                "stale": stream.stale,
                "blocks": blocks,
                "last": last,
            }
            if last:
                message["block_sizes"] = stream.block_sizes
                if stream.digest is not None:
                    message["digest"] = stream.digest
            yield message


def encoded_state_messages(
    streams: Iterable[StreamBlocks], offset: int, chunk_blocks: int = DEFAULT_CHUNK_BLOCKS
) -> Iterator[bytes]:
    """:func:`state_messages`, each encoded to JSON; a chunk's block dicts are freed before the
    next step (nothing of a million rendered blocks lingers for the garbage collector)."""
    for message in state_messages(streams, offset, chunk_blocks):
        data = _json.encode(message)
        message["blocks"].clear()  # the list the generators still refer to until resumed
        yield data


def _head(stream: StreamBlocks) -> dict[str, Any]:
    """A stream's fields of ``GET /v1/blocks`` before its blocks (``digest`` only when captured)."""
    head: dict[str, Any] = {
        "source": stream.source,
        "dp_rank": stream.dp_rank,
        "stale": stream.stale,
        "block_sizes": stream.block_sizes,
    }
    if stream.digest is not None:
        head["digest"] = stream.digest
    return head


def blocks_document(epoch: str, offset: int, streams: Iterable[StreamBlocks]) -> dict[str, Any]:
    """``GET /v1/blocks`` as one dict (tests, small fleets; :func:`iter_document` streams it)."""
    return {
        "epoch": epoch,
        "offset": offset,
        "streams": [
            _head(stream) | {"blocks": [block for chunk in _chunks(stream, DEFAULT_CHUNK_BLOCKS) for block in chunk]}
            for stream in streams
        ],
    }


def iter_document(
    epoch: str, offset: int, streams: Iterable[StreamBlocks], chunk_blocks: int = DEFAULT_CHUNK_BLOCKS
) -> Iterator[bytes]:
    """``GET /v1/blocks`` (``application/json``) in pieces of at most ``chunk_blocks`` blocks.

    The pieces concatenated are the JSON of :func:`blocks_document` (a streaming response body:
    a million blocks are about 90 MB of JSON, never held at once).
    """
    yield b'{"epoch":' + _json.encode(epoch) + b',"offset":' + _json.encode(offset) + b',"streams":['
    for n, stream in enumerate(streams):
        yield (b"," if n else b"") + _json.encode(_head(stream))[:-1] + b',"blocks":['
        for i, chunk in enumerate(_chunks(stream, chunk_blocks)):
            piece = (b"," if i else b"") + _json.encode(chunk)[1:-1]
            chunk.clear()  # freed now, not when the generator is resumed
            yield piece
        yield b"]}"
    yield b"]}"


def iter_ndjson(
    epoch: str, offset: int, streams: Iterable[StreamBlocks], chunk_blocks: int = DEFAULT_CHUNK_BLOCKS
) -> Iterator[bytes]:
    """``GET /v1/blocks`` as NDJSON (``application/x-ndjson``): one line per piece, each ending in ``\\n``.

    The first line is ``{"epoch": ..., "offset": N}``; then the same ``state`` messages as on the
    WebSocket (:func:`encoded_state_messages`), so a router parses one shape in both places.
    """
    yield _json.encode({"epoch": epoch, "offset": offset}) + b"\n"
    for data in encoded_state_messages(streams, offset, chunk_blocks):
        yield data + b"\n"
