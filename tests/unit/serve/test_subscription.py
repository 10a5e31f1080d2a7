"""kvgateway.serve.subscription: a client's queue, its bound on live messages and the slow consumer's cut."""

from __future__ import annotations

from kvgateway.protocol.messages import OutMessage
from tests.support.events import batch, stored
from tests.support.hub import (
    clients,
    decode,
    drain,
    make_hub,
    next_chunk,
    offsets,
    publish_batch,
    run,
    sample,
    stuck_writing,
    subscribe,
)


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
    assert clients(hub) == 1
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


def test_a_take_hands_out_what_fits_its_bytes_and_at_least_one_message() -> None:
    hub = make_hub()
    sub = subscribe(hub)
    drain(sub)
    for seq in range(6):
        publish_batch(hub, "a", 0, seq, batch(stored(*range(seq * 10 + 1))))
    sizes = [len(message.data) for message in sub._queue]
    assert len(set(sizes)) == 6 and sub.queued_bytes == sum(sizes)
    first = sub.take(sum(sizes) - 1)  # all but the last fit
    assert [len(m.data) for m in first] == sizes[:5] and sub.queued_bytes == sizes[5]
    sub.written()
    assert [len(m.data) for m in sub.take(1)] == sizes[5:], "one message even when it does not fit"
    sub.written()
    for seq in range(6, 9):
        publish_batch(hub, "a", 0, seq, batch(stored(seq)))
    more = [len(message.data) for message in sub._queue]
    assert [len(m.data) for m in sub.take(1)] == more[:1], "one message, the others left queued"
    sub.written()
    rest = sub.take(more[1] + more[2])  # exactly what is queued: every message, in order
    assert [len(m.data) for m in rest] == more[1:] and sub.queued_bytes == 0 and not sub.pending
    assert sample(hub, "kvgateway_client_queue_bytes_count") >= 4
