"""The state digest (kvgateway/state/digest.py): the documented test vectors, and the index's O(1)
upkeep equal to a recomputation from scratch under generated store/remove/clear sequences."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgateway.engine.wire import AllBlocksCleared, Event, Hash
from kvgateway.protocol.render import hash_text
from kvgateway.state.digest import EMPTY, MASK, WIDE_FROM, element, elements_sum, hex_digest, prefix_state
from kvgateway.state.occupancy import StreamIndex
from tests.support import REPO
from tests.support.events import BIG, batch, removed, stored

PROTOCOL = REPO / "docs" / "protocol.md"

SHA = bytes.fromhex("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")
VECTORS: list[tuple[str, int, Hash, str]] = [
    ("GPU", 0, 15760518052499183552, "3507684041cdf1ef"),  # a u64 hash above 2^63
    ("GPU", 0, 42, "a35ca2b5829f0e51"),
    ("GPU", 1, -7, "271ae3ad40f2b726"),  # group_idx > 0, a signed hash
    ("CPU_PINNED", 0, SHA, "e6678d1a36eb822a"),  # a bytes hash, as lowercase hex; not a GPU medium
    ("DISK", 2, 2**64 - 1, "70808f1053f5217f"),
]
"""(medium, group_idx, hash, element): the table of docs/protocol.md, "State digest"."""


def test_the_vectors() -> None:
    for medium, group_idx, block_hash, want in VECTORS:
        assert hex_digest(element(medium, group_idx, block_hash)) == want
        assert hex_digest(element(medium, group_idx, hash_text(block_hash))) == want  # the protocol's text
    assert hex_digest(sum(element(m, g, h) for m, g, h, _ in VECTORS)) == "56670acd90405b0f"
    assert hex_digest(element("GPU", 0, SHA)) == "a8c42f63442315cd"  # the medium is part of the key
    assert hex_digest(0) == EMPTY


def test_the_docs_give_the_same_vectors() -> None:
    text = PROTOCOL.read_text()
    for medium, group_idx, block_hash, want in VECTORS:
        row = f"| `{medium}` | {group_idx} | `{hash_text(block_hash)}` | `{want}` |"
        assert row in text, row
    for digest in ("56670acd90405b0f", "d8640af5c46d0040", "ff7eeea3055fb766"):
        assert re.search(rf"`{digest}`", text), digest


def test_an_index_digest_by_medium_and_tier() -> None:
    index = StreamIndex("e", 0)
    assert index.digest() == (0, 0)
    for medium, group_idx, block_hash, _ in VECTORS:
        index.apply(batch(stored(block_hash, medium=medium, group=group_idx)), 0.0)
    assert (hex_digest(index.digest()[0]), index.digest()[1]) == ("56670acd90405b0f", 5)
    assert hex_digest(index.digest(frozenset({"GPU"}))[0]) == "ff7eeea3055fb766"
    # A tier name selects its mediums, as a client's medium filter does.
    assert index.digest(frozenset({"CPU"}))[0] == element("CPU_PINNED", 0, SHA)
    assert index.digest(frozenset({"NVME"})) == (0, 0)
    index.apply(batch(removed(42), removed(-7, group=1)), 0.0)
    want = element("GPU", 0, 15760518052499183552) + element("CPU_PINNED", 0, SHA) + element("DISK", 2, 2**64 - 1)
    assert index.digest() == (want & MASK, 3)


def test_references_beyond_the_first_do_not_change_it() -> None:
    index = StreamIndex("e", 0)
    index.digest()
    index.apply(batch(stored(BIG, BIG), stored(BIG)), 0.0)  # three references, one key
    one = element("GPU", 0, BIG)
    assert index.digest() == (one, 1)
    index.apply(batch(removed(BIG, BIG)), 0.0)
    assert index.digest() == (one, 1)
    index.apply(batch(removed(BIG)), 0.0)
    assert index.digest() == (0, 0)


def test_clear_restart_and_restore_reset_it() -> None:
    index = StreamIndex("e", 0)
    index.apply(batch(stored(1, 2, 3)), 0.0)
    assert index.digest()[1] == 3  # the first ask computes it from the index
    index.apply(batch(AllBlocksCleared()), 0.0)
    assert index.digest() == (0, 0)
    index.apply(batch(stored(4)), 0.0)
    index.reset()
    assert index.digest() == (0, 0)
    index.restore_group("GPU", 0, {5, 6}, {5: 1})
    assert index.digest() == (elements_sum(prefix_state("GPU", 0), [5, 6]), 2)


def scratch(index: StreamIndex) -> tuple[int, int]:
    """The digest recomputed from the resident keys, the way a client would."""
    total = count = 0
    for medium, group_idx, _, blocks, _ in index.block_groups():
        for block_hash in blocks:
            total += element(medium, group_idx, hash_text(block_hash))
            count += 1
    return total & MASK, count


_KEY = st.tuples(st.sampled_from([None, "GPU", "cpu", "DISK"]), st.sampled_from([None, 0, 1]))
_HASHES = st.lists(st.one_of(st.integers(0, 12), st.sampled_from([BIG, -3, b"\x01\x02"])), min_size=0, max_size=6)
_EVENT = st.one_of(
    st.builds(lambda k, h: stored(*h, medium=k[0], group=k[1]), _KEY, _HASHES),
    st.builds(lambda k, h: removed(*h, medium=k[0], group=k[1]), _KEY, _HASHES),
    st.just(AllBlocksCleared()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_EVENT, max_size=4), max_size=12), st.integers(0, 12), st.booleans())
def test_upkeep_equals_recomputation(batches: list[list[Event]], ask_at: int, freeze: bool) -> None:
    """O(1) per key equals the sum from scratch after every batch, whenever tracking began, also
    with a frozen snapshot (copy on write) taken in between."""
    index = StreamIndex("e", 0)
    for n, events in enumerate(batches):
        if n == ask_at:
            index.digest()
        if freeze and n % 3 == 1:
            index.block_groups(freeze=True)
        index.apply(batch(*events), 0.0)
        if n >= ask_at:
            assert index.digest() == scratch(index)
    assert index.digest() == scratch(index)


@settings(max_examples=40, deadline=None)
@given(
    st.sets(
        st.one_of(st.integers(-(2**63), 2**64 - 1), st.binary(min_size=0, max_size=40)),
        min_size=WIDE_FROM,
        max_size=600,
    ),
    st.sampled_from([("GPU", 0), ("CPU_PINNED", 3)]),
)
def test_many_hashes_side_by_side_equal_one_by_one(hashes: set[Hash], key: tuple[str, int]) -> None:
    """The wide path (a group's first sum, a big batch) equals the element-by-element one."""
    prefix = prefix_state(*key)
    assert elements_sum(prefix, hashes) == sum(element(*key, h) for h in hashes) & MASK
    few = list(hashes)[: WIDE_FROM - 1]  # the one-by-one path
    assert elements_sum(prefix, few) == sum(element(*key, h) for h in few) & MASK
