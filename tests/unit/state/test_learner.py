"""The chain learner's table (kvgateway/state/_learner_py.py, the reference: these tests read its
arrays; the compiled twin answers as it does, test_core_differential.py): eviction order, the
entries of blocks no engine holds aged out first, the cap following the fleet, O(1) work per block
at the cap, and exact lookups through growth, compaction, eviction and shrinking."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgateway.engine.wire import BlockStored, Hash
from kvgateway.state._learner_py import _SECOND_CHANCES, ChainLearner, block_digests
from tests.support import events

SIZE = 2


def stored(block_hash: int, content: int, parent: Hash | None = None) -> BlockStored:
    """One block whose tokens are ``[content] * SIZE``."""
    return events.stored(block_hash, parent=parent, tokens=[content] * SIZE, block_size=SIZE)


def found(learner: ChainLearner, content: int, stream: tuple[str, int] = ("a", 0)) -> list[Hash]:
    """The learned hash of the root block of ``content`` (announced with no parent)."""
    return learner.chain(*stream, block_digests([content] * SIZE, SIZE))


def hashes(learner: ChainLearner) -> list[Hash]:
    return [block_hash for _, block_hash in learner.entries()]


def check_index(learner: ChainLearner, *, capped: bool = True) -> None:
    """Every live ring entry is where the index finds it, and nothing else is linked."""
    live = 0
    size = len(learner._keys)
    for n in range(learner._count):
        at = (learner._head + n) % size
        key = learner._keys[at]
        if key:
            live += 1
            assert learner._find(key) == at
    linked = 0
    for first in learner._buckets:
        p = first
        while p:
            linked += 1
            p = learner._nexts[p - 1]
    assert live == len(learner) == linked
    assert len(learner) <= learner.cap or not capped


def test_first_in_first_out_at_the_cap() -> None:
    learner = ChainLearner(max_blocks=5)
    for n in range(12):
        learner.learn("a", 0, stored(100 + n, n))
        assert len(learner) == min(n + 1, 5)
    assert hashes(learner) == [107, 108, 109, 110, 111]  # the newest five, oldest first
    assert learner.evicted == 7 and learner.learned == 12
    assert found(learner, 6) == [] and found(learner, 7) == [107]
    check_index(learner)


def test_eviction_is_one_entry_at_a_time() -> None:
    # The old learner dropped a batch (cap // 64) at once, down to below the cap.
    learner = ChainLearner(max_blocks=640)
    for n in range(641):
        learner.learn("a", 0, stored(n + 1, n))
    assert len(learner) == 640 and learner.evicted == 1


def test_a_re_announced_block_moves_to_the_back() -> None:
    learner = ChainLearner(max_blocks=3)
    for n in range(3):
        learner.learn("a", 0, stored(100 + n, n))
    learner.learn("a", 0, stored(100, 0))  # announced again
    learner.learn("a", 0, stored(103, 3))
    assert hashes(learner) == [102, 100, 103]  # 101 was the oldest announcement
    assert learner.learned == 5 and learner.evicted == 1
    check_index(learner)


def test_a_re_announcement_with_another_hash_replaces_the_entry() -> None:
    learner = ChainLearner(max_blocks=8)
    learner.learn("a", 0, stored(1, 5))
    learner.learn("a", 0, stored(2, 5))  # the engine restarted with another seed: same content, new hash
    assert found(learner, 5) == [2] and len(learner) == 1


def test_entries_of_blocks_no_engine_holds_age_out_first() -> None:
    held = {("a", 0): {100, 101}}
    asked: list[tuple[tuple[str, int], Hash]] = []

    def resident(stream: tuple[str, int], block_hash: Hash) -> bool:
        asked.append((stream, block_hash))
        return block_hash in held.get(stream, set())

    learner = ChainLearner(max_blocks=4, resident=resident)
    for n in range(4):
        learner.learn("a", 0, stored(100 + n, n))
    learner.learn("a", 0, stored(104, 4))
    # 100 and 101 are older, but still resident: 102 goes.
    assert hashes(learner) == [103, 100, 101, 104]
    assert asked == [(("a", 0), 100), (("a", 0), 101), (("a", 0), 102)]
    assert learner.second_chances == 2 and learner.evicted == 1
    learner.learn("a", 0, stored(105, 5))
    assert hashes(learner) == [100, 101, 104, 105]
    for n in range(6, 20):  # churn elsewhere never forgets the resident prefix
        learner.learn("a", 0, stored(100 + n, n))
    assert {100, 101} <= set(hashes(learner))
    assert found(learner, 0) == [100] and found(learner, 1) == [101]
    check_index(learner)


def test_residency_is_asked_of_the_stream_that_announced_the_block() -> None:
    asked: list[tuple[str, int]] = []

    def resident(stream: tuple[str, int], block_hash: Hash) -> bool:
        asked.append(stream)
        return False

    learner = ChainLearner(max_blocks=2, resident=resident)
    learner.learn("a", 0, stored(1, 1))
    learner.learn("b", 3, stored(2, 2))
    learner.learn("a", 1, stored(3, 3))
    learner.learn("a", 1, stored(4, 4))
    assert asked == [("a", 0), ("b", 3)]


def test_every_entry_resident_still_keeps_the_cap_with_bounded_work() -> None:
    calls = 0

    def resident(stream: tuple[str, int], block_hash: Hash) -> bool:
        nonlocal calls
        calls += 1
        return True

    learner = ChainLearner(max_blocks=50, resident=resident)
    for n in range(50):
        learner.learn("a", 0, stored(n + 1, n))
    for n in range(50, 1050):
        before = calls
        learner.learn("a", 0, stored(n + 1, n))
        assert calls - before <= _SECOND_CHANCES  # O(1) per block, whatever the table holds
        assert len(learner) == 50
    assert learner.evicted == 1000
    check_index(learner)


def test_the_cap_follows_the_fleet_between_floor_and_ceiling() -> None:
    learner = ChainLearner(max_blocks=1000, floor=10, per_resident=2)
    assert learner.cap == 10  # no fleet counted yet: the floor
    learner.follow_fleet(120)
    assert learner.cap == 240
    learner.follow_fleet(3)
    assert learner.cap == 10
    learner.follow_fleet(10**9)
    assert learner.cap == 1000  # max_blocks is the ceiling
    assert ChainLearner(max_blocks=4, floor=10).cap == 4


def test_the_table_shrinks_when_the_fleet_does() -> None:
    learner = ChainLearner(max_blocks=100_000, floor=100, per_resident=1)
    learner.follow_fleet(20_000)
    for n in range(20_000):
        learner.learn("a", 0, stored(n + 1, n))
    assert len(learner) == 20_000
    large = learner.nbytes()
    learner.follow_fleet(500)  # most engines restarted
    n = 20_000
    while len(learner) > 500:
        before = len(learner)
        learner.learn("a", 0, stored(n + 1, n))
        # up to four evictions per new entry (and one more while the ring is full): O(1), converging
        assert before - len(learner) in (3, 4) or len(learner) == 500
        if n % 997 == 0:
            check_index(learner, capped=False)
        n += 1
    assert n - 20_000 <= (20_000 - 500) // 3 + 1
    assert hashes(learner)[-100:] == list(range(n - 99, n + 1))  # the newest kept
    assert learner.nbytes() < large / 10
    check_index(learner)


def test_arrays_grow_with_the_entries_not_with_the_cap() -> None:
    learner = ChainLearner(max_blocks=2_000_000, floor=2_000_000)
    empty = learner.nbytes()
    assert empty < 64 * 1024  # not two million slots up front
    for n in range(10_000):
        learner.learn("a", 0, stored(n + 1, n))
    assert learner.nbytes() < 10_000 * 40
    check_index(learner)


def test_re_announcements_are_compacted_not_grown() -> None:
    learner = ChainLearner(max_blocks=100_000)
    for n in range(10):
        learner.learn("a", 0, stored(n + 1, n))
    for _ in range(1000):  # a hot prefix announced over and over
        for n in range(10):
            learner.learn("a", 0, stored(n + 1, n))
    assert len(learner) == 10 and len(learner._keys) <= 100_000
    check_index(learner)


def test_chains_and_streams_are_kept_apart() -> None:
    learner = ChainLearner(max_blocks=100)
    tokens = [1, 1, 2, 2, 3, 3]
    learner.learn("a", 0, BlockStored([11, 12, 13], None, tokens, SIZE, None, None, None, None))
    learner.learn("b", 0, BlockStored([21, 22], None, tokens[:4], SIZE, None, None, None, None))
    digests = block_digests(tokens, SIZE)
    assert learner.chain("a", 0, digests) == [11, 12, 13]
    assert learner.chain("b", 0, digests) == [21, 22]
    assert learner.chain("a", 1, digests) == []
    byte = [b"\x01" * 32, b"\x02" * 32]
    learner.learn("c", 0, BlockStored(byte, None, tokens[:4], SIZE, None, None, None, None))
    assert learner.chain("c", 0, digests) == byte


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_blocks"):
        ChainLearner(max_blocks=-1)
    with pytest.raises(ValueError, match="floor"):
        ChainLearner(floor=0)


class Model:
    """The reference: an ordered dict, first in first out by last announcement, no residency."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.map: OrderedDict[tuple[tuple[str, int], int, Hash | None], Hash] = OrderedDict()

    def learn(self, stream: tuple[str, int], content: int, parent: Hash | None, block_hash: Hash) -> None:
        key = (stream if parent is None else ("", 0), content, parent)
        self.map.pop(key, None)
        self.map[key] = block_hash
        while len(self.map) > self.cap:
            self.map.popitem(last=False)


ops_st = st.lists(
    st.tuples(st.sampled_from([("a", 0), ("b", 1)]), st.integers(0, 40), st.integers(0, 3)),
    min_size=1,
    max_size=400,
)


@settings(max_examples=80, deadline=None)
@given(ops=ops_st, cap=st.integers(1, 60))
def test_same_answers_as_an_ordered_dict(ops: list[tuple[tuple[str, int], int, int]], cap: int) -> None:
    """Exact lookups: every learned root and child block answers as the reference model does
    (with a ring as large as the cap, re-announcements can only make it forget sooner, never
    answer otherwise)."""
    learner = ChainLearner(max_blocks=cap, floor=cap)
    model = Model(cap)
    for n, (stream, content, parent_pick) in enumerate(ops):
        parent = None if parent_pick == 0 else 1_000_000 + parent_pick  # three shared parents
        block_hash = n + 1
        learner.learn(*stream, BlockStored([block_hash], parent, [content] * SIZE, SIZE, None, None, None, None))
        model.learn(stream, content, parent, block_hash)
        assert len(learner) <= cap
    check_index(learner)
    for (stream, content, parent), block_hash in model.map.items():
        if parent is None:
            got = learner.chain(*stream, block_digests([content] * SIZE, SIZE))
            assert got in ([block_hash], [])
    kept = hashes(learner)
    assert kept == list(model.map.values())[len(model.map) - len(kept) :]  # the newest, in order
    assert kept[-1] == block_hash  # the last announcement is always kept


def test_same_answers_as_a_dict_without_eviction_through_growth_and_compaction() -> None:
    rng = random.Random(5)
    learner = ChainLearner(max_blocks=10**6, floor=10**6)
    model: dict[int, int] = {}
    for n in range(30_000):
        content = rng.randrange(12_000)
        learner.learn("a", 0, stored(n + 1, content))
        model[content] = n + 1
    assert len(learner) == len(model) and learner.evicted == 0
    for content, block_hash in model.items():
        assert found(learner, content) == [block_hash]
    assert found(learner, 12_000) == []
    check_index(learner)


def test_a_growing_ring_gives_the_heaps_free_pages_back() -> None:
    from kvgateway.runtime.memory import release_free_heap
    from kvgateway.state._learner_py import _TRIM_FROM

    assert release_free_heap() in (True, False)  # glibc's malloc_trim, or nothing to call
    learner = ChainLearner(max_blocks=10**6, floor=10**6)
    for n in range(_TRIM_FROM + 1000):
        learner.learn("a", 0, stored(n + 1, n))
    # trimmed once the ring passed _TRIM_FROM slots; next after a quarter more
    assert learner._trimmed_at > _TRIM_FROM and learner._trimmed_at >= learner.slots
