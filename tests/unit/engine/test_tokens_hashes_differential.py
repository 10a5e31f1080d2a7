"""Block hashes kept as the wire sent them (kvgateway/engine/_tokens_c.pyx's ``Hashes``) against the
reference's lists (:mod:`kvgateway.engine._tokens_py`): for every msgpack array an engine may send
as ``block_hashes`` (ints of every format at every edge, bins of every length and format, arrays of
every header, cut, padded and miscounted) the compiled core's answer is the reference's list, and a
``Hashes`` exactly where every hash is of one form (all uint 64; uint 64 and int 64 with some
negative and none of 2**63 or more; all 32-byte bin 8); the field that reads it as its list
(equality, ``repr``, pickling, copies, assignment, what encodes events); and the renderer's bytes
for every form, against the reference's for the lists. (The index, the attribution, the learner
and the analytics read packed hashes in their own differential tests: tests/support/cores.py's
``packed``.)

Skipped where the compiled core was not built (or ``KVGATEWAY_NO_EXTENSIONS`` is set)."""

from __future__ import annotations

import copy
import pickle
import struct
from types import ModuleType
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgateway.engine import _tokens_py, wire
from kvgateway.engine.wire import BlockRemoved, BlockStored
from kvgateway.protocol import _render_py
from tests.support.cores import compiled_tokens, compiled_twin, packed, slot
from tests.support.msgpack_forms import array_head, int_forms, wide_array
from tests.support.payloads import U64


def _compiled() -> ModuleType:
    return compiled_tokens()


def _slot(event: Any) -> Any:
    """What the event's ``block_hashes`` slot holds, not read through the field."""
    return slot(event, "block_hashes")


# --- one array -------------------------------------------------------------------------------------

INT_EDGES = [0, 1, 127, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, U64 - 1, U64, -1, -(2**31), -(2**62), -(2**63)]


@st.composite
def hash_cell(draw: st.DrawFn) -> tuple[bytes, Any]:
    """(one hash as msgpack, in a format that can hold it, mostly the engines' wide ones; the value)."""
    kind = draw(st.sampled_from(["int"] * 6 + ["bin"] * 3 + ["other"]))
    if kind == "int":
        value = draw(st.sampled_from(INT_EDGES) | st.integers(-(2**63), U64))
        forms = int_forms(value)
        wide = [form for form in forms if form[0] in (0xCF, 0xD3)]
        return draw(st.sampled_from(wide * 4 + forms)), value
    if kind == "bin":
        value = draw(st.binary(min_size=32, max_size=32) | st.binary(max_size=40))
        forms = [b"\xc4" + bytes([len(value)]) + value] * 4 + [b"\xc5" + struct.pack(">H", len(value)) + value]
        return draw(st.sampled_from(forms)), value
    value = draw(st.sampled_from([None, True, 1.5, "7", [1]]))
    return msgspec.msgpack.encode(value), value


@st.composite
def hash_array(draw: st.DrawFn) -> tuple[bytes, list[tuple[bytes, Any]], bool]:
    """(a msgpack array for ``block_hashes``, its cells, whether it is whole): now and then a count
    that is wrong, bytes left over, or a cut."""
    cells = draw(st.lists(hash_cell(), max_size=8))
    head = draw(st.sampled_from(["fix"] * 4 + ["16", "32"]))
    shape = draw(st.sampled_from(["ok"] * 6 + ["count+1", "count-1", "tail", "cut"]))
    count = len(cells) + (shape == "count+1") - (shape == "count-1" and bool(cells))
    data = array_head(count, head) + b"".join(cell for cell, _ in cells)
    if shape == "tail":
        data += b"\x01"
    elif shape == "cut" and len(data) > 1:
        data = data[: draw(st.integers(1, len(data) - 1))]
    return data, cells, shape == "ok"


def packs(cells: list[tuple[bytes, Any]]) -> bool:
    """Whether the parser keeps these hashes as a Hashes: some, all of one form."""
    if not cells:
        return False
    if all(cell[:2] == b"\xc4\x20" for cell, _ in cells):
        return True
    if not all(cell[0] in (0xCF, 0xD3) for cell, _ in cells):
        return False
    values = [value for _, value in cells]
    return not (any(v < 0 for v in values) and any(v >= 2**63 for v in values))


def assert_same_hashes(compiled: ModuleType, data: bytes) -> Any:
    """Both cores' answer for ``data``: the same list (returned as the compiled core holds it), or
    the same error (None)."""
    try:
        ours = _tokens_py.block_hashes(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        with pytest.raises(type(exc)):
            compiled.block_hashes(data)
        return None
    theirs = compiled.block_hashes(data)
    listed = theirs.tolist() if type(theirs) is compiled.Hashes else theirs
    assert listed == ours and [type(h) for h in listed] == [type(h) for h in ours]
    return theirs


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(array=hash_array())
def test_every_hash_array_gives_the_references_answer(array: tuple[bytes, list[tuple[bytes, Any]], bool]) -> None:
    compiled = _compiled()
    data, cells, whole = array
    theirs = assert_same_hashes(compiled, data)
    assert (type(theirs) is compiled.Hashes) == (whole and packs(cells))


def test_each_form_at_its_edges() -> None:
    compiled = _compiled()
    u64 = [b"\xcf" + struct.pack(">Q", v) for v in (0, 1, 2**63 - 1, 2**63, U64)]
    i64 = [b"\xd3" + struct.pack(">q", v) for v in (-(2**63), -1, 0, 2**63 - 1)]
    blob = b"\xc4\x20" + bytes(range(32))
    for cells, kept in (
        (u64, True),
        (i64, True),
        ([u64[2], *i64], True),  # a uint 64 below 2**63 beside negatives: one int64 array
        ([i64[2], i64[3]], True),  # int 64s, none negative: their values
        ([u64[3], i64[1]], False),  # 2**63 and -1: no one form holds both
        ([u64[0], b"\x05"], False),  # a fixint among them
        ([blob] * 3, True),
        ([blob, b"\xc4\x1f" + bytes(31)], False),  # 31 bytes
        ([b"\xc5\x00\x20" + bytes(32)], False),  # a bin 16 of 32
        ([blob, u64[0]], False),  # two forms
    ):
        for head in ("fix", "16", "32"):
            theirs = assert_same_hashes(compiled, array_head(len(cells), head) + b"".join(cells))
            assert (type(theirs) is compiled.Hashes) is kept
    assert assert_same_hashes(compiled, b"\x90") == []
    assert assert_same_hashes(compiled, b"\x91" + u64[0] + b"\x00") is None  # left over: refused
    assert assert_same_hashes(compiled, b"\x92" + u64[0]) is None  # cut
    assert assert_same_hashes(compiled, b"") is None


# --- the field -------------------------------------------------------------------------------------

U64S = [2**63 + 5, 2**40, 7, U64]
SIGNED = [-(2**63), -5, 2**40, 0]
BLOBS = [bytes(range(32)), b"\xff" * 32]


def decoded(hashes: list[Any], positional: bool, removed: bool) -> Any:
    """A block event of ``hashes`` decoded by the compiled parser from an engine's wide formats,
    its hashes not read yet."""
    wide = wide_array(hashes)
    assert wide is not None, hashes
    raw = msgspec.Raw(wide)
    if removed:
        event: Any = (
            ["BlockRemoved", raw, "GPU"]
            if positional
            else {"type": "BlockRemoved", "block_hashes": raw, "medium": "GPU"}
        )
    elif positional:
        event = ["BlockStored", raw, None, [1] * (2 * len(hashes)), 2, None, "GPU"]
    else:
        event = {"type": "BlockStored", "block_hashes": raw, "token_ids": [1] * (2 * len(hashes)), "block_size": 2,
                 "medium": "GPU"}  # fmt: skip
    return wire.decode_batch(msgspec.msgpack.encode([1.0, [event]])).events[0]


@pytest.mark.parametrize("hashes", [U64S, SIGNED, BLOBS], ids=["u64", "i64", "bytes"])
@pytest.mark.parametrize("positional", [False, True], ids=["map", "positional"])
@pytest.mark.parametrize("removed", [False, True], ids=["stored", "removed"])
def test_the_compiled_core_keeps_the_hashes_until_read_then_the_list_in_their_place(
    hashes: list[Any], positional: bool, removed: bool
) -> None:
    compiled = _compiled()
    event = decoded(hashes, positional, removed)
    assert type(event) is (BlockRemoved if removed else BlockStored)
    held = _slot(event)
    assert type(held) is compiled.Hashes and len(held) == len(hashes)
    assert list(held) == hashes and held[1] == hashes[1] and held[-1] == hashes[-1] and held.tolist() == hashes
    listed = event.block_hashes
    assert type(listed) is list and listed == hashes and [type(h) for h in listed] == [type(h) for h in hashes]
    assert _slot(event) is listed and event.block_hashes is listed  # made once
    event.block_hashes = [1]
    assert event.block_hashes == [1] and _slot(event) == [1]


def test_an_event_holding_hashes_compares_prints_pickles_and_copies_as_with_the_list() -> None:
    compiled = _compiled()
    constructed = BlockRemoved(list(SIGNED), "GPU")
    assert decoded(SIGNED, True, True) == constructed and constructed == decoded(SIGNED, True, True)
    assert decoded(SIGNED, True, True) == decoded(SIGNED, False, True)
    assert (decoded(SIGNED, True, True) != constructed) is False
    assert decoded(SIGNED, True, True) != BlockRemoved([*SIGNED[:-1], 1], "GPU")
    assert repr(decoded(SIGNED, True, True)) == repr(constructed)
    for copied in (pickle.loads(pickle.dumps(decoded(SIGNED, True, True))), copy.deepcopy(decoded(SIGNED, True, True))):
        assert copied == constructed and type(_slot(copied)) is list
    shallow = copy.copy(decoded(SIGNED, True, True))
    assert type(_slot(shallow)) is compiled.Hashes and shallow == constructed
    assert msgspec.structs.replace(decoded(SIGNED, True, True), medium="GPU") == constructed
    # one form's hashes equal the same values held in another form, and a list of them
    unsigned, signed = _slot(decoded([0, 2**40], True, True)), _slot(decoded([0, 2**40, -1], True, True))
    assert unsigned == [0, 2**40] and unsigned != signed and signed[:2] == unsigned.tolist()
    assert unsigned == _slot(decoded([0, 2**40], False, False))
    with pytest.raises(TypeError):
        hash(_slot(decoded(U64S, True, True)))  # unhashable, as the list


def test_what_encodes_events_reads_the_list() -> None:
    """The cluster's records re-encode events through their fields; the reference renderer writes
    them; an event encoded whole must have been read first."""
    _compiled()
    from kvgateway.cluster import records

    op = records._op(decoded(BLOBS, False, True))
    assert op is not None and op.hashes == BLOBS
    assert _render_py.render_event(decoded(SIGNED, True, False))["block_hashes"] == [str(h) for h in SIGNED]
    event = decoded(U64S, True, True)
    with pytest.raises(TypeError):
        msgspec.msgpack.encode(event)  # msgspec has no hook for the kept hashes (nothing does it)
    assert event.block_hashes == U64S
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(event), type=BlockRemoved) == event


# --- the renderer ----------------------------------------------------------------------------------

wide_hash = st.sampled_from(INT_EDGES + BLOBS) | st.integers(-(2**63), U64) | st.binary(min_size=32, max_size=32)


@st.composite
def block_event(draw: st.DrawFn) -> Any:
    hashes = draw(st.lists(st.integers(-(2**63), U64) | st.sampled_from(INT_EDGES), max_size=5))
    if draw(st.booleans()):
        hashes = draw(st.lists(st.binary(min_size=32, max_size=32), max_size=3))
    elif draw(st.booleans()):
        hashes = draw(st.lists(wide_hash, max_size=5))
    medium = draw(st.sampled_from([None, "GPU", "cpu"]))
    if draw(st.booleans()):
        return BlockRemoved(hashes, medium)
    parent = draw(st.none() | wide_hash)
    return BlockStored(hashes, parent, [3] * (2 * len(hashes)), 2, None, medium, None, {})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(block_event(), max_size=5))
def test_the_renderer_writes_kept_hashes_as_the_reference_writes_their_lists(events: list[Any]) -> None:
    _compiled()
    render = compiled_twin("kvgateway.protocol._render_c")
    kept = packed(events)
    theirs, their_keys = render.events_json(kept)
    ours, our_keys = _render_py.events_json(events)
    assert theirs.body == ours.body and list(theirs.ends) == list(ours.ends) and their_keys == our_keys


def test_packed_keeps_each_form_for_the_compiled_side() -> None:
    """The differential tests' helper hands the compiled side Hashes of every form (or the list)."""
    compiled = _compiled()
    events = [
        BlockRemoved(list(U64S)),
        BlockRemoved(list(SIGNED)),
        BlockRemoved(list(BLOBS)),
        BlockRemoved([2**63, -1]),
    ]
    kept = [_slot(event) for event in packed(events)]
    assert [type(k) for k in kept] == [compiled.Hashes] * 3 + [list]
    assert kept == [U64S, SIGNED, BLOBS, [2**63, -1]] and [_slot(e) for e in events] == kept
