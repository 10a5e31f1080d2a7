"""The routers' wiring without sockets: a Serving built but not started, fed through its ordered log.

The snapshot hand-over (state at the hello's offset, then exactly the live messages after it), the
snapshot slots and the queue bound while the state is written, the learner following the log and
its metrics, the fleet facts and their gauges.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
from functools import partial
from typing import Any

import pytest

from kvgateway.config import Settings, SourceConfig
from kvgateway.engine.wire import AllBlocksCleared, Event
from kvgateway.log.records import batch_record
from kvgateway.protocol.filters import ClientFilter
from kvgateway.runtime.metrics import Metrics
from kvgateway.serve import router_state
from kvgateway.serve.query import ClientRequest
from kvgateway.serve.router_state import TooManySnapshots, without_gc
from kvgateway.serve.serving import Serving
from kvgateway.serve.sessions import _hello, _state
from kvgateway.state.blocks import blocks_document, capture, encoded_state_messages, state_messages
from kvgateway.state.lookup import TokenQuery, block_digests
from tests.support import events
from tests.support.events import batch, removed
from tests.support.waits import until

SIZE = 4


def make_gateway(**changes: Any) -> Serving:
    """The serving half over a memory log that the tests append to (no ingest, no sockets)."""
    source = SourceConfig(name="a", endpoint="tcp://127.0.0.1:1", dp_size=2)
    other = SourceConfig(name="b", endpoint="tcp://127.0.0.1:3")
    return Serving(Settings(sources=(source, other), **changes), Metrics())


def feed(gateway: Serving, stream: tuple[str, int], *events: Event) -> int:
    seq = gateway.log.last_offset
    return gateway.log.append(
        batch_record(stream, seq, batch(*events, dp_rank=stream[1]), received=0.0, replayed=False)
    )


stored = partial(events.stored, block_size=SIZE)


def churn(gateway: Serving, rng: random.Random, steps: int) -> None:
    pool = [rng.getrandbits(64) for _ in range(40)]
    streams = [("a", 0), ("a", 1), ("b", 0)]
    for _ in range(steps):
        stream = rng.choice(streams)
        roll = rng.random()
        if roll < 0.6:
            feed(gateway, stream, stored(*rng.sample(pool, rng.randint(1, 5)), medium=rng.choice(["GPU", "cpu"])))
        elif roll < 0.95:
            feed(gateway, stream, removed(*rng.sample(pool, 3), medium=rng.choice(["GPU", "cpu"])))
        else:
            feed(gateway, stream, AllBlocksCleared())


def lines(messages: Any) -> list[dict[str, Any]]:
    return [json.loads(m.data) for m in messages]


def model_blocks(doc: dict[str, Any]) -> set[tuple[Any, ...]]:
    return {
        (s["source"], s["dp_rank"], b["medium"], b["group_idx"], b["hash"], b["refs"])
        for s in doc["streams"]
        for b in s["blocks"]
    }


def apply_live(blocks: set[tuple[Any, ...]], message: dict[str, Any]) -> None:
    """A tiny router: reference counts from batches (only what churn() produces)."""
    key = (message["source"], message["dp_rank"])
    for event in message["events"]:
        if event["type"] == "AllBlocksCleared":
            blocks -= {b for b in blocks if b[:2] == key}
            continue
        medium = (event.get("medium") or "GPU").upper()
        for h in event["block_hashes"]:
            old = next((b for b in blocks if b[:5] == (*key, medium, 0, h)), None)
            refs = 0 if old is None else old[5]
            if old is not None:
                blocks.discard(old)
            refs += 1 if event["type"] == "BlockStored" else -1
            if refs > 0:
                blocks.add((*key, medium, 0, h, refs))


@pytest.mark.parametrize("seed", range(3))
def test_state_then_live_equals_the_index_at_every_later_offset(seed: int) -> None:
    rng = random.Random(seed)
    gateway = make_gateway()
    churn(gateway, rng, 80)
    sub = gateway.subscribe_held(ClientRequest(ClientFilter(), snapshot="blocks"), "ws")
    assert sub.snapshot is not None and sub.snapshot.offset == sub.offset == gateway.log.last_offset
    churn(gateway, rng, 40)  # live, queued while the state is (not yet) written
    states = lines(_state(sub))
    assert states[-1]["last"] and sub.snapshot is None and gateway.routers.snapshots == 0
    assert {m["offset"] for m in states} == {sub.offset}
    assert sorted((m["source"], m["dp_rank"]) for m in states if m["last"]) == [("a", 0), ("a", 1), ("b", 0)]
    blocks = model_blocks({"streams": [{**m, "blocks": m["blocks"]} for m in states]})
    live = lines(sub.take(2**30))
    assert [m["offset"] for m in live] == list(range(sub.offset + 1, gateway.log.last_offset + 1))
    for message in live:
        apply_live(blocks, message)
    doc = blocks_document(gateway.log.epoch, gateway.log.last_offset, capture(gateway.index.streams()))
    assert blocks == model_blocks(doc)
    sub.close()


def test_a_resumed_client_gets_no_state_and_sse_hello_hides_its_id() -> None:
    gateway = make_gateway()
    feed(gateway, ("a", 0), stored(1, 2))
    sse = gateway.subscribe_held(ClientRequest(ClientFilter(sources=frozenset({"a"})), snapshot="blocks"), "sse")
    assert _hello(sse).id is None and b"id:" not in _hello(sse).sse
    states = list(_state(sse))
    assert [m.id for m in states] == [None, sse.hello_message.id]  # a[0] then a[1]; the last has the id
    resumed = gateway.subscribe_held(
        ClientRequest(ClientFilter(), last_event_id=sse.hello_message.id, snapshot="blocks"), "sse"
    )
    assert resumed.recovered and resumed.snapshot is None and _hello(resumed) is resumed.hello_message
    sse.close()
    resumed.close()


def test_snapshot_slots_are_bounded_and_freed() -> None:
    gateway = make_gateway(max_snapshots=2)
    request = ClientRequest(ClientFilter(), snapshot="blocks")
    first = gateway.subscribe_held(request, "ws")
    second = gateway.subscribe_held(request, "ws")
    with pytest.raises(TooManySnapshots):
        gateway.subscribe_held(request, "ws")
    assert gateway.metrics.registry.get_sample_value("kvgateway_clients", {"transport": "ws"}) == 2
    list(_state(first))  # sent: its slot is free
    third = gateway.subscribe_held(request, "sse")
    assert gateway.routers.snapshots == 2
    second.close()
    for message in _state(second):  # a closed client's state stops at once and frees its slot
        raise AssertionError(f"sent {message!r} to a closed client")
    assert gateway.routers.snapshots == 1
    first.close()
    third.close()


def test_live_messages_behind_the_state_are_bounded_by_snapshot_queue_bytes() -> None:
    gateway = make_gateway(snapshot_queue_bytes=4096, client_queue_bytes=1024)
    sub = gateway.subscribe_held(ClientRequest(ClientFilter(), snapshot="blocks"), "ws")
    n = 0
    while sub.closed_reason is None:
        feed(gateway, ("a", 0), stored(n))
        n += 1
        assert n < 1000
    assert sub.closed_reason == "slow_consumer" and 2 < n < 60  # about 4096 bytes of batches
    assert list(_state(sub)) == [] and gateway.routers.snapshots == 0


def test_the_learner_follows_the_log_and_answers_by_tokens() -> None:
    gateway = make_gateway(max_learned_blocks=8)
    tokens = list(range(3 * SIZE))
    feed(gateway, ("a", 1), stored(11, 12, 13, tokens=tokens))
    feed(gateway, ("b", 0), stored(21, 22, tokens=tokens[: 2 * SIZE]))
    routers = gateway.routers
    assert len(routers.learner) == 5
    answer = routers.lookup(list(gateway.index.streams()), TokenQuery(tokens), gateway.log.last_offset)
    assert [(s["source"], s["dp_rank"], s["blocks"], s["tokens"]) for s in answer["streams"][:2]] == [
        ("a", 1, 3, 3 * SIZE),
        ("b", 0, 2, 2 * SIZE),
    ]
    assert block_digests(tokens, SIZE)  # the content is what the chain is keyed by
    for n in range(10):  # past the cap: non-resident entries go first
        feed(gateway, ("b", 0), stored(100 + n, tokens=[n] * SIZE))
        feed(gateway, ("b", 0), removed(100 + n))
    assert len(routers.learner) <= 8
    gateway.routers.refresh_gauges()
    assert gateway.metrics.learned_blocks._value.get() == len(routers.learner)
    assert gateway.metrics.learned_evictions._value.get() == routers.learner.evicted > 0
    kept = routers.lookup(list(gateway.index.streams()), TokenQuery(tokens), gateway.log.last_offset)
    assert kept["streams"][0]["blocks"] == 3  # resident chains got their second chance


def test_the_learners_cap_follows_the_fleets_resident_blocks() -> None:
    from kvgateway.serve.router_state import LEARNER_FOLLOWS_EVERY
    from kvgateway.state.learner import LEARNED_FLOOR, LEARNED_PER_RESIDENT

    gateway = make_gateway()
    learner = gateway.routers.learner
    assert learner.cap == LEARNED_FLOOR  # nothing resident yet: the floor
    blocks = LEARNED_FLOOR  # enough that the cap leaves the floor
    step = blocks // LEARNER_FOLLOWS_EVERY + 1
    for n in range(LEARNER_FOLLOWS_EVERY):
        feed(gateway, ("a", n % 2), stored(*list(range(n * step, (n + 1) * step)), medium="GPU" if n % 3 else "CPU"))
    resident = gateway.index.resident_blocks()
    assert resident == LEARNER_FOLLOWS_EVERY * step
    assert learner.cap == int(LEARNED_PER_RESIDENT * resident)  # counted every LEARNER_FOLLOWS_EVERY batches
    feed(gateway, ("a", 0), AllBlocksCleared())
    feed(gateway, ("a", 1), AllBlocksCleared())
    gateway.routers.refresh_gauges()  # and at every scrape
    assert learner.cap == LEARNED_FLOOR


def test_residency_is_asked_of_the_announcing_stream_only() -> None:
    gateway = make_gateway()
    routers = gateway.routers
    feed(gateway, ("a", 0), stored(1, 2))
    feed(gateway, ("b", 0), stored(3, medium="CPU"))
    assert routers.resident(("a", 0), 1) and routers.resident(("b", 0), 3)
    assert not routers.resident(("a", 1), 1) and not routers.resident(("a", 0), 3)
    feed(gateway, ("a", 0), removed(1))
    assert not routers.resident(("a", 0), 1) and routers.resident(("a", 0), 2)


def test_learning_off_with_zero() -> None:
    gateway = make_gateway(max_learned_blocks=0)
    feed(gateway, ("a", 0), stored(1, 2))
    assert len(gateway.routers.learner) == 0


def test_a_fleet_count_of_nothing_is_not_shown_beside_blocks_and_is_redone_when_they_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33, item 4: the count at start finds no block; the engines' blocks arrive; the
    fleet facts said 0 distinct blocks until the next count, 15 s later. Now they are "being
    counted" (None) meanwhile, and the next count comes as soon as the blocks exist: this test
    puts the refresh an hour away, so only that early count can end its wait."""
    monkeypatch.setattr(router_state, "FLEET_REFRESH_SECONDS", 3600.0)
    gateway = make_gateway()
    routers = gateway.routers

    async def body() -> None:
        routers.start(lambda: gateway.log.last_offset)
        try:
            await until(lambda: routers.fleet is not None, 60, what="the count at start")
            assert routers.fleet is not None and routers.fleet["distinct_blocks"] == 0  # true: none yet
            feed(gateway, ("a", 0), stored(1, 2, 3))
            assert routers.fleet is None  # being counted, not "0 distinct blocks" beside 3 resident
            await until(lambda: routers.fleet is not None, 60, what="a count of the blocks")
            assert routers.fleet is not None and routers.fleet["distinct_blocks"] == 3
            assert routers.fleet["offset"] == gateway.log.last_offset
        finally:
            await routers.stop()

    asyncio.run(body())


def test_fleet_facts_and_their_gauges() -> None:
    gateway = make_gateway()
    feed(gateway, ("a", 0), stored(1, 2, 3))
    feed(gateway, ("a", 1), stored(2, 3, 4))
    feed(gateway, ("b", 0), stored(3, medium="CPU"))
    feed(gateway, ("a", 0), stored(3, medium="CPU"))  # same stream, other medium: shared once more
    facts = asyncio.run(gateway.routers.count_fleet(gateway.log.last_offset))
    assert facts["distinct_blocks"] == 4 and facts["shared_blocks"] == 2  # 2 and 3
    assert facts["mediums"] == {
        "GPU": {"distinct_blocks": 4, "shared_blocks": 2},
        "CPU": {"distinct_blocks": 1, "shared_blocks": 1},
    }
    assert facts["offset"] == gateway.log.last_offset and gateway.routers.fleet is facts
    metrics = gateway.metrics
    assert metrics.fleet_shared_blocks.labels("all")._value.get() == 2
    assert metrics.fleet_distinct_blocks.labels("CPU")._value.get() == 1


def test_encoded_state_messages_equal_the_state_messages_and_gc_is_restored() -> None:
    gateway = make_gateway()
    churn(gateway, random.Random(5), 60)
    streams = capture(gateway.index.streams())
    expected = [json.loads(json.dumps(m)) for m in state_messages(streams, 9, 3)]
    assert gc.isenabled()
    got = [json.loads(data) for data in without_gc(encoded_state_messages(streams, 9, 3))]
    assert got == expected and gc.isenabled()
    gc.disable()
    try:
        assert len(list(without_gc(encoded_state_messages(streams, 9, 3)))) == len(expected)
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.enable()
