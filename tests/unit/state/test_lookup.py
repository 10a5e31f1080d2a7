"""Prefix lookup by hashes and by tokens, the chain learner, fleet facts, request limits (kvgateway.state.lookup)."""

from __future__ import annotations

import hashlib
import json
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgateway.engine.wire import AllBlocksCleared, Event, Hash
from kvgateway.protocol.render import hash_text
from kvgateway.state.lookup import (
    BadLookup,
    ChainLearner,
    FleetCount,
    HashQuery,
    LookupLimits,
    TokenBucket,
    TokenQuery,
    fleet_facts,
    lookup,
    lookup_hashes,
    lookup_tokens,
    parse_hash,
    parse_request,
)
from kvgateway.state.occupancy import OccupancyIndex, StreamIndex
from tests.support import events
from tests.support.events import batch, placeholder, removed

stored = partial(events.stored, block_size=4)

BIG = 2**64 - 12345


def chain_of(*hashes: Hash) -> list[tuple[Hash, ...]]:
    return [(h,) for h in hashes]


def engine_hashes(seed: bytes, tokens: list[int], block_size: int, extra: str = "") -> list[int]:
    """A toy engine's chained hash: what the gateway must never need to know."""
    out, parent = [], seed
    for i in range(len(tokens) // block_size):
        digest = hashlib.sha256(parent + repr((tokens[i * block_size : (i + 1) * block_size], extra)).encode())
        out.append(int.from_bytes(digest.digest()[:8], "big"))
        parent = digest.digest()
    return out


class Fleet:
    """An occupancy index and a learner fed the same batches, as the gateway will feed them."""

    def __init__(self, max_learned: int = 1_000_000) -> None:
        self.occupancy = OccupancyIndex()
        self.learner = ChainLearner(max_learned)

    def apply(self, source: str, dp_rank: int, *events: Event) -> None:
        self.occupancy.apply(source, dp_rank, batch(*events), 0.0)
        self.learner.learn_batch(source, dp_rank, batch(*events))

    def streams(self) -> list[StreamIndex]:
        return list(self.occupancy.streams())


def entry(answer: dict[str, Any], source: str, dp_rank: int = 0) -> dict[str, Any]:
    (found,) = [s for s in answer["streams"] if (s["source"], s["dp_rank"]) == (source, dp_rank)]
    return found


# --- hash parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", (0,)),
        ("-5", (-5,)),
        ("123", (123,)),
        (str(BIG), (BIG, bytes.fromhex(str(BIG)))),  # 20 digits: also 10 bytes of hex
        (str(BIG - 10**19), (BIG - 10**19,)),
        ("1234", (1234, b"\x12\x34")),
        ("ab01", (b"\xab\x01",)),
        ("00", (b"\x00",)),
    ],
)
def test_parse_hash_inverts_the_streams_rendering(text: str, expected: tuple[Hash, ...]) -> None:
    assert parse_hash(text) == expected


@pytest.mark.parametrize("text", ["", "AB01", "abc", "+1", "-0", "007", " 1", "1 ", "0x10", "-ab", "1.5", "1e3"])
def test_parse_hash_refuses_what_no_hash_renders_as(text: str) -> None:
    with pytest.raises(BadLookup) as info:
        parse_hash(text)
    assert "\n" not in str(info.value)


def test_parse_hash_length_cap() -> None:
    with pytest.raises(BadLookup, match="at most 130"):
        parse_hash("1" * 131)
    assert parse_hash("ab" * 64) == (bytes.fromhex("ab" * 64),)


@given(st.one_of(st.integers(-(2**64), 2**64), st.binary(min_size=1, max_size=64)))
def test_parse_hash_roundtrip(h: Hash) -> None:
    candidates = parse_hash(hash_text(h))
    assert h in candidates
    assert all(hash_text(c) == hash_text(h) for c in candidates)


# --- request parsing and limits -------------------------------------------------------------


def test_parse_request_by_hashes() -> None:
    query = parse_request(b'{"block_hashes": ["1", "ab", "-3"], "group_idx": 1}')
    assert query == HashQuery([(1,), (b"\xab",), (-3,)], 1)


def test_parse_request_by_tokens() -> None:
    query = parse_request(b'{"token_ids": [1, 2, 3], "lora_name": "x", "extra_keys": [null, ["s"]]}')
    assert query == TokenQuery([1, 2, 3], "x", [None, ["s"]], None)
    assert parse_request(b'{"token_ids": []}') == TokenQuery([])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "invalid JSON"),
        (b"[1]", "Expected `object`"),
        (b"{}", "exactly one of"),
        (b'{"block_hashes": [], "token_ids": []}', "exactly one of"),
        (b'{"block_hashes": [1]}', 'block_hashes[0]: hashes are decimal strings ("123456789"), got a number'),
        (b'{"block_hashes": ["1", 2.5]}', "block_hashes[1]: hashes are decimal strings"),
        (b'{"block_hashes": [1,2', "invalid JSON: Input data was truncated"),  # not "got `int`" (issue 33, 7)
        (b'{"token_ids": ["1", 2', "invalid JSON"),
        (b'{"block_hashes": ["1", "X"]}', "block_hashes[1]: 'X' is not a hash"),
        (b'{"block_hashes": ["1"], "lora_name": "x"}', "go with token_ids"),
        (b'{"token_ids": [1, -1]}', "token_ids[1]: expected an integer >= 0"),
        (b'{"token_ids": ["1"]}', "Expected `int`"),
        (b'{"token_ids": [1], "typo": 1}', "unknown field `typo`"),
        (b'{"token_ids": [1], "group_idx": -1}', "group_idx"),
        (b'{"token_ids": [1], "lora_name": 5}', "lora_name"),
    ],
)
def test_bad_requests_are_one_line_reasons(body: bytes, reason: str) -> None:
    with pytest.raises(BadLookup) as info:
        parse_request(body)
    assert reason in str(info.value)
    assert "\n" not in str(info.value)


def test_request_limits() -> None:
    limits = LookupLimits(max_body_bytes=200, max_blocks=3, max_tokens=5, max_hash_chars=4)
    with pytest.raises(BadLookup, match="exceeds the 200-byte limit"):
        parse_request(b'{"token_ids": [' + b"1," * 100 + b"1]}", limits)
    with pytest.raises(BadLookup, match="4 hashes \\(at most 3\\)"):
        parse_request(b'{"block_hashes": ["1", "2", "3", "4"]}', limits)
    assert len(parse_request(b'{"block_hashes": ["1", "2", "3"]}', limits).chain) == 3  # type: ignore[union-attr]
    with pytest.raises(BadLookup, match="6 tokens \\(at most 5\\)"):
        parse_request(b'{"token_ids": [1, 2, 3, 4, 5, 6]}', limits)
    with pytest.raises(BadLookup, match="block_hashes\\[0\\]: a hash of 5 characters"):
        parse_request(b'{"block_hashes": ["12345"]}', limits)


def test_token_bucket() -> None:
    bucket = TokenBucket(rate=2, burst=3)
    assert [bucket.allow(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.allow(0.25) is False
    assert bucket.allow(0.5) is True  # half a second: one more token
    assert bucket.allow(100.0) and bucket.allow(100.0) and bucket.allow(100.0)
    assert not bucket.allow(100.0)  # capped at the burst
    assert bucket.allow(99.0) is False  # a clock going back adds nothing
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(0, 1)


# --- lookup by hashes -----------------------------------------------------------------------


def test_leading_blocks_per_medium_and_in_any_medium() -> None:
    fleet = Fleet()
    fleet.apply("a", 0, stored(1, 2, block_size=16), stored(3, medium="CPU", block_size=16))
    fleet.apply("a", 0, stored(2, medium="CPU", block_size=16))
    answer = lookup_hashes(fleet.streams(), chain_of(1, 2, 3, 4), 10)
    assert answer == {
        "offset": 10,
        "streams": [
            {
                "source": "a",
                "dp_rank": 0,
                "blocks": 3,  # 1 (GPU), 2 (GPU, CPU), 3 (CPU)
                "tokens": 48,
                "mediums": {"GPU": {"blocks": 2, "tokens": 32}},  # CPU misses block 1: 0 leading
                "stale": False,
            }
        ],
    }


def test_a_hole_ends_the_prefix() -> None:
    fleet = Fleet()
    fleet.apply("a", 0, stored(1, 3, 4))
    assert entry(lookup_hashes(fleet.streams(), chain_of(1, 2, 3, 4), 0), "a")["blocks"] == 1
    assert entry(lookup_hashes(fleet.streams(), chain_of(2, 3), 0), "a")["blocks"] == 0


def test_streams_sorted_best_first_zero_last_ties_by_name() -> None:
    fleet = Fleet()
    fleet.apply("z", 0, stored(1, 2, 3))
    fleet.apply("b", 1, stored(1))
    fleet.apply("b", 0, stored(1))
    fleet.apply("a", 0, stored(9))
    answer = lookup_hashes(fleet.streams(), chain_of(1, 2, 3), 0)
    assert [(s["source"], s["dp_rank"], s["blocks"]) for s in answer["streams"]] == [
        ("z", 0, 3),
        ("b", 0, 1),
        ("b", 1, 1),
        ("a", 0, 0),
    ]
    assert answer["streams"][-1] == {
        "source": "a",
        "dp_rank": 0,
        "blocks": 0,
        "tokens": 0,
        "mediums": {},
        "stale": False,
    }


def test_refcounts_and_removals() -> None:
    fleet = Fleet()
    fleet.apply("a", 0, stored(1, 2), stored(2))
    fleet.apply("a", 0, removed(2))
    assert entry(lookup_hashes(fleet.streams(), chain_of(1, 2), 0), "a")["blocks"] == 2
    fleet.apply("a", 0, removed(2))
    assert entry(lookup_hashes(fleet.streams(), chain_of(1, 2), 0), "a")["blocks"] == 1
    fleet.apply("a", 0, AllBlocksCleared())
    assert entry(lookup_hashes(fleet.streams(), chain_of(1, 2), 0), "a")["blocks"] == 0


def test_group_idx_none_is_any_group_an_int_is_that_group() -> None:
    fleet = Fleet()
    fleet.apply("a", 0, stored(1, 2, 3, group=0), stored(3, group=1), stored(1, 2, group=1))
    fleet.apply("a", 0, removed(3, group=0))
    streams = fleet.streams()
    assert entry(lookup_hashes(streams, chain_of(1, 2, 3), 0), "a")["blocks"] == 3
    assert entry(lookup_hashes(streams, chain_of(1, 2, 3), 0, group_idx=0), "a")["blocks"] == 2
    assert entry(lookup_hashes(streams, chain_of(1, 2, 3), 0, group_idx=1), "a")["blocks"] == 3
    assert entry(lookup_hashes(streams, chain_of(1, 2, 3), 0, group_idx=7), "a")["blocks"] == 0
    # Events without group_idx are group 0.
    fleet.apply("b", 0, stored(1))
    assert entry(lookup_hashes(fleet.streams(), chain_of(1), 0, group_idx=0), "b")["blocks"] == 1


def test_tokens_use_the_mediums_block_size_or_the_streams() -> None:
    fleet = Fleet()
    fleet.apply("a", 0, stored(1, 2, block_size=16), placeholder(1, 2))
    fleet.apply("p", 0, placeholder(1))
    answer = lookup_hashes(fleet.streams(), chain_of(1, 2), 0)
    assert entry(answer, "a")["mediums"] == {"GPU": {"blocks": 2, "tokens": 32}, "CPU": {"blocks": 2, "tokens": 32}}
    only_placeholders = entry(answer, "p")
    assert only_placeholders["tokens"] is None
    assert only_placeholders["mediums"] == {"CPU": {"blocks": 1, "tokens": None}}


def test_hash_kinds_and_ambiguous_strings() -> None:
    fleet = Fleet()
    fleet.apply("a", 0, stored(b"\x12\x34", -7, BIG))
    chain = [parse_hash(t) for t in ("1234", "-7", str(BIG))]
    assert entry(lookup_hashes(fleet.streams(), chain, 0), "a")["blocks"] == 3
    fleet.apply("b", 0, stored(1234))
    assert entry(lookup_hashes(fleet.streams(), [parse_hash("1234")], 0), "b")["blocks"] == 1


def test_mediums_listed_in_tier_order_with_engine_names() -> None:
    fleet = Fleet()
    fleet.apply("a", 0, *(stored(1, medium=m) for m in ("disk", "cpu_pinned", "gpu", "lmcache")))
    answer = entry(lookup_hashes(fleet.streams(), chain_of(1), 0), "a")
    assert list(answer["mediums"]) == ["GPU", "CPU_PINNED", "DISK", "LMCACHE"]


def test_empty_chain_and_no_streams() -> None:
    fleet = Fleet()
    fleet.apply("a", 0, stored(1))
    assert entry(lookup_hashes(fleet.streams(), [], 0), "a")["blocks"] == 0
    assert lookup_hashes([], chain_of(1), 5) == {"offset": 5, "streams": []}


# --- the chain learner and lookup by tokens -------------------------------------------------


def test_lookup_by_tokens_walks_what_the_engine_announced() -> None:
    fleet = Fleet()
    tokens = list(range(100, 116))
    hashes = engine_hashes(b"seed-a", tokens, 4)
    # Announced in two events, as an engine extends a request's blocks.
    fleet.apply(
        "a",
        0,
        stored(*hashes[:2], tokens=tokens[:8]),
        stored(*hashes[2:], parent=hashes[1], tokens=tokens[8:]),
    )
    answer = lookup_tokens(fleet.streams(), fleet.learner, TokenQuery([*tokens, 1, 2]), 3)
    assert answer == {
        "offset": 3,
        "streams": [
            {
                "source": "a",
                "dp_rank": 0,
                "blocks": 4,
                "tokens": 16,
                "mediums": {"GPU": {"blocks": 4, "tokens": 16}},
                "stale": False,
            }
        ],
    }
    assert entry(lookup_tokens(fleet.streams(), fleet.learner, TokenQuery(tokens[:7]), 0), "a")["blocks"] == 1
    diverging = tokens[:4] + [0] * 12
    assert entry(lookup_tokens(fleet.streams(), fleet.learner, TokenQuery(diverging), 0), "a")["blocks"] == 1


def test_engines_that_hash_differently_each_keep_their_chain() -> None:
    fleet = Fleet()
    tokens = list(range(12))
    for source, seed in (("a", b"1"), ("b", b"2")):
        fleet.apply(source, 0, stored(*engine_hashes(seed, tokens, 4), tokens=tokens))
    fleet.apply("b", 0, removed(engine_hashes(b"2", tokens, 4)[1]))
    answer = lookup_tokens(fleet.streams(), fleet.learner, TokenQuery(tokens), 0)
    assert [(s["source"], s["blocks"]) for s in answer["streams"]] == [("a", 3), ("b", 1)]


def test_streams_that_hash_alike_share_the_deeper_entries() -> None:
    fleet = Fleet()
    tokens = list(range(40))
    hashes = engine_hashes(b"same", tokens, 4)
    fleet.apply("a", 0, stored(*hashes, tokens=tokens))
    fleet.apply("a", 1, stored(*hashes, tokens=tokens))
    assert len(fleet.learner) == len(hashes) + 1  # one more root; the rest shared
    answer = lookup_tokens(fleet.streams(), fleet.learner, TokenQuery(tokens), 0)
    assert [s["blocks"] for s in answer["streams"]] == [10, 10]


def test_per_engine_block_sizes() -> None:
    fleet = Fleet()
    tokens = list(range(64))
    fleet.apply("small", 0, stored(*engine_hashes(b"s", tokens, 16), tokens=tokens, block_size=16))
    fleet.apply("big", 0, stored(*engine_hashes(b"b", tokens[:32], 32), tokens=tokens[:32], block_size=32))
    answer = lookup_tokens(fleet.streams(), fleet.learner, TokenQuery(tokens), 0)
    assert [(s["source"], s["blocks"], s["tokens"]) for s in answer["streams"]] == [("small", 4, 64), ("big", 1, 32)]
    assert fleet.learner.block_sizes("small", 0) == [16]


def test_placeholder_events_teach_nothing_but_their_blocks_count() -> None:
    fleet = Fleet()
    tokens = list(range(8))
    hashes = engine_hashes(b"s", tokens, 4)
    fleet.apply("a", 0, stored(*hashes, tokens=tokens))
    fleet.apply("a", 0, removed(*hashes), placeholder(*hashes))
    assert fleet.learner.placeholders == 1
    answer = entry(lookup_tokens(fleet.streams(), fleet.learner, TokenQuery(tokens), 0), "a")
    assert answer["mediums"] == {"CPU": {"blocks": 2, "tokens": 8}}  # the learned chain finds the offloaded copy
    # A stream that only ever had placeholders cannot be found by tokens.
    fleet.apply("p", 0, placeholder(*hashes))
    assert entry(lookup_tokens(fleet.streams(), fleet.learner, TokenQuery(tokens), 0), "p")["blocks"] == 0


def test_inconsistent_token_counts_teach_nothing() -> None:
    learner = ChainLearner()
    assert learner.learn("a", 0, stored(1, 2, tokens=[1, 2, 3], block_size=4)) == 0
    assert learner.inconsistent == 1
    assert len(learner) == 0


def test_lora_names_and_extra_keys_are_part_of_the_block() -> None:
    fleet = Fleet()
    tokens = list(range(8))
    fleet.apply("a", 0, stored(1, 2, tokens=tokens))
    fleet.apply("b", 0, stored(3, 4, tokens=tokens, lora_name="sql", extra_keys=[["sql"], ["sql"]]))
    fleet.apply("c", 0, stored(5, 6, tokens=tokens, extra_keys=[["salt"], None]))

    def blocks(query: TokenQuery) -> dict[str, int]:
        answer = lookup_tokens(fleet.streams(), fleet.learner, query, 0)
        return {s["source"]: s["blocks"] for s in answer["streams"]}

    assert blocks(TokenQuery(tokens)) == {"a": 2, "b": 0, "c": 0}
    # vLLM's LoRA-only extra key is the LoRA name: the query gives lora_name alone.
    assert blocks(TokenQuery(tokens, "sql")) == {"a": 0, "b": 2, "c": 0}
    assert blocks(TokenQuery(tokens, "other")) == {"a": 0, "b": 0, "c": 0}
    assert blocks(TokenQuery(tokens, None, [["salt"]])) == {"a": 0, "b": 0, "c": 2}
    assert blocks(TokenQuery(tokens, None, [["pepper"]])) == {"a": 0, "b": 0, "c": 0}


def test_extra_keys_of_the_wrong_length_are_ignored() -> None:
    learner = ChainLearner()
    learner.learn("a", 0, stored(1, 2, tokens=list(range(8)), extra_keys=[["x"]]))
    assert learner.chain("a", 0, _digests(list(range(8)), 4)) == [1, 2]


def _digests(tokens: list[int], size: int, lora: str | None = None) -> list[int]:
    from kvgateway.state.lookup import block_digests

    return block_digests(tokens, size, lora)


def test_a_restarted_engine_replaces_its_roots() -> None:
    learner = ChainLearner()
    tokens = list(range(8))
    learner.learn("a", 0, stored(*engine_hashes(b"old", tokens, 4), tokens=tokens))
    new = engine_hashes(b"new", tokens, 4)
    learner.learn("a", 0, stored(*new, tokens=tokens))
    assert learner.chain("a", 0, _digests(tokens, 4)) == new


def test_bytes_hashes_learn_and_walk() -> None:
    fleet = Fleet()
    tokens = list(range(8))
    hashes: list[Hash] = [b"\x01" * 32, b"\x02" * 32]
    fleet.apply("a", 0, stored(*hashes, tokens=tokens))
    assert entry(lookup_tokens(fleet.streams(), fleet.learner, TokenQuery(tokens), 0), "a")["blocks"] == 2


def test_cap_evicts_oldest_announced_and_counts() -> None:
    learner = ChainLearner(max_blocks=128)
    for i in range(200):
        learner.learn("a", 0, stored(1000 + i, tokens=[i, i, i, i]))
        assert len(learner) <= 128
    assert learner.evicted == 200 - len(learner)
    assert learner.learned == 200
    # The newest are kept, the oldest gone.
    assert learner.chain("a", 0, _digests([199] * 4, 4)) == [1199]
    assert learner.chain("a", 0, _digests([0] * 4, 4)) == []


def test_re_announcement_moves_to_the_back() -> None:
    learner = ChainLearner(max_blocks=64)
    learner.learn("a", 0, stored(7, tokens=[7] * 4))
    for i in range(100):
        learner.learn("a", 0, stored(1000 + i, tokens=[i + 10] * 4))
        learner.learn("a", 0, stored(7, tokens=[7] * 4))  # the hot prefix, announced again
    assert learner.chain("a", 0, _digests([7] * 4, 4)) == [7]


def test_resident_blocks_get_a_second_chance() -> None:
    hot = {7}
    learner = ChainLearner(max_blocks=64, resident=lambda stream, h: h in hot)
    learner.learn("a", 0, stored(7, tokens=[7] * 4))
    for i in range(300):
        learner.learn("a", 0, stored(1000 + i, tokens=[i + 10] * 4))
        assert len(learner) <= 64
    assert learner.chain("a", 0, _digests([7] * 4, 4)) == [7]
    assert learner.second_chances > 0
    # When everything is resident the cap still holds.
    everything = ChainLearner(max_blocks=64, resident=lambda stream, h: True)
    for i in range(300):
        everything.learn("a", 0, stored(i, tokens=[i] * 4))
        assert len(everything) <= 64
    assert everything.evicted == 300 - len(everything)


def test_learning_off() -> None:
    learner = ChainLearner(max_blocks=0)
    assert learner.learn_batch("a", 0, batch(stored(1, tokens=[1, 2, 3, 4]))) == 0
    assert len(learner) == 0
    with pytest.raises(ValueError, match="max_blocks"):
        ChainLearner(max_blocks=-1)


def test_lookup_dispatches_both_kinds() -> None:
    fleet = Fleet()
    tokens = list(range(8))
    hashes = engine_hashes(b"x", tokens, 4)
    fleet.apply("a", 0, stored(*hashes, tokens=tokens))
    by_tokens = lookup(fleet.streams(), fleet.learner, parse_request(json.dumps({"token_ids": tokens}).encode()), 1)
    body = json.dumps({"block_hashes": [str(h) for h in hashes]}).encode()
    by_hashes = lookup(fleet.streams(), fleet.learner, parse_request(body), 1)
    assert by_tokens == by_hashes


# Property: by tokens equals by the hashes the engine announced.

requests_st = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),  # stream
        st.lists(st.integers(0, 3), min_size=1, max_size=6),  # tokens in blocks of 2; a tiny vocabulary shares prefixes
        st.sampled_from([None, "GPU", "CPU"]),
        st.booleans(),  # evict part of it afterwards
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(requests=requests_st, query=st.lists(st.integers(0, 3), max_size=8), split=st.integers(1, 3))
def test_by_tokens_equals_by_the_announced_hashes(
    requests: list[tuple[str, list[int], str | None, bool]], query: list[int], split: int
) -> None:
    fleet = Fleet()
    seeds = {"a": b"A", "b": b"B"}
    for source, drawn, medium, evict in requests:
        tokens = drawn[: len(drawn) // 2 * 2]
        hashes = engine_hashes(seeds[source], tokens, 2)
        if not hashes:
            continue
        # Announce it in pieces (parents chained), as engines do.
        cut = min(split, len(hashes))
        fleet.apply(source, 0, stored(*hashes[:cut], tokens=tokens[: cut * 2], block_size=2, medium=medium))
        if cut < len(hashes):
            fleet.apply(
                source,
                0,
                stored(*hashes[cut:], parent=hashes[cut - 1], tokens=tokens[cut * 2 :], block_size=2, medium=medium),
            )
        if evict:
            fleet.apply(source, 0, removed(*hashes[-1:], medium=medium))
    by_tokens = lookup_tokens(fleet.streams(), fleet.learner, TokenQuery(query), 9)
    for stream in fleet.streams():
        announced = engine_hashes(seeds[stream.source], query, 2)
        by_hashes = lookup_hashes([stream], chain_of(*announced), 9)["streams"][0]
        got = entry(by_tokens, stream.source)
        if got["blocks"] or by_hashes["blocks"]:
            assert got == by_hashes
        else:
            assert got["blocks"] == by_hashes["blocks"] == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.lists(st.integers(0, 5000), min_size=1, max_size=300, unique=True))
def test_cap_always_respected(cap: int, blocks: list[int]) -> None:
    learner = ChainLearner(max_blocks=cap, resident=lambda stream, h: h % 2 == 0)
    for h in blocks:
        learner.learn("a", h % 3, stored(h, tokens=[h, h]))
        assert len(learner) <= cap
    assert learner.evicted == learner.learned - len(learner)


# --- fleet facts ----------------------------------------------------------------------------


def test_fleet_facts() -> None:
    fleet = Fleet()
    fleet.apply("a", 0, stored(1, 2, 3), stored(1), stored(9, medium="CPU"))
    fleet.apply("a", 1, stored(2, 3, 4), stored(1, medium="CPU"))
    fleet.apply("b", 0, stored(3, medium="CPU"), stored(3, group=1))
    facts = fleet_facts(fleet.streams())
    assert facts == {
        # (g0: 1 2 3 4 9) + (g1: 3); shared: 1 (a0 GPU, a1 CPU), 2, 3 (a0, a1, b0 CPU)
        "distinct_blocks": 6,
        "shared_blocks": 3,
        "mediums": {
            "GPU": {"distinct_blocks": 5, "shared_blocks": 2},  # g0 1 2 3 4 (2, 3 shared) + g1 3
            "CPU": {"distinct_blocks": 3, "shared_blocks": 0},  # 9 (a0), 1 (a1), 3 (b0)
        },
    }


def test_fleet_count_in_steps_sees_the_fleet_at_construction() -> None:
    fleet = Fleet()
    fleet.apply("a", 0, stored(1, 2))
    fleet.apply("b", 0, stored(2, 3))
    count = FleetCount(fleet.streams())
    fleet.apply("c", 0, stored(1, 2, 3))
    fleet.apply("a", 0, removed(1, 2))
    steps = 0
    while not count.step():
        steps += 1
    assert steps == 1
    assert count.result() == {
        "distinct_blocks": 3,
        "shared_blocks": 1,
        "mediums": {"GPU": {"distinct_blocks": 3, "shared_blocks": 1}},
    }
    assert fleet_facts([]) == {"distinct_blocks": 0, "shared_blocks": 0, "mediums": {}}


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["GPU", "CPU"]), st.integers(0, 1), st.integers(0, 9)),
        max_size=40,
    )
)
def test_fleet_facts_match_a_plain_count(blocks: list[tuple[int, str, int, int]]) -> None:
    fleet = Fleet()
    for stream, medium, group, h in blocks:
        fleet.apply("s", stream, stored(h, medium=medium, group=group))
    holders: dict[tuple[str, int, int], set[int]] = {}
    holders_any: dict[tuple[int, int], set[int]] = {}
    for stream, medium, group, h in blocks:
        holders.setdefault((medium, group, h), set()).add(stream)
        holders_any.setdefault((group, h), set()).add(stream)
    facts = fleet_facts(fleet.streams())
    assert FleetCount(fleet.streams(), step_blocks=1).result() == facts  # one block per step: the same
    assert facts["distinct_blocks"] == len(holders_any)
    assert facts["shared_blocks"] == sum(len(s) > 1 for s in holders_any.values())
    for medium in ("GPU", "CPU"):
        mine = {k: v for k, v in holders.items() if k[0] == medium}
        if mine:
            assert facts["mediums"][medium] == {
                "distinct_blocks": len(mine),
                "shared_blocks": sum(len(s) > 1 for s in mine.values()),
            }


_HASHES = st.sampled_from([0, 1, 2, 3, 4, 5, -3, 2**64 - 1, 2**70, b"\x01" * 32, b"\x02" * 32])
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["store", "store", "remove", "clear"]),
        st.integers(0, 2),
        st.lists(_HASHES, max_size=4),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(_OPS, st.sampled_from([("GPU", 0), ("CPU", 0), ("GPU", 1)]))
def test_a_fleet_of_one_medium_and_group_is_counted_from_its_holders(
    ops: list[tuple[str, int, list[Hash]]], kind: tuple[str, int]
) -> None:
    """Every stream in one (medium, group_idx): the count from the fleet's holders, at once, is the
    count in steps, through repeats, removals of what is not held, clears and every hash kind."""
    medium, group = kind
    fleet = Fleet()
    for op, stream, hashes in ops:
        if op == "clear":
            event: Event = AllBlocksCleared()
        elif op == "store":
            event = stored(*hashes, medium=medium, group=group) if hashes else stored(1, medium=medium, group=group)
        else:
            event = removed(*hashes, medium=medium, group=group)
        fleet.apply("s", stream, event)
    tallied = FleetCount(fleet.streams(), holders=fleet.occupancy)
    assert tallied.step()  # answered at construction: nothing left to count
    assert tallied.result() == fleet_facts(fleet.streams())


def test_a_fleet_of_two_mediums_or_groups_is_counted_in_steps() -> None:
    # hash 2 on a's GPU group 0 and on b's CPU: one block, shared; on b's group 1: two blocks
    for other, shared in (({"medium": "CPU"}, 1), ({"group": 1}, 0)):
        fleet = Fleet()
        fleet.apply("a", 0, stored(1, 2))
        fleet.apply("b", 0, stored(2, **other))  # type: ignore[arg-type]
        count = FleetCount(fleet.streams(), step_blocks=1, holders=fleet.occupancy)
        assert not count.step()  # counted in steps: the holders cannot tell the kinds apart
        facts = count.result()
        assert facts == fleet_facts(fleet.streams())
        assert facts["shared_blocks"] == shared


def test_block_digests_fast_path_and_odd_tokens() -> None:
    from kvgateway.state.lookup import block_digests

    tokens = [5, 6, 7, 8, 9, 10, 11, 12, 13]  # two full blocks of 4, a partial one dropped
    plain = block_digests(tokens, 4)
    assert len(plain) == 2 and plain[0] != plain[1]
    assert block_digests(tokens, 4, None, [None, None]) == plain  # vLLM's list of Nones: no extra keys
    assert block_digests(tokens, 4, None, [["salt"], None])[1:] == plain[1:]
    assert block_digests(tokens, 4, None, [["salt"], None])[0] != plain[0]
    assert block_digests(tokens, 4, "lora") != plain
    assert block_digests([6, 5, 7, 8], 4) != plain[:1]  # order counts
    odd = [-1, 2**64, 2**61 - 1, 0]  # negative and huge ids (no engine sends them) still digest
    assert len(block_digests(odd, 4)) == 1 and 0 <= block_digests(odd, 4)[0] < 2**64


def test_a_stale_stream_says_so_in_both_kinds_of_answer() -> None:
    fleet = Fleet()
    fleet.apply("a", 0, stored(1, 2, block_size=16))
    fleet.apply("b", 0, stored(1, 2, block_size=16))
    fleet.occupancy.stream("b", 0).mark_stale("history_truncated")
    by_hashes = lookup_hashes(fleet.streams(), chain_of(1, 2), 7)
    assert [(e["source"], e["blocks"], e["stale"]) for e in by_hashes["streams"]] == [("a", 2, False), ("b", 2, True)]
    by_tokens = lookup_tokens(fleet.streams(), fleet.learner, TokenQuery(list(range(32))), 7)
    assert [(e["source"], e["stale"]) for e in by_tokens["streams"]] == [("a", False), ("b", True)]
