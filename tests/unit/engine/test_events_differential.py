"""The fast-decoded events made public in C (kvgateway/engine/_events_c.pyx) against the reference
(:mod:`kvgateway.engine._events_py`): the same events, field for field, with ``extra`` in
the same order, for map events with any subset of their keys (every further field, the locality
that renames a remote block's medium, None where a value may be None) and positional events of
every field count vLLM and SGLang have sent, in both envelopes and mixed with removals and clears;
the same batches from ``decode_batch`` with either; and an event the compiled code cannot read
handed to the reference, with the reference's error.

Skipped where the compiled core was not built (or ``KVGATEWAY_NO_EXTENSIONS`` is set)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgateway.engine import _batch_py, _events_py, wire
from kvgateway.engine.wire import Batch
from tests.support.cores import compiled_twin
from tests.support.fast_layouts import field_by_field, map_events, positional_events


def _compiled() -> ModuleType:
    return compiled_twin("kvgateway.engine._events_c", lambda module: wire._events_of is module.events_of)


def payload(events: list[Any], envelope: str) -> bytes:
    body: Any = [2.5, events, 1] if envelope == "array" else {"ts": 2.5, "events": events, "data_parallel_rank": 1}
    return msgspec.msgpack.encode(body)


def fast_batch(data: bytes, envelope: str, positional: bool) -> Any:
    """What the fast decoder ``decode_batch`` takes for this payload gives."""
    if envelope == "map":
        return wire._fast_map_batch_decoder.decode(data)
    return (wire._fast_array_batch_decoder if positional else wire._fast_batch_decoder).decode(data)


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
