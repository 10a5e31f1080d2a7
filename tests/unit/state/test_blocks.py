"""Rendering the resident blocks for routers (kvgateway.state.blocks) and the index's frozen snapshots."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgateway.engine.wire import AllBlocksCleared, Event, Hash
from kvgateway.protocol.render import hash_text
from kvgateway.state.blocks import (
    StreamBlocks,
    block_json,
    blocks_document,
    capture,
    iter_document,
    iter_ndjson,
    state_messages,
)
from kvgateway.state.occupancy import OccupancyIndex, StreamIndex
from tests.support.events import batch, placeholder, removed, stored

BIG = 2**64 - 12345


def index_with(*events: Event, source: str = "a", dp_rank: int = 0) -> StreamIndex:
    index = StreamIndex(source, dp_rank)
    index.apply(batch(*events), 0.0)
    return index


def multiset(blocks: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(b, sort_keys=True) for b in blocks)


def resident(index: StreamIndex) -> list[tuple[Hash, int, str, int, int]]:
    """Every resident block as ``(hash, refs, medium, group_idx, block_size)``, read from the
    index's frozen groups as a router's snapshot reads them."""
    return [
        (block_hash, 1 + extra.get(block_hash, 0), medium, group_idx, block_size)
        for medium, group_idx, block_size, blocks, extra in index.block_groups(freeze=True)
        for block_hash in blocks
    ]


# --- the index's accessors ------------------------------------------------------------------


def test_frozen_groups_hold_refs_medium_group_and_block_size() -> None:
    index = index_with(
        stored(BIG, 5, block_size=16),
        stored(BIG, block_size=16),
        stored(b"\x00\xff", medium="cpu", block_size=32),
        stored(7, group=1),
        placeholder(9, medium="DISK"),
    )
    assert sorted(resident(index), key=repr) == sorted(
        [
            (BIG, 2, "GPU", 0, 16),
            (5, 1, "GPU", 0, 16),
            (7, 1, "GPU", 1, 16),
            (b"\x00\xff", 1, "CPU", 0, 32),
            (9, 1, "DISK", 0, 0),
        ],
        key=repr,
    )


def test_block_groups_without_freeze_are_the_live_sets() -> None:
    index = index_with(stored(1))
    ((medium, group, size, blocks, extra),) = index.block_groups()
    assert (medium, group, size, blocks, extra) == ("GPU", 0, 16, {1}, {})
    index.apply(batch(stored(2)), 0.0)
    assert blocks == {1, 2}  # live: valid until the next apply only


def test_frozen_groups_never_change_while_the_index_moves_on() -> None:
    index = index_with(stored(1, 2, 3), stored(3))
    frozen = index.block_groups(freeze=True)
    before = [(m, g, s, set(b), dict(e)) for m, g, s, b, e in frozen]
    index.apply(batch(stored(4), removed(1), removed(3), stored(2)), 0.0)
    index.apply(batch(removed(2, 2)), 0.0)
    assert [(m, g, s, set(b), dict(e)) for m, g, s, b, e in frozen] == before
    # ... and the index itself is right.
    assert sorted(resident(index)) == [(3, 1, "GPU", 0, 16), (4, 1, "GPU", 0, 16)]
    # A second freeze after the copy shares again, and a clear leaves both snapshots alone.
    second = index.block_groups(freeze=True)
    index.apply(batch(AllBlocksCleared()), 0.0)
    assert set(second[0][3]) == {3, 4}
    assert set(frozen[0][3]) == {1, 2, 3}
    assert resident(index) == []


def test_groups_freeze_when_asked_not_when_first_read() -> None:
    index = index_with(stored(1, 2))
    ((*_, blocks, _extra),) = index.block_groups(freeze=True)
    index.apply(batch(removed(1), stored(3)), 0.0)
    assert sorted(blocks) == [1, 2]


def test_reset_after_freeze_keeps_the_snapshot() -> None:
    index = index_with(stored(1))
    (streams,) = capture([index])
    index.reset()
    assert streams.count == 1
    assert index.block_groups()[0][3] == set()


# --- block rendering ------------------------------------------------------------------------


def test_block_json_shape_and_hash_rendering() -> None:
    assert block_json(BIG, 2, "GPU", 0, 16) == {
        "hash": str(BIG),
        "refs": 2,
        "medium": "GPU",
        "tier": "GPU",
        "group_idx": 0,
        "block_size": 16,
    }
    assert block_json(-5, 1, "CPU_PINNED", 1, 0) == {
        "hash": "-5",
        "refs": 1,
        "medium": "CPU_PINNED",
        "tier": "CPU",
        "group_idx": 1,
        "block_size": None,
    }
    assert block_json(b"\xab\x01", 1, "STORAGE", 0, 16)["hash"] == "ab01"


def test_rendered_hashes_are_exactly_the_streams() -> None:
    hashes: list[Hash] = [0, -1, BIG, 2**63, -(2**63), b"", b"\x00" * 32, bytes(range(32))]
    (stream,) = capture([index_with(stored(*hashes))])
    (message,) = state_messages([stream], 1)
    assert sorted(b["hash"] for b in message["blocks"]) == sorted(hash_text(h) for h in hashes)


# --- state messages -------------------------------------------------------------------------


def test_state_messages_chunks_and_marks_the_last() -> None:
    index = index_with(stored(*range(10)))
    messages = list(state_messages(capture([index]), 42, chunk_blocks=4))
    assert [len(m["blocks"]) for m in messages] == [4, 4, 2]
    assert [m["last"] for m in messages] == [False, False, True]
    assert [m.get("block_sizes") for m in messages] == [None, None, {"GPU": 16}]
    for m in messages:
        assert list(m)[:7] == ["type", "offset", "source", "dp_rank", "stale", "blocks", "last"]
        assert (m["type"], m["offset"], m["source"], m["dp_rank"]) == ("state", 42, "a", 0)
    assert sorted(int(b["hash"]) for m in messages for b in m["blocks"]) == list(range(10))


def test_exact_multiple_of_the_chunk_size_ends_with_a_full_last_chunk() -> None:
    messages = list(state_messages(capture([index_with(stored(*range(8)))]), 1, chunk_blocks=4))
    assert [(len(m["blocks"]), m["last"]) for m in messages] == [(4, False), (4, True)]


def test_a_stream_with_no_block_sends_one_empty_last_chunk() -> None:
    empty = StreamIndex("b", 3)
    cleared = index_with(stored(1), AllBlocksCleared(), source="c")
    messages = list(state_messages(capture([empty, cleared]), 7))
    assert [(m["source"], m["dp_rank"], m["blocks"], m["last"], m["block_sizes"]) for m in messages] == [
        ("b", 3, [], True, {}),
        ("c", 0, [], True, {"GPU": 16}),  # sizes outlive the blocks
    ]


def test_streams_come_one_after_the_other_in_the_order_given() -> None:
    occupancy = OccupancyIndex()
    occupancy.apply("b", 0, batch(stored(1, 2, 3)), 0.0)
    occupancy.apply("a", 1, batch(stored(4)), 0.0)
    messages = list(state_messages(capture(occupancy.streams()), 5, chunk_blocks=2))
    assert [(m["source"], m["dp_rank"], len(m["blocks"]), m["last"]) for m in messages] == [
        ("a", 1, 1, True),
        ("b", 0, 2, False),
        ("b", 0, 1, True),
    ]


def test_chunk_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk_blocks"):
        list(state_messages(capture([index_with(stored(1))]), 1, chunk_blocks=0))


def test_rendering_is_lazy_and_sees_the_state_at_capture() -> None:
    index = index_with(stored(*range(6)))
    messages = state_messages(capture([index]), 3, chunk_blocks=2)
    first = next(messages)
    index.apply(batch(removed(*range(6)), stored(100, 101)), 0.0)  # the loop moves on meanwhile
    rest = list(messages)
    assert sorted(int(b["hash"]) for m in [first, *rest] for b in m["blocks"]) == list(range(6))


def test_placeholder_medium_has_unknown_block_size() -> None:
    (message,) = state_messages(capture([index_with(stored(1), placeholder(2, medium="cpu"))]), 1)
    by_hash = {b["hash"]: b for b in message["blocks"]}
    assert by_hash["1"]["block_size"] == 16
    assert by_hash["2"]["block_size"] is None
    assert by_hash["2"]["medium"] == "CPU"


def test_same_hash_in_two_groups_and_two_mediums_is_four_blocks() -> None:
    index = index_with(stored(1), stored(1, group=1), stored(1, medium="CPU"), stored(1, medium="CPU", group=2))
    (message,) = state_messages(capture([index]), 1)
    assert sorted((b["medium"], b["group_idx"]) for b in message["blocks"]) == [
        ("CPU", 0),
        ("CPU", 2),
        ("GPU", 0),
        ("GPU", 1),
    ]


# --- /v1/blocks -----------------------------------------------------------------------------


def _fleet() -> list[StreamBlocks]:
    a = index_with(stored(BIG, 2, 3), stored(BIG), stored(b"\x01\x02", medium="cpu"), source="a")
    b = index_with(stored(9, group=1), source="b", dp_rank=1)
    b.mark_stale()
    return capture([a, b, StreamIndex("c", 0)])


def test_blocks_document_shape() -> None:
    doc = blocks_document("e1", 99, _fleet())
    assert list(doc) == ["epoch", "offset", "streams"]
    assert (doc["epoch"], doc["offset"]) == ("e1", 99)
    assert [(s["source"], s["dp_rank"], s["stale"], len(s["blocks"])) for s in doc["streams"]] == [
        ("a", 0, False, 4),
        ("b", 1, True, 1),
        ("c", 0, False, 0),
    ]
    refs = {b["hash"]: b["refs"] for b in doc["streams"][0]["blocks"]}
    assert refs == {str(BIG): 2, "2": 1, "3": 1, "0102": 1}


@pytest.mark.parametrize("chunk", [1, 2, 3, 1000])
def test_streamed_document_is_the_document(chunk: int) -> None:
    fleet = _fleet()
    pieces = list(iter_document("e1", 99, fleet, chunk_blocks=chunk))
    assert json.loads(b"".join(pieces)) == json.loads(msgspec.json.encode(blocks_document("e1", 99, fleet)))


def test_empty_fleet_document() -> None:
    assert json.loads(b"".join(iter_document("e", 0, []))) == {"epoch": "e", "offset": 0, "streams": []}


def test_ndjson_is_a_header_then_state_messages_with_stale() -> None:
    lines = b"".join(iter_ndjson("e1", 99, _fleet(), chunk_blocks=3)).split(b"\n")
    assert lines[-1] == b""
    parsed = [json.loads(line) for line in lines[:-1]]
    assert parsed[0] == {"epoch": "e1", "offset": 99}
    assert [(m["source"], len(m["blocks"]), m["last"], m["stale"]) for m in parsed[1:]] == [
        ("a", 3, False, False),
        ("a", 1, True, False),
        ("b", 1, True, True),
        ("c", 0, True, False),
    ]
    assert all(m["type"] == "state" and m["offset"] == 99 for m in parsed[1:])


# --- properties -----------------------------------------------------------------------------

hashes_st = st.one_of(st.integers(-(2**63), 2**64 - 1), st.binary(min_size=1, max_size=4))
ops_st = st.lists(
    st.tuples(
        st.sampled_from(["store", "remove", "clear"]),
        st.lists(st.integers(0, 12), min_size=1, max_size=5),
        st.sampled_from([None, "GPU", "cpu", "DISK"]),
        st.sampled_from([None, 0, 1]),
    ),
    max_size=40,
)


def _apply_ops(index: StreamIndex, pool: list[Hash], ops: list[tuple[str, list[int], str | None, int | None]]) -> None:
    for op, picks, medium, group in ops:
        hashes = [pool[i % len(pool)] for i in picks]
        if op == "store":
            index.apply(batch(stored(*hashes, medium=medium, group=group)), 0.0)
        elif op == "remove":
            index.apply(batch(removed(*hashes, medium=medium, group=group)), 0.0)
        else:
            index.apply(batch(AllBlocksCleared()), 0.0)


def _model(index: StreamIndex) -> Counter[str]:
    """What the index says, block by block, through refcount() (independent of the frozen groups)."""
    out: Counter[str] = Counter()
    for medium, group, size, blocks, _extra in index.block_groups():
        for h in blocks:
            out[json.dumps(block_json(h, index.refcount(h, medium, group), medium, group, size), sort_keys=True)] += 1
    return out


@settings(max_examples=150, deadline=None)
@given(
    pool=st.lists(hashes_st, min_size=1, max_size=13, unique=True),
    before=ops_st,
    after=ops_st,
    chunk=st.integers(1, 7),
)
def test_chunking_yields_every_block_exactly_once_as_at_capture(
    pool: list[Hash], before: list[Any], after: list[Any], chunk: int
) -> None:
    index = StreamIndex("s", 0)
    _apply_ops(index, pool, before)
    expected = _model(index)
    streams = capture([index])
    _apply_ops(index, pool, after)  # the index moves on before rendering
    messages = list(state_messages(streams, 1, chunk_blocks=chunk))
    assert all(len(m["blocks"]) <= chunk for m in messages)
    assert [m["last"] for m in messages] == [False] * (len(messages) - 1) + [True]
    assert multiset([b for m in messages for b in m["blocks"]]) == expected
    doc = json.loads(b"".join(iter_document("e", 1, streams, chunk_blocks=chunk)))
    assert multiset(doc["streams"][0]["blocks"]) == expected
    # The index after the second round is still exact (copy on write did not lose a change).
    fresh = StreamIndex("s", 0)
    _apply_ops(fresh, pool, before + after)
    assert _model(index) == _model(fresh)
