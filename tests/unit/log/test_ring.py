"""kvgateway.log.ring: the ring of recent messages, bound by count and by bytes, filtered variants counted."""

from __future__ import annotations

import pytest

from kvgateway.log.ring import Ring
from tests.support.events import batch, removed, stored
from tests.support.hub import drain, make_hub, offsets, publish_batch, ring, sample, subscribe


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
    # The count bound makes room as a message comes (the trim after its fan-out has nothing left
    # to drop); a ring bounded to no message holds the new one until that trim.
    bounded, entries = Ring(2, 10**6, first_offset=5), list(ring(hub).since(4))
    assert [bounded.append(entry) for entry in entries] == [1, 2, 2]
    assert (bounded.first_offset, bounded.bytes) == (6, entries[1].size + entries[2].size)
    assert bounded.trim() == 2 and bounded.first_offset == 6
    empty = make_hub(ring_messages=0)
    sub = subscribe(empty)
    publish_batch(empty, "a", 0, 1, batch(stored(1)))
    assert offsets(drain(sub)) == [1], "delivered live"
    assert (len(ring(empty)), ring(empty).bytes, sample(empty, "kvgateway_ring_messages")) == (0, 0, 0)
    assert not subscribe(empty, last_event_id=f"{empty.epoch}:0").recovered


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
