"""The hub without sockets: encoding, filters, resume, ring bounds, client queues, query parsing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import QueryParams

from kvgateway.config import StreamConfig
from kvgateway.engine import wire
from kvgateway.log.ordered import MemoryLog, NoticeRecord, batch_record
from kvgateway.log.resume import resume_after
from kvgateway.log.ring import Ring
from kvgateway.log.status import StreamStatus
from kvgateway.protocol import messages, render
from kvgateway.protocol.filters import ClientFilter
from kvgateway.protocol.messages import OutMessage
from kvgateway.runtime.metrics import Metrics
from kvgateway.serve.digests import DigestTicker
from kvgateway.serve.hub import Hub, TooManyClients
from kvgateway.serve.query import (
    MAX_VALUES,
    PARAMETERS,
    ROUTE_PARAMETERS,
    BadRequest,
    ClientRequest,
    parse_query,
    route_query,
)
from kvgateway.serve.sessions import Pump
from kvgateway.serve.subscription import Subscription
from kvgateway.state.digest import EMPTY, MASK, element, hex_digest
from kvgateway.state.occupancy import OccupancyIndex

T = TypeVar("T")
STREAMS = [("a", 0), ("a", 1), ("b", 0)]
BIG = 2**64 - 12345  # a u64 hash above 2^63


# --- helpers ------------------------------------------------------------------------------


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def snapshot(offset: int) -> dict[str, Any]:
    gpu = {"tier": "GPU", "blocks": offset, "tokens": 0, "capacity_blocks": None}
    tiers = {"GPU": {"mediums": ["GPU"], "blocks": offset, "tokens": 0, "capacity_blocks": None}}
    return {
        "offset": offset,
        "streams": [{"source": "a", "dp_rank": 0, "mediums": {"GPU": gpu}, "tiers": tiers}],
        "totals": {"GPU": gpu},
        "tiers": tiers,
    }


TRT_SEQ = 1_789_095_808_837_884_700
"""A TensorRT-LLM seq (its publisher starts at time_ns): far beyond 2^53."""


def statuses() -> list[dict[str, Any]]:
    """The real status of each stream (the schema lists every field of it)."""
    out = []
    for source, dp_rank in STREAMS:
        status = StreamStatus(StreamConfig(source, dp_rank, "tcp://127.0.0.1:5557", None, "", False, {}), True)
        status.last_seq = None if dp_rank == 1 else TRT_SEQ + dp_rank
        out.append(status.to_json(0.0, stale=dp_rank == 1, stale_reason="unrecovered"))
    return out


_METRICS: dict[Hub, Metrics] = {}
_SNAPSHOTS: dict[Hub, Callable[[int], dict[str, Any]]] = {}
_PUMPS: dict[Subscription, Pump] = {}


def make_hub(
    *,
    ring_messages: int = 10_000,
    ring_bytes: int = 64 * 2**20,
    snapshot: Callable[[int], dict[str, Any]] = snapshot,
    **kwargs: Any,
) -> Hub:
    """A hub following its own in-memory log, as the gateway wires them."""
    metrics = Metrics()
    hub_metrics = metrics.hub()
    hub_metrics.retained(0, 0)
    log = MemoryLog(ring_messages, ring_bytes, retained=hub_metrics.retained)
    hub = Hub(log, metrics=hub_metrics, sources=STREAMS, **kwargs)
    log.follow(hub.follow)
    _METRICS[hub] = metrics
    _SNAPSHOTS[hub] = snapshot
    return hub


def ring(hub: Hub) -> Ring:
    assert isinstance(hub.log, MemoryLog)
    return hub.log.ring


def publish_batch(hub: Hub, source: str, dp_rank: int, seq: int, batch: wire.Batch) -> int:
    """What a stream's outlet appends for a delivered batch; its offset."""
    return hub.log.append(batch_record((source, dp_rank), seq, batch, received=batch.ts, replayed=False))


def publish_notice(hub: Hub, kind: str, source: str, dp_rank: int, **fields: Any) -> int:
    return hub.log.append(NoticeRecord((source, dp_rank), kind, fields))


def sample(hub: Hub, name: str, **labels: str) -> float:
    value = _METRICS[hub].registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def stored(*hashes: wire.Hash, medium: str | None = None) -> wire.BlockStored:
    return wire.BlockStored(
        block_hashes=list(hashes), parent_block_hash=None, token_ids=[1, 2], block_size=2, medium=medium
    )


def removed(*hashes: wire.Hash, medium: str | None = None) -> wire.BlockRemoved:
    return wire.BlockRemoved(block_hashes=list(hashes), medium=medium)


def batch(*events: wire.Event, ts: float = 1.5) -> wire.Batch:
    return wire.Batch(ts=ts, events=list(events))


def subscribe(hub: Hub, query: str = "", transport: Any = "ws", last_event_id: str | None = None) -> Subscription:
    return subscribe_request(
        hub, parse_query(QueryParams(query), sources=hub.source_names, last_event_id=last_event_id), transport
    )


def subscribe_request(hub: Hub, request: ClientRequest, transport: Any) -> Subscription:
    """As the gateway subscribes a client: resume point, hello for it, subscription."""
    point = hub.resume_point(request, transport)
    hello = messages.encode_hello(
        epoch=hub.epoch,
        offset=point.offset,
        recovered=point.recovered,
        sources=statuses(),
        occupancy=None if point.recovered else _SNAPSHOTS[hub](point.offset),
    )
    return hub.subscribe(request, transport, hello, point)


async def next_chunk(sub: Subscription, **kwargs: Any) -> list[OutMessage] | None:
    """The web layer's wait for a chunk; the chunk counts as written at once (a client that reads)."""
    pump = _PUMPS.get(sub)
    if pump is None:
        pump = _PUMPS[sub] = Pump(sub)
    chunk = await pump.next_chunk(**kwargs)
    sub.written()
    return chunk


def stuck_writing(sub: Subscription) -> None:
    """As if its writer took a chunk and is stuck writing it to a client that does not read."""
    sub._in_flight = True


def drain(sub: Subscription) -> list[OutMessage]:
    """Every message queued now, through next_chunk (never blocks)."""

    async def collect() -> list[OutMessage]:
        out: list[OutMessage] = []
        while sub.queued_bytes:
            chunk = await next_chunk(sub)
            assert chunk is not None
            out.extend(chunk)
        return out

    return run(collect())


def decode(message: OutMessage) -> dict[str, Any]:
    value = msgspec.json.decode(message.data)
    assert isinstance(value, dict)
    return value


def offsets(items: list[OutMessage]) -> list[int]:
    return [decode(m)["offset"] for m in items if m.type != "hello"]


# --- hello --------------------------------------------------------------------------------


def test_hello_of_a_fresh_client_carries_the_snapshot_at_its_offset() -> None:
    hub = make_hub()
    publish_batch(hub, "a", 0, 7, batch(stored(1)))
    publish_batch(hub, "b", 0, 3, batch(stored(2)))
    sub = subscribe(hub)
    assert not sub.recovered
    assert drain(sub) == []
    hello = sub.hello_message
    assert hello.data is sub.hello
    assert sub.offset == 2
    assert hello.type == "hello"
    assert hello.id == f"{hub.epoch}:2"
    body = decode(hello)
    assert body == {
        "type": "hello",
        "epoch": hub.epoch,
        "offset": 2,
        "recovered": False,
        "sources": statuses(),
        "occupancy": snapshot(2),
    }
    assert list(body) == ["type", "epoch", "offset", "recovered", "sources", "occupancy"]


def test_epoch_is_random_hex_per_hub_and_offsets_count_every_ring_message() -> None:
    one, two = make_hub(), make_hub()
    assert len(one.epoch) == 16
    int(one.epoch, 16)
    assert one.epoch != two.epoch
    assert one.offset == 0
    assert publish_batch(one, "a", 0, 0, batch()) == 1
    assert publish_notice(one, "up", "a", 1, reason="connected") == 2
    assert publish_batch(one, "b", 0, 0, batch(stored(1))) == 3
    assert one.offset == 3


# --- batches ------------------------------------------------------------------------------


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
    assert encoded.event_count == 5
    for chosen in ([0], [4], [1, 3], [0, 2, 4], [0, 1, 2, 3]):
        body = msgspec.json.decode(encoded.select(chosen).data)
        assert body["events"] == [events[i] for i in chosen]
        assert body["id"] == "e:9"
    assert encoded.select(range(5)) is encoded.message
    empty = messages.encode_batch(
        epoch="e", offset=1, source="s", dp_rank=0, seq=1, ts=0.5, events=messages.encode_events([])
    )
    assert msgspec.json.decode(empty.message.data)["events"] == []


def test_encode_once_same_bytes_object_for_clients_with_the_same_filter() -> None:
    hub = make_hub()
    plain = [subscribe(hub), subscribe(hub, transport="sse"), subscribe(hub, "source=a")]
    gpu = [subscribe(hub, "medium=gpu"), subscribe(hub, "medium=GPU&dp_rank=0")]
    stored_only = [subscribe(hub, "type=BlockStored"), subscribe(hub, "type=BlockStored&medium=cpu&medium=gpu")]
    publish_batch(hub, "a", 0, 1, batch(stored(1), removed(2, medium="CPU")))
    got = {id(sub): drain(sub)[0] for sub in plain + gpu + stored_only}
    first = got[id(plain[0])]
    assert all(got[id(sub)] is first for sub in plain)
    assert got[id(gpu[0])] is got[id(gpu[1])]
    assert got[id(gpu[0])] is not first
    assert got[id(gpu[0])].data is not first.data
    assert [e["type"] for e in decode(got[id(gpu[0])])["events"]] == ["BlockStored"]
    # a different filter key that keeps the same events still has its own cache slot
    assert decode(got[id(stored_only[0])]) == decode(got[id(stored_only[1])])
    # a filter that keeps every event shares the unfiltered bytes
    everything = subscribe(hub, "type=BlockStored&type=BlockRemoved")
    publish_batch(hub, "a", 0, 2, batch(stored(3), removed(4)))
    live = drain(plain[0])[-1]
    assert drain(everything)[-1] is live


# --- filters ------------------------------------------------------------------------------

MIXED: list[wire.Event] = [
    stored(1, medium="GPU"),
    stored(2),  # no medium: counts as GPU
    stored(3, medium="cpu"),
    removed(4, medium="CPU"),
    wire.AllBlocksCleared(),
    wire.UnknownEvent(type="Offloaded", body={"type": "Offloaded", "medium": "disk"}),
    wire.UnknownEvent(type="Offloaded", body=["Offloaded", 7]),  # no medium: fails medium filters
]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", [0, 1, 2, 3, 4, 5, 6]),
        ("medium=GPU", [0, 1, 4]),
        ("medium=gpu", [0, 1, 4]),
        ("medium=CPU", [2, 3, 4]),
        ("medium=Disk", [4, 5]),
        ("medium=GPU&medium=disk", [0, 1, 4, 5]),
        ("type=BlockStored", [0, 1, 2]),
        ("type=BlockRemoved&type=AllBlocksCleared", [3, 4]),
        ("type=Offloaded", [5, 6]),
        ("type=Offloaded&medium=DISK", [5]),
        ("type=BlockStored&medium=cpu", [2]),
        ("type=AllBlocksCleared&medium=nowhere", [4]),
        ("type=Nothing", None),
        ("type=BlockRemoved&medium=GPU", None),
    ],
)
def test_event_filters(query: str, expected: list[int] | None) -> None:
    hub = make_hub()
    sub = subscribe(hub, query)
    publish_batch(hub, "a", 0, 1, batch(*MIXED))
    got = drain(sub)
    rendered = render.render_events(MIXED)
    if expected is None:
        assert got == []
    else:
        assert [decode(m)["events"] for m in got] == [json.loads(json.dumps([rendered[i] for i in expected]))]
    request = parse_query(QueryParams(query), sources=hub.source_names)
    chosen = request.filter.select_events(MIXED)
    assert chosen == [MIXED[i] for i in expected or []]
    assert [request.filter.matches_event(e) for e in MIXED] == [i in (expected or []) for i in range(len(MIXED))]


TIERED: list[wire.Event] = [
    stored(1, medium="GPU"),  # 0
    stored(2),  # 1: no medium: GPU
    stored(3, medium=""),  # 2: empty: GPU, as the occupancy index counts it
    stored(4, medium="CPU"),  # 3
    stored(5, medium="cpu_pinned"),  # 4
    removed(6, medium="CPU_PINNED"),  # 5
    stored(7, medium="STORAGE"),  # 6
    stored(8, medium="disk"),  # 7
    stored(9, medium="EXTERNAL"),  # 8
    removed(10, medium="lmcache"),  # 9
    wire.AllBlocksCleared(),  # 10: every medium
    wire.UnknownEvent(type="Offloaded", body={"type": "Offloaded", "medium": "Cpu_Pinned"}),  # 11
]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("medium=GPU", [0, 1, 2, 10]),  # a tier name: the whole tier
        ("medium=CPU", [3, 4, 5, 10, 11]),  # CPU and CPU_PINNED
        ("medium=cpu_pinned", [4, 5, 10, 11]),  # a medium name: only that medium
        ("medium=CPU_PINNED&type=BlockStored", [4]),
        ("medium=DISK", [6, 7, 10]),  # DISK and STORAGE
        ("medium=storage", [6, 10]),
        ("medium=EXTERNAL", [8, 9, 10]),  # anything the tier table does not name
        ("medium=LMCACHE", [9, 10]),
        ("medium=STORAGE&medium=EXTERNAL", [6, 8, 9, 10]),
        ("medium=nowhere", [10]),
    ],
)
def test_medium_filter_takes_a_medium_name_or_a_tier_name(query: str, expected: list[int]) -> None:
    hub = make_hub()
    sub = subscribe(hub, query)
    publish_batch(hub, "a", 0, 1, batch(*TIERED))
    (message,) = drain(sub)
    rendered = render.render_events(TIERED)
    assert decode(message)["events"] == json.loads(json.dumps([rendered[i] for i in expected]))
    request = parse_query(QueryParams(query), sources=hub.source_names)
    assert request.filter.select_events(TIERED) == [TIERED[i] for i in expected]


def test_medium_filter_and_occupancy_index_agree_on_every_event() -> None:
    """One normaliser: an event passes ``medium=M`` exactly when the index counts it under M (or M's tier)."""
    from kvgateway.engine.mediums import TIER_NAMES, TIERS
    from kvgateway.state.occupancy import OccupancyIndex

    blocks = [e for e in TIERED if isinstance(e, wire.BlockStored)]
    index = OccupancyIndex()
    for event in blocks:
        index.apply("a", 0, batch(event), 0.0)
    (entry,) = index.snapshot(1, 0.0)["streams"]
    for name, stats in entry["mediums"].items():
        if name in TIER_NAMES:  # a tier name filters the whole tier: checked below
            continue
        passing = parse_query({"medium": [name]}).filter.select_events(blocks)
        assert len(passing) == stats["blocks"], name
    for tier in TIERS:
        passing = parse_query({"medium": [tier]}).filter.select_events(blocks)
        assert len(passing) == entry["tiers"].get(tier, {"blocks": 0})["blocks"], tier


def test_a_batch_without_matching_events_is_skipped_and_offsets_jump() -> None:
    hub = make_hub()
    sub = subscribe(hub, "type=BlockRemoved")
    publish_batch(hub, "a", 0, 1, batch(removed(1)))
    publish_batch(hub, "a", 0, 2, batch(stored(2)))
    publish_batch(hub, "a", 0, 3, batch(stored(3), removed(3)))
    assert offsets(drain(sub)) == [1, 3]


def test_stream_filters_and_notices_pass_event_filters() -> None:
    hub = make_hub()
    a = subscribe(hub, "source=a")
    rank1 = subscribe(hub, "dp_rank=1")
    b_stored = subscribe(hub, "source=b&type=BlockStored")
    publish_batch(hub, "a", 0, 1, batch(stored(1)))  # 1
    publish_batch(hub, "a", 1, 1, batch(stored(1)))  # 2
    publish_batch(hub, "b", 0, 1, batch(removed(1)))  # 3
    publish_notice(hub, "down", "b", 0, reason="socket closed")  # 4
    publish_notice(hub, "up", "a", 1, reason="connected")  # 5
    assert offsets(drain(a)) == [1, 2, 5]
    assert offsets(drain(rank1)) == [2, 5]
    assert offsets(drain(b_stored)) == [4]
    f = ClientFilter(sources=frozenset({"a"}), dp_ranks=frozenset({1}))
    assert f.matches_stream("a", 1)
    assert not f.matches_stream("a", 0)
    assert not f.matches_stream("b", 1)
    assert ClientFilter().matches_stream("anything", 99)


def test_a_stream_outside_the_configuration_is_served_too() -> None:
    hub = make_hub()
    everyone, only_a = subscribe(hub), subscribe(hub, "source=a")
    publish_batch(hub, "z", 3, 1, batch(stored(1)))
    assert offsets(drain(everyone)) == [1]
    assert offsets(drain(only_a)) == []
    late = subscribe(hub)
    publish_batch(hub, "z", 3, 2, batch(stored(1)))
    assert offsets(drain(late)) == [2]


# --- notices ------------------------------------------------------------------------------


def test_stream_notices_have_offsets_ids_and_their_kind_fields() -> None:
    hub = make_hub()
    sub = subscribe(hub)
    publish_notice(hub, "restart", "a", 0, seq=0, previous=1234, reason="sequence went back")
    publish_notice(hub, "restart", "a", 1, seq=5, previous=None, reason="first seen")
    publish_notice(hub, "unrecovered_gap", "b", 0, first=10, until=19, count=10, reason="no_replay")
    publish_notice(hub, "degraded", "b", 0, reason="10 batches unrecovered (no_replay)", reason_code="no_replay")
    publish_notice(hub, "down", "b", 0, reason="disconnected")
    bodies = [decode(m) for m in drain(sub)]
    assert bodies[0] == {
        "type": "notice",
        "kind": "restart",
        "id": f"{hub.epoch}:1",
        "offset": 1,
        "source": "a",
        "dp_rank": 0,
        "seq": "0",
        "previous": "1234",
        "reason": "sequence went back",
    }
    assert bodies[1]["previous"] is None
    assert {k: bodies[2][k] for k in ("kind", "first", "until", "count", "offset")} == {
        "kind": "unrecovered_gap",
        "first": "10",
        "until": "19",
        "count": 10,
        "offset": 3,
    }
    assert "last" not in bodies[2]  # its deprecated name goes only to a client that asks (compat=gap_last)
    assert [b["kind"] for b in bodies[3:]] == ["degraded", "down"]
    assert bodies[3]["reason_code"] == "no_replay"
    assert (bodies[4]["reason"], bodies[4]["reason_code"]) == ("disconnected", "disconnected")


def test_a_client_that_asks_gets_the_gap_notice_with_last_live_and_on_resume_and_batches_as_they_are() -> None:
    hub = make_hub()
    plain, early = subscribe(hub), subscribe(hub, "compat=gap_last")
    assert parse_query(QueryParams("compat=gap_last&compat=gap_last"), sources=hub.source_names).compat == frozenset(
        {"gap_last"}
    )
    publish_batch(hub, "a", 0, 1, batch(stored(1)))
    publish_notice(hub, "unrecovered_gap", "a", 0, first=2, until=4, count=3, reason="evicted")
    publish_notice(hub, "stale", "a", 0, reason="unrecovered", seq=2, detail="3 batches lost (evicted)")
    late = subscribe(hub, "compat=gap_last", last_event_id=f"{hub.epoch}:0")  # the same from the ring
    assert late.recovered
    mine, theirs, resumed = drain(plain), drain(early), drain(late)
    assert [decode(m)["offset"] for m in mine] == [1, 2, 3]
    assert "last" not in decode(mine[1])
    for got in (theirs, resumed):
        assert decode(got[1]) == {**decode(mine[1]), "last": "4"}
        assert got[1].id == mine[1].id == f"{hub.epoch}:2"
        # what has no deprecated copy is the very message every client shares
        assert got[0] is mine[0] and got[2] is mine[2]
    assert theirs[1] is resumed[1]  # encoded once, for every client that asks
    assert messages.with_deprecated_copies(theirs[1]) is theirs[1]


def test_a_client_that_asks_for_int_seqs_gets_numbers_live_and_on_resume_and_the_others_pay_nothing() -> None:
    hub = make_hub()
    plain, early = subscribe(hub), subscribe(hub, "compat=int_seqs")
    both = subscribe(hub, "compat=int_seqs&compat=gap_last&type=BlockStored")
    publish_batch(hub, "a", 0, TRT_SEQ, batch(stored(1), removed(1)))
    publish_notice(hub, "restart", "a", 0, seq=TRT_SEQ + 7, previous=-1, reason="jump")
    publish_notice(hub, "unrecovered_gap", "a", 0, first=TRT_SEQ, until=TRT_SEQ + 2, count=3, reason="evicted")
    publish_notice(hub, "stale", "a", 0, reason="unrecovered", seq=TRT_SEQ, detail="3 batches lost (evicted)")
    publish_notice(hub, "down", "a", 0, reason="disconnected", reason_code="disconnected")
    late = subscribe(hub, "compat=int_seqs", last_event_id=f"{hub.epoch}:0")  # the same from the ring
    mine, theirs, resumed, filtered = drain(plain), drain(early), drain(late), drain(both)
    strings = [decode(m) for m in mine]
    assert (strings[0]["seq"], strings[1]["seq"], strings[1]["previous"]) == (str(TRT_SEQ), str(TRT_SEQ + 7), None)
    assert (strings[2]["first"], strings[2]["until"], strings[3]["seq"]) == (
        str(TRT_SEQ),
        str(TRT_SEQ + 2),
        str(TRT_SEQ),
    )
    for got in (theirs, resumed):
        numbers = [decode(m) for m in got]
        assert [m.id for m in got] == [m.id for m in mine]
        assert numbers[0] == {**strings[0], "seq": TRT_SEQ}  # exact: Python's json reads any integer
        assert numbers[1] == {**strings[1], "seq": TRT_SEQ + 7, "previous": -1}  # as 0.1 sent it
        assert numbers[2] == {**strings[2], "first": TRT_SEQ, "until": TRT_SEQ + 2}
        assert numbers[3] == {**strings[3], "seq": TRT_SEQ}
        assert got[4] is mine[4]  # nothing to change: the shared message itself
    assert all(a is b for a, b in zip(theirs, resumed, strict=True))  # made once, shared
    assert all(messages.with_int_seqs(m) is m for m in theirs)
    # a filtered batch, and a gap notice with its deprecated copy: numbers as well
    first, gap = decode(filtered[0]), decode(filtered[2])
    assert (first["seq"], [e["type"] for e in first["events"]]) == (TRT_SEQ, ["BlockStored"])
    assert (gap["first"], gap["until"], gap["last"]) == (TRT_SEQ, TRT_SEQ + 2, TRT_SEQ + 2)
    # the hello's statuses too (and a status notice's: the same conversion)
    numbers, strings_ = decode(late.hello_message)["sources"], decode(subscribe(hub).hello_message)["sources"]
    assert [s["last_seq"] for s in strings_] == [
        None if s["dp_rank"] == 1 else str(TRT_SEQ + s["dp_rank"]) for s in strings_
    ]
    assert numbers == [{**s, "last_seq": None if s["last_seq"] is None else int(s["last_seq"])} for s in strings_]


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


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        ("slow_consumer", {"reason": "x"}),
        ("nonsense", {"reason": "x"}),
        ("restart", {"seq": 1, "reason": "x"}),
        ("restart", {"seq": 1, "previous": 0, "reason": "x", "extra": 1}),
        ("restart", {"seq": True, "previous": 0, "reason": "x"}),
        ("restart", {"seq": 0, "previous": -2, "reason": "x"}),
        ("unrecovered_gap", {"first": -1, "until": 2, "count": 1, "reason": "x"}),
        ("unrecovered_gap", {"first": 1, "last": 2, "count": 2, "reason": "x"}),  # the old name is sent, not taken
        ("degraded", {"reason": "x"}),
        ("degraded", {"reason": "x", "reason_code": "restart"}),  # restart losses do not degrade
        ("up", {}),
        ("down", {"reason": 5}),
        ("down", {"reason": "x", "reason_code": "gone"}),  # a closed vocabulary
        ("stale", {"reason": "unrecovered", "seq": None, "detail": "x"}),
    ],
)
def test_bad_stream_notices_are_refused_without_using_an_offset(kind: str, fields: dict[str, Any]) -> None:
    hub = make_hub()
    with pytest.raises(messages.NoticeError):
        publish_notice(hub, kind, "a", 0, **fields)
    assert hub.offset == 0
    assert len(ring(hub)) == 0


# --- resume -------------------------------------------------------------------------------


def test_resume_inside_the_ring_replays_exactly_the_missed_messages_then_live() -> None:
    hub = make_hub()
    watcher = subscribe(hub)
    for seq in range(5):
        publish_batch(hub, "a", 0, seq, batch(stored(seq)))
    publish_notice(hub, "down", "a", 0, reason="gone")
    seen = drain(watcher)
    last = seen[1]  # the client had read offsets 1 and 2 when it dropped
    assert last.id is not None
    sub = subscribe(hub, f"last_event_id={last.id}")
    assert sub.recovered
    backlog = drain(sub)
    hello = sub.hello_message
    assert sub.offset == 2
    assert decode(hello) == {
        "type": "hello",
        "epoch": hub.epoch,
        "offset": 2,
        "recovered": True,
        "sources": statuses(),
        "occupancy": None,
    }
    assert hello.id == last.id
    assert [m.data for m in backlog] == [m.data for m in seen[2:]]
    assert offsets(backlog) == [3, 4, 5, 6]
    publish_batch(hub, "a", 0, 9, batch(stored(9)))
    assert offsets(drain(sub)) == [7]
    assert sample(hub, "kvgateway_resumes_total", transport="ws", recovered="true") == 1


def test_resume_hand_over_has_no_gap_and_no_duplicate_at_any_point() -> None:
    hub = make_hub()
    total = 30
    clients: list[Subscription] = []
    for n in range(1, total + 1):
        for start in range(max(0, n - 3), n):  # resume from a few points behind the head
            clients.append(subscribe(hub, f"last_event_id={hub.epoch}:{start}"))
        publish_batch(hub, "a", n % 2, n, batch(stored(n)))
    for sub in clients:
        start = sub.offset
        assert sub.recovered
        assert offsets(drain(sub)) == list(range(start + 1, total + 1))


def test_a_client_that_reconnects_mid_stream_sees_every_message_once() -> None:
    hub = make_hub()
    total = 300

    async def publisher() -> None:
        for n in range(1, total + 1):
            publish_batch(hub, "a", 0, n, batch(stored(n)))
            if n % 7 == 0:
                await asyncio.sleep(0)

    async def client() -> list[int]:
        seen: list[int] = []
        last_id: str | None = None
        while not seen or seen[-1] < total:
            sub = subscribe(hub, transport="sse", last_event_id=last_id)
            assert sub.recovered == (last_id is not None)
            last_id = sub.hello_message.id  # what EventSource remembers after the hello
            for _ in range(3):  # a few frames, then the connection drops
                chunk = await next_chunk(sub)
                assert chunk is not None
                for message in chunk:
                    last_id = message.id
                    seen.append(decode(message)["offset"])
                if seen and seen[-1] == total:
                    break
            sub.close()
        return seen

    async def scenario() -> list[int]:
        seen, _ = await asyncio.gather(client(), publisher())
        return seen

    assert run(scenario()) == list(range(1, total + 1))
    assert sample(hub, "kvgateway_resumes_total", transport="sse", recovered="true") > 3


def test_resume_applies_the_filters_to_the_backlog() -> None:
    hub = make_hub()
    publish_batch(hub, "a", 0, 1, batch(stored(1), removed(1)))  # 1
    publish_batch(hub, "b", 0, 1, batch(removed(2)))  # 2
    publish_batch(hub, "a", 0, 2, batch(stored(3)))  # 3
    publish_notice(hub, "degraded", "a", 0, reason="x", reason_code="evicted")  # 4
    publish_batch(hub, "a", 1, 2, batch(removed(4)))  # 5
    sub = subscribe(hub, f"last_event_id={hub.epoch}:0&type=BlockRemoved&source=a")
    backlog = drain(sub)
    assert offsets(backlog) == [1, 4, 5]
    assert [e["type"] for e in decode(backlog[0])["events"]] == ["BlockRemoved"]


def test_resume_boundaries_of_the_ring() -> None:
    hub = make_hub(ring_messages=5)
    for seq in range(10):
        publish_batch(hub, "a", 0, seq, batch(stored(seq)))
    assert (ring(hub).first_offset, ring(hub).last_offset) == (6, 10)
    at_edge = subscribe(hub, last_event_id=f"{hub.epoch}:5")
    assert at_edge.recovered
    assert offsets(drain(at_edge)) == [6, 7, 8, 9, 10]
    at_head = subscribe(hub, last_event_id=f"{hub.epoch}:10")
    assert at_head.recovered
    assert drain(at_head) == []
    fresh_hub = make_hub()
    from_zero = subscribe(fresh_hub, last_event_id=f"{fresh_hub.epoch}:0")
    assert from_zero.recovered


@pytest.mark.parametrize(
    "make_id",
    [
        lambda hub: "0123456789abcdef:3",  # another epoch (another process)
        lambda hub: f"{hub.epoch}:4",  # fell out of the ring
        lambda hub: f"{hub.epoch}:1",
        lambda hub: f"{hub.epoch}:11",  # in the future
        lambda hub: f"{hub.epoch}:99999999999999999999",
        lambda hub: f"{hub.epoch}",  # malformed
        lambda hub: f"{hub.epoch}:",
        lambda hub: f"{hub.epoch}:-1",
        lambda hub: f"{hub.epoch}:+7",
        lambda hub: f"{hub.epoch}:7 ",
        lambda hub: f"{hub.epoch}:7:7",
        lambda hub: ":7",
        lambda hub: "garbage",
    ],
)
def test_unrecoverable_ids_get_a_snapshot_and_no_replay(make_id: Any) -> None:
    hub = make_hub(ring_messages=5)
    for seq in range(10):
        publish_batch(hub, "a", 0, seq, batch(stored(seq)))
    sub = subscribe(hub, last_event_id=make_id(hub))
    assert not sub.recovered
    assert drain(sub) == []
    assert decode(sub.hello_message)["occupancy"] == snapshot(10)
    assert decode(sub.hello_message)["offset"] == sub.offset == 10
    assert sample(hub, "kvgateway_resumes_total", transport="ws", recovered="false") == 1
    publish_batch(hub, "a", 0, 10, batch(stored(10)))
    assert offsets(drain(sub)) == [11]


def test_no_or_empty_last_event_id_is_a_fresh_client_not_a_resume() -> None:
    hub = make_hub()
    publish_batch(hub, "a", 0, 0, batch())
    for sub in (subscribe(hub), subscribe(hub, "last_event_id=")):
        assert not sub.recovered
        assert drain(sub) == []
    assert sample(hub, "kvgateway_resumes_total", transport="ws", recovered="false") == 0


def test_resume_after_is_all_or_nothing() -> None:
    assert resume_after("e:4", epoch="e", first_offset=5, last_offset=9) == 4
    assert resume_after("e:9", epoch="e", first_offset=5, last_offset=9) == 9
    assert resume_after("e:3", epoch="e", first_offset=5, last_offset=9) is None
    assert resume_after("e:10", epoch="e", first_offset=5, last_offset=9) is None
    assert resume_after("f:6", epoch="e", first_offset=5, last_offset=9) is None
    assert resume_after("e:0", epoch="e", first_offset=1, last_offset=0) == 0
    assert messages.parse_message_id("ab:12") == ("ab", 12)
    assert messages.parse_message_id("ab:12\n") is None


# --- the ring -----------------------------------------------------------------------------


def test_ring_bound_by_count() -> None:
    hub = make_hub(ring_messages=3)
    for seq in range(7):
        publish_batch(hub, "a", 0, seq, batch(stored(seq)))
    assert len(ring(hub)) == 3
    assert (ring(hub).first_offset, ring(hub).last_offset) == (5, 7)
    assert [e.offset for e in ring(hub).since(4)] == [5, 6, 7]
    with pytest.raises(ValueError, match="no longer"):
        ring(hub).since(3)
    assert sample(hub, "kvgateway_ring_messages") == 3
    assert sample(hub, "kvgateway_ring_bytes") == ring(hub).bytes


def test_ring_bound_by_bytes_and_an_oversized_message_is_live_only() -> None:
    hub = make_hub(ring_bytes=1000)
    sizes = []
    for seq in range(20):
        publish_batch(hub, "a", 0, seq, batch(stored(seq)))
        sizes.append(len(ring(hub).since(hub.offset - 1).__next__().message.data))
    assert ring(hub).bytes <= 1000
    assert ring(hub).bytes + sizes[0] > 1000  # as many as fit, no fewer
    assert ring(hub).bytes == sum(sizes[-len(ring(hub)) :])
    sub = subscribe(hub)
    publish_batch(hub, "a", 0, 99, batch(stored(*range(500))))
    assert len(ring(hub)) == 0
    assert ring(hub).first_offset == hub.offset + 1
    assert offsets(drain(sub)) == [21]
    assert subscribe(hub, last_event_id=f"{hub.epoch}:21").recovered
    assert not subscribe(hub, last_event_id=f"{hub.epoch}:20").recovered


def test_filtered_variants_count_towards_the_ring_bytes() -> None:
    hub = make_hub()
    publish_batch(hub, "a", 0, 1, batch(stored(1), removed(2)))
    before = ring(hub).bytes
    sub = subscribe(hub, f"last_event_id={hub.epoch}:0&type=BlockRemoved")
    variant = drain(sub)[0]
    assert ring(hub).bytes == before + len(variant.data)
    assert sample(hub, "kvgateway_ring_bytes") == ring(hub).bytes


def test_ring_refuses_out_of_order_offsets_and_negative_bounds() -> None:
    hub = make_hub()
    publish_batch(hub, "a", 0, 1, batch())
    publish_batch(hub, "a", 0, 2, batch())
    _, second = ring(hub).since(0)
    with pytest.raises(ValueError, match="expected offset 1"):
        Ring(10, 10).append(second)
    with pytest.raises(ValueError):
        Ring(-1, 10)


# --- client queues ------------------------------------------------------------------------


def test_slow_consumer_is_cut_while_the_others_continue() -> None:
    hub = make_hub(client_queue_bytes=4096)
    slow = subscribe(hub, transport="sse")
    fast = subscribe(hub)
    drain(slow)
    stuck_writing(slow)  # its route is stuck writing to a client that does not read
    received: list[OutMessage] = drain(fast)
    n = 0
    while slow.closed_reason is None:
        n += 1
        publish_batch(hub, "a", 0, n, batch(stored(n, n + 1, n + 2)))
        received += drain(fast)
        assert n < 1000
    assert slow.closed_reason == "slow_consumer"
    assert slow.queued_bytes == 0
    assert run(next_chunk(slow)) is None
    farewell = slow.farewell()
    assert farewell is not None
    assert farewell.id is None
    assert decode(farewell)["kind"] == "slow_consumer"
    assert list(decode(farewell)) == ["type", "kind", "reason"]
    assert farewell.sse.startswith(b"event: notice\ndata: ")
    assert fast.farewell() is None
    for more in range(3):
        publish_batch(hub, "a", 0, n + 1 + more, batch(stored(0)))
    received += drain(fast)
    assert offsets(received) == list(range(1, n + 4))
    assert hub.client_count == 1
    assert sample(hub, "kvgateway_client_disconnects_total", transport="sse", reason="slow_consumer") == 1
    assert sample(hub, "kvgateway_clients", transport="sse") == 0
    assert sample(hub, "kvgateway_clients", transport="ws") == 1
    slow.close()  # the route's finally: nothing more is counted
    assert sample(hub, "kvgateway_client_disconnects_total", transport="sse", reason="closed") == 0


def test_one_message_larger_than_the_bound_still_reaches_an_idle_client() -> None:
    hub = make_hub(client_queue_bytes=100)
    sub = subscribe(hub)
    drain(sub)
    stuck_writing(sub)
    publish_batch(hub, "a", 0, 1, batch(stored(*range(100))))
    assert sub.closed_reason is None
    publish_batch(hub, "a", 0, 2, batch(stored(1)))
    assert sub.closed_reason == "slow_consumer"


def test_hello_and_resume_backlog_do_not_count_against_the_queue_bound() -> None:
    hub = make_hub(client_queue_bytes=2000)
    for seq in range(100):
        publish_batch(hub, "a", 0, seq, batch(stored(seq)))
    sub = subscribe(hub, last_event_id=f"{hub.epoch}:0")
    assert sub.queued_bytes > 10_000
    for seq in range(5):  # live messages behind the backlog: a few hundred bytes
        publish_batch(hub, "a", 0, 100 + seq, batch(stored(seq)))
    assert sub.closed_reason is None
    assert offsets(drain(sub)) == list(range(1, 106))
    stuck_writing(sub)
    for seq in range(100):
        publish_batch(hub, "a", 0, 200 + seq, batch(stored(seq)))
        if sub.closed_reason:
            break
    assert sub.closed_reason == "slow_consumer"  # the bound applies to live messages


def test_a_client_waiting_for_its_turn_is_not_cut() -> None:
    # A burst larger than the bound while the client's writer is not blocked on its socket
    # (the loop was busy publishing): the writer drains it at its next turn.
    hub = make_hub(client_queue_bytes=500)
    sub = subscribe(hub)
    drain(sub)
    for seq in range(50):
        publish_batch(hub, "a", 0, seq, batch(stored(seq)))
    assert sub.closed_reason is None
    assert offsets(drain(sub)) == list(range(1, 51))


def test_next_chunk_returns_everything_pending_up_to_the_byte_cap() -> None:
    hub = make_hub()
    sub = subscribe(hub)
    for seq in range(10):
        publish_batch(hub, "a", 0, seq, batch(stored(seq)))

    async def chunks() -> tuple[list[OutMessage], list[OutMessage], list[OutMessage]]:
        first = await next_chunk(sub, max_bytes=1)  # never less than one message
        assert first is not None
        size = len(sub._queue[0].data) * 3
        second = await next_chunk(sub, max_bytes=size)
        rest = await next_chunk(sub)
        assert second is not None
        assert rest is not None
        return first, second, rest

    first, second, rest = run(chunks())
    assert offsets(first) == [1]
    assert offsets(second) == [2, 3, 4]
    assert offsets(rest) == list(range(5, 11))
    assert sub.queued_bytes == 0
    frame = messages.ws_text(rest)
    assert frame.split("\n") == [m.text for m in rest]
    assert not frame.endswith("\n")
    assert messages.ws_text(rest[:1]) is rest[0].text
    sse = messages.sse_bytes(rest)
    assert sse.count(b"\n\n") == len(rest)
    assert sse.startswith(f"id: {hub.epoch}:5\nevent: batch\ndata: {{".encode())
    assert sample(hub, "kvgateway_messages_sent_total", transport="ws") == 10
    assert sample(hub, "kvgateway_client_queue_bytes_count") == 3


def test_next_chunk_waits_for_a_publish_and_close_wakes_it() -> None:
    hub = make_hub()

    async def scenario() -> None:
        sub = subscribe(hub)
        waiting = asyncio.ensure_future(next_chunk(sub))
        await asyncio.sleep(0)
        assert not waiting.done()
        with pytest.raises(RuntimeError, match="already"):
            await next_chunk(sub)
        publish_batch(hub, "a", 0, 1, batch(stored(1)))
        chunk = await asyncio.wait_for(waiting, 1)
        assert chunk is not None
        assert offsets(chunk) == [1]
        waiting = asyncio.ensure_future(next_chunk(sub))
        await asyncio.sleep(0)
        hub.close()
        assert await asyncio.wait_for(waiting, 1) is None
        assert sub.closed_reason == "shutdown"
        # a cancelled wait leaves the subscription usable
        other = make_hub()
        sub2 = subscribe_request(other, ClientRequest(ClientFilter()), "sse")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(next_chunk(sub2), 0.01)
        publish_batch(other, "a", 0, 1, batch())
        assert await asyncio.wait_for(next_chunk(sub2), 1) is not None

    run(scenario())
    assert sample(hub, "kvgateway_client_disconnects_total", transport="ws", reason="shutdown") == 1
    assert not hub.can_accept()
    with pytest.raises(TooManyClients):
        subscribe(hub)


def test_max_clients_and_close_accounting() -> None:
    hub = make_hub(max_clients=2)
    one = subscribe(hub)
    subscribe(hub, transport="sse")
    assert not hub.can_accept()
    with pytest.raises(TooManyClients):
        subscribe(hub)
    assert sample(hub, "kvgateway_client_rejections_total", transport="ws", reason="too_many_clients") == 0  # route's
    one.close("error")
    one.close("closed")
    assert sample(hub, "kvgateway_client_disconnects_total", transport="ws", reason="error") == 1
    assert sample(hub, "kvgateway_client_disconnects_total", transport="ws", reason="closed") == 0
    assert hub.client_count == 1
    assert hub.can_accept()
    assert run(next_chunk(one)) is None
    publish_batch(hub, "a", 0, 1, batch())  # a closed client gets nothing
    assert one.queued_bytes == 0
    assert sample(hub, "kvgateway_clients", transport="ws") == 0
    assert sample(hub, "kvgateway_broadcast_seconds_count") == 1


# --- query parameters ---------------------------------------------------------------------


def test_parse_query_accepts_repeated_values_and_normalizes() -> None:
    request = parse_query(
        QueryParams("source=a&source=b&dp_rank=0&dp_rank=01&type=BlockStored&medium=cpu&medium=CPU&token=x"),
        sources=["a", "b"],
    )
    assert request == ClientRequest(
        ClientFilter(
            sources=frozenset({"a", "b"}),
            dp_ranks=frozenset({0, 1}),
            types=frozenset({"BlockStored"}),
            mediums=frozenset({"CPU"}),
        ),
        None,
    )
    assert parse_query({"source": ["a"], "last_event_id": ["e:1"]}, sources=["a"]).last_event_id == "e:1"
    assert parse_query({"last_event_id": ["e:1"]}, last_event_id="e:2").last_event_id == "e:2"
    assert parse_query({"last_event_id": ["e:1"]}, last_event_id="").last_event_id == "e:1"
    assert parse_query({}).filter == ClientFilter()
    assert parse_query({"source": ["anything"]}).filter.sources == frozenset({"anything"})


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("sources=a", "sources"),
        ("Source=a", "Source"),
        ("source=c", "source"),
        ("source=", "source"),
        ("dp_rank=-1", "dp_rank"),
        ("dp_rank=x", "dp_rank"),
        ("dp_rank=1_0", "dp_rank"),
        ("dp_rank=%201", "dp_rank"),
        ("dp_rank=1234567890", "dp_rank"),
        ("type=", "type"),
        ("type=Block%20Stored", "type"),
        ("medium=gpu%0A", "medium"),
        ("last_event_id=a&last_event_id=b", "last_event_id"),
        ("compat=last", "compat"),
        ("compat=", "compat"),
        ("digest=0", "digest"),
        ("digest=3601", "digest"),
        ("digest=1.5", "digest"),
        ("digest=", "digest"),
        ("digest=5&digest=5", "digest"),
        ("digest=5&type=BlockStored", "digest"),
        ("=x", "''"),
    ],
)
def test_parse_query_rejects_with_one_line_naming_the_parameter(query: str, parameter: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_query(QueryParams(query), sources=["a", "b"])
    message = caught.value.message
    assert str(caught.value) == message
    assert parameter in message
    assert len(message.splitlines()) == 1


def test_an_unknown_compat_value_says_which_there_are() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_query(QueryParams("compat=gap_until"))
    assert caught.value.message == "compat: expected gap_last or int_seqs, got 'gap_until'"


def test_parse_query_limits_distinct_values() -> None:
    many = [f"T{i}" for i in range(MAX_VALUES + 1)]
    assert parse_query({"type": many[:MAX_VALUES]}).filter.types is not None
    with pytest.raises(BadRequest, match="type: more than"):
        parse_query({"type": many})


_names = st.one_of(st.sampled_from(PARAMETERS), st.text(max_size=12))
_values = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["a", "b", "0", "7", "-1", "BlockStored", "gpu", "CPU", "x:1", ""]),
    st.integers(-5, 10**12).map(str),
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_names, st.lists(_values, max_size=4), max_size=6), st.none() | st.text(max_size=10))
def test_parse_query_returns_a_valid_request_or_bad_request(params: dict[str, list[str]], header: str | None) -> None:
    try:
        request = parse_query(params, sources=["a", "b"], last_event_id=header)
    except BadRequest as exc:
        assert exc.message
        assert len(exc.message.splitlines()) == 1
        return
    assert {name for name, values in params.items() if values} <= set(PARAMETERS)  # a name without values is absent
    f = request.filter
    for name, got in (("source", f.sources), ("dp_rank", f.dp_ranks), ("type", f.types), ("medium", f.mediums)):
        assert (got is None) == (not params.get(name))
    assert f.sources is None or f.sources <= {"a", "b"}
    assert f.dp_ranks is None or all(r >= 0 for r in f.dp_ranks)
    assert f.mediums is None or all(m == m.upper() for m in f.mediums)
    assert request.last_event_id != ""
    if header:
        assert request.last_event_id == header


# --- the schema ---------------------------------------------------------------------------


def test_every_message_validates_against_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(messages.schema_bytes())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    hub = make_hub(client_queue_bytes=1)
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
    hello["occupancy"] = snapshot(0)
    assert not validator.is_valid(hello)  # recovered hellos carry no snapshot


def test_tiers_lenient_fields_and_a_real_snapshot_validate_against_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from kvgateway.state.occupancy import OccupancyIndex

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


def test_every_v1_route_declares_what_it_accepts_and_its_400_lists_exactly_that() -> None:
    from kvgateway.serve.app import ROUTES

    assert {route.path for route in ROUTES if route.path.startswith("/v1/")} == set(ROUTE_PARAMETERS)
    for route, accepted in ROUTE_PARAMETERS.items():
        assert "token" in accepted
        with pytest.raises(BadRequest) as info:
            route_query(route, [("x", "1")])
        assert info.value.message == f"unknown query parameter 'x' (accepted: {', '.join(accepted)})"
    client, own = route_query("/v1/history", [("source", "a"), ("step", "10"), ("since", "1"), ("step", "5")])
    assert client.filter.sources == frozenset({"a"}) and own == {"step": ["10", "5"], "since": ["1"]}
    with pytest.raises(BadRequest, match=r"^unknown query parameter 'type' "):
        route_query("/v1/occupancy", {"type": ["BlockStored"]})


# --- digest messages (digest=SECONDS) ----------------------------------------------------------


def test_digest_messages_come_in_order_at_the_offset_per_selected_stream() -> None:
    """A due client gets, per stream its filter selects, the digest of the index after the log's
    last offset, behind every message it was queued before; then again every SECONDS."""
    hub = make_hub()
    index = OccupancyIndex()
    hub.log.follow(index.follow)
    now = [100.0]
    ticker = DigestTicker(hub, index, lambda: STREAMS, lambda: now[0])
    every = subscribe(hub, "digest=5&source=a")
    gpu = subscribe(hub, "digest=5&source=a&dp_rank=0&medium=gpu")
    plain = subscribe(hub, "source=a")
    publish_batch(hub, "a", 0, 0, batch(stored(1, 2), stored(BIG, medium="cpu"), removed(2)))
    assert ticker.tick() == 3  # a/0 and a/1 for the first client, a/0 for the second
    gpu_part = element("GPU", 0, 1)
    both = (gpu_part + element("CPU", 0, BIG)) & MASK
    first = [decode(m) for m in drain(every)]
    assert first[0]["type"] == "batch"
    assert first[1:] == [
        {"type": "digest", "source": "a", "dp_rank": 0, "offset": 1, "digest": hex_digest(both), "block_count": 2},
        {"type": "digest", "source": "a", "dp_rank": 1, "offset": 1, "digest": EMPTY, "block_count": 0},
    ]
    assert [decode(m).get("digest") for m in drain(gpu)] == [None, hex_digest(gpu_part)]  # the medium filter's sum
    assert [decode(m)["type"] for m in drain(plain)] == ["batch"]  # only to those who asked
    publish_notice(hub, "restart", "a", 0, seq=0, previous=5, reason="seq_reset")  # empties the stream
    now[0] += 4.9
    assert ticker.tick() == 0  # not due yet
    now[0] += 0.1
    assert ticker.tick() == 3
    (notice, digest, _) = [decode(m) for m in drain(every)]
    assert (notice["kind"], digest["offset"], digest["digest"], digest["block_count"]) == ("restart", 2, EMPTY, 0)
    assert [m.id for m in drain(gpu) if m.type == "digest"] == [None]  # not a resume point


def test_a_client_too_slow_for_its_digest_is_cut_and_a_closed_one_forgotten() -> None:
    hub = make_hub(client_queue_bytes=400)
    index = OccupancyIndex()
    ticker = DigestTicker(hub, index, lambda: STREAMS, lambda: 0.0)
    slow = subscribe(hub, "digest=1")
    stuck_writing(slow)
    publish_batch(hub, "a", 0, 0, batch(stored(*range(20))))
    assert slow.closed_reason is None  # the batch fits
    assert ticker.tick() == 0  # its first digest does not
    assert slow.closed_reason == "slow_consumer"
    gone = subscribe(hub, "digest=1")
    gone.close()
    assert hub.digest_clients == [] and ticker.tick() == 0
