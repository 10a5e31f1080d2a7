"""An array envelope of map or positional events parsed where it lies, in C
(kvgateway/engine/_batch_c.pyx), against the reference (:mod:`kvgateway.engine._batch_py`, msgspec's
fast decoders): what engines send (both layouts, every key in any order, ints of every msgpack
width, both ts widths, every rank form) parsed by the twin itself to the reference's batch, field
by field and type by type; any payload near those shapes (cut, changed or grown at any byte;
localities, extra_keys with values, empty token arrays, mixed layouts) decoded by ``decode_batch``
to the same batch or the same error with either; and every shape the twin declines named.

Skipped where the compiled core was not built (or ``KVGATEWAY_NO_EXTENSIONS`` is set)."""

from __future__ import annotations

import copy
import gc
import pickle
import sys
from types import ModuleType
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgateway.engine import _batch_py, wire
from kvgateway.engine.wire import Batch
from tests.support.cores import compiled_twin
from tests.support.fast_layouts import (
    field_by_field,
    hash_st,
    hashes_st,
    map_removed,
    map_stored,
    positional_removed,
    positional_stored,
)


def _compiled() -> ModuleType:
    return compiled_twin("kvgateway.engine._batch_c", lambda module: wire._parse_batch is module.parse_batch)


def decoded(data: bytes, core: ModuleType) -> Batch | str:
    """``decode_batch`` with this core's ``parse_batch``: its batch, or its error's words."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wire, "_parse_batch", core.parse_batch)
        try:
            return wire.decode_batch(data)
        except wire.DecodeError as exc:
            return str(exc)


any_int = st.integers(-(2**63), 2**64 - 1)
text_st = st.text(max_size=5) | st.sampled_from(["GPU", "CPU", "full_attention", "sliding_window", "é\u20ac"])
PARSED: dict[str, st.SearchStrategy[Any]] = {  # what vLLM sends, every key the parser reads itself
    "parent_block_hash": st.none() | hash_st,
    "token_ids": st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=12),
    "block_size": any_int,
    "lora_id": st.none() | any_int,
    "medium": st.none() | text_st,
    "lora_name": st.none() | text_st,
    "extra_keys": st.none() | st.lists(st.none(), max_size=30),
    "group_idx": st.none() | any_int,
    "kv_cache_spec_kind": st.none() | text_st,
    "kv_cache_spec_sliding_window": st.none() | any_int,
}


@st.composite
def parsed_event(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]))
    if kind == "AllBlocksCleared":
        return {"type": kind}
    names = ["medium", "group_idx"] if kind == "BlockRemoved" else [n for n in PARSED if n != "token_ids"]
    chosen = ["block_hashes", *draw(st.lists(st.sampled_from(names), unique=True))]
    if kind == "BlockStored":
        chosen.append("token_ids")
    order = draw(st.permutations(chosen))  # "type" first, as msgspec writes a tagged Struct
    values = {"block_hashes": hashes_st, **PARSED}
    return {"type": kind, **{name: draw(values[name]) for name in order}}


@st.composite
def parsed_positional(draw: st.DrawFn) -> list[Any]:
    """A positional event of any field count the parser reads itself (SGLang's, older vLLM's)."""
    kind = draw(st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]))
    if kind == "AllBlocksCleared":
        return [kind]
    if kind == "BlockRemoved":
        return [
            kind,
            draw(hashes_st),
            *[draw(st.none() | text_st), draw(st.none() | any_int)][: draw(st.integers(0, 2))],
        ]
    names = list(PARSED)[4:]  # after parent, tokens, size and lora_id, which every version sends
    fields = [draw(hashes_st), *(draw(PARSED[name]) for name in list(PARSED)[:4])]
    return [kind, *fields, *(draw(PARSED[name]) for name in names[: draw(st.integers(0, len(names)))])]


def envelope(events: list[Any], ts: float, rank: Any) -> bytes:
    return msgspec.msgpack.encode([ts, events] if rank == "absent" else [ts, events, rank])


DECLINED = object()


def parsed_alone(compiled: ModuleType, data: bytes) -> Any:
    """The compiled parser's answer with its reference replaced: DECLINED where it declined."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled, "_parse_reference", lambda payload: DECLINED)
        return compiled.parse_batch(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(parsed_event(), max_size=6) | st.lists(parsed_positional(), max_size=6),
    ts=st.floats(allow_nan=False),
    rank=st.sampled_from(["absent", None]) | any_int,
)
def test_what_engines_send_is_parsed_where_it_lies_to_the_reference_batch(
    events: list[Any], ts: float, rank: Any
) -> None:
    compiled = _compiled()
    data = envelope(events, ts, rank)
    theirs, ours = parsed_alone(compiled, data), _batch_py.parse_batch(data)
    assert theirs is not DECLINED
    assert isinstance(ours, Batch)
    assert theirs == ours
    assert (theirs.ts, theirs.dp_rank) == (ours.ts, ours.dp_rank)
    assert field_by_field(theirs.events) == field_by_field(ours.events)
    for mine, reference in zip(theirs.events, ours.events, strict=True):  # token ids kept alike
        assert [type(msgspec.structs.astuple(mine)[n]) for n in range(len(mine.__struct_fields__))] == [
            type(msgspec.structs.astuple(reference)[n]) for n in range(len(reference.__struct_fields__))
        ]


def mangled(data: bytes, where: int, how: int) -> bytes:
    """``data`` cut short, a byte changed, or a byte added, at ``where``."""
    where %= len(data) + 1
    if how == 0:
        return data[:where]
    if how == 1 and where < len(data):
        return data[:where] + bytes([(data[where] + 1 + where) % 256]) + data[where + 1 :]
    return data[:where] + b"\xc0" + data[where:]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    events=st.lists(parsed_event() | map_stored() | map_removed(), max_size=4)
    | st.lists(parsed_positional() | positional_stored() | positional_removed(), max_size=4)
    | st.lists(parsed_event() | parsed_positional(), max_size=4),
    where=st.integers(0, 10_000),
    how=st.integers(0, 3),
)
def test_what_the_parser_declines_decodes_as_the_reference_decodes_it(events: list[Any], where: int, how: int) -> None:
    """Any payload near the parser's shapes (cut, changed, grown; localities, extra_keys with values,
    empty token arrays) gives the same batch or the same error from ``decode_batch`` with either core."""
    compiled = _compiled()
    data = envelope(events, 1.5, 0)
    for candidate in (data, mangled(data, where, how)):
        theirs, ours = decoded(candidate, compiled), decoded(candidate, _batch_py)
        assert theirs == ours
        if isinstance(ours, Batch):
            assert isinstance(theirs, Batch)
            assert field_by_field(theirs.events) == field_by_field(ours.events)


@pytest.mark.parametrize(
    "data",
    [
        envelope([{"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "medium ": 1}], 1.0, 0),
        msgspec.msgpack.encode([1.0, [{"block_hashes": [1], "type": "BlockRemoved"}]]),  # "type" not first
        msgspec.msgpack.encode([1, [{"type": "BlockRemoved", "block_hashes": [1]}]]),  # an int ts
        envelope([{"type": "BlockRemoved", "block_hashes": [1]}], 1.0, 0) + b"\xc0",  # a byte after it
        envelope([{"type": "BlockRemoved", "block_hashes": [1], "locality": "REMOTE"}], 1.0, 0),
        envelope([{"type": "BlockStored", "block_hashes": [1], "token_ids": [1], "extra_keys": [[1]]}], 1.0, 0),
        envelope([{"type": "BlockStored", "block_hashes": [1], "token_ids": []}], 1.0, 0),
        envelope([{"type": "BlockStored", "block_hashes": [1], "token_ids": [2**32]}], 1.0, 0),
        envelope([{"type": "BlockStored", "block_hashes": [1]}], 1.0, 0),  # no token ids
        envelope([{"type": "BlockStored", "block_hashes": [True], "token_ids": [1]}], 1.0, 0),
        envelope([{"type": "BlockRemoved", "block_hashes": [1], "block_size": 1}], 1.0, 0),  # not a removal's
        envelope([{"type": "AllBlocksCleared", "medium": None}], 1.0, 0),
        *(  # a key of a known key's length and first letter, another name (the parser's one comparison)
            envelope([{"type": "BlockStored", "block_hashes": [1], "token_ids": [1], name: None}], 1.0, 0)
            for name in ("token_idz", "lora_namf", "groupxidx", "block_sizf", "extra_keyz", "mediun", "lora_iD")
        ),
        envelope([{"type": "BlockStored", "block_hashes": [1], "token_ids": [1], "kv_cache_spec_kinD": None}], 1.0, 0),
        envelope([{"type": "BlockRemoved", "block_hashes": [1], "block_hashez": [1]}], 1.0, 0),
        envelope([{"type": "BlockRemoved", "block_hashes": [1], "parent_block_hasH": 1}], 1.0, 0),
        envelope([{"type": "BlockRemoved", "block_hashes": [1], "kv_cache_spec_sliding_windoW": 1}], 1.0, 0),
        envelope([["BlockRemoved", [1]], {"type": "BlockRemoved", "block_hashes": [1]}], 1.0, 0),  # mixed
        envelope([["BlockRemoved", [1], None, 1, 2]], 1.0, 0),  # a removal of 4 fields
        envelope([["BlockStored", [1], None, [1], 16]], 1.0, 0),  # a BlockStored of 4
        envelope([["BlockStored", [1], None, [1], 16, None, *[None] * 7]], 1.0, 0),  # of 12
        envelope([["AllBlocksCleared", None]], 1.0, 0),
        b"\x93\xcb" + b"\x00" * 8 + b"\x91\x82\xa4type\xacBlockRemoved\xacblock_hashes\x90\xc0",  # ok: control
    ],
)
def test_the_parser_declines_every_other_shape(data: bytes) -> None:
    compiled = _compiled()
    answer = parsed_alone(compiled, data)
    if data.endswith(b"\x90\xc0"):
        assert isinstance(answer, Batch)
        assert answer == _batch_py.parse_batch(data)
    else:
        assert answer is DECLINED
        assert decoded(data, compiled) == decoded(data, _batch_py)


HASH_EDGES = [0, 1, 2**30 - 1, 2**30, 2**32, 2**60 - 1, 2**60, 2**63, 2**64 - 1]
"""A u64's edges: one, two and three of CPython's 30-bit digits (the parser makes the int with its digits)."""
SIGNED_EDGES = [-1, -32, -33, -(2**31), -(2**31) - 1, -(2**62), -(2**63) + 1, -(2**63)]
"""A signed hash's negative half (SGLang's), at the edges of msgpack's signed formats (an int 64 is
read on its own path)."""


def int_forms(value: int) -> list[bytes]:
    """``value`` in each msgpack int format that holds it, the shortest or not (another encoder's)."""
    unsigned = [(0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)]
    forms = [
        bytes([first]) + value.to_bytes(width, "big") for first, width in unsigned if 0 <= value < 2 ** (8 * width)
    ]
    forms += [
        bytes([first]) + value.to_bytes(width, "big", signed=True)
        for first, width in ((0xD0, 1), (0xD1, 2), (0xD2, 4), (0xD3, 8))
        if -(2 ** (8 * width - 1)) <= value < 2 ** (8 * width - 1) and (value < 0 or width >= 4)
    ]
    if -32 <= value < 0:
        forms.append(bytes([value & 0xFF]))  # a negative fixint
    return forms + ([bytes([value])] if 0 <= value <= 0x7F else [])


def test_hashes_in_every_int_format_make_the_references_ints() -> None:
    """Each u64 edge and each signed one as a block hash and a parent, in every int format (a uint 64
    and an int 64 are read on their own path): the reference's ints; cut inside its bytes, declined."""
    compiled = _compiled()
    for value in HASH_EDGES + SIGNED_EDGES:
        for form in int_forms(value):
            for data in (
                b"\x92\xcb" + b"\x00" * 8 + b"\x91\x92\xacBlockRemoved\x92" + form + form,
                b"\x92\xcb" + b"\x00" * 8 + b"\x91\x96\xabBlockStored\x91\x01" + form + b"\x91\x01\x10\xc0",
            ):
                answer = parsed_alone(compiled, data)
                assert answer == _batch_py.parse_batch(data)
                assert field_by_field(answer.events) == field_by_field(_batch_py.parse_batch(data).events)
                event = answer.events[0]
                assert value == (event.parent_block_hash if type(event) is wire.BlockStored else event.block_hashes[1])
            cut = b"\x92\xcb" + b"\x00" * 8 + b"\x91\x92\xacBlockRemoved\x91" + form[:-1]
            assert parsed_alone(compiled, cut) is DECLINED
            assert decoded(cut, compiled) == decoded(cut, _batch_py)


def test_byte_hashes_in_every_bin_format_make_the_references_bytes() -> None:
    """Bytes hashes of 0, 1, 32 and 255 bytes as a block hash and a parent, in each bin format (a bin
    8, vLLM's raw sha256 hashes, is read on its own path): the reference's bytes; cut inside them or
    their length, declined."""
    compiled = _compiled()
    for n in (0, 1, 32, 255):
        value = bytes(range(n))
        for first, width in ((0xC4, 1), (0xC5, 2), (0xC6, 4)):
            form = bytes([first]) + n.to_bytes(width, "big") + value
            for data in (
                b"\x92\xcb" + b"\x00" * 8 + b"\x91\x92\xacBlockRemoved\x92" + form + form,
                b"\x92\xcb" + b"\x00" * 8 + b"\x91\x96\xabBlockStored\x91\x01" + form + b"\x91\x01\x10\xc0",
            ):
                answer = parsed_alone(compiled, data)
                assert answer == _batch_py.parse_batch(data)
                event = answer.events[0]
                assert value == (event.parent_block_hash if type(event) is wire.BlockStored else event.block_hashes[1])
            for cut_at in (1, len(form) - 1) if n else (1,):
                cut = b"\x92\xcb" + b"\x00" * 8 + b"\x91\x92\xacBlockRemoved\x91" + form[:cut_at]
                assert parsed_alone(compiled, cut) is DECLINED
                assert decoded(cut, compiled) == decoded(cut, _batch_py)


def test_the_structs_made_without_their_constructors_are_what_the_constructors_make() -> None:
    """The events and the batch are made as msgspec's constructor makes them (each slot set, the
    type's reference taken, not tracked), then freed as any: they copy, pickle, compare and print
    alike, and a thousand batches made and freed leave the types' references as they were."""
    compiled = _compiled()
    assert compiled.DIRECT == {"BlockStored": True, "BlockRemoved": True, "AllBlocksCleared": True, "Batch": True}
    data = envelope(
        [
            {
                "type": "BlockStored",
                "block_hashes": [2**64 - 1, 2**40],
                "token_ids": [1, 2],
                "medium": "GPU",
                "group_idx": 1,
            },
            {"type": "BlockRemoved", "block_hashes": [7], "medium": "CPU"},
            {"type": "AllBlocksCleared"},
        ],
        2.5,
        3,
    )
    batch = parsed_alone(compiled, data)
    reference = _batch_py.parse_batch(data)
    for made, called in zip([batch, *batch.events], [reference, *reference.events], strict=True):
        assert type(made) is type(called) and not gc.is_tracked(made)
        assert made == called and repr(made) == repr(called)
        assert copy.copy(made) == called and pickle.loads(pickle.dumps(made)) == called
        assert msgspec.structs.replace(made) == called and msgspec.structs.asdict(made) == msgspec.structs.asdict(
            called
        )
    assert batch.events[2].extra is not parsed_alone(compiled, data).events[2].extra  # a dict of its own each
    batch.events[0].medium = "DISK"  # and a field set as on any
    assert batch.events[0].medium == "DISK"
    types = (wire.BlockStored, wire.BlockRemoved, wire.AllBlocksCleared, wire.Batch)
    before = [sys.getrefcount(cls) for cls in types]
    for _ in range(1000):
        parsed_alone(compiled, data)
    assert [sys.getrefcount(cls) for cls in types] == before


class _Counted(msgspec.Struct, gc=False):
    """BlockStored's fields and a __post_init__: only the constructor may make it."""

    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: Any
    block_size: int
    lora_id: Any = None
    medium: Any = None
    lora_name: Any = None
    extra: dict[str, Any] = {}
    type: str = "BlockStored"

    def __post_init__(self) -> None:
        _made.append(self)


_made: list[Any] = []
_Tracked = msgspec.defstruct("_Tracked", [("extra", dict), ("type", str, "AllBlocksCleared")], gc=True)
_Hashed = msgspec.defstruct(
    "_Hashed", [("extra", dict), ("type", str, "AllBlocksCleared")], gc=False, frozen=True, cache_hash=True
)
_Listed = msgspec.defstruct(
    "_Listed", [("extra", dict), ("kinds", list, msgspec.field(default_factory=list))], gc=False
)
_Reordered = msgspec.defstruct("_Reordered", [("medium", Any), ("block_hashes", list), ("extra", dict)], gc=False)


@pytest.mark.parametrize(
    ("role", "cls"),
    [("stored", _Counted), ("cleared", _Tracked), ("cleared", _Hashed), ("cleared", _Listed), ("removed", _Reordered)],
)
def test_a_struct_whose_constructor_does_more_is_made_by_it(role: str, cls: type) -> None:
    """A class with a __post_init__, tracked by the collector, with a cached hash, a further field of
    a made default, or its fields in another order is made by calling it, as before."""
    compiled = _compiled()
    given = {"stored": wire.BlockStored, "removed": wire.BlockRemoved, "cleared": wire.AllBlocksCleared, role: cls}
    events = [
        {"type": "BlockStored", "block_hashes": [2**63], "token_ids": [1]},
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    ]
    _made.clear()
    try:
        compiled.install(stored=given["stored"], removed=given["removed"], cleared=given["cleared"], batch=wire.Batch,
                         fast_decoders=None, refused=(), events_of=None)  # fmt: skip
        assert compiled.DIRECT[cls.__name__] is False
        assert compiled.DIRECT["Batch"] is True
        made = [event for event in parsed_alone(compiled, envelope(events, 1.0, 0)).events if type(event) is cls]
    finally:
        wire._batch_core()  # wire's own types again
    assert compiled.DIRECT == {"BlockStored": True, "BlockRemoved": True, "AllBlocksCleared": True, "Batch": True}
    assert len(made) == 1
    if cls is _Counted:
        assert _made == made  # its __post_init__ ran
    elif cls is _Tracked:
        assert gc.is_tracked(made[0]) is gc.is_tracked(_Tracked(extra={}))
    elif cls is _Listed:
        assert made[0].kinds == []  # type: ignore[attr-defined]
    elif cls is _Reordered:
        assert made[0].medium == [1] and made[0].block_hashes == "GPU"  # type: ignore[attr-defined]  # by position, as called


def test_a_key_or_tag_one_byte_off_a_known_one_is_declined() -> None:
    """Each known key, and each event type's tag, with any one of its bytes changed: declined (the
    parser compares them word by word, the middle words of the longest too)."""
    compiled = _compiled()
    known = {"type": "BlockStored", "block_hashes": [1], "token_ids": [1]}
    for name in wire.STORED_FIELDS:
        for place in range(len(name)):
            other = name[:place] + chr(ord(name[place]) ^ 0x01) + name[place + 1 :]
            assert parsed_alone(compiled, envelope([{**known, other: None}], 1.0, 0)) is DECLINED
        control = {**known, name: {"block_hashes": [1], "token_ids": [1], "block_size": 16}.get(name)}
        assert parsed_alone(compiled, envelope([control], 1.0, 0)) is not DECLINED
    for tag in (wire.STORED, wire.REMOVED, wire.CLEARED):
        for place in range(len(tag)):
            other = tag[:place] + chr(ord(tag[place]) ^ 0x01) + tag[place + 1 :]
            assert parsed_alone(compiled, envelope([[other, [1]]], 1.0, 0)) is DECLINED


def test_each_extra_is_the_references_whatever_the_events_before_it() -> None:
    """An event's ``extra`` is copied from the first one of its keys the parser made, its values set
    again where they are not the same objects: events of the same keys and other values (another
    group, kind or window, an int too large to be shared, extra_keys or none) parse to the
    reference's items in order, each its own dict of the reference's size, tracked by the collector
    as the reference's; a parsed extra changed by its reader changes no later one. From bytes and
    from any buffer alike."""
    compiled = _compiled()
    keys = ("extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
    values = [
        ([None, None], 0, "full_attention", None),
        ([None], 1, "sliding_window", 4096),
        (None, 0, "full_attention", 2**40),
        ([], 2**40, "full_attention", 2**40),
        ([None], 0, "sliding_window", None),
        ([None], 0, "k" * 65, None),  # a kind too long to be kept
    ]
    events = [
        {"type": "BlockStored", "block_hashes": [n], "token_ids": [n], **dict(zip(keys, row, strict=True))}
        for n, row in enumerate(values)
    ] + [{"type": "BlockRemoved", "block_hashes": [n], "group_idx": group} for n, group in enumerate((0, 3, 2**40))]
    for round_ in range(2):
        data = envelope(events[round_:] + events[:round_], 1.0, 0)  # another first event each round
        reference = _batch_py.parse_batch(data)
        for payload in (data, memoryview(data), bytearray(data)):
            batch = parsed_alone(compiled, payload)
            assert field_by_field(batch.events) == field_by_field(reference.events)
            extras = [event.extra for event in batch.events]
            assert len({id(extra) for extra in extras}) == len(extras)
            assert [gc.is_tracked(extra) for extra in extras] == [gc.is_tracked(e.extra) for e in reference.events]
            assert [sys.getsizeof(extra) for extra in extras] == [sys.getsizeof(e.extra) for e in reference.events]
            for extra in extras:
                extra["group_idx"] = "changed"
                extra["added"] = True
        assert field_by_field(parsed_alone(compiled, data).events) == field_by_field(reference.events)
