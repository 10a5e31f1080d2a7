"""kvgateway.serve.hub without sockets: the hello, one encoding per filter, notices and their compat
variants, resume from the ring, and client accounting."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.datastructures import QueryParams

from kvgateway.log.records import batch_record
from kvgateway.protocol import messages
from kvgateway.runtime.metrics import FOLD_AT
from kvgateway.serve.hub import TooManyClients
from kvgateway.serve.query import parse_query
from kvgateway.serve.subscription import Subscription
from tests.support.events import batch, removed, stored
from tests.support.hub import (
    TRT_SEQ,
    clients,
    decode,
    drain,
    make_hub,
    next_chunk,
    offsets,
    publish_batch,
    publish_notice,
    ring,
    run,
    sample,
    snapshot,
    statuses,
    subscribe,
)

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


# --- batches and filters ------------------------------------------------------------------


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


def test_a_batch_without_matching_events_is_skipped_and_offsets_jump() -> None:
    hub = make_hub()
    sub = subscribe(hub, "type=BlockRemoved")
    publish_batch(hub, "a", 0, 1, batch(removed(1)))
    publish_batch(hub, "a", 0, 2, batch(stored(2)))
    publish_batch(hub, "a", 0, 3, batch(stored(3), removed(3)))
    assert offsets(drain(sub)) == [1, 3]


def test_a_stream_outside_the_configuration_is_served_too() -> None:
    hub = make_hub()
    everyone, only_a = subscribe(hub), subscribe(hub, "source=a")
    publish_batch(hub, "z", 3, 1, batch(stored(1)))
    assert offsets(drain(everyone)) == [1]
    assert offsets(drain(only_a)) == []
    late = subscribe(hub)
    publish_batch(hub, "z", 3, 2, batch(stored(1)))
    assert offsets(drain(late)) == [2]


def test_entries_of_streams_in_turn_reach_their_own_streams_clients_only() -> None:
    """The hub keeps the last entry's stream object and its subscribers (a run of one stream's
    entries, its outlet's one tuple, skips the lookup): in runs and in turn, with one tuple per
    stream as an outlet appends and with equal new ones, an entry reaches its stream's clients."""
    hub = make_hub()
    only_a, only_b, everyone = subscribe(hub, "source=a"), subscribe(hub, "source=b"), subscribe(hub)
    keys = {"a": ("a", 0), "b": ("b", 0)}
    for seq, source in enumerate("aabbab", start=1):
        hub.log.append(batch_record(keys[source], seq, batch(stored(seq)), received=0.0, replayed=False))
    for seq, source in enumerate("ab", start=7):
        publish_batch(hub, source, 0, seq, batch(stored(seq)))
    assert offsets(drain(only_a)) == [1, 2, 5, 7]
    assert offsets(drain(only_b)) == [3, 4, 6, 8]
    assert offsets(drain(everyone)) == list(range(1, 9))


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


# --- clients ------------------------------------------------------------------------------


def test_max_clients_and_close_accounting() -> None:
    hub = make_hub(max_clients=2)
    one = subscribe(hub)
    subscribe(hub, transport="sse")
    with pytest.raises(TooManyClients):
        subscribe(hub)
    assert sample(hub, "kvgateway_client_rejections_total", transport="ws", reason="too_many_clients") == 0  # route's
    one.close("error")
    one.close("closed")
    assert sample(hub, "kvgateway_client_disconnects_total", transport="ws", reason="error") == 1
    assert sample(hub, "kvgateway_client_disconnects_total", transport="ws", reason="closed") == 0
    assert clients(hub) == 1
    subscribe(hub).close("closed")  # a place again
    assert run(next_chunk(one)) is None
    publish_batch(hub, "a", 0, 1, batch())  # a closed client gets nothing
    assert one.queued_bytes == 0
    assert sample(hub, "kvgateway_clients", transport="ws") == 0
    assert sample(hub, "kvgateway_broadcast_seconds_count") == 1
    # Broadcast times wait unbucketed, FOLD_AT at most; a scrape sees every one.
    times = hub.metrics.broadcasts.values
    for seq in range(2, FOLD_AT + 3):
        publish_batch(hub, "a", 0, seq, batch())
        assert len(times) < FOLD_AT
    assert len(times) == 1  # the scrape above folded the first; FOLD_AT of the next FOLD_AT + 1 folded as they came
    assert sample(hub, "kvgateway_broadcast_seconds_count") == FOLD_AT + 2
