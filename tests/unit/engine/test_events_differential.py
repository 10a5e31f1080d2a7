"""The fast-decoded events made public in C (kvgateway/engine/_events_c.pyx) against the reference
(:mod:`kvgateway.engine._events_py`): the same events, field for field, with ``extra`` in
the same order, for map events with any subset of their keys (every further field, the locality
that renames a remote block's medium, None where a value may be None) and positional events of
every field count vLLM and SGLang have sent, in both envelopes and mixed with removals and clears;
the same batches from ``decode_batch`` with either; and an event the compiled code cannot read
handed to the reference, with the reference's error.

Skipped where the compiled core was not built (or ``KVGATEWAY_NO_EXTENSIONS`` is set)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgateway.engine import _batch_py, _events_py, wire
from kvgateway.engine.wire import Batch, Event
from tests.support.payloads import U64


def _compiled() -> ModuleType:
    try:
        module = importlib.import_module("kvgateway.engine._events_c")
    except ImportError:
        pytest.skip("the compiled core is not built here (no C compiler at install)")
    if wire._events_of is not module.events_of:
        pytest.skip("the pure-Python core is forced (KVGATEWAY_NO_EXTENSIONS)")
    return module


hash_st = st.integers(0, 40) | st.integers(2**63, U64) | st.integers(-(2**63), -1) | st.binary(min_size=32, max_size=32)
hashes_st = st.lists(hash_st, min_size=0, max_size=4)
tokens_st = st.lists(st.integers(0, 2**32 - 1) | st.sampled_from([0, 151_643, 2**32 - 1]), max_size=12)
medium_st = st.sampled_from([None, "GPU", "CPU", "cpu_tier", "DISK", "LMCACHE"])
maybe_int = st.none() | st.integers(0, 3)
FURTHER: dict[str, st.SearchStrategy[Any]] = {
    "extra_keys": st.none() | st.lists(st.none() | st.integers(-3, 3) | st.text(max_size=3), max_size=3),
    "group_idx": maybe_int,
    "kv_cache_spec_kind": st.none() | st.sampled_from(["full_attention", "sliding_window", "mamba"]),
    "kv_cache_spec_sliding_window": maybe_int,
}
LOCALITY = st.none() | st.sampled_from(["local", "LOCAL", "remote", "REMOTE", "Remote", "elsewhere"])


@st.composite
def map_stored(draw: st.DrawFn) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "BlockStored", "block_hashes": draw(hashes_st)}
    optional: dict[str, st.SearchStrategy[Any]] = {
        "parent_block_hash": st.none() | hash_st,
        "token_ids": tokens_st,
        "block_size": st.integers(0, 64),
        "lora_id": maybe_int,
        "medium": medium_st,
        "lora_name": st.none() | st.sampled_from(["lora-a", ""]),
        **FURTHER,
        "locality": LOCALITY,
    }
    for name in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):  # any subset, in any order
        event[name] = draw(optional[name])
    return event


@st.composite
def map_removed(draw: st.DrawFn) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": draw(hashes_st)}
    optional = {"medium": medium_st, "group_idx": maybe_int, "locality": LOCALITY}
    for name in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):
        event[name] = draw(optional[name])
    return event


@st.composite
def positional_stored(draw: st.DrawFn) -> list[Any]:
    fields = [draw(hashes_st), draw(st.none() | hash_st), draw(tokens_st), draw(st.integers(0, 64)), draw(maybe_int)]
    further = [medium_st, st.none() | st.sampled_from(["lora-a"]), *FURTHER.values()]
    count = draw(st.integers(0, len(further)))  # 5 to 11 fields: every engine's version
    return ["BlockStored", *fields, *(draw(strategy) for strategy in further[:count])]


@st.composite
def positional_removed(draw: st.DrawFn) -> list[Any]:
    further = [draw(medium_st), draw(maybe_int)][: draw(st.integers(0, 2))]
    return ["BlockRemoved", draw(hashes_st), *further]


map_events = st.lists(map_stored() | map_removed() | st.just({"type": "AllBlocksCleared"}), max_size=6)
positional_events = st.lists(positional_stored() | positional_removed() | st.just(["AllBlocksCleared"]), max_size=6)


def payload(events: list[Any], envelope: str) -> bytes:
    body: Any = [2.5, events, 1] if envelope == "array" else {"ts": 2.5, "events": events, "data_parallel_rank": 1}
    return msgspec.msgpack.encode(body)


def fast_batch(data: bytes, envelope: str, positional: bool) -> Any:
    """What the fast decoder ``decode_batch`` takes for this payload gives."""
    if envelope == "map":
        return wire._fast_map_batch_decoder.decode(data)
    return (wire._fast_array_batch_decoder if positional else wire._fast_batch_decoder).decode(data)


def field_by_field(events: list[Event]) -> list[tuple[Any, ...]]:
    """Each event's type and fields, ``extra`` as its items in order, token ids read as the list."""
    out = []
    for event in events:
        fields = tuple(
            list(event.extra.items()) if name == "extra" else getattr(event, name)  # type: ignore[union-attr]
            for name in event.__struct_fields__
        )
        out.append((type(event), *fields))
    return out


def assert_alike(compiled: ModuleType, fast: Any) -> None:
    theirs = compiled.events_of(fast)
    ours = _events_py.events_of(fast)
    assert theirs == ours
    assert field_by_field(theirs) == field_by_field(ours)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=map_events, envelope=st.sampled_from(["array", "map"]))
def test_map_events_with_any_of_their_keys_become_the_same_public_events(events: list[Any], envelope: str) -> None:
    compiled = _compiled()
    assert_alike(compiled, fast_batch(payload(events, envelope), envelope, positional=False))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=positional_events)
def test_positional_events_of_every_field_count_become_the_same_public_events(events: list[Any]) -> None:
    compiled = _compiled()
    assert_alike(compiled, fast_batch(payload(events, "array"), "array", positional=True))


def decoded(data: bytes, core: ModuleType) -> Batch | str:
    """``decode_batch`` with this events core, through msgspec's fast decoders (the batch parser's
    reference, :mod:`kvgateway.engine._batch_py`, given the core's ``events_of``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wire, "_events_of", core.events_of)
        patch.setattr(_batch_py, "_events_of", core.events_of)
        patch.setattr(wire, "_parse_batch", _batch_py.parse_batch)
        try:
            return wire.decode_batch(data)
        except wire.DecodeError as exc:
            return str(exc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=map_events | positional_events, envelope=st.sampled_from(["array", "map"]))
def test_decode_batch_gives_the_same_batch_with_either(events: list[Any], envelope: str) -> None:
    compiled = _compiled()
    data = payload(events, envelope)
    theirs, ours = decoded(data, compiled), decoded(data, _events_py)
    assert theirs == ours
    if isinstance(ours, Batch):
        assert isinstance(theirs, Batch)
        assert field_by_field(theirs.events) == field_by_field(ours.events)


def test_a_remote_blocks_medium_is_renamed_and_its_locality_kept_last() -> None:
    compiled = _compiled()
    event = {"type": "BlockStored", "block_hashes": [1], "medium": "CPU", "locality": "REMOTE", "group_idx": 2}
    (stored,) = compiled.events_of(fast_batch(payload([event], "array"), "array", positional=False))
    assert stored.medium == _events_py.events_of(fast_batch(payload([event], "array"), "array", False))[0].medium
    assert stored.medium != "CPU"
    assert list(stored.extra) == ["group_idx", "locality"]


def test_an_event_it_cannot_read_is_left_to_the_reference_with_its_error() -> None:
    compiled = _compiled()
    stored = {"type": "BlockStored", "block_hashes": [1], "token_ids": [1, 2], "block_size": 2}
    fast = fast_batch(payload([stored, {"type": "AllBlocksCleared"}], "array"), "array", positional=False)
    del fast.events[0].medium  # an empty slot, which msgspec's decode never leaves
    with pytest.raises(AttributeError) as reference:
        _events_py.events_of(fast)
    with pytest.raises(AttributeError) as compiled_error:
        compiled.events_of(fast)
    assert str(compiled_error.value) == str(reference.value)


def test_a_token_array_the_typed_decode_refuses_sends_the_batch_to_the_general_path() -> None:
    _compiled()
    event = {"type": "BlockStored", "block_hashes": [1], "token_ids": [1, "two"], "block_size": 1}
    with pytest.raises(wire.DecodeError, match="token_ids"):
        wire.decode_batch(payload([event], "array"))
