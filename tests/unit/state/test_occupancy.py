"""The reference-counted occupancy index (sans-I/O: every ``now`` is injected)."""

from __future__ import annotations

import gc
import random
import tracemalloc
from collections import defaultdict
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgateway.engine.wire import AllBlocksCleared, Batch, BlockStored, Event, Hash, UnknownEvent
from kvgateway.protocol.filters import event_key, select
from kvgateway.state.attribution import Attribution
from kvgateway.state.occupancy import (
    MAX_GROUPS,
    MAX_MEDIUMS,
    OVERFLOW_GROUP,
    OVERFLOW_MEDIUM,
    RATE_WINDOW_SECONDS,
    MediumStats,
    OccupancyIndex,
    StreamIndex,
)
from tests.support.events import BIG, batch, removed, stored


def stats(index: StreamIndex, medium: str = "GPU", now: float = 0.0) -> MediumStats:
    return index.medium_stats(now)[medium]


# --- reference counts ----------------------------------------------------------------------


def test_store_twice_remove_once_stays_resident_remove_again_drops() -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(stored(BIG), stored(BIG)), 0.0)
    assert index.refcount(BIG) == 2
    assert stats(index).blocks == 1
    index.apply(batch(removed(BIG)), 0.0)
    assert index.refcount(BIG) == 1
    assert stats(index).blocks == 1
    index.apply(batch(removed(BIG)), 0.0)
    assert index.refcount(BIG) == 0
    assert stats(index).blocks == 0
    assert index.unknown_removes == 0


def test_repeats_inside_one_event_count_one_reference_each() -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(stored(1, 1, 2)), 0.0)
    assert (index.refcount(1), index.refcount(2)) == (2, 1)
    index.apply(batch(removed(1, 1)), 0.0)
    assert index.refcount(1) == 0
    assert index.unknown_removes == 0
    # refcount 1, removed twice in one event: the second mention is an unknown remove
    index.apply(batch(removed(2, 2)), 0.0)
    assert index.refcount(2) == 0
    assert index.unknown_removes == 1


def test_remove_of_unknown_hash_is_counted_not_an_error() -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(stored(1), removed(2, 3), removed(1), removed(1)), 0.0)
    assert index.unknown_removes == 3
    assert stats(index).blocks == 0
    assert stats(index).removes == 4


def test_a_medium_only_ever_removed_from_is_not_listed() -> None:
    # SGLang removes offloaded hashes from DISK and EXTERNAL it never announced storing
    index = StreamIndex("a", 0, {"CPU": 100})
    index.apply(batch(stored(1), removed(7, medium="DISK"), removed(8, medium="external")), 0.0)
    assert list(index.medium_stats(0.0)) == ["CPU", "GPU"]  # CPU: a configured capacity
    assert index.unknown_removes == 2
    # once a block was stored it stays listed, also empty again
    index.apply(batch(stored(9, medium="disk"), removed(9, medium="DISK")), 0.0)
    assert list(index.medium_stats(0.0)) == ["CPU", "DISK", "GPU"]
    assert (stats(index, "DISK").blocks, stats(index, "DISK").removes) == (0, 2)


def test_bytes_and_int_hashes_are_distinct_blocks() -> None:
    raw = bytes(range(32))
    index = StreamIndex("a", 0)
    index.apply(batch(stored(raw, 5, -5)), 0.0)
    assert index.refcount(raw) == 1
    assert index.refcount(bytes(32)) == 0
    assert stats(index).blocks == 3
    index.apply(batch(removed(bytes(range(32)))), 0.0)  # an equal bytes object, not the same one
    assert index.refcount(raw) == 0
    assert stats(index).blocks == 2


# --- clears, reset, stale -------------------------------------------------------------------


def test_all_blocks_cleared_empties_every_medium_and_group_keeps_them_listed() -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(stored(1, 2, group=0), stored(1, group=1), stored(3, medium="CPU", block_size=32)), 0.0)
    index.apply(batch(AllBlocksCleared()), 1.0)
    got = index.medium_stats(1.0)
    assert set(got) == {"CPU", "GPU"}
    assert all(s.blocks == 0 and s.tokens == 0 for s in got.values())
    assert index.groups("GPU") == {0: 0, 1: 0}
    # cumulative counters and the last known block size survive
    assert (got["GPU"].stores, got["GPU"].block_size) == (3, 16)
    assert (got["CPU"].stores, got["CPU"].block_size) == (1, 32)
    # and the index keeps working after the clear
    index.apply(batch(stored(1), removed(1), removed(1)), 1.0)
    assert stats(index).blocks == 0
    assert index.unknown_removes == 1


def test_clear_in_the_middle_of_a_batch_applies_in_order() -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(stored(1, 2), AllBlocksCleared(), stored(3), removed(1)), 0.0)
    assert index.refcount(3) == 1
    assert index.refcount(1) == index.refcount(2) == 0
    assert index.unknown_removes == 1


def test_reset_empties_and_clears_stale() -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(stored(1, 2, medium="CPU"), stored(BIG, BIG)), 0.0)
    index.mark_stale("history_truncated")
    assert index.stale_reason == "history_truncated"
    index.reset()
    assert (index.stale, index.stale_reason) == (False, None)
    assert all(s.blocks == 0 for s in index.medium_stats(0.0).values())
    assert set(index.medium_stats(0.0)) == {"CPU", "GPU"}
    assert index.refcount(BIG) == 0
    index.apply(batch(removed(BIG)), 0.0)
    assert index.unknown_removes == 1  # the extra reference went too


def test_stale_until_all_blocks_cleared() -> None:
    index = StreamIndex("a", 0)
    assert index.stale is False
    index.mark_stale()
    index.apply(batch(stored(1), removed(1), UnknownEvent(type="Foo", body=["Foo"])), 0.0)
    assert index.stale is True
    assert index.stale_reason == "unrecovered"
    index.apply(batch(stored(2), AllBlocksCleared(), stored(3)), 0.0)
    assert (index.stale, index.stale_reason) == (False, None)
    index.mark_stale("undecodable")
    assert (index.snapshot(0.0)["stale"], index.snapshot(0.0)["stale_reason"]) == (True, "undecodable")


def test_unknown_events_are_ignored() -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(UnknownEvent(type="Foo", body={"type": "Foo", "block_hashes": [1]})), 0.0)
    assert index.medium_stats(0.0) == {}
    assert index.unknown_removes == 0


# --- groups and mediums ----------------------------------------------------------------------


def test_group_idx_separates_blocks_and_none_is_group_zero() -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(stored(7, group=0), stored(7, group=1)), 0.0)
    assert stats(index).blocks == 2
    assert index.groups() == {0: 1, 1: 1}
    index.apply(batch(removed(7, group=1)), 0.0)
    assert (index.refcount(7, group_idx=0), index.refcount(7, group_idx=1)) == (1, 0)
    index.apply(batch(removed(7)), 0.0)  # no group_idx = group 0
    assert stats(index).blocks == 0
    assert index.unknown_removes == 0
    index.apply(batch(stored(8, group=None), removed(8, group=0)), 0.0)
    assert index.unknown_removes == 0


def test_non_int_group_idx_falls_back_to_group_zero() -> None:
    index = StreamIndex("a", 0)
    event = BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[], block_size=16, extra={"group_idx": "x"})
    index.apply(batch(event), 0.0)
    assert index.refcount(1, group_idx=0) == 1


@pytest.mark.parametrize(("store_as", "remove_as"), [("gpu", "GPU"), (None, "GPU"), ("GPU", None), ("Gpu", "gPU")])
def test_medium_names_are_normalised(store_as: str | None, remove_as: str | None) -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(stored(1, medium=store_as)), 0.0)
    assert list(index.medium_stats(0.0)) == ["GPU"]
    assert index.refcount(1, medium="gpu") == 1
    index.apply(batch(removed(1, medium=remove_as)), 0.0)
    assert stats(index).blocks == 0
    assert index.unknown_removes == 0


def test_mediums_are_separate_and_keep_their_own_block_size() -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(stored(1, 2, medium="gpu"), stored(1, medium="cpu_pinned", block_size=64)), 0.0)
    got = index.medium_stats(0.0)
    assert list(got) == ["CPU_PINNED", "GPU"]
    assert (got["GPU"].blocks, got["GPU"].tokens) == (2, 32)
    assert (got["CPU_PINNED"].blocks, got["CPU_PINNED"].tokens) == (1, 64)
    index.apply(batch(removed(1, medium="CPU_PINNED")), 0.0)
    assert index.refcount(1, medium="GPU") == 1


def test_placeholder_events_keep_tokens_from_the_last_known_block_size() -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(stored(1, medium="CPU", block_size=0)), 0.0)
    assert (stats(index, "CPU").blocks, stats(index, "CPU").tokens, stats(index, "CPU").block_size) == (1, 0, 0)
    index.apply(batch(stored(2, 3, medium="CPU", block_size=16)), 0.0)
    assert stats(index, "CPU").tokens == 48
    index.apply(batch(stored(4, 5, medium="CPU", block_size=0)), 0.0)  # placeholder: size stays 16
    assert (stats(index, "CPU").blocks, stats(index, "CPU").tokens) == (5, 80)


# --- rates -----------------------------------------------------------------------------------


def test_rates_average_the_last_sixty_seconds() -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(stored(*range(120))), 1000.2)
    index.apply(batch(removed(*range(30))), 1000.7)
    assert (stats(index, now=1000.7).stores_per_s, stats(index, now=1000.7).removes_per_s) == (2.0, 0.5)
    assert stats(index, now=1059.99).stores_per_s == 2.0  # second 1000 is still one of the last 60
    assert stats(index, now=1060.0).stores_per_s == 0.0
    assert stats(index, now=1060.0).removes_per_s == 0.0
    assert (stats(index, now=1060.0).stores, stats(index, now=1060.0).removes) == (120, 30)


def test_rates_match_a_brute_force_sum_across_ring_wraps() -> None:
    rng = random.Random(7)
    index = StreamIndex("a", 0)
    history: list[tuple[float, int]] = []
    now, next_hash = 500.0, 0
    while now < 800.0:
        now += rng.choice([0.05, 0.3, 1.0, 2.5, 17.0, 61.0])
        n = rng.randint(1, 5)
        index.apply(batch(stored(*range(next_hash, next_hash + n))), now)
        next_hash += n
        history.append((now, n))
        expected = sum(k for t, k in history if int(t) > int(now) - RATE_WINDOW_SECONDS) / RATE_WINDOW_SECONDS
        assert stats(index, now=now).stores_per_s == pytest.approx(expected)
        later = now + rng.uniform(0, 90)  # queried later, without new events
        expected = sum(k for t, k in history if int(later) - RATE_WINDOW_SECONDS < int(t) <= int(later))
        assert stats(index, now=later).stores_per_s == pytest.approx(expected / RATE_WINDOW_SECONDS)


def test_clock_stepping_back_still_counts() -> None:
    index = StreamIndex("a", 0)
    index.apply(batch(stored(1)), 1005.5)
    index.apply(batch(stored(2, 3)), 1003.0)  # lands in the newest bucket
    assert stats(index, now=1005.5).stores_per_s == 3 / 60
    assert stats(index).stores == 3


# --- snapshot --------------------------------------------------------------------------------


def test_snapshot_shape_sorting_totals_and_capacity() -> None:
    occ = OccupancyIndex({("b", 0): {"gpu": 1000, "cpu": 4000}, ("a", 0): {"GPU": 500}})
    occ.apply("b", 0, batch(stored(1, 2, 3), stored(9, medium="CPU", block_size=32)), 10.0)
    occ.apply("a", 1, batch(stored(1, 2, block_size=16)), 10.0)
    occ.apply("a", 0, batch(stored(1), stored(1)), 10.0)
    occ.stream("a", 1).mark_stale()
    snap = occ.snapshot(42, 10.5)
    assert snap["offset"] == 42
    assert [(s["source"], s["dp_rank"]) for s in snap["streams"]] == [("a", 0), ("a", 1), ("b", 0)]
    a0, a1, b0 = snap["streams"]
    assert (a0["stale"], a1["stale"], b0["stale"]) == (False, True, False)
    assert a0["mediums"]["GPU"] == {
        "tier": "GPU",
        "blocks": 1,
        "tokens": 16,
        "capacity_blocks": 500,
        "block_size": 16,
        "stores": 2,
        "removes": 0,
        "stores_per_s": 0.033,  # 2 / 60, rounded to RATE_DECIMALS
        "removes_per_s": 0.0,
    }
    assert a1["mediums"]["GPU"]["capacity_blocks"] is None
    assert set(b0["mediums"]) == {"CPU", "GPU"}
    assert (b0["mediums"]["CPU"]["blocks"], b0["mediums"]["CPU"]["tokens"]) == (1, 32)
    assert b0["mediums"]["CPU"]["capacity_blocks"] == 4000
    assert list(snap["totals"]) == ["CPU", "GPU"]
    assert snap["totals"]["GPU"]["blocks"] == 1 + 2 + 3
    assert snap["totals"]["GPU"]["tokens"] == 16 * 6
    assert snap["totals"]["GPU"]["capacity_blocks"] is None  # a1 has none configured
    assert snap["totals"]["CPU"]["capacity_blocks"] == 4000
    assert snap["totals"]["CPU"]["tokens"] == 32
    # JSON-ready as it is
    assert msgspec.json.decode(msgspec.json.encode(snap)) == snap


def test_configured_streams_and_mediums_are_listed_before_any_event() -> None:
    occ = OccupancyIndex({("a", 0): {"cpu": 10}})
    snap = occ.snapshot(0, 0.0)
    assert snap["streams"] == [
        {
            "source": "a",
            "dp_rank": 0,
            "stale": False,
            "stale_reason": None,
            "unknown_removes": 0,
            "mediums": {
                "CPU": {
                    "tier": "CPU",
                    "blocks": 0,
                    "tokens": 0,
                    "capacity_blocks": 10,
                    "block_size": 0,
                    "stores": 0,
                    "removes": 0,
                    "stores_per_s": 0.0,
                    "removes_per_s": 0.0,
                }
            },
            "tiers": {
                "CPU": {
                    "mediums": ["CPU"],
                    "blocks": 0,
                    "tokens": 0,
                    "capacity_blocks": 10,
                    "stores_per_s": 0.0,
                    "removes_per_s": 0.0,
                }
            },
        }
    ]
    assert snap["totals"]["CPU"]["capacity_blocks"] == 10
    assert snap["tiers"]["CPU"]["capacity_blocks"] == 10
    assert OccupancyIndex().snapshot(3, 0.0) == {"offset": 3, "streams": [], "totals": {}, "tiers": {}}


def test_emptied_mediums_stay_in_the_snapshot() -> None:
    occ = OccupancyIndex()
    occ.apply("a", 0, batch(stored(1, medium="CPU"), stored(2)), 0.0)
    occ.apply("a", 0, batch(removed(1, medium="CPU"), removed(2)), 0.0)
    snap = occ.snapshot(1, 0.0)
    assert {m: v["blocks"] for m, v in snap["streams"][0]["mediums"].items()} == {"CPU": 0, "GPU": 0}
    assert {m: v["blocks"] for m, v in snap["totals"].items()} == {"CPU": 0, "GPU": 0}


def test_stream_is_created_once_and_apply_routes_to_it() -> None:
    occ = OccupancyIndex()
    first = occ.stream("a", 3)
    assert occ.stream("a", 3) is first
    occ.apply("a", 3, batch(stored(1)), 0.0)
    assert first.refcount(1) == 1
    assert occ.stream("a", 4).refcount(1) == 0  # ranks are separate streams
    assert [(s.source, s.dp_rank) for s in occ.streams()] == [("a", 3), ("a", 4)]


def test_every_stream_is_made_with_the_fleets_observer() -> None:
    """Given when the stream's index is made (by its first batch, or when asked for), not set after."""
    attribution = Attribution()
    occ = OccupancyIndex(observer=attribution)
    occ.apply("b", 0, batch(stored(7), removed(7)), 0.0)
    assert occ.stream("b", 0).observer is attribution
    assert occ.stream("c", 1).observer is attribution
    assert OccupancyIndex().stream("b", 0).observer is None


# --- memory ----------------------------------------------------------------------------------


def _u64s(rng: random.Random, n: int) -> list[Hash]:
    return [rng.getrandbits(64) | (1 << 63) for _ in range(n)]


def test_memory_per_resident_block_is_at_most_150_bytes() -> None:
    blocks = 200_000
    rng = random.Random(1)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        index = StreamIndex("a", 0)
        for _ in range(blocks // 8):
            # the hash ints are created under tracing: the index keeps them alive, they are its cost
            index.apply(batch(stored(*_u64s(rng, 8), block_size=0)), 0.0)
        gc.collect()
        per_block = (tracemalloc.get_traced_memory()[0] - base) / blocks
    finally:
        tracemalloc.stop()
    assert stats(index).blocks == blocks
    print(f"occupancy memory: {per_block:.1f} bytes per resident u64 block at {blocks} blocks")
    assert per_block <= 150


def test_memory_stays_flat_under_churn() -> None:
    rng = random.Random(2)
    gc.collect()
    tracemalloc.start()  # from the start: frees of untraced blocks would not be subtracted
    try:
        index = StreamIndex("a", 0)
        resident: list[Hash] = _u64s(rng, 20_000)
        index.apply(batch(stored(*resident)), 0.0)

        def cycle(now: float) -> None:
            nonlocal resident
            old, resident = resident[:2_000], resident[2_000:]
            fresh = _u64s(rng, 2_000)
            shared = fresh[:200]  # some blocks get extra references, dropped again at once
            index.apply(batch(removed(*old), stored(*fresh), stored(*shared), removed(*shared)), now)
            resident.extend(fresh)

        samples = []
        for i in range(40):
            cycle(float(i))
            if i % 10 == 9:
                gc.collect()
                samples.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert stats(index).blocks == 20_000
    assert index.unknown_removes == 0
    # after warm-up (the first sample) every table has its steady size; what remains is the rate
    # ring filling its 60 slots with count ints (~64 bytes per second of traffic, bounded)
    assert max(samples[1:]) - samples[0] < 16 * 1024, [s - samples[0] for s in samples]


# --- against a naive model -------------------------------------------------------------------

POOL: list[Hash] = [0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, b"\x00" * 32, b"\xff" * 32]
MEDIUMS = [None, "GPU", "gpu", "CPU", "cpu", "CPU_PINNED"]


def _norm(medium: str | None) -> str:
    return medium.upper() if medium else "GPU"


op = st.one_of(
    st.tuples(
        st.just("store"),
        st.sampled_from(MEDIUMS),
        st.sampled_from([None, 0, 1]),
        st.lists(st.sampled_from(POOL), max_size=5),
        st.sampled_from([0, 16, 32]),
    ),
    st.tuples(
        st.just("remove"),
        st.sampled_from(MEDIUMS),
        st.sampled_from([None, 0, 1]),
        st.lists(st.sampled_from(POOL), max_size=5),
    ),
    st.tuples(st.just("clear")),
    st.tuples(st.just("unknown")),
)
step = st.one_of(
    st.lists(op, min_size=0, max_size=6),  # one batch
    st.sampled_from(["reset", "stale"]),
)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(step, max_size=30), dt=st.lists(st.floats(0, 30), min_size=30, max_size=30))
def test_matches_a_dict_of_counts_model(steps: list[list[tuple[Any, ...]] | str], dt: list[float]) -> None:
    index = StreamIndex("a", 0)
    counts: dict[tuple[str, int, Hash], int] = defaultdict(int)
    block_size: dict[str, int] = {}
    stores: dict[str, int] = defaultdict(int)
    removes: dict[str, int] = defaultdict(int)
    unknown = 0
    stale = False
    now = 100.0
    for step_, delta in zip(steps, dt, strict=False):
        now += delta
        if step_ == "reset":
            index.reset()
            counts.clear()
            stale = False
            continue
        if step_ == "stale":
            index.mark_stale()
            stale = True
            continue
        assert not isinstance(step_, str)
        events: list[Event] = []
        for kind, *args in step_:
            if kind == "store":
                medium, group, hashes, size = args
                events.append(stored(*hashes, medium=medium, group=group, block_size=size))
                m = _norm(medium)
                for h in hashes:
                    counts[(m, group or 0, h)] += 1
                stores[m] += len(hashes)
                if size:
                    block_size[m] = size
                else:
                    block_size.setdefault(m, 0)
            elif kind == "remove":
                medium, group, hashes = args
                events.append(removed(*hashes, medium=medium, group=group))
                m = _norm(medium)
                block_size.setdefault(m, 0)  # the block size it keeps, but listed only once stored in
                for h in hashes:
                    key = (m, group or 0, h)
                    if counts[key] > 0:
                        counts[key] -= 1
                    else:
                        unknown += 1
                removes[m] += len(hashes)
            elif kind == "clear":
                events.append(AllBlocksCleared())
                counts.clear()
                stale = False
            else:
                events.append(UnknownEvent(type="Foo", body=["Foo", 1]))
        index.apply(Batch(ts=now, events=events), now)

        got = index.medium_stats(now)
        assert set(got) == {m for m in block_size if stores[m]}
        for m, s in got.items():
            resident = sum(1 for (mm, _, _), n in counts.items() if mm == m and n > 0)
            assert (s.blocks, s.tokens, s.block_size) == (resident, resident * block_size[m], block_size[m])
            assert (s.stores, s.removes) == (stores[m], removes[m])
        for m in {_norm(x) for x in MEDIUMS}:
            for group in (0, 1):
                for h in POOL:
                    assert index.refcount(h, m, group) == counts.get((m, group, h), 0)
        assert index.unknown_removes == unknown
        assert index.stale is stale


# --- mediums and tiers ---------------------------------------------------------------------------


def test_mediums_keep_the_engines_names_and_sum_by_tier_per_stream_and_fleet() -> None:
    occ = OccupancyIndex({("vllm", 0): {"gpu": 100, "cpu": 1000}, ("sglang", 0): {"GPU": 50, "CPU_PINNED": 400}})
    occ.apply(
        "vllm",
        0,
        batch(stored(1, 2), stored(3, medium="gpu"), stored(4, medium="CPU"), stored(5, 6, medium="storage")),
        10.0,
    )
    occ.apply(
        "sglang",
        0,
        batch(
            stored(1, medium="GPU", block_size=32),
            stored(7, 8, medium="cpu_pinned", block_size=32),
            stored(9, medium="DISK", block_size=32),
            stored(10, medium="EXTERNAL", block_size=32),
            stored(11, medium="lmcache", block_size=32),
        ),
        10.0,
    )
    snap = occ.snapshot(7, 10.0)
    sglang, vllm = snap["streams"]
    # per stream: the engine's own names (upper-cased), each with its tier
    assert {m: v["tier"] for m, v in vllm["mediums"].items()} == {"CPU": "CPU", "GPU": "GPU", "STORAGE": "DISK"}
    assert {m: v["tier"] for m, v in sglang["mediums"].items()} == {
        "CPU_PINNED": "CPU",
        "DISK": "DISK",
        "EXTERNAL": "EXTERNAL",
        "GPU": "GPU",
        "LMCACHE": "EXTERNAL",
    }
    # per stream by tier, fastest tier first
    assert list(sglang["tiers"]) == ["GPU", "CPU", "DISK", "EXTERNAL"]
    assert list(vllm["tiers"]) == ["GPU", "CPU", "DISK"]
    assert sglang["tiers"]["EXTERNAL"] == {
        "mediums": ["EXTERNAL", "LMCACHE"],
        "blocks": 2,
        "tokens": 64,
        "capacity_blocks": None,
        "stores_per_s": 0.033,  # 2 / 60, rounded to RATE_DECIMALS
        "removes_per_s": 0.0,
    }
    assert sglang["tiers"]["CPU"]["mediums"] == ["CPU_PINNED"]
    assert sglang["tiers"]["CPU"]["capacity_blocks"] == 400
    assert vllm["tiers"]["GPU"]["blocks"] == 3  # None and "gpu" are both GPU
    assert vllm["tiers"]["DISK"]["mediums"] == ["STORAGE"]
    # fleet totals: per medium name as before, and per tier
    assert snap["totals"]["CPU_PINNED"]["tier"] == "CPU"
    tiers = snap["tiers"]
    assert list(tiers) == ["GPU", "CPU", "DISK", "EXTERNAL"]
    assert {t: v["blocks"] for t, v in tiers.items()} == {"GPU": 4, "CPU": 3, "DISK": 3, "EXTERNAL": 2}
    assert {t: v["streams"] for t, v in tiers.items()} == {"GPU": 2, "CPU": 2, "DISK": 2, "EXTERNAL": 1}
    assert tiers["CPU"]["mediums"] == ["CPU", "CPU_PINNED"]
    assert tiers["CPU"]["capacity_blocks"] == 1400
    assert tiers["GPU"]["capacity_blocks"] == 150
    assert tiers["GPU"]["tokens"] == 3 * 16 + 32
    assert tiers["DISK"]["capacity_blocks"] is None  # no DISK capacity configured anywhere
    for tier, total in tiers.items():
        assert total["blocks"] == sum(s["tiers"][tier]["blocks"] for s in snap["streams"] if tier in s["tiers"])
        assert total["blocks"] == sum(v["blocks"] for v in snap["totals"].values() if v["tier"] == tier)
    assert msgspec.json.decode(msgspec.json.encode(snap)) == snap


def test_tier_capacity_is_null_unless_every_medium_of_the_tier_has_one() -> None:
    occ = OccupancyIndex({("a", 0): {"CPU": 10}})
    occ.apply("a", 0, batch(stored(1, medium="CPU"), stored(2, medium="CPU_PINNED")), 0.0)
    (entry,) = occ.snapshot(1, 0.0)["streams"]
    assert entry["mediums"]["CPU"]["capacity_blocks"] == 10
    assert entry["tiers"]["CPU"]["capacity_blocks"] is None
    assert entry["tiers"]["CPU"]["blocks"] == 2


def test_empty_medium_counts_as_gpu_like_the_hub_filter() -> None:
    from kvgateway.serve.query import parse_query

    occ = OccupancyIndex()
    events = [stored(1, medium=""), stored(2, medium=None), stored(3, medium="gPu")]
    occ.apply("a", 0, batch(*events), 0.0)
    assert occ.stream("a", 0).groups("GPU") == {0: 3}
    gpu_filter = parse_query({"medium": ["GPU"]}).filter
    assert select([event_key(e) for e in events], gpu_filter.types, gpu_filter.mediums) == [0, 1, 2]


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from([("a", 0), ("a", 1), ("b", 0)]),
            st.sampled_from(["stored", "removed", "cleared", "restart"]),
            st.lists(st.integers(0, 6), min_size=1, max_size=4),
            st.sampled_from([None, "CPU"]),
        ),
        max_size=30,
    )
)
def test_holds_any_answers_as_the_resident_count_does(
    steps: list[tuple[tuple[str, int], str, list[int], str | None]],
) -> None:
    """The O(1) question the routers ask (the fleet's holders not empty) against the O(groups)
    count, after every store, remove, clear and restart of any stream, medium and group."""
    occupancy = OccupancyIndex()
    assert not occupancy.holds_any()
    for (source, rank), kind, hashes, medium in steps:
        if kind == "restart":
            occupancy.stream(source, rank).reset()
        elif kind == "cleared":
            occupancy.apply(source, rank, batch(AllBlocksCleared()), 0.0)
        else:
            make = stored if kind == "stored" else removed
            occupancy.apply(source, rank, batch(make(*hashes, medium=medium)), 0.0)
        assert occupancy.holds_any() == (occupancy.resident_blocks() > 0)


# --- bounds on what the wire names -----------------------------------------------------------


def test_a_stream_past_its_mediums_and_groups_counts_the_rest_in_one_each(caplog: pytest.LogCaptureFixture) -> None:
    """A faulty engine naming ever new mediums or groups: the index keeps MAX_MEDIUMS mediums and
    MAX_GROUPS groups a medium apart, and counts every later one's blocks, exactly, in
    OVERFLOW_MEDIUM or OVERFLOW_GROUP, with one warning for each bound."""
    index = StreamIndex("a", 0, capacity_blocks={"CPU": 100})  # a configured medium counts as one
    extra = 5
    index.apply(batch(*(stored(n, medium=f"m{n}") for n in range(1, MAX_MEDIUMS + extra))), 0.0)
    kept = [f"M{n}" for n in range(1, MAX_MEDIUMS)]
    assert sorted(index.medium_stats(0.0)) == sorted(["CPU", *kept, OVERFLOW_MEDIUM])
    assert stats(index, OVERFLOW_MEDIUM).blocks == extra
    # the same medium again stays in its own; one removed under yet another new name leaves OTHER
    index.apply(batch(stored(10_000, medium="m1"), removed(MAX_MEDIUMS + 1, medium="never-seen")), 0.0)
    assert (stats(index, "M1").blocks, stats(index, OVERFLOW_MEDIUM).blocks) == (2, extra - 1)
    assert index.unknown_removes == 0
    other = StreamIndex("b", 1)
    other.apply(batch(*(stored(20_000 + g, medium="GPU", group=g) for g in range(MAX_GROUPS + 3))), 0.0)
    other.apply(batch(removed(20_000 + MAX_GROUPS, medium="GPU", group=10**9)), 0.0)
    assert sorted(other.groups("GPU")) == [OVERFLOW_GROUP, *range(MAX_GROUPS)]
    assert other.groups("GPU")[OVERFLOW_GROUP] == 2
    warned = [r.getMessage() for r in caplog.records if r.name == "kvgateway.index"]
    assert warned == [
        f"stream a:0 reports more than {MAX_MEDIUMS} mediums ('M{MAX_MEDIUMS}' among them): "
        f"the index counts the rest as {OVERFLOW_MEDIUM}",
        f"stream b:1 reports more than {MAX_GROUPS} groups in GPU ('{MAX_GROUPS}' among them): "
        f"the index counts the rest as group {OVERFLOW_GROUP}",
    ]
