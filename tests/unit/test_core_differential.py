"""The compiled core against the pure-Python reference, fed the same generated batches side by side in
one process: byte-identical rendered events; the same learner answers, entries in the same
eviction order, the same counters and slots; for every wire layout (positional and map events,
u64, i64 and byte hashes, extra_keys, mediums, groups, locality, LoRA, clears, unknown events) and
for the chains, caps, residency and re-announcements that make a table evict, second-chance,
shrink and rebuild; and the same state digest sums and elements for every hash kind (u64, i64,
ints of any size, bytes of any length, none).

Skipped where the compiled core was not built (an install without a C compiler); ``make test`` runs
it on the compiled build, and hypothesis shrinks any difference to a minimal batch."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvgateway.engine import wire
from kvgateway.engine.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored, Event, Hash, UnknownEvent
from kvgateway.protocol import _render_py
from kvgateway.protocol.messages import encode_events
from kvgateway.state import _digest_py
from kvgateway.state import _learner_py as pure
from kvgateway.state._learner_py import block_digests
from tests.support.cores import compiled_twin
from tests.support.payloads import U64, encoded_event


def _compiled(name: str = "kvgateway.state._learner_c") -> ModuleType:
    return compiled_twin(name)


Stream = tuple[str, int]
STREAMS = [("a", 0), ("a", 1), ("b", 0)]

# Hashes of every kind on the wire, few enough that chains share parents and blocks come back.
hash_st = st.one_of(
    st.integers(0, 40),
    st.integers(2**63, U64),
    st.integers(-(2**63), -1),
    st.integers(U64 + 1, 2**70),  # wider than any wire sends: still only hashed and kept
    st.binary(min_size=32, max_size=32),
    st.sampled_from([b"\x00" * 32, b"\xff" * 32, -1, -2, 2**61 - 1, 2**63, U64]),
)
extra_st = st.one_of(
    st.none(),
    st.sampled_from(["lora-a", "img-1"]),
    st.lists(st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=3), st.binary(max_size=3)), max_size=3),
    st.dictionaries(st.sampled_from(["k", "m"]), st.integers(0, 3), max_size=2),
)


@st.composite
def stored(draw: st.DrawFn, earlier: list[Hash]) -> BlockStored:
    """A BlockStored that teaches (consistent tokens), or now and then one that cannot."""
    size = draw(st.sampled_from([1, 2, 4]))
    blocks = draw(st.integers(1, 5))
    hashes = draw(st.lists(hash_st, min_size=blocks, max_size=blocks))
    tokens = draw(st.lists(st.integers(0, 5), min_size=blocks * size, max_size=blocks * size))
    shape = draw(st.sampled_from(["ok"] * 8 + ["placeholder", "inconsistent", "no-hashes"]))
    if shape == "placeholder":
        tokens, size = [], 0
    elif shape == "inconsistent":
        tokens = [*tokens, 1]
    elif shape == "no-hashes":
        hashes = []
    parent = draw(st.none() | (st.sampled_from(earlier) if earlier else st.none()) | hash_st)
    lora_name = draw(st.none() | st.sampled_from(["lora-a", "x"]))
    extra: dict[str, Any] = {}
    keys = draw(st.sampled_from(["none", "all-none", "per-block", "lora-only", "wrong-length", "not-a-list"]))
    if keys == "all-none":
        extra["extra_keys"] = [None] * len(hashes)
    elif keys == "per-block":
        extra["extra_keys"] = draw(st.lists(extra_st, min_size=len(hashes), max_size=len(hashes)))
    elif keys == "lora-only":
        extra["extra_keys"] = [[lora_name or "lora-a"]] * len(hashes)
    elif keys == "wrong-length":
        extra["extra_keys"] = [None] * (len(hashes) + 1)
    elif keys == "not-a-list":
        extra["extra_keys"] = "bad"
    if draw(st.booleans()):
        extra["group_idx"] = draw(st.integers(0, 2))
    if draw(st.booleans()):
        extra["locality"] = draw(st.sampled_from(["local", "remote"]))
    medium = draw(st.sampled_from([None, "GPU", "CPU", "DISK"]))
    return BlockStored(hashes, parent, tokens, size, None, medium, lora_name, extra)


@st.composite
def step_st(draw: st.DrawFn, earlier: list[Hash]) -> tuple[str, Any]:
    kind = draw(st.sampled_from(["batch"] * 6 + ["fleet"]))
    if kind == "fleet":
        return "fleet", draw(st.integers(0, 80))
    events: list[Event] = []
    for _ in range(draw(st.integers(1, 3))):
        pick = draw(st.sampled_from(["stored"] * 5 + ["removed", "cleared", "unknown"]))
        if pick == "stored":
            event = draw(stored(earlier))
            earlier.extend(event.block_hashes)
        elif pick == "removed":
            chosen = draw(st.lists(st.sampled_from(earlier), max_size=3)) if earlier else []
            event = BlockRemoved(chosen, draw(st.sampled_from([None, "GPU"])), {})
        elif pick == "cleared":
            event = AllBlocksCleared()
        else:
            event = UnknownEvent(type="BlockMoved", body=["BlockMoved", 1, b"\x01"])
        events.append(event)
    return "batch", (draw(st.sampled_from(STREAMS)), events)


@st.composite
def scenario_st(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    options = {
        "max_blocks": draw(st.sampled_from([0, 1, 3, 8, 30, 10_000])),
        "floor": draw(st.sampled_from([1, 4, 16, 64])),
        "per_resident": draw(st.sampled_from([0.5, 1.0, 1.25, 3.0])),
        "resident": draw(st.booleans()),
        "held": draw(st.booleans()),
    }
    earlier: list[Hash] = []
    steps = [draw(step_st(earlier)) for _ in range(draw(st.integers(1, 20)))]
    return options, steps


class Held:
    """Which stream holds which block (the gateway's index, as far as residency goes)."""

    def __init__(self) -> None:
        self.by_stream: dict[Stream, set[Hash]] = {}
        self.asked: list[tuple[Stream, Hash]] = []

    def apply(self, stream: Stream, events: list[Event]) -> None:
        held = self.by_stream.setdefault(stream, set())
        for event in events:
            if type(event) is BlockStored:
                held.update(event.block_hashes)
            elif type(event) is BlockRemoved:
                held.difference_update(event.block_hashes)
            elif type(event) is AllBlocksCleared:
                held.clear()

    def resident(self, stream: Stream, block_hash: Hash) -> bool:
        self.asked.append((stream, block_hash))
        return block_hash in self.by_stream.get(stream, ())

    def __contains__(self, block_hash: object) -> bool:
        """Whether any stream holds ``block_hash`` (the learner's ``held``: the fleet's holders)."""
        return any(block_hash in held for held in self.by_stream.values())


def state(learner: Any) -> dict[str, Any]:
    """Everything a learner shows: counters, size, slots, and every entry in eviction order."""
    names = ("cap", "learned", "evicted", "second_chances", "rebuilds", "placeholders", "inconsistent", "slots")
    out = {name: getattr(learner, name) for name in names}
    out["len"] = len(learner)
    out["entries"] = learner.entries()
    # nbytes is not compared: the compiled ring keeps a byte a slot more (what each hash word
    # holds, a value or a reference), and no int object for a u64 hash (tests/unit/state/test_learner.py)
    out["sizes"] = {stream: learner.block_sizes(*stream) for stream in STREAMS}
    return out


def answers(learner: Any, events_seen: list[tuple[Stream, BlockStored]]) -> list[list[Hash]]:
    """The learner's chain for every announced event's tokens, as a lookup by tokens asks it."""
    out = []
    for stream, event in events_seen:
        if event.block_size > 0 and event.token_ids:
            extra = event.extra.get("extra_keys") if event.extra else None
            keys = extra if isinstance(extra, list) and len(extra) == len(event.block_hashes) else None
            digests = block_digests(event.token_ids, event.block_size, event.lora_name, keys)
            out.append(learner.chain(*stream, digests))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenario=scenario_st())
# a 32-byte parent whose fingerprint is 1 beside the int parent 1 (hash() 1): the compiled learner
# mixes the one from its fingerprint, the other from hash(); spread, the two keys do not meet
@example(
    scenario=(
        {"max_blocks": 1, "floor": 1, "per_resident": 0.5, "resident": False, "held": False},
        [("batch", (("a", 0), [BlockStored([1, b"\x00" * 32, 0], None, [0, 0, 0], 1, None, None, None, {})]))],
    )
)
def test_the_compiled_learner_answers_and_evicts_as_the_reference(
    scenario: tuple[dict[str, Any], list[tuple[str, Any]]],
) -> None:
    compiled = _compiled()
    options, steps = scenario
    helds = [Held(), Held()]
    learners = [
        module.ChainLearner(
            options["max_blocks"],
            resident=held.resident if options["resident"] else None,
            floor=options["floor"],
            per_resident=options["per_resident"],
            held=held if options["held"] else None,
        )
        for module, held in zip((pure, compiled), helds, strict=True)
    ]
    seen: list[tuple[Stream, BlockStored]] = []
    for kind, value in steps:
        if kind == "fleet":
            for learner in learners:
                learner.follow_fleet(value)
            continue
        stream, events = value
        batch = Batch(0.0, events, stream[1])
        taught = []
        for learner, held in zip(learners, helds, strict=True):
            held.apply(stream, events)
            taught.append(learner.learn_batch(stream[0], stream[1], batch))
        assert taught[0] == taught[1]
        seen.extend((stream, e) for e in events if type(e) is BlockStored)
        assert state(learners[0]) == state(learners[1])
        assert helds[0].asked == helds[1].asked  # the same residency questions, in the same order
    assert answers(learners[0], seen) == answers(learners[1], seen)


def test_events_longer_than_the_compiled_learners_runs_are_learned_alike() -> None:
    """Events of 17 to 68 blocks: the compiled learner teaches them in runs of 16 (each run's lines
    asked for first; beyond 64 blocks, their keys in an allocated array), here at caps that evict,
    shrink and grow inside an event, with second chances, and blocks re-announced within an event
    (one content, hashes repeating every 30 blocks) and across events: the same state, residency
    questions and answers after each batch."""
    compiled = _compiled()
    helds = [Held(), Held()]
    learners = [
        module.ChainLearner(200, resident=held.resident, floor=20, held=held)
        for module, held in zip((pure, compiled), helds, strict=True)
    ]
    seen: list[tuple[Stream, BlockStored]] = []
    parent: Hash | None = None
    for step in range(16):
        stream = STREAMS[step % len(STREAMS)]
        blocks = 17 + 17 * (step % 4)
        hashes: list[Hash] = [1000 * (step % 5) + i % 30 for i in range(blocks)]
        stored = BlockStored(hashes, parent, [1, 2] * blocks, 2, None, "GPU", None, {})
        events: list[Event] = [stored, BlockRemoved(hashes[:3], "GPU", {})]
        for learner, held in zip(learners, helds, strict=True):
            if step % 5 == 4:
                learner.follow_fleet(10 if step % 10 == 4 else 150)  # a cap of 20, then of 187
            held.apply(stream, events)
            learner.learn_batch(stream[0], stream[1], Batch(0.0, events, stream[1]))
        seen.append((stream, stored))
        parent = hashes[-1] if step % 3 else None
        assert state(learners[0]) == state(learners[1])
        assert helds[0].asked == helds[1].asked
    assert learners[1].evicted and learners[1].second_chances  # both paths taken
    assert answers(learners[0], seen) == answers(learners[1], seen)


def test_a_stream_named_by_other_objects_is_the_same_stream_to_both_learners() -> None:
    """The compiled learner remembers the last stream's tuple, id, root and block sizes while its
    source and dp_rank are the same objects: streams alternating, named by equal strings and ints
    that are other objects, their block sizes changing (a size seen before, and a new one), chains
    starting at the stream's root and continuing a parent; the same state and chains after each
    batch, and each stream's sizes listed apart."""
    compiled = _compiled()
    learners = [module.ChainLearner(500, floor=500) for module in (pure, compiled)]
    rank = int("300")  # past the small ints CPython keeps: equal ints are other objects
    names = [("a", 0), ("".join(["a"]), 0), ("b", rank), ("b", int("3" + "00")), ("a", 1)]
    seen: list[tuple[Stream, BlockStored]] = []
    for step in range(24):
        source, dp_rank = names[(step * 3) % len(names)] if step % 4 else names[step % 2]
        size = (2, 4, 2, 3)[(step // 5) % 4]
        hashes: list[Hash] = [100 * step + i for i in range(3)]
        parent = None if step % 3 == 0 else 100 * (step - 1) + 2
        stored = BlockStored(hashes, parent, [step % 5, 1, 2, 3] * size, size, None, "GPU", None, {})
        events: list[Event] = [stored, BlockStored([9_000 + step], None, [5] * size, size, None, "GPU", None, {})]
        for learner in learners:
            learner.learn_batch(source, dp_rank, Batch(0.0, events, 0))
        seen.extend(((source, dp_rank), event) for event in events)  # type: ignore[misc]
        assert state(learners[0]) == state(learners[1])
        for stream in names:
            assert learners[0].block_sizes(*stream) == learners[1].block_sizes(*stream)
    assert answers(learners[0], seen) == answers(learners[1], seen)
    assert sum(1 for chain in answers(learners[1], seen) if chain) > 20


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(encoded_event(), max_size=6), rank=st.sampled_from([0, 3]))
def test_every_wire_layout_decoded_then_learned_alike(
    items: list[tuple[Any, Event, tuple[Any, ...]]], rank: int
) -> None:
    """The wire's own generator (tests/support/payloads.py: every layout, hash kind, medium, group and
    unknown event), encoded, decoded and learned by both cores."""
    compiled = _compiled()
    payload = msgspec.msgpack.encode([1.0, [value for value, _, _ in items], rank])
    # a batch each: the compiled core's token ids as its decoder kept them, not read as a list first
    batches = [wire.decode_batch(payload) for _ in range(2)]
    learners = [module.ChainLearner(16, floor=16) for module in (pure, compiled)]
    taught = [learner.learn_batch("eng", rank, batch) for learner, batch in zip(learners, batches, strict=True)]
    assert taught[0] == taught[1]
    assert state(learners[0]) == state(learners[1])
    seen = [(("eng", rank), e) for e in batches[0].events if type(e) is BlockStored]
    assert answers(learners[0], seen) == answers(learners[1], seen)


def _held(event: BlockStored) -> Any:
    """What a BlockStored's ``token_ids`` slot holds, not read through the field."""
    field = BlockStored.__dict__["token_ids"]
    return getattr(field, "member", field).__get__(event, BlockStored)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tokens=st.lists(
        st.integers(0, 2**32 - 1) | st.sampled_from([0, 2**32 - 1, 2**31, 151_643]), min_size=1, max_size=24
    ),
    size=st.sampled_from([1, 2, 3, 4]),
    lora_name=st.none() | st.just("lora-a"),
    extra_keys=st.sampled_from(["none", "all-none", "one"]),
    positional=st.booleans(),
)
def test_token_ids_kept_as_sent_are_learned_as_their_list(
    tokens: list[int], size: int, lora_name: str | None, extra_keys: str, positional: bool
) -> None:
    """The compiled decoder keeps ids of 0 to 2**32-1 as the wire sent them
    (kvgateway/engine/_tokens_c.pyx); the compiled learner digests them there (no LoRA, no extra
    keys: the list is not made) or from the list they read as, and learns what the reference learns."""
    compiled = _compiled()
    blocks = max(1, len(tokens) // size)
    tokens = (tokens * size)[: blocks * size]
    keys = {"none": None, "all-none": [None] * blocks, "one": [None] * (blocks - 1) + [["img", 1]]}[extra_keys]
    hashes = list(range(500, 500 + blocks))
    if positional:
        event: Any = ["BlockStored", hashes, None, tokens, size, None, "GPU", lora_name, keys]
    else:
        event = {"type": "BlockStored", "block_hashes": hashes, "token_ids": tokens, "block_size": size,
                 "lora_name": lora_name, "extra_keys": keys}  # fmt: skip
    payload = msgspec.msgpack.encode([1.0, [event], 0])
    batches = [wire.decode_batch(payload) for _ in range(2)]
    learners = [module.ChainLearner(64, floor=64) for module in (pure, compiled)]
    assert [learner.learn_batch("eng", 0, batch) for learner, batch in zip(learners, batches, strict=True)] == [
        blocks,
        blocks,
    ]
    assert state(learners[0]) == state(learners[1])
    plain = lora_name is None and extra_keys != "one"
    if wire._tokens.__name__.endswith("_c"):  # the common case learned without making the list
        assert (type(_held(batches[1].events[0])).__name__ == "Tokens") == plain
    seen = [(("eng", 0), batches[0].events[0])]
    assert answers(learners[0], seen) == answers(learners[1], seen) == [hashes]


class LaterBatch(Batch):
    """A Batch of another type (a further field): its fields are found where a Batch's are not."""

    note: str = ""


def test_a_batch_or_event_of_another_type_is_learned_as_the_reference_learns_it() -> None:
    """The compiled learner reads a Batch's and a BlockStored's fields from their slots (their
    offsets found for those exact types); a Batch subclass, and an event handed to ``learn`` that is
    no BlockStored (a namespace with its fields), are read through their attributes, as the
    reference reads them."""
    compiled = _compiled()
    chain = [BlockStored([11, 12], None, [1, 2, 3, 4], 2), BlockStored([13], 12, [5, 6], 2, lora_name="l")]
    other = SimpleNamespace(
        block_hashes=[14], parent_block_hash=13, token_ids=[7, 8], block_size=2, lora_name=None, extra={}
    )
    learners = [module.ChainLearner(16, floor=16) for module in (pure, compiled)]
    taught = [
        (learner.learn_batch("a", 0, LaterBatch(0.0, chain, 0)), learner.learn("a", 0, other)) for learner in learners
    ]
    assert taught[0] == taught[1] == (3, 1)
    assert state(learners[0]) == state(learners[1])
    seen = [(("a", 0), event) for event in chain]
    assert answers(learners[0], seen) == answers(learners[1], seen)


def test_hash_kinds_at_the_edges_of_fixed_width_integers() -> None:
    """Negative, above 2**63, wider than 64 bits, and bytes hashes: kept as sent, chained alike."""
    compiled = _compiled()
    edge: list[Hash] = [-1, -(2**63), 2**63, U64, 2**64, 2**80, 0, b"\x00" * 32, b"\xff" * 32, -2]
    event = BlockStored(edge, -(2**63), list(range(len(edge))), 1, None, None, None, {})
    learners = [module.ChainLearner(100, floor=100) for module in (pure, compiled)]
    for learner in learners:
        assert learner.learn("s", 0, event) == len(edge)
    digests = block_digests(list(range(len(edge))), 1)
    assert learners[0].chain("s", 0, digests) == []  # a first block with a parent: not a root
    assert state(learners[0]) == state(learners[1])
    for learner in learners:
        assert [h for _, h in learner.entries()] == edge
    root = BlockStored(edge, None, list(range(len(edge))), 1, None, None, None, {})
    for learner in learners:
        learner.learn("s", 0, root)
        assert learner.chain("s", 0, digests) == edge
        assert all(type(a) is type(b) for a, b in zip(learner.chain("s", 0, digests), edge, strict=True))


@given(
    tokens=st.lists(
        st.one_of(
            st.integers(0, 200_000),
            st.integers(-(2**70), 2**70),
            st.sampled_from([-1, -2, 0, 2**61 - 2, 2**61 - 1, 2**61, 2**64 - 1, 2**64]),
        ),
        max_size=40,
    ),
    size=st.integers(1, 8),
)
def test_the_compiled_learners_digests_are_pythons_tuple_hash_without_the_tuples(tokens: list[int], size: int) -> None:
    """The compiled learner hashes a block's tokens as CPython hashes ``(tuple(tokens), None,
    None)``, without building the tuples; a block learned by one core is found by the other's
    digests (the reference: :func:`kvgateway.state._learner_py.block_digests`)."""
    compiled = _compiled()
    assert compiled._tuple_hash_agrees()  # else it builds the tuples: slower, still the same digests
    blocks = len(tokens) // size
    if not blocks:
        return
    tokens = tokens[: blocks * size]
    hashes: list[Hash] = list(range(1000, 1000 + blocks))
    event = BlockStored(hashes, None, tokens, size, None, None, None, {})
    learners = [module.ChainLearner(100, floor=100) for module in (pure, compiled)]
    for learner in learners:
        assert learner.learn("s", 0, event) == blocks
        assert learner.chain("s", 0, block_digests(tokens, size)) == hashes
    assert state(learners[0]) == state(learners[1])


def test_the_compiled_learner_keeps_int64_u64_and_32_byte_hashes_in_its_ring_and_any_other_by_reference() -> None:
    """A u64 int hash (vLLM's default) and a negative int64 one (a signed hash's other half:
    SGLang's, LMCache's) are kept as their value and a 32-byte one (vLLM's raw sha256) as its bytes,
    with no reference to their objects: those die with their batch, and the answers are objects
    made of the value or the bytes, equal and of the announced type. Any other hash (wider, bytes of
    another length) is kept by reference, as the reference keeps every hash; the fleet is asked
    either way (a second chance for a resident block, told the hash that was announced), and a
    learner's arrays are counted by their slots."""
    compiled = _compiled()
    u64, raw, wide, short = 2**63 + 12_345, bytes(range(32)), 2**70 + 1, bytes(range(16))
    signed, lowest = -(2**62) - 12_345, -(2**63)
    announced = [u64, raw, wide, short, signed, lowest]
    kept = dict.fromkeys(announced, False)
    told: list[object] = []

    def resident(stream: Stream, block_hash: object) -> bool:
        told.append(block_hash)
        return bool(kept.get(block_hash))  # type: ignore[call-overload]

    learner = compiled.ChainLearner(6, resident, floor=6)
    counts = [sys.getrefcount(h) for h in announced]
    event = BlockStored(list(announced), None, [1, 2, 3, 4, 5, 6], 1, None, None, None, {})
    learner.learn("s", 0, event)
    del event
    now = [sys.getrefcount(h) for h in announced]
    assert [b - a for a, b in zip(counts, now, strict=True)] == [0, 0, 1, 1, 0, 0]  # kept: the wide and the short
    answer = learner.chain("s", 0, block_digests([1, 2, 3, 4, 5, 6], 1))
    assert answer == announced
    assert [type(h) for h in answer] == [int, bytes, int, bytes, int, int]
    assert [a is h for a, h in zip(answer, announced, strict=True)] == [False, False, True, True, False, False]
    # the same steps on both cores: the same second chances and evictions, slots and buckets
    learners = [learner, pure.ChainLearner(6, resident, floor=6)]
    learners[1].learn("s", 0, BlockStored(list(announced), None, [1, 2, 3, 4, 5, 6], 1, None, None, None, {}))
    kept[u64] = kept[raw] = kept[signed] = True
    for one in learners:
        told.clear()
        one.learn("s", 1, BlockStored([11, 12, 13], None, [7, 8, 9], 1, None, None, None, {}))
        assert told == [u64, raw, wide, short, signed, lowest]  # each front asked about as announced
        assert [h for _, h in one.entries()] == [u64, raw, 11, 12, signed, 13]  # the resident ones moved back
    assert learners[0].slots == learners[1].slots
    # a kind byte a slot more, and CONTENT bytes a slot since the first 32-byte hash
    assert learners[0].nbytes() - learners[1].nbytes() == learners[0].slots * (1 + 32)


def test_both_cores_are_importable_side_by_side_and_the_public_one_is_chosen() -> None:
    from kvgateway.protocol import render
    from kvgateway.runtime import extensions
    from kvgateway.state import learner

    compiled = _compiled()
    compiled_render = _compiled("kvgateway.protocol._render_c")
    expected = pure.ChainLearner if extensions.forced_pure() else compiled.ChainLearner
    assert learner.ChainLearner is expected
    assert render.render_events is (_render_py if extensions.forced_pure() else compiled_render).render_events
    assert extensions.core() == (extensions.PURE if extensions.forced_pure() else extensions.COMPILED)
    assert learner.block_digests is pure.block_digests
    from kvgateway.state import digest

    compiled_digest = _compiled("kvgateway.state._digest_c")
    chosen = _digest_py if extensions.forced_pure() else compiled_digest
    assert (digest.elements_sum, digest.element, digest.prefix_state) == (
        chosen.elements_sum,
        chosen.element,
        chosen.prefix_state,
    )


# --- rendering -------------------------------------------------------------------------------------

nested_st = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), U64),
        st.floats(allow_nan=False),
        st.text(max_size=4),
        st.binary(max_size=4),
        st.builds(msgspec.msgpack.Ext, st.integers(-128, 127), st.binary(max_size=4)),
    ),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.one_of(st.text(max_size=3), st.integers(-3, 3), st.binary(max_size=2), st.none()), inner,
                      max_size=3),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(encoded_event(), max_size=6), rank=st.sampled_from([0, 3]))
def test_every_wire_layout_renders_to_the_same_bytes(
    items: list[tuple[Any, Event, tuple[Any, ...]]], rank: int
) -> None:
    compiled = _compiled("kvgateway.protocol._render_c")
    batch = wire.decode_batch(msgspec.msgpack.encode([1.0, [value for value, _, _ in items], rank]))
    theirs, ours = (encode_events(m.render_events(batch.events)) for m in (compiled, _render_py))
    assert ours.body == theirs.body and list(ours.ends) == list(theirs.ends)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=nested_st, extra=st.dictionaries(st.sampled_from(["extra_keys", "locality", "x"]), nested_st))
def test_opaque_values_and_further_fields_render_alike(value: Any, extra: dict[str, Any]) -> None:
    """Any msgpack value an engine may send (bytes, extensions, maps keyed by nil or arrays, deep
    nesting) in the further fields of every event type, and in an unknown event's body."""
    compiled = _compiled("kvgateway.protocol._render_c")
    events: list[Event] = [
        BlockStored([1, b"\x01"], None, [1, 2], 1, None, "cpu", "lora", extra),
        BlockRemoved([-1], None, extra),
        AllBlocksCleared(extra=extra),
        UnknownEvent(type="BlockMoved", body=["BlockMoved", value]),
        UnknownEvent(type="X", body={"type": "X", "v": value}),
    ]
    ours, theirs = (encode_events(m.render_events(events)).body for m in (_render_py, compiled))
    assert ours == theirs
    assert msgspec.json.encode(_render_py.plain(value)) == msgspec.json.encode(compiled.plain(value))
    deep: Any = value
    for _ in range(40):  # past MAX_RENDER_DEPTH: cut off alike
        deep = [deep, {b"k": 1}]
    assert msgspec.json.encode(_render_py.plain(deep)) == msgspec.json.encode(compiled.plain(deep))
    for h in (0, -1, 2**63, U64, b"\x00\xff"):
        assert _render_py.hash_text(h) == compiled.hash_text(h)


def test_the_pure_core_switch_is_no_unknown_setting() -> None:
    """``KVGATEWAY_NO_EXTENSIONS`` is read by the process, and the settings accept it beside theirs
    (an unknown ``KVGATEWAY_`` name is an error there)."""
    from kvgateway.config.options import NO_EXTENSIONS_ENV
    from tests.support.command_line import serve_settings

    source = ("--source", "name=a,endpoint=tcp://127.0.0.1:9")
    assert serve_settings(*source, environ={NO_EXTENSIONS_ENV: "1"}) == serve_settings(*source)


# --- the state digest ------------------------------------------------------------------------------

digest_hash_st = st.one_of(
    st.integers(0, U64),  # u64
    st.integers(-(2**63), 2**63 - 1),  # i64
    st.integers(2**63 - 3, 2**63 + 3) | st.integers(U64 - 3, U64 + 3) | st.integers(-(2**63) - 3, -(2**63) + 3),
    st.integers(-(2**200), 2**200),  # ints of any size: through str() in C too
    st.binary(max_size=40),  # empty, short and 32-byte hashes
)
group_st = st.tuples(st.sampled_from(["GPU", "CPU", "DISK", "é"]), st.integers(-2, 2**70))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hashes=st.one_of(
        st.sets(digest_hash_st, max_size=8),
        st.sets(digest_hash_st, min_size=_digest_py.WIDE_FROM, max_size=200),  # the reference side by side
        st.frozensets(st.integers(0, U64), max_size=80),
        st.lists(st.binary(min_size=32, max_size=32), unique=True, max_size=80),
        st.dictionaries(digest_hash_st, st.integers(1, 3), max_size=8),  # an index group's blocks
    ),
    group=group_st,
)
def test_the_compiled_digest_sums_as_the_reference(hashes: Any, group: tuple[str, int]) -> None:
    """``elements_sum`` of every hash kind (u64, i64, the edges of both, ints of any size, bytes of
    any length, none at all) in every collection the index passes, and each ``element`` alike."""
    compiled = _compiled("kvgateway.state._digest_c")
    prefix = _digest_py.prefix_state(*group)
    assert compiled.prefix_state(*group) == prefix
    assert compiled.elements_sum(prefix, hashes) == _digest_py.elements_sum(prefix, hashes)
    for block_hash in hashes:
        ours = _digest_py.element(*group, block_hash)
        assert compiled.element(*group, block_hash) == ours
        assert compiled.element(*group, _render_py.hash_text(block_hash)) == ours  # as protocol text
        assert compiled.elements_sum(prefix, [block_hash]) == ours


def test_the_compiled_digest_at_the_edges_of_fixed_width_integers() -> None:
    """Every boundary of the C paths (int64, uint64, wider, each decimal length), the empty
    collection and hashes the reference refuses (refused alike)."""
    compiled = _compiled("kvgateway.state._digest_c")
    prefix = _digest_py.prefix_state("GPU", 0)
    edges: list[Hash] = [0, 9, 10, -1, -9, -10, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, U64, U64 + 1]
    edges += [10**19, 10**20, -(10**19), 2**128, -(2**128), b"", b"\x00", b"\xff" * 32, bytes(range(256))]
    # every decimal length's edges: the C writer's parts of four and eight digits, and its leading digits
    edges += [sign * (10**k + d) for k in range(1, 21) for d in (-1, 0, 1) for sign in (1, -1)]
    for block_hash in edges:
        assert compiled.elements_sum(prefix, [block_hash]) == _digest_py.elements_sum(prefix, [block_hash])
    assert compiled.elements_sum(prefix, edges) == _digest_py.elements_sum(prefix, edges)
    assert compiled.elements_sum(prefix, ()) == _digest_py.elements_sum(prefix, ()) == 0
    assert compiled.elements_sum(prefix, [bytearray(b"\x01")]) == _digest_py.elements_sum(prefix, [bytearray(b"\x01")])
    for bad in (True, "ab", None):  # not an index's hash: the reference fails on .hex(), and so does C
        with pytest.raises(AttributeError):
            _digest_py.elements_sum(prefix, [bad])
        with pytest.raises(AttributeError):
            compiled.elements_sum(prefix, [bad])
