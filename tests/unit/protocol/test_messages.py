"""kvgateway.protocol.messages: the fields of each message, a batch's selections and variants, and every
message the package sends against the JSON Schema."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from kvgateway.engine import wire
from kvgateway.protocol import messages, render
from kvgateway.protocol.messages import OutMessage
from kvgateway.state.learner import ChainLearner
from kvgateway.state.lookup import BadLookup, TokenQuery, lookup_hashes, lookup_tokens, parse_hash
from kvgateway.state.occupancy import OccupancyIndex
from tests.support.events import MIXED, batch, removed, stored
from tests.support.hub import TRT_SEQ, decode, drain, make_hub, publish_batch, publish_notice, snapshot, subscribe


def test_batch_message_has_the_documented_fields_and_rendered_events() -> None:
    hub = make_hub()
    sub = subscribe(hub)
    big = 2**64 - 1
    events: list[wire.Event] = [
        wire.BlockStored(
            block_hashes=[big, -5, b"\x00\xff"],
            parent_block_hash=big - 1,
            token_ids=[1, 2, 3],
            block_size=1,
            medium="GPU",
            extra={"group_idx": 0},
        ),
        removed(b"\x01", medium="cpu"),
        wire.AllBlocksCleared(),
        wire.UnknownEvent(type="Fancy", body=["Fancy", 1, b"\x02"]),
    ]
    publish_batch(hub, "a", 1, 42, batch(*events, ts=1789095808.8378847))
    [message] = drain(sub)
    assert message.type == "batch"
    assert message.id == f"{hub.epoch}:1"
    body = decode(message)
    assert list(body) == ["type", "id", "offset", "source", "dp_rank", "seq", "ts", "events"]
    assert body["id"] == message.id
    assert (body["offset"], body["source"], body["dp_rank"], body["seq"]) == (1, "a", 1, "42")  # seqs are strings
    assert body["ts"] == 1789095808.8378847
    assert body["events"] == json.loads(json.dumps(render.render_events(events)))
    assert body["events"][0]["block_hashes"] == [str(big), "-5", "00ff"]
    assert b"\n" not in message.data


def test_encoded_batch_select_gives_exactly_the_chosen_events() -> None:
    events = [{"type": "X", "n": i, "s": "a,b]}"} for i in range(5)]
    encoded = messages.encode_batch(
        epoch="e", offset=9, source="s", dp_rank=0, seq=1, ts=0.5, events=messages.encode_events(events)
    )
    assert msgspec.json.decode(encoded.message.data)["events"] == events
    for chosen in ([0], [4], [1, 3], [0, 2, 4], [0, 1, 2, 3]):
        body = msgspec.json.decode(encoded.select(chosen).data)
        assert body["events"] == [events[i] for i in chosen]
        assert body["id"] == "e:9"
    assert encoded.select(range(5)) is encoded.message
    empty = messages.encode_batch(
        epoch="e", offset=1, source="s", dp_rank=0, seq=1, ts=0.5, events=messages.encode_events([])
    )
    assert msgspec.json.decode(empty.message.data)["events"] == []


def test_the_int_seqs_variant_of_a_batch_unquotes_its_seq_only() -> None:
    events = messages.encode_events([{"type": "X", "note": ',"seq":"1"'}])
    encoded = messages.encode_batch(
        epoch="00ff00ff00ff00ff", offset=3, source='s,"seq":"9', dp_rank=0, seq=TRT_SEQ, ts=1.5, events=events
    )
    text = encoded.message.data
    variant = messages.with_int_seqs(encoded.message)
    assert json.loads(variant.data) == {**json.loads(text), "seq": TRT_SEQ}
    assert (variant.id, variant.type) == (encoded.message.id, "batch")
    state = OutMessage(b'{"type":"state","offset":3,"last":true}', "state")
    assert messages.with_int_seqs(state) is state  # no seq in it: the message itself


def _occupancy(offset: int) -> dict[str, Any]:
    """A real occupancy snapshot: the schema requires every field the index always emits."""
    index = OccupancyIndex({("a", 0): {"GPU": 10}})
    index.apply("a", 0, batch(stored(1, 2, medium="GPU")), 0.0)
    return index.snapshot(offset, 0.0)


def test_every_message_validates_against_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(messages.schema_bytes())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    hub = make_hub(client_queue_bytes=1, snapshot=_occupancy)
    sub = subscribe(hub)
    publish_batch(hub, "a", 0, 1, batch(*MIXED, stored(2**64 - 1, b"\xab", -3, medium="CPU")))
    publish_batch(hub, "a", 0, 2, batch())
    publish_notice(hub, "restart", "a", 0, seq=0, previous=None, reason="r")
    publish_notice(hub, "restart", "a", 1, seq=0, previous=-1, reason="seq_reset")
    publish_notice(hub, "unrecovered_gap", "a", 0, first=1, until=2, count=2, reason="evicted")
    publish_notice(hub, "degraded", "b", 0, reason="r", reason_code="evicted")
    for kind in ("up", "down"):
        publish_notice(hub, kind, "b", 0, reason="r")
    resumed = subscribe(hub, f"last_event_id={hub.epoch}:0")
    sent = [resumed.hello_message, *drain(resumed), sub.hello_message, hub.slow_consumer_notice]
    assert len(sent) == 11
    for message in sent:
        validator.validate(decode(message))
    bad = decode(sent[1])
    bad["events"][0]["block_hashes"] = [1]
    assert not validator.is_valid(bad)
    for event in decode(sent[1])["events"]:
        if event["type"] in ("BlockStored", "BlockRemoved"):
            assert not validator.is_valid(decode(sent[1]) | {"events": [event | {"tier": "NVME"}]})
            assert not validator.is_valid(
                decode(sent[1]) | {"events": [{k: v for k, v in event.items() if k != "tier"}]}
            )
    notice = decode(sent[3])
    notice["extra"] = 1
    assert not validator.is_valid(notice)
    hello = decode(sent[0])
    hello["occupancy"] = _occupancy(0)
    assert not validator.is_valid(hello)  # recovered hellos carry no snapshot
    fresh = decode(sent[-2])
    assert fresh["occupancy"] is not None
    assert not validator.is_valid(fresh | {"occupancy": snapshot(0)})  # no stale, block_size, stores, ...
    for where, field in (("stream", "stale_reason"), ("stream", "unknown_removes"), ("medium", "block_size")):
        broken = json.loads(json.dumps(fresh))
        stream = broken["occupancy"]["streams"][0]
        del (stream if where == "stream" else stream["mediums"]["GPU"])[field]
        assert not validator.is_valid(broken), field


def test_tiers_lenient_fields_and_a_real_snapshot_validate_against_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")

    validator = jsonschema.Draft202012Validator(json.loads(messages.schema_bytes()))
    index = OccupancyIndex({("a", 0): {"GPU": 10, "cpu_pinned": 20}})
    payload = msgspec.msgpack.encode(
        [
            1.0,
            [
                ["BlockStored", [1, 2], None, [1, 2], 1, None, "GPU", {"cache_salt": "abc"}],  # SGLang's metadata
                ["BlockStored", [3], None, [3], 1, None, "cpu_pinned", None, None, "0"],  # a str group_idx
                {"type": "BlockStored", "block_hashes": [4], "medium": "STORAGE", "lora_name": 5},
                {"type": "BlockRemoved", "block_hashes": [5], "medium": ["EXTERNAL"]},
                ["BlockRemoved", [6], "lmcache", 0],
            ],
            0,
        ]
    )
    decoded = wire.decode_batch(payload)
    hub = make_hub(snapshot=lambda offset: index.snapshot(offset, 0.0))
    index.apply("a", 0, decoded, 0.0)
    publish_batch(hub, "a", 0, 1, decoded)
    sub = subscribe(hub)
    hello = decode(sub.hello_message)
    validator.validate(hello)
    # LMCACHE (EXTERNAL) was only removed from, never held a block: not listed
    assert list(hello["occupancy"]["tiers"]) == ["GPU", "CPU", "DISK"]
    resumed = subscribe(hub, f"last_event_id={hub.epoch}:0")
    (message,) = drain(resumed)
    body = decode(message)
    validator.validate(body)
    events = body["events"]
    assert [e["tier"] for e in events] == ["GPU", "CPU", "DISK", "GPU", "EXTERNAL"]
    assert events[0]["field_7"] == {"cache_salt": "abc"}
    assert events[1]["field_9"] == "0"
    assert (events[2]["field_lora_name"], events[2]["lora_name"]) == (5, None)
    assert (events[3]["field_medium"], events[3]["medium"]) == (["EXTERNAL"], None)
    broken = json.loads(json.dumps(hello))
    broken["occupancy"]["tiers"]["SSD"] = broken["occupancy"]["tiers"]["DISK"]
    assert not validator.is_valid(broken)
    del broken["occupancy"]["tiers"]
    assert not validator.is_valid(broken)


def _shape(schema: dict[str, Any], name: str) -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    return jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": f"#/$defs/{name}"})


def test_lookup_answers_validate_and_the_hash_pattern_is_what_the_server_accepts() -> None:
    schema = json.loads(messages.schema_bytes())
    answer, lookup_hash = _shape(schema, "lookup_answer"), _shape(schema, "lookup_hash")
    index = OccupancyIndex()
    index.apply("a", 0, batch(stored(1, 2, medium="GPU")), 0.0)
    streams = list(index.streams())
    by_hashes = lookup_hashes(streams, [parse_hash("1"), parse_hash("2")], 1)
    by_tokens = lookup_tokens(streams, ChainLearner(), TokenQuery([1, 2]), 1)
    for found in (by_hashes, by_tokens):
        answer.validate(found)
        unmarked = {k: v for k, v in found["streams"][0].items() if k != "stale"}
        assert not answer.is_valid(found | {"streams": [unmarked]})
    texts = ["0", "-7", "1234", "0012", "ab", "9" * 130, "", "-0", "012", "abc", "AB", "+1", " 1", "9" * 131]
    for text in texts:
        try:
            accepted = bool(parse_hash(text))
        except BadLookup:
            accepted = False
        assert lookup_hash.is_valid(text) == accepted, text
