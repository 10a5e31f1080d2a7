"""Engine payloads built by hand with msgspec.msgpack.encode of plain lists and dicts (never with the
simulator's encoder, so the decoder is not checked against itself): every layout an engine sends, and
hypothesis strategies drawing them with the events they must decode to."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import strategies as st

from kvgateway.engine import wire
from kvgateway.engine.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored, Event, UnknownEvent
from kvgateway.protocol import render

enc = msgspec.msgpack.encode
U64 = 2**64 - 1
ABOVE_I64 = 15760518052499183552  # from a real vLLM 0.26 capture: > 2^63
RAW32 = bytes(range(0xE0, 0x100))  # 32 raw bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)
STORED_CORE = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name")
STORED_FURTHER = ("extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
STORED_POSITIONAL = STORED_CORE + STORED_FURTHER  # the 11 positional fields, in wire order
RENDERED_STORED = {"type", *STORED_CORE, "tier"}
RENDERED_REMOVED = {"type", "block_hashes", "medium", "tier"}
MAP_ONLY_KEYS = {"locality": "LOCAL", "ownership": "owned", "session_id": "s-1", "cache_salt": "salt"}


def decode(*events: Any, tail: tuple[Any, ...] = (0,)) -> Batch:
    return wire.decode_batch(enc([1789095808.8378847, list(events), *tail]))


def stored_array(n: int, **fields: Any) -> list[Any]:
    """A positional BlockStored with its first ``n`` fields (unspecified ones None)."""
    values = {"block_hashes": [1], "token_ids": [], "block_size": 16} | fields
    return ["BlockStored", *(values.get(name) for name in STORED_POSITIONAL[:n])]


FULL_STORED: dict[str, Any] = {
    "block_hashes": [ABOVE_I64, -5, RAW32],
    "parent_block_hash": U64,
    "token_ids": list(range(48)),
    "block_size": 16,
    "lora_id": 3,
    "medium": "GPU",
    "lora_name": "adapter",
    "extra_keys": [None, ["adapter", ["mm-hash"], "salt"], None],
    "group_idx": 1,
    "kv_cache_spec_kind": "sliding_window",
    "kv_cache_spec_sliding_window": 4096,
}


def roundtrip(events: list[Event]) -> list[dict[str, Any]]:
    """What a web client sees: msgspec's JSON, read back by a plain JSON parser."""
    out: list[dict[str, Any]] = json.loads(msgspec.json.encode(render.render_events(events)))
    return out


hash_st = st.one_of(
    st.integers(2**63, U64), st.integers(-(2**63), -1), st.integers(0, 2**63), st.binary(min_size=32, max_size=32)
)


medium_st = st.sampled_from(["GPU", "gpu", "CPU", "CPU_PINNED", "DISK", None])
small_value = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), U64), st.text(max_size=8), st.binary(max_size=8)
)


@st.composite
def stored_fields(draw: st.DrawFn) -> dict[str, Any]:
    hashes = draw(st.lists(hash_st, max_size=4))
    return {
        "block_hashes": hashes,
        "parent_block_hash": draw(st.none() | hash_st),
        "token_ids": draw(st.lists(st.integers(0, 2**32 - 1), max_size=20)),
        "block_size": draw(st.sampled_from([0, 1, 16, 64])),
        "lora_id": draw(st.none() | st.integers(0, 2**31)),
        "medium": draw(medium_st),
        "lora_name": draw(st.none() | st.text(max_size=8)),
        "extra_keys": draw(
            st.none() | st.just([None] * len(hashes)) | st.just([["lora", [b"\x01"], "s"]] * len(hashes))
        ),
        "group_idx": draw(st.none() | st.integers(0, 3)),
        "kv_cache_spec_kind": draw(st.none() | st.sampled_from(["full_attention", "mamba", "unknown"])),
        "kv_cache_spec_sliding_window": draw(st.none() | st.integers(1, 2**20)),
    }


def counted_medium(medium: str | None, extra: dict[str, Any]) -> str | None:
    """The medium a map event's block is counted under (docs/protocol.md): a block of a remote pool,
    ``locality`` "REMOTE" in any case, under ``REMOTE_`` and its medium (GPU where none is sent)."""
    locality = extra.get("locality")
    if isinstance(locality, str) and locality.upper() == "REMOTE":
        return "REMOTE_" + (medium.upper() if medium else "GPU")
    return medium


@st.composite
def encoded_event(draw: st.DrawFn) -> tuple[Any, Event, tuple[Any, ...]]:
    """(the plain value an engine sends, the event it must decode to, its layout-free core)."""
    kind = draw(st.sampled_from(["stored", "removed", "cleared", "unknown"]))
    as_map = draw(st.booleans())
    if kind == "stored":
        f = draw(stored_fields())
        if as_map:
            body: dict[str, Any] = {"type": "BlockStored"}
            for name in STORED_POSITIONAL:  # None values may be left out (omit_defaults)
                if f[name] is not None or name == "block_hashes" or draw(st.booleans()):
                    body[name] = f[name]
            body.update(draw(st.dictionaries(st.sampled_from(sorted(MAP_ONLY_KEYS)), small_value)))
            items = draw(st.permutations(list(body.items())))
            wire_value: Any = dict(items)
            extra = {k: v for k, v in wire_value.items() if k not in {"type", *STORED_CORE}}
        else:
            last = max([0, *(i + 1 for i, name in enumerate(STORED_POSITIONAL) if f[name] is not None)])
            n = draw(st.sampled_from([c for c in (5, 6, 7, 8, 11) if c >= last]))
            trailing = draw(st.lists(small_value, max_size=3)) if n == 11 else []
            wire_value = ["BlockStored", *(f[name] for name in STORED_POSITIONAL[:n]), *trailing]
            extra = {name: f[name] for name in STORED_FURTHER[: max(0, n - 7)]}
        fields = {name: f[name] for name in STORED_CORE} | {"medium": counted_medium(f["medium"], extra)}
        expected: Event = BlockStored(**fields, extra=extra)
        core = ("BlockStored", *(fields[name] for name in STORED_CORE), f["group_idx"])
        return wire_value, expected, core
    if kind == "removed":
        hashes = draw(st.lists(hash_st, max_size=4))
        medium = draw(medium_st)
        group_idx = draw(st.none() | st.integers(0, 3))
        core = ("BlockRemoved", hashes, medium, group_idx)
        if as_map:
            body = {"type": "BlockRemoved", "block_hashes": hashes}
            if medium is not None or draw(st.booleans()):
                body["medium"] = medium
            if group_idx is not None or draw(st.booleans()):
                body["group_idx"] = group_idx
            body.update(draw(st.dictionaries(st.sampled_from(["locality", "ownership"]), small_value)))
            extra = {k: v for k, v in body.items() if k not in {"type", "block_hashes", "medium"}}
            counted = counted_medium(medium, extra)
            core = ("BlockRemoved", hashes, counted, group_idx)
            return body, BlockRemoved(block_hashes=hashes, medium=counted, extra=extra), core
        n = 3 if group_idx is not None else draw(st.sampled_from([2, 3] if medium is not None else [1, 2, 3]))
        values = ["BlockRemoved", hashes, medium, group_idx][: n + 1]
        extra = {"group_idx": group_idx} if n == 3 else {}
        return values, BlockRemoved(block_hashes=hashes, medium=medium, extra=extra), core
    if kind == "cleared":
        if as_map:
            body = {"type": "AllBlocksCleared"} | draw(st.dictionaries(st.sampled_from(["reason"]), small_value))
            return body, AllBlocksCleared(extra={k: v for k, v in body.items() if k != "type"}), ("AllBlocksCleared",)
        return ["AllBlocksCleared"], AllBlocksCleared(), ("AllBlocksCleared",)
    tag = draw(st.sampled_from(["BlockMoved", "KVTransfer", "blockstored"]))
    fields = draw(st.lists(small_value, max_size=4))
    if as_map:
        body = {"type": tag, **{f"f{i}": v for i, v in enumerate(fields)}}
        return body, UnknownEvent(type=tag, body=body), (tag,)
    array: list[Any] = [tag, *fields]
    return array, UnknownEvent(type=tag, body=array), (tag,)


def core_of(event: Event) -> tuple[Any, ...]:
    if isinstance(event, BlockStored):
        return ("BlockStored", *(getattr(event, name) for name in STORED_CORE), event.group_idx)
    if isinstance(event, BlockRemoved):
        return ("BlockRemoved", event.block_hashes, event.medium, event.group_idx)
    return (event.type,)
