"""kvgateway.simulator.encode: the simulator's batches in every event form and dialect, read back by the
gateway's decoder."""

from __future__ import annotations

import msgspec
import pytest

from kvgateway.engine import wire
from kvgateway.simulator import Workload, encode
from tests.support.events import workload_batches


@pytest.mark.parametrize("form", ["map", "array"])
def test_round_trip_through_wire(form: encode.EventForm) -> None:
    for batch in workload_batches(Workload(19, cpu_offload=True, clear_every=7, hash_kind="bytes"), 30):
        decoded = wire.decode_batch(encode.encode_batch(batch, form))
        assert decoded.ts == batch.ts and decoded.dp_rank == batch.dp_rank
        assert [type(e) for e in decoded.events] == [type(e) for e in batch.events]
        for got, sent in zip(decoded.events, batch.events, strict=True):
            if isinstance(sent, wire.BlockStored):
                assert isinstance(got, wire.BlockStored)
                assert (got.block_hashes, got.parent_block_hash, got.token_ids, got.block_size, got.medium) == (
                    sent.block_hashes,
                    sent.parent_block_hash,
                    sent.token_ids,
                    sent.block_size,
                    sent.medium,
                )
                assert got.group_idx == 0 and got.extra["kv_cache_spec_kind"] == "full_attention"
            elif isinstance(sent, wire.BlockRemoved):
                assert isinstance(got, wire.BlockRemoved)
                assert (got.block_hashes, got.medium, got.group_idx) == (sent.block_hashes, sent.medium, 0)


def test_sglang_without_metadata_sends_six_fields_and_vllm_is_unchanged() -> None:
    plain = Workload(22, dialect="sglang").next_batch(0.0, 0)
    stored = [e for e in plain.events if isinstance(e, wire.BlockStored)]
    assert stored and all(e.extra == {} for e in stored)
    for event in msgspec.msgpack.decode(encode.encode_batch(plain, "array", dialect="sglang"))[1]:
        if event[0] == "BlockStored":
            assert len(event) == 7
    vllm = Workload(22).next_batch(0.0, 0)
    assert encode.encode_batch(vllm, "array") == encode.encode_batch(vllm, "array", dialect="vllm")
    with pytest.raises(ValueError):
        Workload(0, metadata=True)
    with pytest.raises(ValueError):
        Workload(0, dialect="tgi")  # type: ignore[arg-type]
