"""kvgateway.state.analytics: sampled block lifetimes, refetches after eviction, prefix spread."""

from __future__ import annotations

from functools import partial
from typing import Any

from kvgateway.engine.wire import AllBlocksCleared
from kvgateway.log.ordered import MemoryLog
from kvgateway.log.records import NoticeRecord, batch_record
from kvgateway.state.analytics import MAX_TRACKED, SAMPLE, CacheAnalytics, Stream
from kvgateway.state.occupancy import OccupancyIndex
from tests.support import events
from tests.support.events import batch, removed

A: Stream = ("a", 0)
B: Stream = ("b", 0)
SAMPLED = [SAMPLE * i for i in range(1, 50)]  # hash(int) == int: a store starting with one is followed
UNSAMPLED = [SAMPLE * i + 1 for i in range(1, 50)]


stored = partial(events.stored, parent=7, tokens=[])


def test_lifetime_by_the_engines_timestamps_per_tier() -> None:
    analytics = CacheAnalytics()
    # a store event is followed whole when its first block is sampled
    events = [stored(*SAMPLED[:1] + UNSAMPLED[:2]), stored(*UNSAMPLED[2:4] + SAMPLED[1:2])]
    analytics.apply(A, [*events, stored(*SAMPLED[3:4], medium="cpu_pinned")], ts=100.0)
    analytics.apply(A, [removed(*SAMPLED[:2] + UNSAMPLED[:4])], ts=104.0)
    analytics.apply(A, [removed(*SAMPLED[3:4], medium="CPU_PINNED")], ts=200.0)
    assert [(stream, tier, stats.lifetimes, stats.lifetime_sum) for stream, tier, stats in analytics.counted()] == [
        (A, "GPU", 3, 12.0),
        (A, "CPU", 1, 100.0),
    ]  # what the Prometheus families list, in the order of each tier's first eviction
    gpu = analytics.tier(A, "GPU").to_json()
    assert gpu["sampled_lifetimes"] == 3 and gpu["lifetime_mean_seconds"] == 4.0
    assert gpu["lifetime_p50_le_seconds"] == 5.0 and gpu["lifetime_buckets"]["5.0"] == 3
    assert gpu["sampled_evictions"] == 3  # the second event's blocks are not followed
    assert analytics.tier(A, "CPU").to_json()["lifetime_buckets"]["120.0"] == 1


def test_a_block_stored_again_soon_after_eviction_is_a_refetch() -> None:
    analytics = CacheAnalytics()
    analytics.apply(A, [stored(*SAMPLED[:4])], ts=0.0)
    analytics.apply(A, [removed(*SAMPLED[:4])], ts=10.0)
    analytics.apply(A, [stored(*SAMPLED[:1])], ts=30.0)  # 20 s later: refetched
    analytics.apply(A, [stored(*SAMPLED[1:2])], ts=100.0)  # 90 s later: not within the window
    stats = analytics.tier(A, "GPU").to_json()
    assert (stats["sampled_evictions"], stats["refetches"], stats["refetch_ratio"]) == (4, 1, 0.25)
    # a removal of a block stored before the gateway watched is not followed
    analytics.apply(B, [removed(*SAMPLED[:1])], ts=5.0)
    assert analytics.tier(B, "GPU").to_json()["sampled_evictions"] == 0
    assert [(stream, tier) for stream, tier, _ in analytics.counted()] == [(A, "GPU")]  # B evicted nothing followed


def test_a_restart_or_clear_forgets_the_stored_blocks() -> None:
    analytics = CacheAnalytics()
    analytics.apply(A, [stored(*SAMPLED[:2])], ts=0.0)
    analytics.apply(A, [AllBlocksCleared()], ts=1.0)
    analytics.apply(A, [removed(*SAMPLED[:1])], ts=2.0)
    assert analytics.tier(A, "GPU").lifetimes == 0
    analytics.apply(A, [stored(*SAMPLED[:2])], ts=3.0)
    log = MemoryLog()
    log.follow(analytics.follow)
    log.append(NoticeRecord(A, "restart", {"seq": 0, "previous": 5, "reason": "seq_reset"}))
    analytics.apply(A, [removed(*SAMPLED[:1])], ts=4.0)
    assert analytics.tier(A, "GPU").lifetimes == 0


def test_memory_is_bounded() -> None:
    analytics = CacheAnalytics()
    many = [SAMPLE * i for i in range(MAX_TRACKED + 500)]
    analytics.apply(A, [stored(*many)], ts=0.0)
    assert len(analytics.tier(A, "GPU").stored_at) == MAX_TRACKED
    analytics.apply(A, [removed(*many)], ts=1.0)
    assert len(analytics.tier(A, "GPU").evicted_at) == MAX_TRACKED
    assert analytics.tier(A, "GPU").lifetimes == MAX_TRACKED  # the oldest 500 were dropped unobserved


def test_follows_the_log_and_reports_offload_share_and_prefix_spread() -> None:
    index = OccupancyIndex()
    analytics = CacheAnalytics()
    log = MemoryLog()
    log.follow(index.follow)
    log.follow(analytics.follow)
    for n, (stream, happened) in enumerate(
        [
            (A, [stored(11, 12, parent=None), stored(13, medium="CPU", parent=None)]),
            (B, [stored(11, 12, parent=None), stored(21, parent=None)]),
            (("c", 0), [stored(31, parent=None)]),
        ],
        start=1,
    ):
        log.append(batch_record(stream, n, batch(*happened, ts=float(n)), received=float(n), replayed=False))
    doc: dict[str, Any] = analytics.to_json(index.streams())
    shares = {(s["source"], s["dp_rank"]): s["offloaded_share"] for s in doc["streams"]}
    assert shares == {("a", 0): 0.3333, ("b", 0): 0.0, ("c", 0): 0.0}
    spread = doc["prefixes"]
    # first blocks: 11 (a, b), 13 (a's CPU), 21 (b), 31 (c): 5 holdings over 4 blocks
    assert spread["engines"] == 3 and spread["first_blocks"] == 4 and spread["mean_engines"] == 1.25
    assert spread["top"][0] == {"medium": "GPU", "hash": "11", "engines": 2}
    # once evicted everywhere a first block no longer counts
    index.apply("a", 0, batch(removed(11), ts=9.0), 9.0)
    index.apply("b", 0, batch(removed(11), ts=9.0), 9.0)
    assert analytics.prefix_spread(index.streams())["first_blocks"] == 3


def test_prefix_hashes_are_written_as_in_the_stream() -> None:
    """A bytes hash (an engine that hashes to bytes) is lowercase hex, as the stream writes it."""
    index = OccupancyIndex()
    analytics = CacheAnalytics()
    log = MemoryLog()
    log.follow(index.follow)
    log.follow(analytics.follow)
    block = stored(b"\xab\x01", parent=None)
    for n, stream in enumerate((A, B), start=1):
        log.append(batch_record(stream, n, batch(block, ts=1.0), received=1.0, replayed=False))
    assert analytics.prefix_spread(index.streams())["top"] == [{"medium": "GPU", "hash": "ab01", "engines": 2}]


_FOLLOWED = """
import json, random
from functools import partial
from kvgateway.state.analytics import CacheAnalytics
from tests.support import events
rng = random.Random(7)
analytics = CacheAnalytics()
stored = partial(events.stored, parent=None, tokens=[])
firsts = [rng.randbytes(32) for _ in range(400)]
analytics.apply(("a", 0), [stored(first, rng.randbytes(32)) for first in firsts], ts=1.0)
tiers = analytics.core.tiers.values()
print(json.dumps(sorted(h.hex() for stats in tiers for h in stats.stored_at)))
"""


def test_byte_hashes_are_sampled_alike_in_every_process() -> None:
    """Which chains of sha256 hashes are followed does not hang on the process's hash seed: two
    processes of different ``PYTHONHASHSEED`` (a cluster's two edges, a gateway before and after a
    restart) follow the same blocks of the same events, about one chain in SAMPLE."""
    import json
    import os
    import subprocess
    import sys

    followed = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _FOLLOWED], env=env, capture_output=True, text=True, check=True)
        followed.append(json.loads(out.stdout))
    assert followed[0] == followed[1]
    assert 400 * 2 // (4 * SAMPLE) < len(followed[0]) < 400 * 2 * 4 // SAMPLE  # two blocks a chain followed
