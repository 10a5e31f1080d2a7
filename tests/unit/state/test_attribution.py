"""Prefill attribution (sans-I/O): every GPU-tier store gets one origin, in tokens, against the
fleet as it was at that event; the fleet's holders kept by the occupancy index."""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgateway.engine.wire import AllBlocksCleared, Event
from kvgateway.state.attribution import Attribution
from kvgateway.state.history import ORIGINS
from kvgateway.state.occupancy import OccupancyIndex
from tests.support import events
from tests.support.events import batch, removed

SIZE = 4


stored = partial(events.stored, tokens=[], block_size=SIZE)


class Fleet:
    """An index with the attribution observing it, and batches applied at chosen times."""

    def __init__(self, window: float = 60.0, **kwargs: Any) -> None:
        self.attribution = Attribution(window, **kwargs)
        self.index = OccupancyIndex(observer=self.attribution)

    def apply(self, source: str, *events: Event, ts: float = 0.0) -> None:
        self.index.apply(source, 0, batch(*events, ts=ts), now=ts)

    def tokens(self, source: str) -> dict[str, int]:
        account = self.attribution.account((source, 0))
        return {name: n for name, n in zip(ORIGINS, account.tokens, strict=True) if n}


def test_each_origin_in_its_order_of_precedence() -> None:
    fleet = Fleet()
    fleet.apply("a", stored(1, 2))  # new
    fleet.apply("a", stored(1))  # hit: a re-announced reuse
    fleet.apply("a", stored(3, medium="CPU"))  # a CPU store: a tier movement, not counted
    fleet.apply("a", stored(3))  # offloaded: a held it in CPU
    fleet.apply("a", removed(2), ts=10.0)
    fleet.apply("a", stored(2), ts=69.0)  # refetch: evicted 59 s ago
    fleet.apply("b", stored(1, 9))  # elsewhere (1: a holds it) and new (9)
    assert fleet.tokens("a") == {"hit": 4, "offloaded": 4, "refetch": 4, "new": 8}
    assert fleet.tokens("b") == {"elsewhere": 4, "new": 4}


def test_an_eviction_older_than_the_window_is_not_a_refetch() -> None:
    fleet = Fleet(window=30.0)
    fleet.apply("a", stored(1, 2), ts=0.0)
    fleet.apply("a", removed(1, 2), ts=1.0)
    fleet.apply("a", stored(1), ts=31.0)
    fleet.apply("a", stored(2), ts=31.5)
    assert fleet.tokens("a") == {"new": 12, "refetch": 4}


def test_hit_beats_offloaded_beats_refetch_beats_elsewhere() -> None:
    fleet = Fleet()
    fleet.apply("b", stored(5))
    fleet.apply("a", stored(5))  # elsewhere
    fleet.apply("a", removed(5))
    fleet.apply("a", stored(5, medium="CPU"))
    fleet.apply("a", stored(5))  # offloaded, though evicted and held by b
    fleet.apply("a", stored(5))  # hit
    assert fleet.tokens("a") == {"elsewhere": 4, "offloaded": 4, "hit": 4}


def test_events_of_one_batch_see_the_ones_before_them() -> None:
    fleet = Fleet()
    fleet.apply("a", stored(1, 2), removed(1), stored(1), stored(3), stored(3))
    assert fleet.tokens("a") == {"new": 12, "refetch": 4, "hit": 4}
    fleet.apply("b", stored(7), stored(8), removed(9, medium="CPU"))  # all new: accounted at once
    assert fleet.tokens("b") == {"new": 8}


def test_a_block_held_only_by_a_stream_that_evicted_it_is_new() -> None:
    fleet = Fleet()
    fleet.apply("b", stored(5))
    fleet.apply("b", removed(5))
    fleet.apply("a", stored(5))
    assert fleet.tokens("a") == {"new": 4}


def test_same_content_under_another_hash_family_is_elsewhere() -> None:
    fleet = Fleet()
    fleet.apply("b", stored(99))  # new; one stream alone never looks for a second hash family
    prompt = list(range(100, 112))  # three blocks
    fleet.apply("a", stored(11, 12, 13, tokens=prompt))
    # b hashes with another seed: the same first block's content under another hash shows the second family
    fleet.apply("b", stored(21, 22, 23, tokens=prompt))
    assert fleet.attribution.content.active
    assert fleet.tokens("b") == {"elsewhere": 4, "new": 12}  # a's chain before the start: its root only
    # from then on, every level meets: a chain announced in two events, under a third seed
    fleet.apply("a", stored(31, tokens=list(range(200, 204))))
    fleet.apply("a", stored(32, 33, parent=31, tokens=list(range(204, 212))))
    fleet.apply("c", stored(41, tokens=list(range(200, 204))))
    fleet.apply("c", stored(42, 43, 44, parent=41, tokens=list(range(204, 216))))
    assert fleet.tokens("c") == {"elsewhere": 12, "new": 4}


def test_content_is_not_compared_while_the_fleet_hashes_alike() -> None:
    fleet = Fleet()
    fleet.apply("a", stored(1, 2, tokens=list(range(8))))
    fleet.apply("b", stored(1, 2, tokens=list(range(8))))
    assert not fleet.attribution.content.active
    assert fleet.tokens("b") == {"elsewhere": 8}
    assert fleet.attribution.to_json(fleet.index.streams(), 0.0)["compared_by"] == "hash"


def test_a_stale_stream_is_flagged_and_its_stores_counted_apart() -> None:
    fleet = Fleet()
    fleet.index.stream("a", 0).mark_stale("unrecovered")
    fleet.apply("a", stored(1, 2))
    assert fleet.tokens("a") == {}
    doc = fleet.attribution.stream_json(fleet.index.stream("a", 0), 0.0)
    assert doc["stale"] is True
    assert doc["unattributed_tokens"] == 8
    fleet.apply("a", AllBlocksCleared())  # whole again
    fleet.apply("a", stored(1))
    assert fleet.tokens("a") == {"new": 4}


def test_decode_filled_blocks_are_stores_and_unknown_sizes_use_the_streams_last() -> None:
    fleet = Fleet()
    fleet.apply("a", stored(1, 2, tokens=list(range(8))))
    fleet.apply("a", stored(3, parent=2, block_size=0))  # a block filled by decode, size not repeated
    assert fleet.tokens("a") == {"new": 12}


def test_recent_counts_keep_five_minutes() -> None:
    fleet = Fleet()
    fleet.apply("a", stored(1), ts=0.0)
    fleet.apply("a", stored(2), ts=200.0)
    doc = fleet.attribution.stream_json(fleet.index.stream("a", 0), 320.0)
    assert doc["since_start"]["tokens"]["new"] == 8
    assert doc["last_5m"]["tokens"]["new"] == 4
    assert doc["last_5m"]["shares"]["new"] == 1.0


def test_the_eviction_memory_is_bounded() -> None:
    fleet = Fleet(max_evicted=3)
    fleet.apply("a", stored(*range(1, 11)), ts=0.0)
    fleet.apply("a", removed(*range(1, 11)), ts=1.0)
    fleet.apply("a", removed(*range(11, 14)), ts=20.0)  # the next bucket: the first is forgotten at the bound
    account = fleet.attribution.account(("a", 0))
    assert (account.evicted.size, account.evicted.dropped) == (3, 10)
    assert fleet.attribution.tracked() == (3, 3)
    fleet.apply("a", stored(5, 12), ts=21.0)
    assert fleet.tokens("a") == {"new": 44, "refetch": 4}


def test_the_content_table_is_bounded_and_keeps_blocks_still_held() -> None:
    fleet = Fleet(max_content=4)
    fleet.apply("b", stored(99))
    fleet.apply("a", stored(1, tokens=[9, 9, 9, 9]))
    fleet.apply("b", stored(2, tokens=[9, 9, 9, 9]))  # second family: comparing
    for root in range(10, 20):
        fleet.apply("a", stored(root, tokens=[root] * SIZE))
        fleet.apply("a", removed(root))
    assert len(fleet.attribution.content) == 4
    fleet.apply("c", stored(3, tokens=[9, 9, 9, 9]))  # a and b still hold the prompt: kept
    assert fleet.tokens("c") == {"elsewhere": 4}


# --- the fleet's holders, against a model --------------------------------------------------

op = st.one_of(
    st.tuples(
        st.just("store"),
        st.sampled_from("ab"),
        st.sampled_from([None, "CPU"]),
        st.lists(st.integers(0, 6), min_size=1, max_size=4),
    ),
    st.tuples(
        st.just("remove"),
        st.sampled_from("ab"),
        st.sampled_from([None, "CPU"]),
        st.lists(st.integers(0, 6), min_size=1, max_size=4),
    ),
    st.tuples(st.just("clear"), st.sampled_from("ab"), st.none(), st.just([])),
)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(op, max_size=40))
def test_fleet_holders_and_origins_match_a_model(ops: list[tuple[str, str, str | None, list[int]]]) -> None:
    fleet = Fleet(window=1e9)
    refs: dict[tuple[str, str], Counter[int]] = {}
    evicted: dict[str, set[int]] = {"a": set(), "b": set()}
    expected: dict[str, Counter[str]] = {"a": Counter(), "b": Counter()}
    for kind, source, medium, hashes in ops:
        tier = medium or "GPU"
        if kind == "store":
            if tier == "GPU":
                for h in hashes:
                    expected[source][_model_origin(refs, evicted, source, h)] += SIZE
            fleet.apply(source, stored(*hashes, medium=medium))
            for h in hashes:
                refs.setdefault((source, tier), Counter())[h] += 1
        elif kind == "remove":
            fleet.apply(source, removed(*hashes, medium=medium))
            held = refs.setdefault((source, tier), Counter())
            for h in hashes:
                if held[h]:
                    held[h] -= 1
            if tier == "GPU":
                evicted[source].update(hashes)
        else:
            fleet.apply(source, AllBlocksCleared())
            for key in refs:
                if key[0] == source:
                    refs[key] = Counter()
        for h in range(7):
            groups = sum(1 for held in refs.values() if held[h] > 0)
            assert fleet.index.stream("a", 0).fleet_holders(h) == groups
    for source in "ab":
        assert fleet.tokens(source) == {k: v for k, v in expected[source].items() if v}


def _model_origin(refs: dict[tuple[str, str], Counter[int]], evicted: dict[str, set[int]], source: str, h: int) -> str:
    """The origin of one block, batch by batch (a repeat inside one event sees the state before it)."""
    if refs.get((source, "GPU"), Counter())[h] > 0:
        return "hit"
    if refs.get((source, "CPU"), Counter())[h] > 0:
        return "offloaded"
    if h in evicted[source]:
        evicted[source].discard(h)
        return "refetch"
    if any(held[h] > 0 for (other, _tier), held in refs.items() if other != source):
        return "elsewhere"
    return "new"


def test_the_origins_names_follow_the_accounts_indexes() -> None:
    """The pass counts by index (kvgateway/state/_apply_py.py); the documents and metrics by name."""
    from kvgateway.state import _apply_py

    indexes = [_apply_py.HIT, _apply_py.OFFLOADED, _apply_py.REFETCH, _apply_py.ELSEWHERE, _apply_py.NEW]
    assert [ORIGINS[i] for i in indexes] == ["hit", "offloaded", "refetch", "elsewhere", "new"]
    assert len(ORIGINS) == _apply_py.ORIGIN_COUNT


def test_the_observer_says_what_to_compare_as_streams_and_families_appear() -> None:
    from kvgateway.state._apply_py import COMPARE_ALL, COMPARE_NONE, COMPARE_ROOTS

    observer = Attribution()
    assert observer.compare == COMPARE_NONE
    observer.account(("a", 0))
    assert observer.compare == COMPARE_NONE  # one stream: no second family possible
    observer.account(("b", 0))
    assert observer.compare == COMPARE_ROOTS
    observer.content.active = True  # as a second hash family makes it
    observer.account(("c", 0))
    assert observer.compare == COMPARE_ALL
