"""The cache analytics' compiled pass (kvgateway/state/_analytics_c.pyx) against its pure-Python
reference (_analytics_py.py), fed the same generated steps side by side in one process: identical
observable state after every step (every stream's tiers with every :class:`TierStats` field, the
sampled blocks stored and evicted with their times in their order, the first blocks of chains in
theirs, the tiers counted in the order of their first eviction, the routes cached) and identical
answers of :class:`~kvgateway.state.analytics.CacheAnalytics` around each (``tracked``,
``counted``, ``streams``, the /v1/analytics document with its prefix spread); over stores, removes,
clears, restarts and unknown events, u64, i64 and bytes hashes that repeat within and across
events, sampled and not, mediums of every tier and odd names (None, empty, any case, unknown),
engine times that go back or are ints, refetch windows, and every bound small enough to be hit
(tracked blocks, first blocks, the routes' cache).

Each side is a :class:`CacheAnalytics` built around one core's pass (:func:`analytics_with`).
Skipped where the compiled core was not built."""

from __future__ import annotations

import math
import random
from types import ModuleType
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgateway.engine.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored, Event, Hash, UnknownEvent
from kvgateway.log.ordered import MemoryLog
from kvgateway.log.records import NoticeRecord, batch_record
from kvgateway.runtime.metrics import LIFETIME_BUCKETS
from kvgateway.state import _analytics_py, analytics
from kvgateway.state.analytics import SAMPLE, CacheAnalytics
from kvgateway.state.occupancy import OccupancyIndex
from tests.support.cores import compiled_twin, packed
from tests.support.payloads import U64

STREAMS = [("a", 0), ("a", 1), ("b", 0)]


def _compiled() -> ModuleType:
    return compiled_twin("kvgateway.state._analytics_c")


def analytics_with(module: ModuleType, window: float = 60.0, **bounds: int) -> CacheAnalytics:
    """A :class:`CacheAnalytics` around ``module``'s pass."""
    return CacheAnalytics(core=module.AnalyticsPass(window, **bounds))


# Few hashes of every kind, so that blocks come back, repeat and sample alike across streams: ints
# sampled by their value (multiples of SAMPLE, 0 and -16 among them), ints whose hash is not their
# value (-1 hashes to -2; u64s above 2**61 - 1 are reduced), and bytes (hashed by the process).
POOL: list[Hash] = [
    *(SAMPLE * i for i in range(-1, 6)),
    1,
    3,
    -1,
    -2,
    2**61 - 1,
    2**61 + SAMPLE,
    2**63,
    U64,
    U64 - 15,
    -(2**63),
    b"\x00" * 32,
    b"\xff" * 32,
    b"\x01",
    b"",
]
hash_st = st.sampled_from(POOL)
medium_st = st.sampled_from([None, "GPU", "gpu", "CPU", "cpu_pinned", "", "DISK", "LMCACHE", "REMOTE_GPU", "Ünï"])


@st.composite
def event_st(draw: st.DrawFn) -> Event:
    kind = draw(st.sampled_from(["stored"] * 5 + ["removed"] * 4 + ["cleared", "unknown"]))
    if kind == "stored":
        hashes = draw(st.lists(hash_st, max_size=6))
        return BlockStored(hashes, draw(st.none() | hash_st), [], 4, None, draw(medium_st))
    if kind == "removed":
        return BlockRemoved(draw(st.lists(hash_st, max_size=6)), draw(medium_st))
    if kind == "cleared":
        return AllBlocksCleared()
    return UnknownEvent(type="BlockMoved", body=["BlockMoved", 1])


@st.composite
def step_st(draw: st.DrawFn) -> tuple[str, Any]:
    """A batch through the log, a batch applied directly (its time an int or a float), or a restart."""
    kind = draw(st.sampled_from(["batch"] * 6 + ["apply"] * 3 + ["restart"]))
    stream = draw(st.sampled_from(STREAMS))
    if kind == "restart":
        return kind, stream
    events = draw(st.lists(event_st(), min_size=1, max_size=5))
    return kind, (stream, events, draw(st.sampled_from([0, 1, 2, 30, 0.5, 1.25, -1, -0.75])))


def shown(side: CacheAnalytics, index: OccupancyIndex) -> dict[str, Any]:
    """Everything the analytics keep and show: each table's entries in their order, each value
    by its ``repr`` (an int and a float that are equal still differ)."""
    core = side.core
    tiers = core.tiers
    return {
        "tiers": [(key, repr(stats)) for key, stats in tiers.items()],
        "counted": [(key, stats is tiers[key]) for key, stats in core.counted.items()],
        "roots": repr(list(core.roots.items())),
        "routes": [
            (key, medium, tier, stats is tiers[(key[0], tier)]) for key, (medium, tier, stats) in core.routes.items()
        ],
        "bounds": (core.refetch_window, core.max_tracked, core.max_roots, core.max_routes),
        "tracked": side.tracked(),
        "listed": repr([*side.counted(), *side.streams()]),
        "document": side.to_json(index.streams()),
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    steps=st.lists(step_st(), min_size=1, max_size=30),
    window=st.sampled_from([0.0, 1.5, 60.0]),
    max_tracked=st.sampled_from([1, 2, 3, 20_000]),
    max_roots=st.sampled_from([1, 2, 256]),
    max_routes=st.sampled_from([0, 1, 3, 4_096]),
)
def test_both_passes_keep_and_show_the_same_analytics(
    steps: list[tuple[str, Any]], window: float, max_tracked: int, max_roots: int, max_routes: int
) -> None:
    compiled = _compiled()
    bounds = {"max_tracked": max_tracked, "max_roots": max_roots, "max_routes": max_routes}
    sides = [analytics_with(module, window, **bounds) for module in (_analytics_py, compiled)]
    index = OccupancyIndex()  # the streams the document lists and the prefix spread looks up
    log = MemoryLog()
    for follower in (index.follow, *(side.follow for side in sides)):
        log.follow(follower)
    ts: float = 0
    for n, (kind, value) in enumerate(steps):
        if kind == "restart":
            log.append(NoticeRecord(value, "restart", {"seq": 0, "previous": n, "reason": "seq_reset"}))
        else:
            stream, events, dt = value
            ts += dt
            if kind == "batch":
                log.append(batch_record(stream, n, Batch(ts, events), received=1.0, replayed=False))
            else:
                sides[0].apply(stream, events, ts)
                sides[1].apply(stream, packed(events), ts)  # the hashes as the compiled parser keeps them
        assert shown(sides[0], index) == shown(sides[1], index)


def test_the_bounds_evict_the_oldest_alike() -> None:
    """Each bound hit on purpose, then every table's order compared: the oldest entry went first."""
    compiled = _compiled()
    sides = [analytics_with(module, max_tracked=3, max_roots=2, max_routes=1) for module in (_analytics_py, compiled)]
    a = STREAMS[0]
    sampled = [SAMPLE * i for i in range(1, 7)]
    for side in sides:
        side.apply(a, [BlockStored(sampled, None, [], 4, None, "cpu")], 1.0)  # the newest 3 kept
        for n, h in enumerate(sampled[:4]):
            side.apply(a, [BlockStored([h], None, [], 4, None, None)], 2.0 + n)  # 4 first blocks
        side.apply(a, [BlockRemoved(sampled, "CPU")], 9.0)
        side.apply(a, [BlockStored(sampled[:2], 7, [], 4, None, "cpu")], 10.0)
        side.apply(a, [BlockRemoved(sampled[:2], "cpu")], 11.0)  # a fourth and fifth eviction
        side.apply(a, [BlockStored(sampled[5:], 7, [], 4, None, "cpu")], 12.0)  # refetched
    pure, fast = (side.core for side in sides)
    evicted = list(pure.tier(a, "CPU").evicted_at.items())
    assert list(fast.tier(a, "CPU").evicted_at.items()) == evicted == [(16, 11.0), (32, 11.0)]
    assert fast.tier(a, "CPU").refetches == pure.tier(a, "CPU").refetches == 1
    assert list(fast.tier(a, "CPU").stored_at) == list(pure.tier(a, "CPU").stored_at) == [sampled[5]]
    assert list(fast.tier(a, "GPU").stored_at) == list(pure.tier(a, "GPU").stored_at) == sampled[1:4]
    assert list(fast.roots[a]) == list(pure.roots[a]) == [("GPU", sampled[2]), ("GPU", sampled[3])]
    assert list(fast.routes) == list(pure.routes) == [(a, "cpu")]
    assert repr(sides[0].counted()) == repr(sides[1].counted())
    assert repr(sides[0].streams()) == repr(sides[1].streams())


def test_many_blocks_of_every_kind_through_tables_that_churn() -> None:
    """Thousands of blocks of every kind (u64, negative and larger ints, 32-byte and other bytes)
    stored, evicted and stored again through bounds that churn: the compiled pass's ordered tables
    (state/_ordered.pxd) take entries out of their middle, compact and grow many times, and every
    table stays the reference's, in its order."""
    compiled = _compiled()
    rng = random.Random(29)
    kinds = [
        lambda: rng.getrandbits(64),
        lambda: -rng.getrandbits(63) - 1,
        lambda: 2**64 + rng.getrandbits(70),
        lambda: rng.randbytes(32),
        lambda: rng.randbytes(rng.choice([1, 16, 33])),
    ]
    pool = [kinds[n % len(kinds)]() for n in range(3_000)]
    sides = [analytics_with(module, 5.0, max_tracked=300) for module in (_analytics_py, compiled)]
    index = OccupancyIndex()
    stored: list[Hash] = []
    evicted_most = 0
    for n in range(600):
        events: list[Event] = []
        for _ in range(4):  # stores followed whole (a sampled first block), of blocks seen before
            chain: list[Hash] = [SAMPLE * rng.randrange(2**40), *rng.sample(pool, rng.randrange(8))]
            events.append(BlockStored(chain, rng.choice([None, 7]), [], 4, None, rng.choice(["GPU", "cpu"])))
            stored += chain
        gone = [stored.pop(rng.randrange(len(stored))) for _ in range(min(len(stored), rng.randrange(30)))]
        events.append(BlockRemoved(gone, rng.choice(["GPU", "CPU"])))
        if n % 150 == 149:
            events.append(AllBlocksCleared())
        for side in sides:
            side.apply(STREAMS[n % 2], events, n * 0.25)
        evicted_most = max(evicted_most, *(len(stats.evicted_at) for stats in sides[1].core.tiers.values()))
        if n % 50 == 49:
            assert shown(sides[0], index) == shown(sides[1], index)
    assert evicted_most == 300  # the bound churned: many more keys added than the tables' first columns hold


def test_the_public_analytics_run_the_chosen_pass() -> None:
    from kvgateway.runtime import extensions

    compiled = _compiled()
    chosen = _analytics_py if extensions.forced_pure() else compiled
    assert analytics.AnalyticsPass is chosen.AnalyticsPass
    assert type(CacheAnalytics().core) is chosen.AnalyticsPass
    assert "kvgateway.state._analytics_c" in extensions.COMPILED_MODULES


def test_lifetimes_at_the_buckets_bounds_fall_alike() -> None:
    """A sampled block's lifetime counted in the bucket whose bound is the first not below it: the
    compiled pass compares a float lifetime with the bounds in C, an int's as the reference does.
    Lifetimes at every bound, a hair below and above it, zero, negative and past the last bound,
    as floats and as ints; the same buckets, counts and sums."""
    compiled = _compiled()
    sides = [analytics_with(module) for module in (_analytics_py, compiled)]
    a = STREAMS[0]
    lifetimes: list[float] = [0.0, -2.5, 1e9]
    for bound in LIFETIME_BUCKETS:
        lifetimes += [bound, math.nextafter(bound, 0.0), math.nextafter(bound, math.inf), bound + 0.5]
    for n, seconds in enumerate(lifetimes):
        block = SAMPLE * (n + 1)
        for stored, removed in ((100.0, 100.0 + seconds), (100, 100 + int(seconds))):
            for side in sides:
                side.apply(a, [BlockStored([block], 1, [], 4, None, "GPU")], stored)
                side.apply(a, [BlockRemoved([block], "GPU")], removed)
    pure, fast = (side.core.tier(a, "GPU") for side in sides)
    assert repr(fast) == repr(pure)
    assert fast.lifetimes == 2 * len(lifetimes) and sum(fast.buckets) == fast.lifetimes
    assert all(n > 0 for n in fast.buckets)  # every bucket met
