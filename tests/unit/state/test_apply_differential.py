"""The index's compiled pass (kvgateway/state/_apply_c.pyx) against its pure-Python reference
(_apply_py.py), fed the same generated steps side by side in one process: identical index state
(every group's hashes and reference counts), snapshots, digests, fleet holders, prefill attribution
counts and its JSON, and the routers' learner of the same core answering alike with each index's
residency question and its fleet holders (the compiled learner asks a compiled :class:`BlockSet` in C);
over every layout feature the index reads (mediums of every tier and case, groups and group_idx
that are not ints, repeats inside one event, removes of unknown blocks, clears, restarts, stale
marks, replayed batches, frozen snapshots, a second hash family with token ids, the refetch window
and the evictions' bound).

Each index runs with one core's pass: the names :mod:`kvgateway.state.occupancy` and
:mod:`kvgateway.state.attribution` take from the chosen module are swapped for every step of that
index (:func:`core`). Skipped where the compiled core was not built."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgateway.engine.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored, Event, Hash, UnknownEvent
from kvgateway.state import _apply_py, _learner_py, attribution, occupancy
from kvgateway.state.attribution import Attribution
from kvgateway.state.occupancy import OccupancyIndex
from tests.support.cores import compiled_twin, packed
from tests.support.payloads import U64

STREAMS = [("a", 0), ("a", 1), ("b", 0)]
SWAPPED = ("Account", "Evictions", "Group", "Medium", "apply_batch")


def _compiled(name: str) -> ModuleType:
    return compiled_twin(name)


@contextmanager
def core(module: ModuleType) -> Iterator[None]:
    """The index and the attribution built and applied with ``module``'s pass while the block runs."""
    saved = [getattr(occupancy, name) for name in SWAPPED]
    saved_account = attribution.Account
    for name in SWAPPED:
        setattr(occupancy, name, getattr(module, name))
    attribution.Account = module.Account
    try:
        yield
    finally:
        for name, value in zip(SWAPPED, saved, strict=True):
            setattr(occupancy, name, value)
        attribution.Account = saved_account


# A small pool of every hash kind, so that blocks come back, repeat and collide across streams.
POOL: list[Hash] = [0, 1, 2, 3, 5, 8, 2**63, U64, -1, -(2**63), 2**70, b"\x00" * 32, b"\xff" * 32, b"\x01"]
hash_st = st.sampled_from(POOL)
# 32-byte hashes (vLLM's raw sha256 ones) alike in all but one byte, and bytes of other lengths
BLOBS: list[Hash] = [
    *(bytes([i]) * 32 for i in range(0, 256, 17)),
    *(b"\x00" * 31 + bytes([i]) for i in range(1, 40)),
    *(bytes([i]) + b"\x00" * 31 for i in range(1, 9)),
    b"\x00" * 31,
    b"\x00" * 33,
]
medium_st = st.sampled_from([None, "GPU", "gpu", "CPU", "cpu_tier", "DISK", "LMCACHE", ""])
group_st = st.sampled_from([None, 0, 1, 2, "1", True, 2.0])


@st.composite
def event_st(draw: st.DrawFn) -> Event:
    kind = draw(st.sampled_from(["stored"] * 5 + ["removed"] * 3 + ["cleared", "unknown"]))
    extra: dict[str, Any] = {}
    group_idx = draw(group_st)
    if group_idx is not None:
        extra["group_idx"] = group_idx
    if kind == "stored":
        hashes = draw(st.lists(hash_st, max_size=5))
        size = draw(st.sampled_from([0, 1, 2, 4]))
        # tokens alike for a chain's first blocks whatever the hash: a second hash family shows
        tokens = [] if size == 0 or draw(st.booleans()) else [i % 3 for i in range(len(hashes) * size)]
        parent = draw(st.none() | hash_st)
        return BlockStored(
            hashes, parent, tokens, size, None, draw(medium_st), draw(st.none() | st.just("lora")), extra
        )
    if kind == "removed":
        return BlockRemoved(draw(st.lists(hash_st, max_size=5)), draw(medium_st), extra)
    if kind == "cleared":
        return AllBlocksCleared()
    return UnknownEvent(type="BlockMoved", body=["BlockMoved", 1])


@st.composite
def step_st(draw: st.DrawFn) -> tuple[str, Any]:
    kind = draw(st.sampled_from(["batch"] * 8 + ["restart", "stale", "digest", "freeze"]))
    stream = draw(st.sampled_from(STREAMS))
    if kind != "batch":
        return kind, stream
    events = draw(st.lists(event_st(), min_size=1, max_size=4))
    return "batch", (stream, events, draw(st.floats(0, 3)), draw(st.booleans()))


class Side:
    """One core's index, attribution and learner, every step applied with that core's pass."""

    def __init__(self, module: ModuleType, window: float, bound: int) -> None:
        self.module = module
        with core(module):
            self.attribution = Attribution(window, max_evicted=bound, max_content=6)
            self.index = OccupancyIndex(observer=self.attribution)
        # the gateway's learner (serve/router_state.py) of the same core: the residency question
        # asked of the fleet's holders first (a compiled BlockSet, asked in C, on the compiled side)
        learner = _learner_py if module is _apply_py else _compiled("kvgateway.state._learner_c")
        self.learner = learner.ChainLearner(64, resident=self.index.holds, floor=8, held=self.index.holders)
        self.frozen: list[Any] = []

    def step(self, kind: str, value: Any, ts: float) -> None:
        with core(self.module):
            if kind == "batch":
                (source, rank), events, _dt, replayed = value
                if self.module is not _apply_py:  # the hashes as the compiled parser keeps them
                    events = packed(events)
                batch = Batch(ts, events, rank)
                self.index.apply(source, rank, batch, now=1000.0 + ts, replayed=replayed)
                self.learner.learn_batch(source, rank, batch)
            elif kind == "restart":
                self.index.stream(*value).reset()
            elif kind == "stale":
                self.index.stream(*value).mark_stale("unrecovered")
            elif kind == "digest":
                self.index.stream(*value).digest()
            else:  # a snapshot holds the groups: the next change copies them first
                self.frozen.append(shown_groups(self.index.stream(*value).block_groups(freeze=True)))

    def shown(self, now: float) -> dict[str, Any]:
        """Everything the index, the attribution and the learner show."""
        index = self.index
        streams = list(index.streams())
        out: dict[str, Any] = {
            "occupancy": index.snapshot(0, now),
            "holders": [index.stream(*STREAMS[0]).fleet_holders(h) for h in POOL],
            "fleet": sorted(map(repr, index.holders)),  # every hash some group holds, whatever the pool
            "holds": [index.holds(s, h) for s in STREAMS for h in POOL],
            "resident": index.resident_blocks(),
            "prefill": self.attribution.to_json(streams, now),
            "tracked": self.attribution.tracked(),
            "learner": (self.learner.entries(), self.learner.evicted, self.learner.second_chances, len(self.learner)),
        }
        for stream in streams:
            key = f"{stream.source}/{stream.dp_rank}"
            out[key] = {
                "groups": shown_groups(stream.block_groups()),
                "unknown_removes": stream.unknown_removes,
                "stale": stream.stale_reason,
                "prefill": self.attribution.stream_json(stream, now),
                "refcounts": [stream.refcount(h, m, g) for h in POOL for m in (None, "CPU") for g in (None, 1)],
            }
            if stream._digest:
                out[key]["digest"] = stream.digest()
        return out


def shown_groups(groups: list[occupancy.BlockGroup]) -> list[Any]:
    return [
        (medium, group_idx, size, sorted(map(repr, blocks)), sorted((repr(h), n) for h, n in extra.items()))
        for medium, group_idx, size, blocks, extra in groups
    ]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    steps=st.lists(step_st(), min_size=1, max_size=30),
    window=st.sampled_from([0.5, 2.0, 60.0]),
    bound=st.sampled_from([2, 5, 32_768]),
)
def test_both_passes_keep_the_same_index_attribution_and_learner(
    steps: list[tuple[str, Any]], window: float, bound: int
) -> None:
    compiled = _compiled("kvgateway.state._apply_c")
    sides = [Side(_apply_py, window, bound), Side(compiled, window, bound)]
    ts = 0.0
    for kind, value in steps:
        if kind == "batch":
            ts += value[2]
        for side in sides:
            side.step(kind, value, ts)
        assert sides[0].shown(1000.0 + ts) == sides[1].shown(1000.0 + ts)
    assert sides[0].frozen == sides[1].frozen


def test_events_of_any_length_are_applied_alike_with_their_keys_read_once() -> None:
    """The compiled pass reads an event's keys once, into its own room up to 64 hashes and into an
    allocated one beyond: events of 1, 63, 64, 65 and 130 hashes of every kind, stored fresh,
    stored again (held elsewhere in the fleet, and evicted lately), removed in part with unknown
    hashes, by two streams sharing blocks, a tracked digest and a tuple of hashes among them; the
    same index, attribution and learner as the reference after every batch."""
    sides = [Side(_apply_py, 60.0, 32_768), Side(_compiled("kvgateway.state._apply_c"), 60.0, 32_768)]
    kinds: list[Hash] = [2**63 + 5, U64, 0, -3, 2**70, b"\x07" * 32, b"short", 7, -(2**63), 3, -(2**64)]
    ts = 0.0
    for step, n in enumerate([1, 63, 64, 65, 130, 2, 65, 66, 3]):
        base = 1_000 * (step % 4)
        # the streams share no block until step 5 (a hash held by one group alone leaves the fleet
        # with it, the keys read once), then the hashes of every kind in both
        shared = kinds[2 * (step - 5) : 2 * (step - 5) + 5] if step >= 5 else []
        hashes: list[Hash] = [base + i for i in range(n - len(shared))] + shared
        stream = STREAMS[step % 2]
        tokens = [i % 5 for i in range(2 * n)]
        events: list[Event] = [
            BlockStored(hashes, None, tokens, 2, None, "GPU", None, {}),
            BlockRemoved([*hashes[: n // 2], 99_999], "GPU", {}),
            BlockStored(tuple(hashes[n // 3 :]) if step == 5 else hashes[n // 3 :], None, [], 0, None, "GPU", None, {}),
        ]
        ts += 1.0
        for side in sides:
            if step == 3:
                side.step("digest", stream, ts)
            side.step("batch", (stream, events, 1.0, False), ts)
        assert sides[0].shown(1000.0 + ts) == sides[1].shown(1000.0 + ts)
    assert sides[1].learner.evicted and sides[1].attribution.tracked()


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["add", "take", "none_of"]), st.lists(hash_st, max_size=6), st.floats(0, 5)),
        max_size=25,
    ),
    window=st.sampled_from([0.5, 3.0]),
    bound=st.sampled_from([1, 3, 8]),
)
def test_the_compiled_evictions_remember_and_forget_as_the_reference(
    ops: list[tuple[str, list[Hash], float]], window: float, bound: int
) -> None:
    """Generations, expiry and the bound (``dropped``) hash by hash, at every step."""
    compiled = _compiled("kvgateway.state._apply_c")
    both = [module.Evictions(window, bound) for module in (_apply_py, compiled)]
    ts = 0.0
    for kind, hashes, dt in ops:
        ts += dt
        answers = []
        for evictions in both:
            if kind == "add":
                answers.append(evictions.add(hashes, ts))
            elif kind == "take":
                answers.append([evictions.take(h) for h in hashes])
            else:
                answers.append(evictions.none_of(hashes))
        assert answers[0] == answers[1]
        shown = [(e.current, e.previous, e.since, e.dropped, e.size) for e in both]
        assert shown[0] == shown[1]


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "add", "take", "none_of"]),
            st.lists(
                st.integers(-300, 300)  # a negative hash and a u64 of its magnitude: two hashes
                | st.sampled_from([U64, 2**63, 2**64, -5, b"k", *BLOBS])
                | st.binary(min_size=32, max_size=32),
                max_size=40,
            ),
            st.floats(0, 2),
        ),
        max_size=40,
    ),
    bound=st.sampled_from([50, 400]),
)
def test_the_compiled_evictions_table_grows_and_deletes_as_the_reference_forgets(
    ops: list[tuple[str, list[Hash], float]], bound: int
) -> None:
    """Many hashes at once: the compiled generations' tables grow past their first size, a take
    frees a slot inside a run of collisions, 32-byte hashes that differ in one byte share the
    content table, negative hashes in their own table beside u64 ones of the same magnitude, hash 0
    and the hashes of no table's kind sit beside them; every generation still shows the
    reference's, at every step."""
    compiled = _compiled("kvgateway.state._apply_c")
    both = [module.Evictions(3.0, bound) for module in (_apply_py, compiled)]
    ts = 0.0
    for kind, hashes, dt in ops:
        ts += dt
        if kind == "add":
            for evictions in both:
                evictions.add(hashes, ts)
        elif kind == "take":
            assert [both[0].take(h) for h in hashes] == [both[1].take(h) for h in hashes]
        else:
            assert both[0].none_of(hashes) == both[1].none_of(hashes)
        shown = [(e.current, e.previous, e.since, e.dropped, e.size) for e in both]
        assert shown[0] == shown[1]
        # every remembered hash is still found where a lookup probes, not only where a scan looks
        assert not any(both[1].none_of([h]) for h in [*both[0].current, *both[0].previous])


EDGES: list[Hash] = [
    *(2**k + d for k in (0, 29, 30, 31, 59, 60, 61, 63, 64) for d in (-1, 0, 1)),
    (15 << 60) | 12_345,  # a three-digit hash whose top digit is the largest that fits
    (17 << 60) + 3,  # one whose top digit does not
    2**90 + 7,
    # and a signed hash's negative half at the same edges: -2**63 the last kept in the negatives'
    # table, -2**63 - 1 (top digit 8 and a digit below it) the first that is not
    -1,
    -2,
    *(-(2**k) + d for k in (29, 30, 31, 59, 60, 61, 63, 64) for d in (-1, 0, 1)),
    -((15 << 60) | 12_345),
]


def test_the_compiled_evictions_read_every_digit_of_a_hash_at_the_digit_edges() -> None:
    """Ints at the edges of 30-bit digits and of 64 bits: each shows as itself (a digit lost or
    shifted wrong shows another int), is found and is taken back, as the reference does."""
    compiled = _compiled("kvgateway.state._apply_c")
    both = [module.Evictions(3.0, 1_000) for module in (_apply_py, compiled)]
    for evictions in both:
        evictions.add(EDGES, 1.0)
    assert both[1].current == both[0].current == dict.fromkeys(EDGES, 1.0)
    assert all(not e.none_of([h]) for e in both for h in EDGES)
    assert [both[1].take(h) for h in EDGES] == [both[0].take(h) for h in EDGES] == [1.0] * len(EDGES)
    assert both[1].size == both[0].size == 0


def test_the_compiled_tables_keep_no_object_of_an_int64_u64_or_32_byte_hash() -> None:
    """A group's set and the evictions keep a u64 hash, a negative int64 one (a signed hash's other
    half) and a 32-byte one in their tables, no reference to the object; only a hash of no table's
    kind (a wider int, bytes of another length) is kept by reference. A negative hash and the u64
    of its magnitude are two hashes, each found, listed and taken out alone."""
    compiled = _compiled("kvgateway.state._apply_c")
    by_value: list[Hash] = [2**63 + 7, -(2**62) - 7, -(2**63), bytes(range(32))]
    by_reference: list[Hash] = [2**70 + 1, -(2**63) - 1, bytes(range(16))]
    hashes = by_value + by_reference
    blocks, evictions = compiled.BlockSet(), compiled.Evictions(3.0, 100)
    before = [sys.getrefcount(h) for h in hashes]
    assert all(map(blocks.enter, hashes))  # no name of the test's left bound to a hash
    evictions.add(hashes, 1.0)
    after = [sys.getrefcount(h) for h in hashes]
    assert [b - a for a, b in zip(before, after, strict=True)] == [0] * 4 + [2] * 3  # the set's, the dict's
    assert set(blocks) == set(hashes) and set(evictions.current) == set(hashes)
    magnitude, negative = 2**62 + 7, -(2**62) - 7
    assert magnitude not in blocks and evictions.none_of([magnitude])
    assert blocks.enter(magnitude) and len(blocks) == len(hashes) + 1
    assert blocks.leave(negative) and negative not in blocks and magnitude in blocks
    assert evictions.take(negative) == 1.0 and evictions.take(negative) is None


KEY_ST = (
    st.integers(-300, 300)  # -5 and 5 are two hashes, though their keys are alike
    | st.sampled_from([U64, 2**63, 2**64, -5, b"k", "s", (1, 2), *EDGES, *BLOBS])
    | st.binary(min_size=32, max_size=32)
)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["enter", "enter", "leave", "copy"]), st.lists(KEY_ST, max_size=40)), max_size=30
    )
)
def test_the_compiled_groups_hashes_are_the_set_the_reference_keeps(ops: list[tuple[str, list[Hash]]]) -> None:
    """The compiled groups' :class:`BlockSet` against a Python set, step by step: what each
    insertion and removal answers, membership, size, the hashes listed (each once), comparisons both
    ways, the set operators, and copies that stay as they were while the original changes; past
    the tables' first size, with frees inside runs of collisions, hash 0, 32-byte hashes alike in
    one byte and hashes of neither kind (in the Python set beside the tables)."""
    compiled = _compiled("kvgateway.state._apply_c")
    mine, ref = compiled.BlockSet(), set()
    copies: list[tuple[Any, set[Any]]] = []
    for kind, hashes in ops:
        for h in hashes:
            if kind == "enter":
                assert mine.enter(h) is (h not in ref)
                ref.add(h)
            elif kind == "leave":
                assert mine.leave(h) is (h in ref)
                ref.discard(h)
        if kind == "copy":
            copies.append((mine.copy(), set(ref)))
        listed = list(mine)
        assert len(listed) == len(mine) == len(ref) and set(listed) == ref
        assert all(h in mine for h in ref) and not any(h in mine for h in hashes if h not in ref)
    for copied, was in copies:
        assert set(copied) == was and len(list(copied)) == len(copied) == len(was)
    other = {0, 1, b"k", U64}
    assert mine == ref and ref == mine and (mine != other) == (ref != other) and mine <= ref and mine >= ref
    assert (mine & other, mine | other) == (ref & other, ref | other)
    assert (mine - other, mine ^ other) == (ref - other, ref ^ other)
    assert (other & mine, other - mine) == (other & ref, other - ref)
    assert mine.isdisjoint(other) == ref.isdisjoint(other)
    assert pickle.loads(pickle.dumps(mine)) == ref
    assert isinstance(mine, AbstractSet)


def test_a_compiled_groups_hashes_cannot_change_under_an_iterator() -> None:
    """Iterating a :class:`BlockSet` while it changes raises, as a set does (its tables may have
    moved: reading on would read freed memory); an iterator started after the change runs."""
    compiled = _compiled("kvgateway.state._apply_c")
    blocks = compiled.BlockSet(range(10))
    listed = iter(blocks)
    next(listed)
    blocks.enter(10_000)
    with pytest.raises(RuntimeError, match="changed size during iteration"):
        next(listed)
    assert sorted(blocks) == [*range(10), 10_000]
    with pytest.raises(TypeError):
        hash(blocks)


class LaterBatch(Batch):
    """A Batch of another type (a further field): its fields are found where a Batch's are not."""

    note: str = ""


def test_a_batch_of_another_type_is_read_as_the_reference_reads_it() -> None:
    """The compiled pass reads a Batch's and its events' fields from their slots (their offsets found
    for those exact types); a Batch subclass or a batch that is no Struct at all is read through its
    attributes, and applies as the reference applies it."""
    events: list[Event] = [
        BlockStored([1, 2], None, [0, 1, 2, 3], 2, None, "GPU", None, {"group_idx": 1}),
        BlockRemoved([1, 9], "GPU"),
        BlockStored([3], 2, [], 0, medium="CPU"),
    ]
    batches = [LaterBatch(1.0, events, 0, note="later"), SimpleNamespace(ts=2.5, events=events[::-1], dp_rank=0)]
    sides = [Side(_apply_py, 60.0, 8), Side(_compiled("kvgateway.state._apply_c"), 60.0, 8)]
    for n, batch in enumerate(batches):
        for side in sides:
            with core(side.module):
                side.index.apply("a", 0, batch, now=1000.0 + n)  # type: ignore[arg-type]
        assert sides[0].shown(1000.0 + n) == sides[1].shown(1000.0 + n)
    assert sides[1].index.stream("a", 0).unknown_removes == 4  # both batches applied (group None holds none)


def test_the_public_index_runs_the_chosen_pass() -> None:
    from kvgateway.runtime import extensions

    compiled = _compiled("kvgateway.state._apply_c")
    chosen = _apply_py if extensions.forced_pure() else compiled
    assert [getattr(occupancy, name) for name in SWAPPED] == [getattr(chosen, name) for name in SWAPPED]
    assert attribution.Account is chosen.Account
    assert "kvgateway.state._apply_c" in extensions.COMPILED_MODULES


def test_extra_references_past_their_filters_size_leave_as_the_reference_counts_them() -> None:
    """A group's extra references (a hash stored again while held) many and churning: the compiled
    group asks its ``extra`` dict at a removal only for the hashes its filter may hold, the filter
    noted at each new key, made again when too full, after a snapshot's copy and a restart; keys of
    neither kind among them (every hash asked of the dict then). Removals of hashes with and without
    extra references, and of unknown ones, count alike after every batch."""
    sides = [Side(_apply_py, 60.0, 32_768), Side(_compiled("kvgateway.state._apply_c"), 60.0, 32_768)]
    stream = STREAMS[0]
    ts = 0.0
    for step in range(40):
        base = 10_000 * (step % 5)
        held = [base + i for i in range(60)] + [-(base + i) for i in range(1, 60, 7)]  # signed too
        again = held[step % 7 :: 3]  # stored again: an extra reference each (more every step)
        odd: list[Hash] = [2**70 + step, -(2**64) - step] if step in (20, 21) else []  # no table's kind
        events: list[Event] = [
            BlockStored(held + odd, None, [], 0, None, "GPU", None, {}),
            BlockStored(again + odd, None, [], 0, None, "GPU", None, {}),
            BlockRemoved([*held[step % 4 :: 5], 123_456, *odd[:1]], "GPU", {}),
            BlockRemoved(again[::2], "GPU", {}),
        ]
        ts += 0.5
        for side in sides:
            if step == 12:
                side.step("freeze", stream, ts)  # the group's dict copied at its next change
            if step == 30:
                side.step("restart", stream, ts)
            side.step("batch", (stream, events, 0.5, False), ts)
        assert sides[0].shown(1000.0 + ts) == sides[1].shown(1000.0 + ts)
    extra = sides[1].index.stream(*stream).block_groups()[0][4]
    assert len(extra) > 100  # the filter's first size (256 bits, 32 keys) outgrown


def test_events_routed_alike_whatever_objects_carry_their_medium_and_group() -> None:
    """The compiled pass reuses the previous event's group where its (medium, group_idx) is the
    same key: equal strings and ints that are other objects, a group_idx that is no int, an
    AllBlocksCleared between them, and a route not yet made (the index makes it) apply as the
    reference applies them."""
    sides = [Side(_apply_py, 60.0, 32_768), Side(_compiled("kvgateway.state._apply_c"), 60.0, 32_768)]
    gpu = "".join(["G", "PU"])  # equal to "GPU", another object
    big = int("1" * 20)  # a group_idx of many digits: equal ints are other objects
    keys: list[tuple[str | None, Any]] = [
        ("GPU", None), (gpu, None), ("GPU", 1), (gpu, int("1")), ("GPU", big), (gpu, int("1" * 20)),
        ("cpu", 1), (None, 1), (None, None), ("GPU", True), ("GPU", "1"), ("GPU", 2), (gpu, 2),
    ]  # fmt: skip
    ts = 0.0
    for step in range(len(keys)):
        events: list[Event] = []
        for n, (medium, group_idx) in enumerate(keys[step:] + keys[:step]):
            extra = {} if group_idx is None else {"group_idx": group_idx}
            hashes = [100 * step + n, 7, 9_000 + n % 3]
            events.append(BlockStored(hashes, None, [], 0, None, medium, None, extra))
            events.append(BlockRemoved([hashes[0] - 1, 7], medium, extra))
            if n == 4:
                events.append(AllBlocksCleared())
        ts += 1.0
        for side in sides:
            side.step("batch", (STREAMS[step % 2], events, 1.0, False), ts)
        assert sides[0].shown(1000.0 + ts) == sides[1].shown(1000.0 + ts)
