"""kvgateway.serve.digests: digest messages (digest=SECONDS) in order at their offset, and a client
too slow for them cut."""

from __future__ import annotations

from kvgateway.serve.digests import DigestTicker
from kvgateway.state.digest import EMPTY, MASK, element, hex_digest
from kvgateway.state.occupancy import OccupancyIndex
from tests.support.events import BIG, batch, removed, stored
from tests.support.hub import STREAMS, decode, drain, make_hub, publish_batch, publish_notice, stuck_writing, subscribe


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
