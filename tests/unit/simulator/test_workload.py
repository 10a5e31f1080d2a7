"""kvgateway.simulator.workload: the simulated cache's batches, block hashes, evictions and clears."""

from __future__ import annotations

import hashlib
from collections import Counter

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgateway.engine import wire
from kvgateway.simulator import HashKind, Workload, block_hash, encode
from tests.support.events import workload_batches

MASK64 = (1 << 64) - 1


def reference_hash(parent: wire.Hash | None, tokens: list[int], kind: str) -> wire.Hash:
    """The recipe from the simulator's docstring, written out independently."""
    data = bytearray(b"\x00" if parent is None else b"\x01")
    if parent is not None:
        data += parent if isinstance(parent, bytes) else (parent & MASK64).to_bytes(8, "big")
    for token in tokens:
        data += token.to_bytes(4, "big")
    digest = hashlib.sha256(bytes(data)).digest()
    if kind == "bytes":
        return digest
    low = int.from_bytes(digest[-8:], "big")
    return low - (1 << 64) if kind == "signed" and low >= 1 << 63 else low


def is_placeholder(event: wire.BlockStored) -> bool:
    return event.block_size == 0 and event.token_ids == [] and event.parent_block_hash is None


class RefModel:
    """An independent consumer: reference counts per (medium, hash), reset by AllBlocksCleared."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter[wire.Hash]] = {"GPU": Counter(), "CPU": Counter()}
        self.ever_stored: dict[str, set[wire.Hash]] = {"GPU": set(), "CPU": set()}
        self.since_clear: set[wire.Hash] = set()
        self.unknown_removes = 0
        self.duplicate_stores = 0
        self.clears = 0

    def apply(self, batch: wire.Batch) -> None:
        for event in batch.events:
            if isinstance(event, wire.AllBlocksCleared):
                self.counts = {"GPU": Counter(), "CPU": Counter()}
                self.since_clear = set()
                self.clears += 1
            elif isinstance(event, wire.BlockStored):
                assert event.medium in ("GPU", "CPU")
                counts = self.counts[event.medium]
                for h in event.block_hashes:
                    if counts[h] > 0:
                        self.duplicate_stores += 1
                    counts[h] += 1
                    self.ever_stored[event.medium].add(h)
                    self.since_clear.add(h)
            elif isinstance(event, wire.BlockRemoved):
                assert event.medium in ("GPU", "CPU")
                counts = self.counts[event.medium]
                for h in event.block_hashes:
                    if counts[h] > 0:
                        counts[h] -= 1
                        if counts[h] == 0:
                            del counts[h]
                    else:
                        # Only a hash this medium never held may be removed unannounced.
                        assert h not in self.ever_stored[event.medium], f"remove of {h!r} below zero"
                        self.unknown_removes += 1
            else:  # pragma: no cover - the workload only makes the three known types
                raise AssertionError(f"unexpected event {event!r}")

    def check_parents(self, batch: wire.Batch, block_size: int, kind: str) -> None:
        """Every self-describing store is a valid chain whose parent was stored since the last clear."""
        seen = set(self.since_clear)
        for event in batch.events:
            if isinstance(event, wire.AllBlocksCleared):
                seen = set()
            elif isinstance(event, wire.BlockStored):
                if not is_placeholder(event):
                    assert event.block_size == block_size
                    assert len(event.token_ids) == block_size * len(event.block_hashes)
                    parent = event.parent_block_hash
                    assert parent is None or parent in seen, "parent never stored"
                    for i, h in enumerate(event.block_hashes):
                        assert h == reference_hash(parent, event.token_ids[i * block_size : (i + 1) * block_size], kind)
                        parent = h
                seen.update(event.block_hashes)


# --- Workload -----------------------------------------------------------------------------


def test_same_seed_same_batches_different_seed_different() -> None:
    a = [encode.encode_batch(b) for b in workload_batches(Workload(7, cpu_offload=True, clear_every=50), 150)]
    b = [encode.encode_batch(b) for b in workload_batches(Workload(7, cpu_offload=True, clear_every=50), 150)]
    c = [encode.encode_batch(b) for b in workload_batches(Workload(8, cpu_offload=True, clear_every=50), 150)]
    assert a == b
    assert a != c


def test_streams_share_system_prompts_but_not_requests() -> None:
    def roots(workload: Workload) -> set[wire.Hash]:
        found: set[wire.Hash] = set()
        for batch in workload_batches(workload, 200):
            for event in batch.events:
                if isinstance(event, wire.BlockStored) and event.parent_block_hash is None:
                    found.add(event.block_hashes[0])
        return found

    rank0, rank1 = Workload(3, stream=0), Workload(3, stream=1)
    assert roots(rank0) & roots(rank1), "ranks of one model share system-prompt prefixes"
    first0 = encode.encode_batch(Workload(3, stream=0).next_batch(0.0, 0))
    first1 = encode.encode_batch(Workload(3, stream=1).next_batch(0.0, 0))
    assert first0 != first1


def test_batch_carries_ts_and_rank() -> None:
    workload = Workload(1)
    batch = workload.next_batch(123.5, 4)
    assert batch.ts == 123.5 and batch.dp_rank == 4
    assert workload.next_batch(1.0, None).dp_rank is None
    assert workload.batches == 2


@pytest.mark.parametrize("kind", ["int", "signed", "bytes"])
def test_reference_counts_never_negative_and_match_resident(kind: HashKind) -> None:
    workload = Workload(11, hash_kind=kind, gpu_capacity_blocks=96, cpu_offload=True, cpu_capacity_blocks=160)
    model = RefModel()
    for batch in workload_batches(workload, 400):
        model.check_parents(batch, 16, kind)
        model.apply(batch)
        assert dict(model.counts["GPU"]) == workload.resident_counts("GPU")
        assert dict(model.counts["CPU"]) == workload.resident_counts("CPU")
        assert sum(model.counts["GPU"].values()) <= 96
        assert sum(model.counts["CPU"].values()) <= 160
    assert model.unknown_removes > 0, "deliberate removes of never-stored hashes"
    assert model.duplicate_stores > 0, "duplicate stores of resident hashes"


def test_lru_evictions_happen_when_over_capacity() -> None:
    removed = 0
    for batch in workload_batches(Workload(5, gpu_capacity_blocks=64), 100):
        for event in batch.events:
            if isinstance(event, wire.BlockRemoved):
                removed += len(event.block_hashes)
    assert removed > 100


def test_prefix_sharing_gives_cache_hits() -> None:
    """With a roomy cache most requests reuse a stored prefix: fewer blocks stored than requested."""
    workload = Workload(2, gpu_capacity_blocks=4096)
    roots = stored = 0
    for batch in workload_batches(workload, 300):
        for event in batch.events:
            if isinstance(event, wire.BlockStored):
                stored += 1
                roots += event.parent_block_hash is None
    assert stored > 0
    assert roots < stored / 3, "most stores continue a cached prefix"


@pytest.mark.parametrize("kind", ["int", "signed", "bytes"])
def test_hash_kinds(kind: HashKind) -> None:
    hashes: list[wire.Hash] = []
    for batch in workload_batches(Workload(4, hash_kind=kind), 100):
        for event in batch.events:
            if isinstance(event, wire.BlockStored | wire.BlockRemoved):
                hashes.extend(event.block_hashes)
    assert hashes
    if kind == "bytes":
        assert all(isinstance(h, bytes) and len(h) == 32 for h in hashes)
        return
    assert all(isinstance(h, int) for h in hashes)
    ints = [h for h in hashes if isinstance(h, int)]
    if kind == "int":
        assert all(0 <= h <= MASK64 for h in ints)
        assert any(h >= 1 << 63 for h in ints), "unsigned values above i64 occur"
    else:
        assert all(-(1 << 63) <= h < 1 << 63 for h in ints)
        assert any(h < 0 for h in ints), "negative values occur"


def test_int_and_signed_are_the_same_bits() -> None:
    unsigned = Workload(9, hash_kind="int").next_batch(0.0, 0)
    signed = Workload(9, hash_kind="signed").next_batch(0.0, 0)
    for a, b in zip(unsigned.events, signed.events, strict=True):
        assert isinstance(a, wire.BlockStored | wire.BlockRemoved)
        assert isinstance(b, wire.BlockStored | wire.BlockRemoved)
        assert [h & MASK64 for h in b.block_hashes if isinstance(h, int)] == a.block_hashes


def test_block_hash_matches_reference() -> None:
    tokens = list(range(16))
    for kind in ("int", "signed", "bytes"):
        root = block_hash(None, tokens, kind)
        assert root == reference_hash(None, tokens, kind)
        child = block_hash(root, [151_000] * 16, kind)
        assert child == reference_hash(root, [151_000] * 16, kind)


def test_vllm_026_fields() -> None:
    for batch in workload_batches(Workload(6, cpu_offload=True), 100):
        for event in batch.events:
            if isinstance(event, wire.BlockStored):
                n = len(event.block_hashes)
                assert event.extra == {"extra_keys": [None] * n, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
                assert event.lora_id is None and event.lora_name is None
            elif isinstance(event, wire.BlockRemoved):
                assert event.extra == {"group_idx": 0}


def test_capture_like_first_block() -> None:
    """Roots start with the chat template, like the real vLLM 0.26 capture."""
    batch = Workload(0).next_batch(0.0, 0)
    stored = [e for e in batch.events if isinstance(e, wire.BlockStored)]
    assert stored[0].parent_block_hash is None
    assert stored[0].token_ids[:3] == [151644, 8948, 198]
    assert all(0 <= t < 152_000 for t in stored[0].token_ids)


def test_placeholders_only_with_cpu_offload() -> None:
    placeholders = described = 0
    for batch in workload_batches(Workload(12, cpu_offload=True), 200):
        for event in batch.events:
            if isinstance(event, wire.BlockStored) and event.medium == "CPU":
                if is_placeholder(event):
                    placeholders += 1
                else:
                    described += 1
                    assert event.block_size == 16
    assert placeholders > 0 and described > 0
    for batch in workload_batches(Workload(12), 200):
        for event in batch.events:
            if isinstance(event, wire.BlockStored | wire.BlockRemoved):
                assert event.medium == "GPU"
            if isinstance(event, wire.BlockStored):
                assert not is_placeholder(event)


def test_cpu_evictions_when_cpu_pool_small() -> None:
    cpu_removes = 0
    for batch in workload_batches(Workload(13, cpu_offload=True, cpu_capacity_blocks=32), 150):
        cpu_removes += sum(isinstance(e, wire.BlockRemoved) and e.medium == "CPU" for e in batch.events)
    assert cpu_removes > 0


def test_clears_every_n_batches() -> None:
    workload = Workload(14, clear_every=10)
    for index, batch in enumerate(workload_batches(workload, 35), start=1):
        clears = [i for i, e in enumerate(batch.events) if isinstance(e, wire.AllBlocksCleared)]
        if index % 10 == 0:
            assert clears == [0]
            # Right after a clear, the first store starts a chain from the root.
            first_store = next(e for e in batch.events if isinstance(e, wire.BlockStored))
            assert first_store.parent_block_hash is None
        else:
            assert clears == []
    assert not any(
        isinstance(e, wire.AllBlocksCleared) for b in workload_batches(Workload(14), 50) for e in b.events
    ), "clear_every=0 never clears"


def test_reset_cache_is_silent() -> None:
    workload = Workload(15, gpu_capacity_blocks=64)
    before = RefModel()
    for batch in workload_batches(workload, 20):
        before.apply(batch)
    assert workload.resident_counts("GPU")
    workload.reset_cache()
    assert workload.resident_counts("GPU") == {} and workload.resident_counts("CPU") == {}
    # A consumer that restarts with the engine: it never sees a remove of a pre-restart block.
    after = RefModel()
    after.ever_stored = before.ever_stored
    for batch in workload_batches(workload, 40):
        assert not any(isinstance(e, wire.AllBlocksCleared) for e in batch.events)
        after.apply(batch)


def test_events_per_batch() -> None:
    for batch in workload_batches(Workload(16, events_per_batch=5), 50):
        assert len(batch.events) >= 5
    for batch in workload_batches(Workload(16, events_per_batch=(1, 2)), 50):
        assert len(batch.events) >= 1


def test_block_size_is_respected() -> None:
    model = RefModel()
    for batch in workload_batches(Workload(17, block_size=4, gpu_capacity_blocks=40), 60):
        model.check_parents(batch, 4, "int")
        model.apply(batch)


def test_tiny_gpu_pool_stays_consistent() -> None:
    workload = Workload(18, gpu_capacity_blocks=1, cpu_offload=True, cpu_capacity_blocks=1)
    model = RefModel()
    for batch in workload_batches(workload, 100):
        model.check_parents(batch, 16, "int")
        model.apply(batch)
        assert sum(model.counts["GPU"].values()) <= 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0},
        {"gpu_capacity_blocks": 0},
        {"cpu_capacity_blocks": 0},
        {"clear_every": -1},
        {"events_per_batch": 0},
        {"events_per_batch": (3, 2)},
        {"hash_kind": "str"},
    ],
)
def test_bad_workload_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Workload(0, **kwargs)  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    gpu=st.integers(1, 80),
    cpu=st.integers(1, 80),
    offload=st.booleans(),
    clear_every=st.integers(0, 12),
    kind=st.sampled_from(["int", "signed", "bytes"]),
)
def test_invariants_hold_for_any_configuration(
    *, seed: int, gpu: int, cpu: int, offload: bool, clear_every: int, kind: HashKind
) -> None:
    workload = Workload(
        seed,
        hash_kind=kind,
        gpu_capacity_blocks=gpu,
        cpu_offload=offload,
        cpu_capacity_blocks=cpu,
        clear_every=clear_every,
    )
    model = RefModel()
    for batch in workload_batches(workload, 40):
        model.check_parents(batch, 16, kind)
        model.apply(batch)
        assert dict(model.counts["GPU"]) == workload.resident_counts("GPU")
        assert dict(model.counts["CPU"]) == workload.resident_counts("CPU")


# --- SGLang's dialect -------------------------------------------------------------------------


def test_sglang_workload_events_and_encoding() -> None:
    workload = Workload(
        21, hash_kind="signed", dialect="sglang", metadata=True, cpu_offload=True, gpu_capacity_blocks=96
    )
    mediums: set[str | None] = set()
    stored = 0
    for batch in workload_batches(workload, 150):
        for event in batch.events:
            if isinstance(event, (wire.BlockStored, wire.BlockRemoved)):
                mediums.add(event.medium)
                assert "group_idx" not in event.extra and "extra_keys" not in event.extra
            if isinstance(event, wire.BlockStored):
                stored += 1
                assert set(event.extra) == {"cache_salt"}
        array = msgspec.msgpack.decode(encode.encode_batch(batch, "array", dialect="sglang"))
        maps = msgspec.msgpack.decode(encode.encode_batch(batch, "map", dialect="sglang"))
        for event, as_array, as_map in zip(batch.events, array[1], maps[1], strict=True):
            if isinstance(event, wire.BlockStored):
                assert len(as_array) == 8 and as_array[7] == event.extra, "metadata map at index 7"
                assert as_array[1:7] == [
                    event.block_hashes,
                    event.parent_block_hash,
                    event.token_ids,
                    event.block_size,
                    event.lora_id,
                    event.medium,
                ]
                assert "lora_name" not in as_map and as_map["cache_salt"] == event.extra["cache_salt"]
            elif isinstance(event, wire.BlockRemoved):
                assert as_array == ["BlockRemoved", event.block_hashes, event.medium]
                assert as_map == {"type": "BlockRemoved", "block_hashes": event.block_hashes, "medium": event.medium}
    assert stored and {"GPU", "CPU_PINNED"} <= mediums <= {"GPU", "CPU_PINNED", "DISK", "EXTERNAL"}
    assert workload.resident_counts("CPU"), "the offload tier is still addressed as the CPU pool"
