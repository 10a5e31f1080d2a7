"""The compiled writers against the reference: what the log keeps of a batch
(:func:`kvgateway.protocol.render.events_json`: the events' JSON, where each ends, how many of
each type, each one's filter key) and the batch message around it (:func:`~kvgateway.protocol.render.batch_message`),
byte for byte, from both cores fed the same decoded batches: every wire layout (positional and map
events, u64, i64 and byte hashes, extra_keys, mediums, groups, locality, LoRA, clears, unknown
events), the values the C writer has no fast path for (it must hand them to the reference), the
further fields named like an event's own, strings that need escaping, integers at every edge of
64 bits, and the heads' epochs, sources, offsets, seqs and timestamps.

Skipped where the compiled core was not built; hypothesis shrinks any difference to a minimal batch."""

from __future__ import annotations

import gc
import math
from array import array
from types import ModuleType
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgateway.engine import wire
from kvgateway.engine.wire import AllBlocksCleared, BlockRemoved, BlockStored, Event, UnknownEvent
from kvgateway.protocol import _render_py, render
from kvgateway.protocol.messages import EncodedBatch, EncodedEvents, OutMessage, encode_events
from kvgateway.runtime import extensions
from tests.support.cores import compiled_twin
from tests.support.payloads import U64, encoded_event


def _compiled() -> ModuleType:
    return compiled_twin("kvgateway.protocol._render_c")


def assert_same(events: list[Event]) -> tuple[EncodedEvents, Any]:
    """Both cores' events_json of ``events``: the same body, ends and keys (returned); or, for a
    value the reference cannot encode (not one a decoder makes), the same error. The compiled
    writer goes first: token ids a compiled decoder kept as sent are not yet read as a list."""
    compiled = _compiled()
    try:
        theirs, their_keys = compiled.events_json(events)
    except (TypeError, AttributeError) as exc:
        with pytest.raises(type(exc)):
            _render_py.events_json(events)
        return EncodedEvents(b"", array("q")), ()
    ours, our_keys = _render_py.events_json(events)
    assert theirs.body == ours.body
    assert list(theirs.ends) == list(ours.ends)
    assert their_keys == our_keys
    assert theirs.counts == ours.counts
    return theirs, their_keys


def assert_same_message(
    epoch: str, offset: int, stream: tuple[str, int], *, seq: int, ts: float, events: EncodedEvents
) -> EncodedBatch:
    compiled = _compiled()
    ours, theirs = (
        m.batch_message(epoch, offset, stream, seq=seq, ts=ts, events=events) for m in (_render_py, compiled)
    )
    assert theirs.message.data == ours.message.data
    assert (theirs.message.id, theirs.message.type) == (ours.message.id, ours.message.type)
    assert theirs._prefix == ours._prefix and theirs._ends == ours._ends
    return theirs


# --- every wire layout ----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(encoded_event(), max_size=6), rank=st.sampled_from([0, 3]))
def test_every_wire_layout_gives_the_same_bytes_ends_and_keys(
    items: list[tuple[Any, Event, tuple[Any, ...]]], rank: int
) -> None:
    batch = wire.decode_batch(msgspec.msgpack.encode([1.0, [value for value, _, _ in items], rank]))
    encoded, keys = assert_same(batch.events)
    # and what the log kept is what the reference's two steps gave before this writer existed
    assert encoded.body == encode_events(_render_py.render_events(batch.events)).body
    assert len(keys) == len(batch.events)
    kinds = [type(event) for event in batch.events]
    others = sum(kind not in (BlockStored, BlockRemoved, AllBlocksCleared) for kind in kinds)
    assert encoded.counts == (
        kinds.count(BlockStored),
        kinds.count(BlockRemoved),
        kinds.count(AllBlocksCleared),
        others,
    )
    message = assert_same_message("0123456789abcdef", 7, ("eng", rank), seq=41, ts=batch.ts, events=encoded)
    assert msgspec.json.decode(message.message.data)["events"] == msgspec.json.decode(b"[" + encoded.body + b"]")


# --- values off the fast paths ----------------------------------------------------------------------

text_st = st.text(max_size=6) | st.sampled_from(
    ["", "GPU", 'a"b', "a\\b", "\n", "\x00\x1f", "\x7f", "é", "\u2028", "日本"]
)
int_st = st.integers(-(2**63), U64) | st.sampled_from(
    [0, 9, 10, 99, 100, -1, -10, 2**63 - 1, -(2**63), 2**63, U64, U64 + 1, -(2**63) - 1, 2**80, -(2**80)]
)
nested_st = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        int_st,
        st.floats(),
        text_st,
        st.binary(max_size=4),
        st.builds(msgspec.msgpack.Ext, st.integers(-128, 127), st.binary(max_size=4)),
    ),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.one_of(text_st, st.integers(-3, 3), st.binary(max_size=2), st.none()), inner, max_size=3)
    ),
    max_leaves=10,
)
hash_st = int_st | st.binary(max_size=33)
# further fields: the usual names, names of the events' own fields (the reference overwrites those
# in place), and names that need escaping
OWN_NAMES = [
    "type",
    "medium",
    "tier",
    "block_hashes",
    "token_ids",
    "lora_name",
    "lora_id",
    "parent_block_hash",
    "block_size",
]
extra_name_st = st.sampled_from(
    ["extra_keys", "group_idx", "locality", "kv_cache_spec_kind", "x", 'q"', "é", *OWN_NAMES]
)
extra_st = st.dictionaries(extra_name_st, nested_st, max_size=3) | st.sampled_from(
    [{}, {"extra_keys": [None, None]}, {"extra_keys": []}, {"extra_keys": [None, 1]}, {"group_idx": True}]
)
medium_st = st.none() | text_st | st.sampled_from(["GPU", "cpu", "CPU_PINNED", "REMOTE_GPU", "DISK", ""])


@st.composite
def odd_event(draw: st.DrawFn) -> Event:
    kind = draw(st.sampled_from(["stored"] * 3 + ["removed", "cleared", "unknown"]))
    extra = draw(extra_st)
    if kind == "stored":
        return BlockStored(
            draw(st.lists(hash_st, max_size=4)),
            draw(st.none() | hash_st),
            draw(st.lists(int_st, max_size=6) | st.lists(nested_st, max_size=3)),
            draw(int_st | st.sampled_from([None, 1.5, True])),
            draw(st.none() | int_st | st.sampled_from([False, 2.0, "7"])),
            draw(medium_st),
            draw(st.none() | text_st | st.sampled_from([1, b"\x01"])),
            extra,
        )
    if kind == "removed":
        return BlockRemoved(draw(st.lists(hash_st, max_size=4)), draw(medium_st), extra)
    if kind == "cleared":
        return AllBlocksCleared(extra=extra)
    if draw(st.booleans()):
        return UnknownEvent(type="BlockMoved", body=["BlockMoved", draw(nested_st)])
    return UnknownEvent(type="X", body={"type": "X", "medium": draw(medium_st), "v": draw(nested_st)})


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(odd_event(), max_size=5))
def test_values_off_the_fast_paths_are_written_as_the_reference_writes_them(events: list[Event]) -> None:
    """Escaped strings, ints past 64 bits, floats, bools, bytes and nested values in every field,
    further fields named like the event's own, unknown events: the reference's bytes every time."""
    assert_same(events)


def test_a_value_msgspec_refuses_where_a_further_field_overwrites_it() -> None:
    """The compiled writer's fast pass raises on a value msgspec cannot encode, which the reference
    never encodes (a further field of the same name overwrites it): the batch is written again, that
    event the reference's, the others the compiled writer's."""
    ext = msgspec.msgpack.Ext(1, b"x")
    events: list[Event] = [
        BlockStored([1], None, [1], 16, None, "GPU", None, {}),
        BlockStored([2], None, [ext], 16, None, "GPU", None, {"token_ids": [3]}),
        BlockRemoved([3], "GPU", {"lora_name": ext}),
    ]
    encoded, _ = assert_same(events)
    assert b'"token_ids":[3]' in encoded.body


# every decimal length and the values on each side of it, the 32-bit split, the 10**16 split of
# a 64-bit value into three parts, CPython's 30-bit digits, and what is not a u64 at all
DECIMAL_EDGES = sorted(
    {v for k in range(21) for v in (10**k - 1, 10**k, 10**k + 1) if 0 <= v <= U64}
    | {v for k in (30, 31, 32, 33, 60, 61, 63, 64) for v in (2**k - 1, 2**k, 2**k + 1) if v <= U64}
    | {10**16 * 1844 + 10**16 - 1, 10**8 * (10**8 - 1), 10**8 * 10**8 - 1, 4_294_967_295 * 10**8 + 99_999_999}
)
NOT_U64 = [-1, -(2**63), U64 + 1, 2**80, -(2**80)]


def test_ints_at_every_decimal_and_digit_edge_are_written_as_the_reference_writes_them() -> None:
    """token_ids (the list written in place), hashes and further fields at every edge of the C
    writer's arithmetic; then each non-u64 int at the start, the middle and the end of a token
    list (the list written again from its start, an int at a time)."""
    edges = [v for v in DECIMAL_EDGES if v <= U64]
    assert_same([BlockStored(edges, edges[-1], edges, 16, edges[-2], "GPU", None, {"n": edges[-3]})])
    for v in edges:
        assert_same([BlockStored([v], v, [v, v], v, v, None, None, {})])
    for bad in NOT_U64:
        for tokens in ([bad, 1, 2], [1, bad, 2], [1, 2, bad], [bad]):
            assert_same([BlockStored([1], None, tokens, 1, None, "GPU", None, {})])
            assert_same([BlockStored([bad, 2], bad, [3, *tokens], 1, bad, None, None, {})])
    assert_same([BlockStored([], None, [], 0, None, None, None, {})])


eight_digits = st.integers(0, 10**8 - 1) | st.integers(0, 999)  # zeros in front, most of them


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hashes=st.lists(
        st.integers(2**32, U64)
        | st.builds(
            lambda top, middle, low: top * 10**16 + middle * 10**8 + low,
            st.integers(0, 1844),
            eight_digits,
            eight_digits,
        ).filter(lambda value: value <= U64),
        min_size=1,
        max_size=30,
    )
)
def test_hashes_of_any_u64_value_are_written_as_the_reference_writes_them(hashes: list[int]) -> None:
    """A hash's digits are its leading part and one or two parts of exactly eight digits, each
    written by multiplications: any u64, many with zeros in front of a part."""
    assert_same([BlockStored(hashes, hashes[0], [1], 16, None, "GPU", None, {}), BlockRemoved(hashes[::-1], "GPU", {})])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hashes=st.lists(
        st.integers(-(2**63), -1) | st.sampled_from([-(2**63), -(2**63) + 1, -(10**18), -1, U64, 2**63]),
        min_size=1,
        max_size=40,
    )
)
def test_signed_hashes_are_written_in_the_room_of_a_u64_as_the_reference_writes_them(hashes: list[int]) -> None:
    """A signed hash's negative half (SGLang's) is written in place, its sign and up to 19 digits in
    the room a u64's 20 take: long lists of the longest ones, beside u64s, end where they should."""
    stored = BlockStored(hashes, hashes[-1], [1], 16, None, "GPU", None, {})
    assert_same([stored, BlockRemoved(hashes[::-1], "GPU", {})])


def test_byte_hashes_of_every_length_and_byte_are_written_as_their_hex() -> None:
    """Bytes hashes of 0 to 80 bytes (the compiled writer takes 16 a step, then 4, then 1), whose
    bytes run through all 256 values (each nibble at both places, the digits 9 and a at their
    edge): written as the reference writes them, and each as ``bytes.hex()``."""
    every = bytes(range(256)) * 2
    hashes = [every[start : start + n] for n in range(81) for start in (0, 7, 128 + 3, 240)]
    theirs, _ = assert_same([BlockStored(hashes, None, [1], 16, None, "GPU", None, {})])
    listed = b'"block_hashes":[' + b",".join(b'"%s"' % h.hex().encode() for h in hashes) + b"]"
    assert listed in theirs.body


def _held(event: Event) -> Any:
    """What a BlockStored's ``token_ids`` slot holds, not read through the field."""
    field = type(event).__dict__["token_ids"]
    return getattr(field, "member", field).__get__(event, type(event))


def test_token_ids_kept_as_sent_are_written_as_the_reference_writes_their_list() -> None:
    """The compiled decoder keeps ids of 0 to 2**32-1 as the wire sent them
    (kvgateway/engine/_tokens_c.pyx): written from there at every decimal length, in map and
    positional events, beside ids that are lists (wider or negative ones, empty lists, and every
    list of a batch that takes the general path)."""
    edges = [v for v in DECIMAL_EDGES if v < 2**32]
    lists: list[list[int]] = [edges, [0], [2**32 - 1, 1], [], [2**32], [-1, 5], [U64, 0], [-(2**63)]]
    events: list[Any] = []
    for tokens in lists:
        events.append({"type": "BlockStored", "block_hashes": [1], "token_ids": tokens, "block_size": 1})
        events.append(["BlockStored", [2], None, tokens, 1, None, "GPU"])
    compiled_decoder = wire._tokens.__name__.endswith("_c")
    for group, kept in ((events[0::2], 3), (events[1::2], 3), (events, 0)):  # map, positional: fast; mixed
        batch = wire.decode_batch(msgspec.msgpack.encode([1.0, group, 0]))
        held = [type(_held(e)).__name__ for e in batch.events]
        assert held.count("Tokens") == (kept if compiled_decoder else 0)
        assert_same(batch.events)
        expected = lists if group is not events else [tokens for tokens in lists for _ in "mp"]
        assert [e.token_ids for e in batch.events] == expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=st.lists(st.integers(0, 2**32 - 1) | st.integers(10**8, 2**32 - 1), min_size=1, max_size=40))
def test_token_ids_of_any_value_kept_as_sent_are_written_as_the_reference_writes_them(tokens: list[int]) -> None:
    """The writer of a kept token id takes its digits by multiplication, each range by its own
    constant: any id, most of them of 9 or 10 digits, where the last pair's margin is the thinnest."""
    event = {"type": "BlockStored", "block_hashes": [1], "token_ids": [*tokens, 100_000_015], "block_size": 1}
    batch = wire.decode_batch(msgspec.msgpack.encode([1.0, [event], 0]))
    assert_same(batch.events)
    assert batch.events[0].token_ids == [*tokens, 100_000_015]


def test_a_hash_of_no_hash_type_fails_alike() -> None:
    """Neither int nor bytes: the reference fails on ``.hex()``, and so does the compiled writer."""
    compiled = _compiled()
    for bad in ("ab", None, True):
        event = BlockStored([1, bad], None, [], 0)  # type: ignore[list-item]
        for module in (_render_py, compiled):
            with pytest.raises(AttributeError):
                module.events_json([event])


def test_a_huge_batch_and_the_next_small_one() -> None:
    """A batch far larger than the writer's reused buffer, then a small one: both exact."""
    big = [BlockStored(list(range(2000)), None, list(range(40_000)), 20, None, "GPU", None, {}) for _ in range(30)]
    encoded, _ = assert_same(big)
    assert len(encoded.body) > 2**20
    assert_same([AllBlocksCleared()])


def test_further_fields_of_the_same_value_again_and_of_others_between() -> None:
    """The compiled writer keeps a further field's name and value as written once the same value
    object came twice in a row under that name: each value written again, another value between,
    one name in several event types, values of every scalar kind and some it does not keep."""
    kind, other, escaped, wide = "full_attention", "sliding_window", 'a"b\\', 2**70
    values: list[Any] = [0, 0, 0, 1, 0, 0, kind, kind, kind, other, kind, None, None, True, True, False]
    values += [escaped, escaped, wide, wide, -5, -5, U64, U64, [None], [None], 1.5, 1.5, kind, kind]
    events: list[Event] = []
    for value in values:
        events.append(BlockStored([1], None, [1], 16, None, "GPU", None, {"group_idx": value, "k": value}))
        events.append(BlockRemoved([2], "GPU", {"group_idx": value}))
    events.append(AllBlocksCleared(extra={"group_idx": 0}))
    for _ in range(2):  # and again from a batch's start
        assert_same(events)
        assert_same(events[::-1])


# --- the message's head -------------------------------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    epoch=st.sampled_from(["0123456789abcdef", "KV_events-1", "a"]) | text_st,
    offset=st.integers(0, 2**70),
    source=text_st | st.text(min_size=50, max_size=200),
    dp_rank=int_st,
    seq=st.integers(0, 2**70),
    ts=st.floats() | st.integers(-3, 2**64) | st.sampled_from([0.0, -0.0, 1e20, 1.5e-7, 1789095808.8378847]),
    events=st.lists(odd_event(), max_size=2),
)
def test_the_head_is_the_references_for_every_epoch_stream_offset_seq_and_time(
    *, epoch: str, offset: int, source: str, dp_rank: int, seq: int, ts: float, events: list[Event]
) -> None:
    encoded, _ = assert_same(events)
    message = assert_same_message(epoch, offset, (source, dp_rank), seq=seq, ts=ts, events=encoded)
    if not (isinstance(ts, float) and not math.isfinite(ts)):
        decoded = msgspec.json.decode(message.message.data)
        assert (decoded["offset"], decoded["seq"], decoded["source"]) == (offset, str(seq), source)


def test_one_epoch_after_another_and_a_select_of_the_compiled_message() -> None:
    """The per-epoch part of the head is kept: a second epoch must not reuse the first's; a
    filtered variant cut from the compiled message is the reference's too."""
    events: list[Event] = [
        BlockStored([1, 2], None, [1, 2], 1, None, "GPU", None, {}),
        BlockRemoved([b"\x01"], "CPU", {}),
        AllBlocksCleared(),
    ]
    encoded, _ = assert_same(events)
    for epoch in ("first", "second", "first"):
        message = assert_same_message(epoch, 3, ("s", 0), seq=5, ts=1.0, events=encoded)
        assert message.message.id == f"{epoch}:3"
        reference = _render_py.batch_message(epoch, 3, ("s", 0), seq=5, ts=1.0, events=encoded)
        for chosen in ([0], [1, 2], [0, 2]):
            assert message.select(chosen).data == reference.select(chosen).data


def test_a_stream_again_after_another_is_written_as_the_reference_writes_it() -> None:
    """The head's part of the last stream is kept for the same tuple: another between, equal
    tuples that are other objects, the first again."""
    encoded, _ = assert_same([AllBlocksCleared()])
    first, second = ("a", 0), ("b", 1)
    for offset, stream in enumerate([first, first, second, first, ("a", 0), ("a", 1), second, second]):
        assert_same_message("e", offset, stream, seq=offset, ts=1.0, events=encoded)


def test_the_compiled_writers_structs_are_made_as_their_constructors_make_them() -> None:
    """EncodedEvents, EncodedBatch and OutMessage are made without their constructors (each slot
    set: engine/_direct.pxd) where a check at import found them the same: here, every field of
    each the same value as the reference's, of the exact class, untracked by the collector."""
    compiled = _compiled()
    assert compiled.DIRECT == {"EncodedEvents": True, "EncodedBatch": True, "OutMessage": True}
    events: list[Event] = [BlockStored([1], None, [1], 16, None, "GPU", None, {}), AllBlocksCleared()]
    (theirs, _), (ours, _) = compiled.events_json(events), _render_py.events_json(events)
    assert type(theirs) is EncodedEvents and not gc.is_tracked(theirs)
    assert msgspec.structs.astuple(theirs) == msgspec.structs.astuple(ours)
    message = compiled.batch_message("e", 1, ("s", 0), seq=2, ts=3.0, events=theirs)
    reference = _render_py.batch_message("e", 1, ("s", 0), seq=2, ts=3.0, events=ours)
    assert type(message) is EncodedBatch and type(message.message) is OutMessage
    assert msgspec.structs.astuple(message)[1:] == msgspec.structs.astuple(reference)[1:]
    assert msgspec.structs.astuple(message.message) == msgspec.structs.astuple(reference.message)
    assert not (gc.is_tracked(message) or gc.is_tracked(message.message))
    assert message.message.text == reference.message.text  # its cache filled on the made one


def test_the_chosen_core_writes_the_log() -> None:
    compiled = _compiled()
    chosen = _render_py if extensions.forced_pure() else compiled
    assert (render.events_json, render.batch_message) == (chosen.events_json, chosen.batch_message)
