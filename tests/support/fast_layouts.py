"""What the fast decoders take, drawn by hypothesis as plain dicts and lists for msgspec to encode:
map events with any subset of their keys in any order, positional events of every field count
vLLM and SGLang have sent (tests/unit/engine/test_events_differential.py and
test_batch_differential.py); and :func:`field_by_field`, the public events as those tests compare
them."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvgateway.engine.wire import Event
from tests.support.payloads import U64

hash_st = st.integers(0, 40) | st.integers(2**63, U64) | st.integers(-(2**63), -1) | st.binary(min_size=32, max_size=32)
hashes_st = st.lists(hash_st, min_size=0, max_size=4)
tokens_st = st.lists(st.integers(0, 2**32 - 1) | st.sampled_from([0, 151_643, 2**32 - 1]), max_size=12)
medium_st = st.sampled_from([None, "GPU", "CPU", "cpu_tier", "DISK", "LMCACHE"])
maybe_int = st.none() | st.integers(0, 3)
FURTHER: dict[str, st.SearchStrategy[Any]] = {
    "extra_keys": st.none() | st.lists(st.none() | st.integers(-3, 3) | st.text(max_size=3), max_size=3),
    "group_idx": maybe_int,
    "kv_cache_spec_kind": st.none() | st.sampled_from(["full_attention", "sliding_window", "mamba"]),
    "kv_cache_spec_sliding_window": maybe_int,
}
LOCALITY = st.none() | st.sampled_from(["local", "LOCAL", "remote", "REMOTE", "Remote", "elsewhere"])


@st.composite
def map_stored(draw: st.DrawFn) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "BlockStored", "block_hashes": draw(hashes_st)}
    optional: dict[str, st.SearchStrategy[Any]] = {
        "parent_block_hash": st.none() | hash_st,
        "token_ids": tokens_st,
        "block_size": st.integers(0, 64),
        "lora_id": maybe_int,
        "medium": medium_st,
        "lora_name": st.none() | st.sampled_from(["lora-a", ""]),
        **FURTHER,
        "locality": LOCALITY,
    }
    for name in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):  # any subset, in any order
        event[name] = draw(optional[name])
    return event


@st.composite
def map_removed(draw: st.DrawFn) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": draw(hashes_st)}
    optional = {"medium": medium_st, "group_idx": maybe_int, "locality": LOCALITY}
    for name in draw(st.lists(st.sampled_from(sorted(optional)), unique=True)):
        event[name] = draw(optional[name])
    return event


@st.composite
def positional_stored(draw: st.DrawFn) -> list[Any]:
    fields = [draw(hashes_st), draw(st.none() | hash_st), draw(tokens_st), draw(st.integers(0, 64)), draw(maybe_int)]
    further = [medium_st, st.none() | st.sampled_from(["lora-a"]), *FURTHER.values()]
    count = draw(st.integers(0, len(further)))  # 5 to 11 fields: every engine's version
    return ["BlockStored", *fields, *(draw(strategy) for strategy in further[:count])]


@st.composite
def positional_removed(draw: st.DrawFn) -> list[Any]:
    further = [draw(medium_st), draw(maybe_int)][: draw(st.integers(0, 2))]
    return ["BlockRemoved", draw(hashes_st), *further]


map_events = st.lists(map_stored() | map_removed() | st.just({"type": "AllBlocksCleared"}), max_size=6)
positional_events = st.lists(positional_stored() | positional_removed() | st.just(["AllBlocksCleared"]), max_size=6)


def field_by_field(events: list[Event]) -> list[tuple[Any, ...]]:
    """Each event's type and fields, ``extra`` as its items in order, token ids read as the list."""
    out = []
    for event in events:
        fields = tuple(
            list(event.extra.items()) if name == "extra" else getattr(event, name)  # type: ignore[union-attr]
            for name in event.__struct_fields__
        )
        out.append((type(event), *fields))
    return out
