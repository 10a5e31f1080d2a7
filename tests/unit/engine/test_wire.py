"""kvgateway.engine.wire: every layout an engine sends, built by hand with msgspec.msgpack.encode of
plain lists and dicts (tests/support/payloads.py; never with encode.encode_batch, so the decoder is not
checked against itself)."""

from __future__ import annotations

import json
from datetime import UTC
from typing import Any, Final

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvgateway.engine import _batch_py, wire
from kvgateway.engine.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored, DecodeError, Event, UnknownEvent
from kvgateway.protocol import render
from tests.support.payloads import (
    ABOVE_I64,
    FULL_STORED,
    MAP_ONLY_KEYS,
    RAW32,
    STORED_CORE,
    STORED_FURTHER,
    STORED_POSITIONAL,
    U64,
    core_of,
    decode,
    enc,
    encoded_event,
    hash_st,
    roundtrip,
    stored_array,
    stored_fields,
)


def one_line(exc: DecodeError) -> str:
    text = str(exc)
    assert text, "empty error message"
    assert "\n" not in text and "\r" not in text, text
    return text


# --- the batch envelope ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tail", "rank"),
    [
        ((), None),  # vLLM 0.9.0: [ts, events]
        ((0,), 0),  # 0.9.1 on: [ts, events, data_parallel_rank]
        ((None,), None),  # the rank may be null
        ((3, "publisher-id"), 3),  # a proposed 4th element: ignored
        ((7, "publisher-id", {"x": 1}, [1, 2], b"\x00"), 7),  # anything further: ignored
    ],
)
def test_batch_layouts(tail: tuple[Any, ...], rank: int | None) -> None:
    events = [stored_array(5, block_hashes=[ABOVE_I64]), ["AllBlocksCleared"]]
    got = wire.decode_batch(enc([12.5, events, *tail]))
    assert got.ts == 12.5
    assert got.dp_rank == rank
    assert got.events == [
        BlockStored(block_hashes=[ABOVE_I64], parent_block_hash=None, token_ids=[], block_size=16),
        AllBlocksCleared(),
    ]


def test_empty_batch_and_integer_ts() -> None:
    assert wire.decode_batch(enc([5, []])) == Batch(ts=5.0, events=[], dp_rank=None)


def test_memoryview_payload() -> None:
    payload = enc([1.0, [["BlockRemoved", [U64]]], 1])
    assert wire.decode_batch(memoryview(payload)) == wire.decode_batch(payload)


@pytest.mark.parametrize("n", [5, 6, 7, 8, 9, 10, 11])
def test_positional_block_stored_every_field_count(n: int) -> None:
    (event,) = decode(["BlockStored", *(FULL_STORED[name] for name in STORED_POSITIONAL[:n])]).events
    assert isinstance(event, BlockStored)
    for name in STORED_CORE[:n]:
        assert getattr(event, name) == FULL_STORED[name], name
    for name in STORED_CORE[n:]:  # fields an older engine did not have
        assert getattr(event, name) is None, name
    assert event.extra == {name: FULL_STORED[name] for name in STORED_FURTHER[: max(0, n - 7)]}
    assert event.group_idx == (1 if n >= 9 else None)


def test_positional_block_stored_with_extra_trailing_fields() -> None:
    values = ["BlockStored", *(FULL_STORED[name] for name in STORED_POSITIONAL), "future", 12, None, [1]]
    (event,) = decode(values).events
    (reference,) = decode(values[:12]).events
    assert event == reference


def test_positional_block_stored_too_short_fails_the_batch() -> None:
    with pytest.raises(DecodeError, match=r"^event 1: BlockStored") as info:
        decode(["AllBlocksCleared"], ["BlockStored", [1], None, [], 16])
    one_line(info.value)


@pytest.mark.parametrize(
    ("values", "medium", "extra"),
    [
        (["BlockRemoved", [ABOVE_I64, RAW32]], None, {}),
        (["BlockRemoved", [ABOVE_I64, RAW32], "CPU"], "CPU", {}),
        (["BlockRemoved", [ABOVE_I64, RAW32], "CPU", 2], "CPU", {"group_idx": 2}),
        (["BlockRemoved", [ABOVE_I64, RAW32], None, None], None, {"group_idx": None}),
        (["BlockRemoved", [ABOVE_I64, RAW32], "gpu", 0, "LOCAL", "x", 9], "gpu", {"group_idx": 0}),
    ],
)
def test_positional_block_removed(values: list[Any], medium: str | None, extra: dict[str, Any]) -> None:
    (event,) = decode(values).events
    assert event == BlockRemoved(block_hashes=[ABOVE_I64, RAW32], medium=medium, extra=extra)


def test_positional_all_blocks_cleared_with_trailing_fields() -> None:
    assert decode(["AllBlocksCleared"], ["AllBlocksCleared", 1, "x"]).events == [AllBlocksCleared()] * 2


# --- map events --------------------------------------------------------------------------------


def test_map_events_with_omitted_defaults() -> None:
    got = decode(
        {"type": "BlockStored", "block_hashes": [U64]},
        {"type": "BlockRemoved", "block_hashes": [U64]},
        {"type": "AllBlocksCleared"},
    ).events
    assert got == [
        BlockStored(block_hashes=[U64], parent_block_hash=None, token_ids=[], block_size=0),
        BlockRemoved(block_hashes=[U64]),
        AllBlocksCleared(),
    ]
    stored_event = got[0]
    assert isinstance(stored_event, BlockStored)
    assert (stored_event.lora_id, stored_event.medium, stored_event.lora_name, stored_event.group_idx) == (None,) * 4


def test_map_unknown_keys_are_kept() -> None:
    got = decode(
        {"type": "BlockStored", "block_hashes": [1], "block_size": 16, **MAP_ONLY_KEYS, "group_idx": 2},
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": 2, "locality": "REMOTE"},
        {"type": "AllBlocksCleared", "reason": "drop"},
    ).events
    assert isinstance(got[0], BlockStored)
    assert isinstance(got[1], BlockRemoved)
    assert isinstance(got[2], AllBlocksCleared)
    assert got[0].extra == {**MAP_ONLY_KEYS, "group_idx": 2}
    assert got[1].extra == {"group_idx": 2, "locality": "REMOTE"}
    assert got[2].extra == {"reason": "drop"}
    assert got[0].group_idx == got[1].group_idx == 2


def test_real_vllm_0_26_capture() -> None:
    (event,) = decode(
        {
            "type": "BlockStored",
            "block_hashes": [15760518052499183552],
            "parent_block_hash": None,
            "token_ids": [
                151644,
                872,
                198,
                9064,
                374,
                279,
                6722,
                315,
                5616,
                30,
                151645,
                198,
                151644,
                77091,
                198,
                151667,
            ],
            "block_size": 16,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "extra_keys": [None],
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }
    ).events
    assert isinstance(event, BlockStored)
    assert event.block_hashes == [15760518052499183552]
    assert (event.block_size, event.medium, event.group_idx) == (16, "GPU", 0)
    assert event.extra == {"extra_keys": [None], "group_idx": 0, "kv_cache_spec_kind": "full_attention"}


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "BlockStored"},  # no block_hashes
        {"type": "BlockStored", "block_hashes": [1.5]},
        {"type": "BlockStored", "block_hashes": [1], "block_size": "16"},
        {"type": "BlockStored", "block_hashes": [1], "token_ids": [1, "2"]},
        ["BlockStored", [1], None, "tokens", 16, None],
        ["BlockStored", [1], None, [], 16.0, None],
        ["BlockStored", "1", None, [], 16, None],
        {"type": "BlockRemoved", "block_hashes": 1},
        {"type": "BlockRemoved", "block_hashes": [True]},
        {"block_hashes": [1]},  # no type
        {"type": 7},
        ["BlockRemoved"],
        ["BlockRemoved", [1.0], "GPU"],
        [],
        [42, 1],
        "BlockStored",
        7,
        None,
    ],
)
def test_malformed_events_fail_the_batch(bad: Any) -> None:
    with pytest.raises(DecodeError, match=r"^event 1: ") as info:
        wire.decode_batch(enc([1.0, [["AllBlocksCleared"], bad]]))
    one_line(info.value)


# --- hashes and mediums ------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 2**53 + 1, 2**63, ABOVE_I64, U64, -1, -(2**63), RAW32, b"\x00" * 32])
def test_hash_values_survive_both_forms(value: int | bytes) -> None:
    got = decode(
        stored_array(5, block_hashes=[value], parent_block_hash=value),
        {"type": "BlockStored", "block_hashes": [value], "parent_block_hash": value},
        ["BlockRemoved", [value]],
        {"type": "BlockRemoved", "block_hashes": [value]},
    ).events
    for event in got:
        assert isinstance(event, BlockStored | BlockRemoved)
        assert event.block_hashes == [value]
        assert type(event.block_hashes[0]) is type(value)
        if isinstance(event, BlockStored):
            assert event.parent_block_hash == value


@pytest.mark.parametrize("medium", ["GPU", "gpu", "CPU", "CPU_PINNED", "DISK", "EXTERNAL", "STORAGE", None])
def test_medium_is_kept_as_sent(medium: str | None) -> None:
    got = decode(
        stored_array(6, medium=medium),
        {"type": "BlockStored", "block_hashes": [1], "medium": medium},
        ["BlockRemoved", [1], medium],
        {"type": "BlockRemoved", "block_hashes": [1], "medium": medium},
    ).events
    assert [e.medium for e in got if isinstance(e, BlockStored | BlockRemoved)] == [medium] * 4
    rendered = render.render_events(got)
    assert [r["medium"] for r in rendered] == [medium] * 4


def test_medium_absent_is_none() -> None:
    got = decode(stored_array(5), {"type": "BlockStored", "block_hashes": [1]}, ["BlockRemoved", [1]]).events
    assert [e.medium for e in got if isinstance(e, BlockStored | BlockRemoved)] == [None] * 3


@pytest.mark.parametrize(
    "event",
    [
        ["BlockStored", [ABOVE_I64], None, [], 0, None, "CPU"],
        ["BlockStored", [ABOVE_I64], None, [], 0, None, "CPU", None, None, 0, "full_attention", None],
        {"type": "BlockStored", "block_hashes": [ABOVE_I64], "token_ids": [], "block_size": 0, "medium": "CPU"},
    ],
)
def test_placeholder_offload_events(event: Any) -> None:
    (got,) = decode(event).events
    assert isinstance(got, BlockStored)
    assert (got.block_hashes, got.parent_block_hash, got.token_ids, got.block_size) == ([ABOVE_I64], None, [], 0)
    assert render.render_event(got)["block_size"] == 0


# --- unknown event types -----------------------------------------------------------------------


def test_unknown_event_types_are_kept_in_order_and_rendered() -> None:
    got = decode(
        ["BlockStored", [1], None, [], 16, None],
        ["BlockMoved", [ABOVE_I64], "CPU", b"\xab\xcd", {"k": b"\x01"}],
        {"type": "KVTransfer", "block_hashes": [U64], "blob": b"\xff", "nested": {"x": [b"\x0a"]}},
        ["AllBlocksCleared"],
    ).events
    assert [type(e) for e in got] == [BlockStored, UnknownEvent, UnknownEvent, AllBlocksCleared]
    assert got[1] == UnknownEvent(
        type="BlockMoved", body=["BlockMoved", [ABOVE_I64], "CPU", b"\xab\xcd", {"k": b"\x01"}]
    )
    assert got[2] == UnknownEvent(
        type="KVTransfer",
        body={"type": "KVTransfer", "block_hashes": [U64], "blob": b"\xff", "nested": {"x": [b"\x0a"]}},
    )
    rendered = json.loads(msgspec.json.encode(render.render_events(got)))
    assert rendered[1] == {"type": "BlockMoved", "fields": [[ABOVE_I64], "CPU", "abcd", {"k": "01"}]}
    assert rendered[2] == {"type": "KVTransfer", "block_hashes": [U64], "blob": "ff", "nested": {"x": ["0a"]}}


def test_lowercase_or_unlisted_tag_is_unknown_not_an_error() -> None:
    got = decode(["blockstored", 1], {"type": "Blockstored"}, ["AllBlocksCleared2"]).events
    assert [e.type for e in got] == ["blockstored", "Blockstored", "AllBlocksCleared2"]
    assert all(type(e) is UnknownEvent for e in got)


batch_st = st.tuples(
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(encoded_event(), max_size=6),
    st.sampled_from([(), (0,), (None,), (3,), (1, "publisher-id")]),
)


REMOTE_REMOVAL = {"type": "BlockRemoved", "block_hashes": [], "medium": "GPU", "locality": "REMOTE"}
"""A map removal of a remote pool's block (hypothesis drew it once: the oracle then expected GPU)."""


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batch_st)
@example(
    batch=(
        0.0,
        [
            (
                REMOTE_REMOVAL,
                BlockRemoved([], "REMOTE_GPU", {"locality": "REMOTE"}),
                ("BlockRemoved", [], "REMOTE_GPU", None),
            )
        ],
        (),
    )
)
def test_every_layout_mixed_in_one_batch_decodes_to_the_same_events(
    batch: tuple[float, list[tuple[Any, Event, tuple[Any, ...]]], tuple[Any, ...]],
) -> None:
    ts, items, tail = batch
    got = wire.decode_batch(enc([ts, [value for value, _, _ in items], *tail]))
    assert got.ts == ts
    assert got.dp_rank == (tail[0] if tail else None)
    assert got.events == [expected for _, expected, _ in items]
    assert [core_of(e) for e in got.events] == [core for _, _, core in items]


def _positional(item: tuple[Any, Event, tuple[Any, ...]]) -> bool:
    return isinstance(item[0], list)


one_layout_st = st.one_of(
    st.lists(encoded_event().filter(_positional), max_size=6),
    st.lists(encoded_event().filter(lambda item: not _positional(item)), max_size=6),
    st.lists(encoded_event(), max_size=6),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(items=one_layout_st, as_map=st.booleans(), rank=st.sampled_from([None, 0, 3]))
def test_the_fast_paths_decode_what_the_general_path_decodes(
    items: list[tuple[Any, Event, tuple[Any, ...]]], as_map: bool, rank: int | None
) -> None:
    """All positional, all map or mixed events, in an array or a map envelope: a fast path takes the
    batch or leaves it, and decode_batch gives the general path's events either way (which the
    tests above check against the engines' values)."""
    values = [value for value, _, _ in items]
    envelope: Any = {"ts": 1.5, "events": values, "data_parallel_rank": rank} if as_map else [1.5, values, rank]
    payload = enc(envelope)
    general = wire._decode_general(payload, as_map)
    assert wire.decode_batch(payload) == general
    assert general.events == [expected for _, expected, _ in items]


@pytest.mark.parametrize("core", ["chosen", "reference"])
def test_positional_and_map_batches_each_take_a_fast_path_as_an_engine_switches_layout(
    monkeypatch: pytest.MonkeyPatch, core: str
) -> None:
    """An array envelope of positional events, then of map events, and back: each decoded in one
    call, not event by event, to the general path's events; by the reference (msgspec's fast
    decoders), the order the two are tried in follows the layout."""
    stored = {"block_hashes": [1, 2], "parent_block_hash": None, "token_ids": [5, 6, 7, 8], "block_size": 2}
    positional = enc([1.0, [["BlockStored", [1, 2], None, [5, 6, 7, 8], 2, None], ["BlockRemoved", [1]]], 0])
    as_map = enc([1.0, [{"type": "BlockStored", **stored}, {"type": "BlockRemoved", "block_hashes": [1]}], 0])
    expected = {payload: wire._decode_general(payload, False) for payload in (positional, as_map)}
    layouts = []

    def no_general(payload: bytes, as_map: bool) -> Batch:
        raise AssertionError("took the general path")

    monkeypatch.setattr(wire, "_decode_general", no_general)
    if core == "reference":
        monkeypatch.setattr(wire, "_parse_batch", _batch_py.parse_batch)
    for payload in (positional, positional, as_map, as_map, positional, as_map):
        got = wire.decode_batch(payload)
        assert got == expected[payload]
        assert [type(e) for e in got.events] == [BlockStored, BlockRemoved]
        layouts.append(_batch_py._layout.positional)
    if core == "reference":
        assert layouts == [True, True, False, False, True, False]


# --- garbage never escapes as anything but DecodeError ------------------------------------------


def decodes_or_refuses(payload: bytes) -> None:
    """A payload either decodes to a batch that renders to JSON, or raises a one-line DecodeError."""
    try:
        got = wire.decode_batch(payload)
    except DecodeError as exc:
        one_line(exc)
        return
    assert isinstance(got, Batch)
    assert all(isinstance(e, BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent) for e in got.events)
    msgspec.json.encode(render.render_events(got.events))


@settings(max_examples=500)
@given(payload=st.binary(max_size=300))
def test_random_bytes_raise_only_decode_error(payload: bytes) -> None:
    decodes_or_refuses(payload)


@settings(max_examples=300)
@given(payload=st.binary(max_size=200))
def test_random_bytes_behind_a_valid_prefix_raise_only_decode_error(payload: bytes) -> None:
    # fixarray(3), float64 ts, then an events array header: the fuzz lands inside the events
    decodes_or_refuses(b"\x93\xcb" + bytes(8) + b"\x92" + payload)


def test_map_event_keys_that_are_not_strings_are_kept_under_names() -> None:
    # CI's fuzzing found it: an inserted byte turned two keys into 1 and nil, which then failed to render
    payload = enc([1.0, [{"type": "BlockStored", "block_hashes": [U64], 1: "a", None: "b", (2, 3): "c"}], 0])
    event = wire.decode_batch(payload).events[0]
    assert isinstance(event, BlockStored) and event.block_hashes == [U64]
    assert event.extra == {"1": "a", "null": "b", "[2,3]": "c"}
    assert all(type(key) is str for key in event.extra)
    out = render.render_event(event)
    assert (out["1"], out["null"], out["[2,3]"]) == ("a", "b", "c")
    decodes_or_refuses(payload)
    cleared = enc([1.0, [{"type": "AllBlocksCleared", 7: True}], 0])
    assert wire.decode_batch(cleared).events[0].extra == {"7": True}


mutation = st.tuples(
    st.sampled_from(["flip", "insert", "delete", "truncate"]), st.integers(0, 2**16), st.integers(1, 255)
)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(encoded_event(), min_size=1, max_size=4), mutations=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_valid_payloads_raise_only_decode_error(
    items: list[tuple[Any, Event, tuple[Any, ...]]], mutations: list[tuple[str, int, int]]
) -> None:
    data = bytearray(enc([1.0, [value for value, _, _ in items], 0]))
    for how, where, byte in mutations:
        at = where % (len(data) + 1)
        if how == "insert":
            data.insert(at, byte)
        elif not data:
            continue
        elif how == "flip":
            data[at % len(data)] ^= byte
        elif how == "delete":
            del data[at % len(data)]
        else:
            del data[at % len(data) :]
    decodes_or_refuses(bytes(data))


# --- size limit and message framing ------------------------------------------------------------


def test_oversized_payload_is_refused_before_decoding() -> None:
    payload = enc([1.0, [["BlockRemoved", [U64] * 100]], 0])
    assert wire.decode_batch(payload, max_bytes=len(payload)).events
    with pytest.raises(DecodeError, match="exceeds") as info:
        wire.decode_batch(payload, max_bytes=len(payload) - 1)
    one_line(info.value)
    with pytest.raises(DecodeError, match="exceeds"):  # the default limit; zero bytes are not valid msgpack anyway
        wire.decode_batch(bytes(wire.MAX_PAYLOAD_BYTES + 1))


def test_a_map_envelope_is_read_as_one_whatever_its_header() -> None:
    """A fixmap, map 16 or map 32 envelope (forks): the same batch; an array envelope's header of
    each size is no map."""
    body = b"".join(enc(item) for item in ("ts", 1.5, "events", [["BlockRemoved", [7]]], "data_parallel_rank", 2))
    expected = Batch(ts=1.5, events=[BlockRemoved(block_hashes=[7])], dp_rank=2)
    for header in (b"\x83", b"\xde\x00\x03", b"\xdf\x00\x00\x00\x03"):
        assert wire.decode_batch(header + body) == expected
    items = b"".join(enc(item) for item in (1.5, [["BlockRemoved", [7]]], 2))
    for header in (b"\x93", b"\xdc\x00\x03", b"\xdd\x00\x00\x00\x03"):
        assert wire.decode_batch(header + items) == expected


def test_split_message_reads_the_seq_unsigned() -> None:
    payload = enc([1.0, [["BlockRemoved", [U64]]], 2])
    assert wire.split_message([b"kv-events", (U64).to_bytes(8, "big"), payload]) == (U64, payload)  # not -1
    assert wire.split_message([b"", bytes(8), payload]) == (0, payload)


@pytest.mark.parametrize("count", [0, 1, 2, 4])
def test_split_message_frame_count(count: int) -> None:
    frames = [b"kv", bytes(8), enc([1.0, []]), b"more"][:count]
    with pytest.raises(DecodeError, match=rf"^message has {count} frames") as info:
        wire.split_message(frames)
    one_line(info.value)


@pytest.mark.parametrize("seq_frame", [b"", b"\x00" * 7, b"\x00" * 9, b"\x01"])
def test_split_message_sequence_length(seq_frame: bytes) -> None:
    with pytest.raises(DecodeError, match=rf"^sequence frame is {len(seq_frame)} bytes") as info:
        wire.split_message([b"kv", seq_frame, enc([1.0, []])])
    one_line(info.value)


def test_parse_seq_is_unsigned_big_endian() -> None:
    assert wire.parse_seq(wire.seq_bytes(258)) == 258
    assert wire.parse_seq(b"\x00\x00\x00\x00\x00\x00\x01\x02") == 258
    assert wire.parse_seq(wire.END_SEQ_BYTES) == U64
    assert int.from_bytes(wire.END_SEQ_BYTES, "big", signed=True) == wire.END_SEQ


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        enc([1.0]),
        enc(["1.0", []]),
        enc([1.0, {}]),
        enc([1.0, [], "0"]),
        enc([1.0, [], 0])[:-1] + b"\x92",  # trailing garbage
        enc([1.0, [["BlockRemoved", [1, 2, 3]]]])[:-2],  # truncated
    ],
)
def test_bad_batches(payload: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        wire.decode_batch(payload)
    one_line(info.value)


# --- hostile payloads found by fuzzing: each refused or rendered, never an escape --------------


@pytest.mark.parametrize(
    "event",
    [
        b"\x92\xa1X\xa1\xff",  # in an unknown array event
        b"\x92\xabBlockStored\xa1\xff",  # in a known one (its tag check fails first, then the generic decode)
        b"\x81\xa4type\xa1\xff",  # in a map event
    ],
)
def test_invalid_utf8_raises_decode_error(event: bytes) -> None:
    with pytest.raises(DecodeError):
        wire.decode_batch(b"\x92\xcb" + bytes(8) + b"\x91" + event)


def nested(depth: int) -> bytes:
    """``[[[...[]...]]]`` nested ``depth`` deep, in a few bytes per level."""
    return b"\x91" * depth + b"\x90"


# Deeper than msgspec decodes on any supported CPython: about 1,000 levels on 3.11 and 3.12, and
# between 5,000 and 20,000 on 3.13 (its recursion guard counts the C stack differently; 5,000
# levels decode and render there, checked).
TOO_DEEP: Final = 100_000


@pytest.mark.parametrize(
    "payload",
    [
        b"\x92\xcb" + bytes(8) + b"\x91" + nested(TOO_DEEP),  # inside events, while skipping Raw
        b"\x92\xcb" + bytes(8) + b"\x91\x92\xa1X" + nested(TOO_DEEP),  # an unknown array event's body
        b"\x92\xcb" + bytes(8) + b"\x91\x82\xa4type\xa1X\xa1a" + nested(TOO_DEEP),  # an unknown map event's body
    ],
)
def test_deeply_nested_payload_raises_decode_error(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        wire.decode_batch(payload)


def test_decodable_nesting_renders() -> None:
    # 600 levels decode today (msgspec's limit is near 1000), but rendering needs ~1200 Python frames
    decodes_or_refuses(b"\x92\xcb" + bytes(8) + b"\x91\x82\xa4type\xa1X\xa1a" + nested(600))


# --- one field of an unexpected type: kept as an unnamed further field, never the event's loss ----

WRONG_VALUES: dict[str, Any] = {
    "null": None,
    "bool": True,
    "int": 7,
    "negative int": -(2**63),
    "u64": U64,
    "float": 1.5,
    "str": "GPU",
    "bytes": b"\x01\x02",
    "array": [1, "x"],
    "int array": [1, 2],
    "empty array": [],
    "map": {"cache_salt": "abc"},
    "empty map": {},
    "ext": msgspec.msgpack.Ext(5, b"\x01"),
}


# The types each field takes; any other value is "wrong" for it.
FITS: dict[str, tuple[str, ...]] = {
    "parent_block_hash": ("null", "int", "negative int", "u64", "bytes"),
    "lora_id": ("null", "int", "negative int", "u64"),
    "medium": ("null", "str"),
    "lora_name": ("null", "str"),
    "extra_keys": ("null", "array", "int array", "empty array"),
    "group_idx": ("null", "int", "negative int", "u64"),
    "kv_cache_spec_kind": ("null", "str"),
    "kv_cache_spec_sliding_window": ("null", "int", "negative int", "u64"),
}


STORED_LENIENT = ("parent_block_hash", "lora_id", "medium", "lora_name", *STORED_FURTHER)
STORED_ATTRS = ("block_hashes", *STORED_CORE[1:])  # fields of BlockStored itself, the rest in extra
REMOVED_POSITIONAL = ("block_hashes", "medium", "group_idx")
REMOVED_LENIENT = ("medium", "group_idx")
WRONG_CASES = [
    pytest.param(name, label, id=f"{name}-{label}")
    for name in STORED_LENIENT
    for label in WRONG_VALUES
    if label not in FITS[name]
]


REMOVED_WRONG_CASES = [
    pytest.param(name, label, id=f"{name}-{label}")
    for name in REMOVED_LENIENT
    for label in WRONG_VALUES
    if label not in FITS[name]
]


NEIGHBOURS = (["AllBlocksCleared"], {"type": "BlockRemoved", "block_hashes": [9], "medium": "CPU"})


def expect_stored(fields: dict[str, Any], extra: dict[str, Any]) -> BlockStored:
    return BlockStored(**{name: fields[name] for name in STORED_ATTRS}, extra=extra)


def test_sglang_metadata_map_in_the_lora_name_position() -> None:
    """The reported case: a 7th positional field that is a map, where lora_name is expected."""
    sglang = ["BlockStored", [ABOVE_I64, -5], None, list(range(32)), 16, None, "GPU", {"cache_salt": "abc"}]
    got = decode(["AllBlocksCleared"], sglang, ["BlockRemoved", [3], "CPU_PINNED"]).events
    assert len(got) == 3
    stored = got[1]
    assert stored == BlockStored(
        block_hashes=[ABOVE_I64, -5],
        parent_block_hash=None,
        token_ids=list(range(32)),
        block_size=16,
        medium="GPU",
        extra={"field_7": {"cache_salt": "abc"}},
    )
    rendered = roundtrip(got)[1]
    assert rendered["field_7"] == {"cache_salt": "abc"}
    assert rendered["lora_name"] is None
    assert rendered["block_hashes"] == [str(ABOVE_I64), "-5"]


@pytest.mark.parametrize(("name", "label"), WRONG_CASES)
def test_positional_block_stored_field_of_a_wrong_type_is_kept_unnamed(name: str, label: str) -> None:
    value = WRONG_VALUES[label]
    position = STORED_POSITIONAL.index(name) + 1  # its index in the array: the tag is 0
    for n in sorted(c for c in {max(position, 5), 7, 11} if c >= position):  # layouts long enough to have it
        values = ["BlockStored", *(FULL_STORED[f] for f in STORED_POSITIONAL[:n])]
        values[position] = value
        got = decode(NEIGHBOURS[0], values, NEIGHBOURS[1]).events
        assert len(got) == 3, "the neighbours are kept too"
        event = got[1]
        assert isinstance(event, BlockStored)
        fields = FULL_STORED | {f: None for f in STORED_POSITIONAL[n:]}
        extra = {f: fields[f] for f in STORED_FURTHER[: max(0, n - 7)]}
        extra = {(f"field_{position}" if f == name else f): v for f, v in extra.items()}
        if name in STORED_ATTRS:
            fields = fields | {name: None}
            extra = {f"field_{position}": value} | extra  # in positional order
        else:
            extra[f"field_{position}"] = value
        assert event == expect_stored(fields, extra)
        assert list(event.extra) == [k for k in extra]  # in the order of the array
        rendered = roundtrip([event])[0]
        assert f"field_{position}" in rendered
        assert name not in rendered or rendered[name] is None
        assert rendered["block_hashes"] == [render.hash_text(h) for h in FULL_STORED["block_hashes"]]
        if name == "group_idx":
            assert event.group_idx is None


@pytest.mark.parametrize(("name", "label"), REMOVED_WRONG_CASES)
def test_positional_block_removed_field_of_a_wrong_type_is_kept_unnamed(name: str, label: str) -> None:
    value = WRONG_VALUES[label]
    position = REMOVED_POSITIONAL.index(name) + 1
    full = {"block_hashes": [ABOVE_I64, RAW32], "medium": "CPU", "group_idx": 2}
    values = ["BlockRemoved", *full.values()]
    values[position] = value
    (_, event, _) = decode(NEIGHBOURS[0], values, NEIGHBOURS[1]).events
    if name == "medium":
        assert event == BlockRemoved(block_hashes=full["block_hashes"], extra={"field_2": value, "group_idx": 2})
    else:
        assert event == BlockRemoved(block_hashes=full["block_hashes"], medium="CPU", extra={"field_3": value})
    rendered = roundtrip([event])[0]
    assert f"field_{position}" in rendered
    assert rendered["tier"] == ("GPU" if name == "medium" else "CPU")


@pytest.mark.parametrize(("name", "label"), WRONG_CASES)
def test_map_block_stored_known_key_of_a_wrong_type_is_kept_raw(name: str, label: str) -> None:
    value = WRONG_VALUES[label]
    body = {"type": "BlockStored", **FULL_STORED, "locality": "LOCAL"}
    body[name] = value
    (_, event, _) = decode(NEIGHBOURS[0], body, NEIGHBOURS[1]).events
    assert isinstance(event, BlockStored)
    fields = FULL_STORED | ({name: None} if name in STORED_ATTRS else {})
    extra = {(f"field_{f}" if f == name else f): body[f] for f in (*STORED_FURTHER, "locality")}
    if name in STORED_ATTRS:
        extra = {f"field_{name}": value} | extra  # the map's key order
    assert event == expect_stored(fields, extra)
    rendered = roundtrip([event])[0]
    assert f"field_{name}" in rendered
    assert name not in rendered or rendered[name] is None
    assert rendered["locality"] == "LOCAL"


@pytest.mark.parametrize(("name", "label"), REMOVED_WRONG_CASES)
def test_map_block_removed_known_key_of_a_wrong_type_is_kept_raw(name: str, label: str) -> None:
    value = WRONG_VALUES[label]
    body = {"type": "BlockRemoved", "block_hashes": [1], "medium": "DISK", "group_idx": 0, "ownership": "x"}
    body[name] = value
    (_, event, _) = decode(NEIGHBOURS[0], body, NEIGHBOURS[1]).events
    medium = None if name == "medium" else "DISK"
    extra = {("field_" + k if k == name else k): v for k, v in body.items() if k not in {"type", "block_hashes"}}
    if name != "medium":
        del extra["medium"]
    assert event == BlockRemoved(block_hashes=[1], medium=medium, extra=extra)


@pytest.mark.parametrize(
    ("event", "field"),
    [
        *(
            pytest.param(["BlockStored", value, None, [], 16, None], "field 1 (block_hashes)", id=f"pos-hashes-{label}")
            for label, value in WRONG_VALUES.items()
            if label not in ("int array", "empty array")
        ),
        pytest.param(["BlockStored", [1, 1.5], None, [], 16, None], "field 1", id="pos-hashes-float-item"),
        pytest.param(["BlockStored", [True], None, [], 16, None], "field 1", id="pos-hashes-bool-item"),
        *(
            pytest.param(["BlockStored", [1], None, value, 16, None], "field 3 (token_ids)", id=f"pos-tokens-{label}")
            for label, value in WRONG_VALUES.items()
            if label not in ("null", "int array", "empty array")
        ),
        *(
            pytest.param(["BlockStored", [1], None, [], value, None], "field 4 (block_size)", id=f"pos-size-{label}")
            for label, value in WRONG_VALUES.items()
            if label not in ("null", "int", "negative int", "u64")
        ),
        *(
            pytest.param(["BlockRemoved", value, "GPU"], "field 1 (block_hashes)", id=f"pos-removed-{label}")
            for label, value in WRONG_VALUES.items()
            if label not in ("int array", "empty array")
        ),
        *(
            pytest.param({"type": "BlockStored", "block_hashes": value}, "block_hashes", id=f"map-hashes-{label}")
            for label, value in WRONG_VALUES.items()
            if label not in ("int array", "empty array")
        ),
        *(
            pytest.param(
                {"type": "BlockStored", "block_hashes": [1], "token_ids": value}, "token_ids", id=f"map-tokens-{label}"
            )
            for label, value in WRONG_VALUES.items()
            if label not in ("null", "int array", "empty array")
        ),
        *(
            pytest.param(
                {"type": "BlockStored", "block_hashes": [1], "block_size": value}, "block_size", id=f"map-size-{label}"
            )
            for label, value in WRONG_VALUES.items()
            if label not in ("null", "int", "negative int", "u64")
        ),
        pytest.param({"type": "BlockRemoved", "block_hashes": [b"\x01", "x"]}, "block_hashes", id="map-removed-str"),
        pytest.param({"type": "BlockRemoved", "medium": "GPU"}, "block_hashes", id="map-removed-missing"),
        pytest.param(["BlockStored", [1], None, [], 16], "at least 5", id="pos-too-short"),
        pytest.param(["BlockRemoved"], "at least 1", id="pos-removed-empty"),
    ],
)
def test_a_core_field_of_a_wrong_type_still_fails_the_batch(event: Any, field: str) -> None:
    with pytest.raises(DecodeError, match=r"^event 1: Block(Stored|Removed): ") as info:
        decode(["AllBlocksCleared"], event)
    assert field in one_line(info.value)


@pytest.mark.parametrize(
    "event",
    [
        ["BlockStored", [1], None, None, None, None],
        {"type": "BlockStored", "block_hashes": [1], "token_ids": None, "block_size": None},
        {"type": "BlockStored", "block_hashes": [1], "token_ids": None},
    ],
)
def test_null_token_ids_and_block_size_read_as_a_placeholder(event: Any) -> None:
    (got,) = decode(event).events
    assert isinstance(got, BlockStored)
    assert (got.block_hashes, got.token_ids, got.block_size) == ([1], [], 0)


def test_several_wrong_fields_in_one_event_are_all_kept() -> None:
    values = ["BlockStored", [1], 2.5, [1], 1, "x", 5, {"a": 1}, "not a list", "0", 3, "4096"]
    (event,) = decode(values).events
    assert isinstance(event, BlockStored)
    assert event.extra == {
        "field_2": 2.5,
        "field_5": "x",
        "field_6": 5,
        "field_7": {"a": 1},
        "field_8": "not a list",
        "field_9": "0",
        "field_10": 3,
        "field_11": "4096",
    }
    assert (event.parent_block_hash, event.lora_id, event.medium, event.lora_name) == (None, None, None, None)
    assert event.group_idx is None
    rendered = roundtrip([event])[0]
    assert rendered["tier"] == "GPU"  # an unreadable medium counts like an absent one
    assert rendered["field_9"] == "0"
    assert "kv_cache_spec_kind" not in rendered  # position 10 was wrong: 3 is not a spec kind name


msgpack_value = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), U64)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.datetimes(timezones=st.just(UTC))  # the timestamp extension (-1): decoded to a datetime
    # any other extension (an ext -1 that is not a valid timestamp is malformed msgpack: DecodeError)
    | st.builds(msgspec.msgpack.Ext, st.integers(-128, 127).filter(lambda code: code != -1), st.binary(max_size=4)),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=8,
)


def fits(name: str, value: Any) -> bool:
    """Whether ``value`` has the type the field ``name`` takes."""
    if value is None:
        return True
    if name in ("parent_block_hash",):
        return type(value) in (int, bytes)
    if name in ("medium", "lora_name", "kv_cache_spec_kind"):
        return type(value) is str
    if name == "extra_keys":
        return type(value) is list
    return type(value) is int  # lora_id, group_idx, kv_cache_spec_sliding_window


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    fields=stored_fields(),
    name=st.sampled_from(STORED_LENIENT),
    value=msgpack_value,
    n=st.sampled_from([7, 8, 11]),
    as_map=st.booleans(),
)
def test_any_value_in_one_optional_field_keeps_the_event_and_its_hashes(
    fields: dict[str, Any], name: str, value: Any, n: int, as_map: bool
) -> None:
    position = STORED_POSITIONAL.index(name) + 1
    n = max(n, position)
    if as_map:
        event: Any = {"type": "BlockStored", **fields, name: value}
    else:
        event = ["BlockStored", *(fields[f] for f in STORED_POSITIONAL[:n])]
        event[position] = value
    unnamed = f"field_{name}" if as_map else f"field_{position}"
    got = decode(NEIGHBOURS[0], event, NEIGHBOURS[1]).events
    assert [e.type for e in got] == ["AllBlocksCleared", "BlockStored", "BlockRemoved"]
    stored = got[1]
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == fields["block_hashes"]
    assert (stored.token_ids, stored.block_size) == (fields["token_ids"], fields["block_size"])
    if fits(name, value):
        held = getattr(stored, name) if name in STORED_ATTRS else stored.extra[name]
        assert held == value
        assert unnamed not in stored.extra
    else:
        assert stored.extra[unnamed] == value
        assert getattr(stored, name, None) is None and name not in stored.extra
    rendered = roundtrip(got)[1]
    assert rendered["block_hashes"] == [render.hash_text(h) for h in fields["block_hashes"]]
    assert rendered["tier"] in ("GPU", "CPU", "DISK", "EXTERNAL")


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    hashes=st.lists(hash_st, max_size=4),
    name=st.sampled_from(REMOVED_LENIENT),
    value=msgpack_value,
    as_map=st.booleans(),
)
def test_any_value_in_one_optional_removed_field_keeps_the_event_and_its_hashes(
    hashes: list[Any], name: str, value: Any, as_map: bool
) -> None:
    full = {"block_hashes": hashes, "medium": "CPU", "group_idx": 1}
    if as_map:
        event: Any = {"type": "BlockRemoved", **full, name: value}
    else:
        event = ["BlockRemoved", *full.values()]
        event[REMOVED_POSITIONAL.index(name) + 1] = value
    got = decode(NEIGHBOURS[0], event, NEIGHBOURS[1]).events
    removed = got[1]
    assert isinstance(removed, BlockRemoved)
    assert removed.block_hashes == hashes
    assert roundtrip(got)[1]["block_hashes"] == [render.hash_text(h) for h in hashes]


# --- frames: live messages and replay replies -----------------------------------------------


def test_split_message_gives_seq_and_payload_or_one_line_errors() -> None:
    assert wire.split_message([b"kv", wire.seq_bytes(7), b"payload"]) == (7, b"payload")
    with pytest.raises(DecodeError, match="message has 2 frames, expected 3"):
        wire.split_message([b"kv", wire.seq_bytes(7)])
    with pytest.raises(DecodeError, match="sequence frame is 3 bytes, expected 8"):
        wire.split_message([b"kv", b"abc", b"payload"])


@pytest.mark.parametrize(
    ("frames", "parsed"),
    [
        ([b"", b"kv", wire.seq_bytes(5), b"p"], (5, b"p")),  # vLLM >= 0.26: with the topic
        ([b"", wire.seq_bytes(5), b"p"], (5, b"p")),  # older vLLM, SGLang
        ([b"", wire.END_SEQ_BYTES, b""], (wire.END_SEQ, b"")),
        ([b"", b"kv", wire.END_SEQ_BYTES, b""], (wire.END_SEQ, b"")),
        ([b"x", wire.seq_bytes(5), b"p"], None),  # no empty delimiter
        ([b"", wire.seq_bytes(5)], None),
        ([b"", b"kv", wire.seq_bytes(5), b"p", b"q"], None),
        ([b"", b"short", b"p"], None),
    ],
)
def test_parse_replay_reply_takes_both_layouts_and_refuses_others(
    frames: list[bytes], parsed: tuple[int, bytes] | None
) -> None:
    assert wire.parse_replay_reply(frames) == parsed


def test_field_lists_follow_the_struct_definitions() -> None:
    """Every layout's struct names the same fields in the same order: the positional one is the
    definition the field lists derive from."""
    assert wire.STORED_FIELDS[:7] == (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
    )
    assert len(wire.STORED_FIELDS) == 11
    assert wire.REMOVED_FIELDS == ("block_hashes", "medium", "group_idx")
    # The fast map structs also know the map-only ``locality`` (vLLM 0.26, TensorRT-LLM), last.
    for stored, more in ((wire._MapStored, ()), (wire._FastStored, ("locality",))):
        assert tuple(f.name for f in msgspec.structs.fields(stored)) == (*wire.STORED_FIELDS, *more)
    for removed, more in ((wire._MapRemoved, ()), (wire._FastRemoved, ("locality",))):
        assert tuple(f.name for f in msgspec.structs.fields(removed)) == (*wire.REMOVED_FIELDS, *more)


# --- the 2026 fields and envelopes, from bytes built by hand -------------------------------------
#
# A msgpack writer of its own (nothing of msgspec or the simulator's encoder), so that a fault
# shared by an encoder and the decoder cannot hide here.


def mp(value: Any) -> bytes:
    """msgpack bytes of nil, bools, ints (-2^63 .. 2^64-1), floats (64-bit), str, bytes, lists, dicts."""
    if value is None:
        return b"\xc0"
    if value is True or value is False:
        return b"\xc3" if value else b"\xc2"
    if isinstance(value, int):
        if 0 <= value < 0x80:
            return bytes([value])
        if -32 <= value < 0:
            return (value & 0xFF).to_bytes(1, "big")
        if value >= 0:
            return b"\xcf" + value.to_bytes(8, "big")
        return b"\xd3" + value.to_bytes(8, "big", signed=True)
    if isinstance(value, float):
        import struct

        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, str):
        data = value.encode()
        assert len(data) < 256
        return (bytes([0xA0 | len(data)]) if len(data) < 32 else b"\xd9" + bytes([len(data)])) + data
    if isinstance(value, bytes):
        assert len(value) < 256
        return b"\xc4" + bytes([len(value)]) + value
    if isinstance(value, list | tuple):
        assert len(value) < 16
        return bytes([0x90 | len(value)]) + b"".join(mp(v) for v in value)
    assert isinstance(value, dict) and len(value) < 16
    return bytes([0x80 | len(value)]) + b"".join(mp(k) + mp(v) for k, v in value.items())


def test_the_hand_writer_agrees_with_msgpack() -> None:
    """The writer above is itself right: msgspec reads back what it wrote."""
    value = [1.5, -3, 2**64 - 1, -(2**63), "x", b"\x00", None, True, {"k": [1, {"n": False}]}]
    assert msgspec.msgpack.decode(mp(value)) == value


def stored_map(**fields: Any) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": [2**64 - 5], "parent_block_hash": None, "token_ids": [1, 2],
            "block_size": 2, "lora_id": None, "medium": "GPU", **fields}  # fmt: skip


def one(payload: bytes) -> Event:
    (event,) = wire.decode_batch(payload).events
    return event


@pytest.mark.parametrize(
    ("locality", "medium", "counted"),
    [
        ("LOCAL", "GPU", "GPU"),
        ("REMOTE", "GPU", "REMOTE_GPU"),
        ("REMOTE", "CPU", "REMOTE_CPU"),
        ("remote", None, "REMOTE_GPU"),
        (None, "GPU", "GPU"),
    ],
)
def test_locality_on_stores_and_removals(locality: str | None, medium: str | None, counted: str) -> None:
    """vLLM 0.26 and TensorRT-LLM: a REMOTE block is held by a remote pool, not in this engine's
    memory. It is counted under ``REMOTE_<medium>`` (the EXTERNAL tier); ``locality`` is kept."""
    for event_map in (
        stored_map(medium=medium, locality=locality),
        {"type": "BlockRemoved", "block_hashes": [7], "medium": medium, "locality": locality},
        stored_map(medium=medium, locality=locality, session_id="s1"),  # the general path too
    ):
        event = one(mp([1.0, [event_map], 0]))
        assert isinstance(event, BlockStored | BlockRemoved)
        assert (event.medium, event.extra["locality"]) == (counted if locality else medium, locality)
        rendered = render.render_event(event)
        assert rendered["locality"] == locality
        assert rendered["tier"] == ("EXTERNAL" if counted.startswith("REMOTE") else "GPU")


@pytest.mark.parametrize("medium", ["FS", "OBJ", "STORAGE"])
def test_vllm_0_26_offload_mediums_keep_their_names(medium: str) -> None:
    event = one(mp([1.0, [stored_map(medium=medium, token_ids=[], block_size=0)], 0]))
    assert isinstance(event, BlockStored) and event.medium == medium
    assert render.render_event(event)["tier"] == {"FS": "DISK", "OBJ": "EXTERNAL", "STORAGE": "DISK"}[medium]


def test_kv_cache_spec_fields_in_maps_and_arrays() -> None:
    fields = {"group_idx": 1, "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 4096}
    as_map = one(mp([1.0, [stored_map(**fields)], 0]))
    as_array = one(mp([1.0, [["BlockStored", [5], None, [1, 2], 2, None, "GPU", None, [None], 1,
                              "sliding_window", 4096]], 0]))  # fmt: skip
    for event in (as_map, as_array):
        assert isinstance(event, BlockStored)
        assert {k: event.extra[k] for k in fields} == fields
        assert event.group_idx == 1


def test_extra_keys_as_hash_offset_pairs_are_kept() -> None:
    """vLLM 0.19+: a multimodal entry of ``extra_keys`` is a ``(hash, offset)`` pair; a block's entry
    is null or a tuple of such pairs, LoRA names and cache salts."""
    keys = [None, [["mm-hash-1", 0], ["mm-hash-2", 16]], [b"\x01\x02", 3]]
    for payload in (
        mp([1.0, [stored_map(block_hashes=[1, 2, 3], token_ids=[0] * 6, extra_keys=keys)], 0]),
        mp([1.0, [["BlockStored", [1, 2, 3], None, [0] * 6, 2, None, "GPU", None, keys]], 0]),
    ):
        event = one(payload)
        assert isinstance(event, BlockStored) and event.extra["extra_keys"] == keys
        assert render.render_event(event)["extra_keys"][1] == [["mm-hash-1", 0], ["mm-hash-2", 16]]


def test_remaining_copy_counts_on_a_removal_is_kept() -> None:
    """An open proposal: how many physical copies of each hash remain. Kept and passed on; the index
    counts references itself (docs/protocol.md)."""
    event = one(mp([1.0, [{"type": "BlockRemoved", "block_hashes": [4, 5], "medium": "GPU",
                           "remaining_copy_counts": [0, 2]}], 0]))  # fmt: skip
    assert isinstance(event, BlockRemoved) and event.extra == {"remaining_copy_counts": [0, 2]}
    assert render.render_event(event)["remaining_copy_counts"] == [0, 2]


def test_trtllm_native_vllm_compatible_batch() -> None:
    """TensorRT-LLM's own vLLM-compatible publisher: map events (locality on stores and removals) in
    a positional envelope with the rank."""
    payload = mp([1789095808.5, [
        stored_map(locality="LOCAL", group_idx=0),
        {"type": "BlockRemoved", "block_hashes": [9], "medium": "GPU", "group_idx": 0, "locality": "LOCAL"},
        {"type": "AllBlocksCleared"},
    ], 3])  # fmt: skip
    batch = wire.decode_batch(payload)
    assert (batch.ts, batch.dp_rank) == (1789095808.5, 3)
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == [2**64 - 5]
    assert stored.extra == {"group_idx": 0, "locality": "LOCAL"} and stored.medium == "GPU"
    assert isinstance(removed, BlockRemoved) and removed.extra == {"group_idx": 0, "locality": "LOCAL"}
    assert isinstance(cleared, AllBlocksCleared)


@pytest.mark.parametrize(
    "envelope",
    [
        {"ts": 2.5, "events": [stored_map()], "data_parallel_rank": 1},
        {"events": [stored_map()], "ts": 2.5, "data_parallel_rank": 1, "publisher_id": "p"},  # any order, more keys
    ],
)
def test_an_envelope_encoded_as_a_map_decodes(envelope: dict[str, Any]) -> None:
    """Some forks and proposals encode the batch without ``array_like``: the same batch."""
    assert wire.decode_batch(mp(envelope)) == wire.decode_batch(mp([2.5, [stored_map()], 1]))


def test_a_map_envelope_of_array_events_and_without_a_rank() -> None:
    batch = wire.decode_batch(mp({"ts": 1.0, "events": [["BlockRemoved", [3], "CPU"]]}))
    assert batch.dp_rank is None
    assert batch.events == [BlockRemoved(block_hashes=[3], medium="CPU")]


@pytest.mark.parametrize(
    "envelope",
    [{"ts": 1.0}, {"events": []}, {"ts": "1", "events": []}, {"ts": 1.0, "events": {}}],
)
def test_a_map_envelope_without_its_fields_is_a_decode_error(envelope: dict[str, Any]) -> None:
    with pytest.raises(DecodeError, match="bad batch"):
        wire.decode_batch(mp(envelope))
