"""The token ids' compiled core (kvgateway/engine/_tokens_c.pyx) against the reference
(:mod:`kvgateway.engine._tokens_py`): the same answer for every msgpack array an engine may send
as ``token_ids`` (ints of every msgpack format and at every edge: 0, 2**32, 2**63, 2**64-1,
negative; empty arrays; arrays of other values; truncated, padded and garbled bytes), the same
batches and the same errors from :func:`kvgateway.engine.wire.decode_batch` with either core, for
both envelopes (array and map) and both event layouts (map and positional); and the field that
reads the compiled core's compact array as its list (equality, ``repr``, pickling, copies,
assignment, the cluster's records).

Skipped where the compiled core was not built (or ``KVGATEWAY_NO_EXTENSIONS`` is set); hypothesis
shrinks any difference to a minimal array."""

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

from kvgateway.config.options import NO_EXTENSIONS_ENV
from kvgateway.engine import _tokens_py, wire
from kvgateway.engine.wire import Batch, BlockStored, DecodeError
from kvgateway.runtime import extensions
from tests.support.cores import compiled_tokens, slot
from tests.support.msgpack_forms import array_head, int_forms
from tests.support.payloads import U64


def _compiled() -> ModuleType:
    return compiled_tokens()


def _slot(event: BlockStored) -> Any:
    """What the event's ``token_ids`` slot holds, not read through the field."""
    return slot(event, "token_ids")


# --- msgpack ints in every format, and arrays of them ------------------------------------------------

EDGES = [0, 1, 127, 128, 255, 256, 2**16 - 1, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, U64]
EDGES += [-1, -32, -33, -128, -129, -(2**31), -(2**63)]


@st.composite
def packed_int(draw: st.DrawFn) -> tuple[bytes, int]:
    """(an int in one of the msgpack formats that can hold it, the int)."""
    value = draw(st.integers(0, 200_000) | st.integers(-(2**63), U64) | st.sampled_from(EDGES))
    forms = int_forms(value)
    if 0 <= value <= 0x7F or -32 <= value < 0:
        forms.append(struct.pack(">b", value))  # positive or negative fixint
    return draw(st.sampled_from(forms)), value


OTHER_VALUES = [None, True, False, 1.5, "7", b"7", [1], {"a": 1}, msgspec.msgpack.Ext(1, b"x")]


@st.composite
def token_array(draw: st.DrawFn) -> bytes:
    """A msgpack array for ``token_ids``: mostly ints in any format, now and then another value, a
    count that is wrong, bytes left over, or a cut."""
    items = draw(st.lists(packed_int() | st.sampled_from(OTHER_VALUES).map(lambda v: (msgspec.msgpack.encode(v), v)),
                          max_size=20))  # fmt: skip
    count = len(items)
    shape = draw(st.sampled_from(["ok"] * 6 + ["count+1", "count-1", "tail", "cut"]))
    if shape == "count+1":
        count += 1
    elif shape == "count-1" and count:
        count -= 1
    data = array_head(count, draw(st.sampled_from(["fix", "16", "32"]))) + b"".join(b for b, _ in items)
    if shape == "tail":
        data += b"\x01"
    elif shape == "cut" and len(data) > 1:
        data = data[: draw(st.integers(1, len(data) - 1))]
    return data


def as_list(value: Any) -> Any:
    return value.tolist() if type(value).__name__ == "Tokens" else value


def assert_same_tokens(compiled: ModuleType, data: bytes) -> Any:
    """Both cores' answer for ``data``: the same list of ints (returned as the compiled core holds
    it), or both refuse it (None)."""
    try:
        ours = _tokens_py.token_ids(msgspec.Raw(data))
    except _tokens_py.NotTokens:
        with pytest.raises(_tokens_py.NotTokens):
            compiled.token_ids(msgspec.Raw(data))
        return None
    theirs = compiled.token_ids(msgspec.Raw(data))
    assert type(as_list(theirs)) is list and as_list(theirs) == ours
    assert all(type(v) is int for v in as_list(theirs))
    # the compact array exactly where every id fits 32 bits, and never for an empty list
    assert (type(theirs) is compiled.Tokens) == (bool(ours) and all(0 <= v < 2**32 for v in ours))
    return theirs


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=token_array() | st.binary(max_size=12))
def test_every_token_array_gives_the_references_answer(data: bytes) -> None:
    assert_same_tokens(_compiled(), data)


def test_the_edges_of_each_int_format() -> None:
    compiled = _compiled()
    for value in EDGES:
        for cell in int_forms(value):
            for data in (b"\x91" + cell, b"\x92\x05" + cell, b"\x92" + cell + b"\x05", b"\x91" + cell[:-1]):
                assert_same_tokens(compiled, data)
    assert type(assert_same_tokens(compiled, b"\x93\x00\xce\xff\xff\xff\xff\xcd\x01\x00")) is compiled.Tokens
    assert assert_same_tokens(compiled, b"\x90") == []
    assert assert_same_tokens(compiled, b"\xdc\x00\x00") == []
    assert assert_same_tokens(compiled, b"\xc0") is None  # null: the general path reads it as []
    assert assert_same_tokens(compiled, b"") is None
    assert compiled.NotTokens is _tokens_py.NotTokens  # one vocabulary


# --- decode_batch with either core ------------------------------------------------------------------


def test_ids_read_four_at_a_time_stop_at_any_place() -> None:
    """Runs of ids in the formats read four at a time (uint 32, uint 16, a fixint, uint 8) of every
    length to 15, as they are, with an id of another format (or none at all) at each place, and cut
    at each byte: the reference's answer."""
    compiled = _compiled()
    cells = [b"\xce\x00\x02\x4f\x5b", b"\xcd\x01\x00", b"\x05", b"\xcc\x80", b"\xce\xff\xff\xff\xff"]
    others = [
        b"\xd2\x00\x00\x00\x07",
        b"\xcf" + bytes(7) + b"\x09",
        b"\xcf\x00\x00\x00\x01" + bytes(4),
        b"\xc0",
        b"\xd0\xff",
    ]
    for count in range(1, 16):
        run = [cells[(k * 3 + count) % len(cells)] for k in range(count)]
        data = array_head(count, "fix") + b"".join(run)
        assert type(assert_same_tokens(compiled, data)) is compiled.Tokens
        for cut in range(1, len(data)):
            assert assert_same_tokens(compiled, data[:cut]) is None
        for place in range(count):
            for other in others:
                assert_same_tokens(
                    compiled, array_head(count, "fix") + b"".join([*run[:place], other, *run[place + 1 :]])
                )


def _stored(tokens: bytes, positional: bool) -> Any:
    if positional:
        return ["BlockStored", [1, 2], None, msgspec.Raw(tokens), 2, None, "GPU"]
    return {"type": "BlockStored", "block_hashes": [1, 2], "token_ids": msgspec.Raw(tokens), "block_size": 2}


def decoded(payload: bytes, core: Any) -> Batch | str:
    """The batch ``decode_batch`` gives with ``core``'s token ids, or its error's text."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wire, "_token_ids", core.token_ids)
        try:
            return wire.decode_batch(payload)
        except DecodeError as exc:
            return str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrays=st.lists(token_array(), min_size=1, max_size=3),
    positional=st.booleans(),
    envelope=st.sampled_from(["array", "map"]),
    removed=st.booleans(),
)
def test_decode_batch_gives_the_same_batch_or_error_with_either_core(
    arrays: list[bytes], positional: bool, envelope: str, removed: bool
) -> None:
    compiled = _compiled()
    events = [_stored(data, positional) for data in arrays]
    if removed:
        events.insert(1, ["BlockRemoved", [3]] if positional else {"type": "BlockRemoved", "block_hashes": [3]})
    body: Any = [1.5, events, 0] if envelope == "array" else {"ts": 1.5, "events": events, "data_parallel_rank": 0}
    payload = msgspec.msgpack.encode(body)
    theirs = decoded(payload, compiled)
    ours = decoded(payload, _tokens_py)
    if isinstance(ours, str):
        assert theirs == ours
        return
    assert isinstance(theirs, Batch)
    assert theirs == ours and ours == theirs  # before either is read as a list, then after
    assert [as_list(getattr(e, "token_ids", None)) for e in theirs.events] == [
        getattr(e, "token_ids", None) for e in ours.events
    ]
    assert theirs == ours


# --- the field -------------------------------------------------------------------------------------

TOKENS = [5, 0, 127, 128, 70_000, 2**32 - 1, 151_643, 9]


def fresh() -> BlockStored:
    """A map BlockStored decoded by the compiled core, its ids not read yet."""
    payload = msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [7, 8], "token_ids": TOKENS,
                                             "block_size": 4, "medium": "GPU"}]])  # fmt: skip
    event = wire.decode_batch(payload).events[0]
    assert type(event) is BlockStored
    return event


def test_the_compiled_core_keeps_the_ids_until_read_then_the_list_in_their_place() -> None:
    compiled = _compiled()
    event = fresh()
    assert type(_slot(event)) is compiled.Tokens and len(_slot(event)) == len(TOKENS)
    tokens = event.token_ids
    assert type(tokens) is list and tokens == TOKENS and all(type(t) is int for t in tokens)
    assert _slot(event) is tokens and event.token_ids is tokens  # made once
    event.token_ids = [1]
    assert event.token_ids == [1] and _slot(event) == [1]
    positional = wire.decode_batch(msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, TOKENS, 8, None]]]))
    assert type(_slot(positional.events[0])) is compiled.Tokens
    assert positional.events[0].token_ids == TOKENS


def test_an_event_holding_the_ids_compares_prints_pickles_and_copies_as_with_the_list() -> None:
    compiled = _compiled()
    constructed = BlockStored([7, 8], None, list(TOKENS), 4, None, "GPU", None, {})
    assert fresh() == constructed and constructed == fresh() and fresh() == fresh()
    assert (fresh() != constructed) is False and fresh() != BlockStored(
        [7, 8], None, [*TOKENS[:-1], 10], 4, medium="GPU"
    )
    assert repr(fresh()) == repr(constructed)
    for copied in (pickle.loads(pickle.dumps(fresh())), copy.deepcopy(fresh())):
        assert copied == constructed and type(_slot(copied)) is list
    shallow = copy.copy(fresh())
    assert type(_slot(shallow)) is compiled.Tokens and shallow == constructed
    assert shallow.token_ids == TOKENS
    assert msgspec.structs.replace(fresh(), block_size=4) == constructed
    with pytest.raises(TypeError):
        hash(_slot(fresh()))  # unhashable, as the list


def test_what_encodes_events_reads_the_list() -> None:
    """The cluster's records re-encode events through their fields; the renderer writes them; an
    event encoded whole must have been read first."""
    _compiled()
    from kvgateway.cluster import records
    from kvgateway.protocol import _render_py

    event = fresh()
    op = records._op(event)
    assert op is not None and op.tokens == TOKENS
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(op), type=records._Op).tokens == TOKENS
    assert _render_py.render_event(fresh())["token_ids"] == TOKENS
    # an event encoded whole while its ids are kept: msgspec has no hook for them (nothing does it)
    event = fresh()
    with pytest.raises(TypeError):
        msgspec.msgpack.encode(event)
    assert event.token_ids == TOKENS  # read once: the list, which encodes
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(event), type=BlockStored) == event


def test_the_field_refuses_what_is_not_its_owners() -> None:
    compiled = _compiled()
    field = BlockStored.__dict__["token_ids"]
    assert type(field) is compiled.Field and BlockStored.token_ids is field
    with pytest.raises(TypeError):
        field.__get__(wire.BlockRemoved([1]), wire.BlockRemoved)
    with pytest.raises(TypeError):
        compiled.Field(BlockStored, property(lambda self: None))
    compiled.install(BlockStored)  # again: left as it is
    assert BlockStored.__dict__["token_ids"] is field


def test_the_core_is_the_one_the_package_reports() -> None:
    """wire.py decides below the runtime package, by the same setting."""
    assert NO_EXTENSIONS_ENV == "KVGATEWAY_NO_EXTENSIONS"
    chosen = extensions.load("kvgateway.engine._tokens_c")
    assert wire._tokens is (chosen if chosen is not None else _tokens_py)
    if chosen is None:
        assert type(BlockStored.__dict__["token_ids"]).__name__ == "member_descriptor"
