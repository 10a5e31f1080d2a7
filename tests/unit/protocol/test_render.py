"""kvgateway.protocol.render: decoded events as a web client reads them: hashes as exact decimal
strings or lowercase hex, the field set of every layout, the tier after the medium, and any
decodable event as JSON."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgateway.engine import wire
from kvgateway.engine.wire import BlockRemoved, BlockStored, Event
from kvgateway.protocol import render
from tests.support.payloads import (
    ABOVE_I64,
    FULL_STORED,
    RAW32,
    RENDERED_REMOVED,
    RENDERED_STORED,
    STORED_POSITIONAL,
    U64,
    decode,
    enc,
    encoded_event,
    roundtrip,
    stored_array,
)


@given(
    hashes=st.lists(st.integers(2**53 + 1, U64) | st.integers(-(2**63), -(2**53) - 1), min_size=1, max_size=8),
    parent=st.integers(2**53 + 1, U64),
)
def test_rendered_u64_hashes_are_exact_decimal_strings(hashes: list[int], parent: int) -> None:
    events = decode(
        stored_array(5, block_hashes=hashes, parent_block_hash=parent),
        {"type": "BlockRemoved", "block_hashes": hashes},
    ).events
    stored_json, removed_json = roundtrip(events)
    assert stored_json["block_hashes"] == removed_json["block_hashes"] == [str(h) for h in hashes]
    assert [int(text) for text in stored_json["block_hashes"]] == hashes
    assert stored_json["parent_block_hash"] == str(parent)


@given(hashes=st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=4))
def test_rendered_bytes_hashes_are_lowercase_hex(hashes: list[bytes]) -> None:
    events = decode(stored_array(5, block_hashes=hashes, parent_block_hash=hashes[0]), ["BlockRemoved", hashes]).events
    stored_json, removed_json = roundtrip(events)
    for texts in (stored_json["block_hashes"], removed_json["block_hashes"]):
        assert texts == [h.hex() for h in hashes]
        assert all(len(t) == 64 and t == t.lower() for t in texts)
    assert stored_json["parent_block_hash"] == hashes[0].hex()


def test_rendered_small_and_negative_int_hashes() -> None:
    (event,) = roundtrip(decode(["BlockRemoved", [0, 7, -1, -(2**63)]]).events)
    assert event["block_hashes"] == ["0", "7", "-1", str(-(2**63))]


def test_rendered_field_sets_from_the_sparsest_layouts() -> None:
    events = decode(
        stored_array(5),
        {"type": "BlockStored", "block_hashes": [1]},
        ["BlockRemoved", [1]],
        {"type": "BlockRemoved", "block_hashes": [1]},
        ["AllBlocksCleared"],
    ).events
    a, b, c, d, e = roundtrip(events)
    expected_stored = {
        "type": "BlockStored",
        "block_hashes": ["1"],
        "parent_block_hash": None,
        "token_ids": [],
        "lora_id": None,
        "medium": None,
        "tier": "GPU",
        "lora_name": None,
    }
    assert a == expected_stored | {"block_size": 16}
    assert b == expected_stored | {"block_size": 0}
    assert c == d == {"type": "BlockRemoved", "block_hashes": ["1"], "medium": None, "tier": "GPU"}
    assert e == {"type": "AllBlocksCleared"}


def test_rendered_further_fields_with_bytes_as_hex() -> None:
    fields = FULL_STORED | {"extra_keys": [None, ["adapter", [b"\x01\x02"], "salt"], None]}
    (stored_json,) = roundtrip(decode(["BlockStored", *(fields[name] for name in STORED_POSITIONAL)]).events)
    assert stored_json["extra_keys"] == [None, ["adapter", ["0102"], "salt"], None]
    assert stored_json["group_idx"] == 1
    assert stored_json["kv_cache_spec_kind"] == "sliding_window"
    assert stored_json["kv_cache_spec_sliding_window"] == 4096
    assert stored_json["block_hashes"] == [str(ABOVE_I64), "-5", RAW32.hex()]
    assert stored_json["parent_block_hash"] == str(U64)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(encoded_event(), max_size=6))
def test_rendering_carries_the_required_fields_and_is_json_ready(
    items: list[tuple[Any, Event, tuple[Any, ...]]],
) -> None:
    events = wire.decode_batch(enc([1.0, [value for value, _, _ in items]])).events
    rendered = roundtrip(events)
    assert len(rendered) == len(events)
    for event, out in zip(events, rendered, strict=True):
        assert out["type"] == event.type
        if isinstance(event, BlockStored):
            assert out.keys() >= RENDERED_STORED
            assert out["block_hashes"] == [render.hash_text(h) for h in event.block_hashes]
            assert all(isinstance(h, str) for h in out["block_hashes"])
            parent = event.parent_block_hash
            assert out["parent_block_hash"] == (None if parent is None else render.hash_text(parent))
            assert (out["token_ids"], out["block_size"], out["medium"]) == (
                event.token_ids,
                event.block_size,
                event.medium,
            )
            assert event.extra.keys() <= out.keys()
        elif isinstance(event, BlockRemoved):
            assert out.keys() >= RENDERED_REMOVED
            assert out["block_hashes"] == [render.hash_text(h) for h in event.block_hashes]
            assert event.extra.keys() <= out.keys()


@pytest.mark.parametrize(
    "event",
    [
        {"type": "KVTransfer", "blob": msgspec.msgpack.Ext(5, b"\x01")},  # unknown event
        {"type": "BlockStored", "block_hashes": [1], "session": msgspec.msgpack.Ext(1, b"")},  # extra of a known one
        ["KVTransfer", msgspec.msgpack.Ext(5, b"\x01")],
        {"type": "KVTransfer", "index": {None: 1}},  # nil map key
        {"type": "KVTransfer", "index": {(1, 2): 1}},  # array map key: decodes to a tuple
    ],
)
def test_any_decodable_event_renders_to_json(event: Any) -> None:
    batch = wire.decode_batch(enc([1.0, [event]]))
    json.loads(msgspec.json.encode(render.render_events(batch.events)))


@pytest.mark.parametrize(
    ("medium", "tier"),
    [
        ("GPU", "GPU"),
        ("gpu", "GPU"),
        (None, "GPU"),
        ("", "GPU"),
        ("CPU", "CPU"),
        ("cpu_pinned", "CPU"),
        ("STORAGE", "DISK"),
        ("DISK", "DISK"),
        ("EXTERNAL", "EXTERNAL"),
        ("lmcache", "EXTERNAL"),
    ],
)
def test_block_events_render_their_tier_after_the_medium_as_sent(medium: str | None, tier: str) -> None:
    got = decode(stored_array(6, medium=medium), {"type": "BlockRemoved", "block_hashes": [1], "medium": medium})
    for rendered in roundtrip(got.events):
        assert rendered["medium"] == medium
        assert rendered["tier"] == tier
        keys = list(rendered)
        assert keys[keys.index("medium") + 1] == "tier"
