"""mediums.py: the one medium normaliser and the tier table, shared by the index and the filters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvgateway.engine import mediums
from kvgateway.engine.mediums import TIERS, medium_tier, normalise_medium, tier_rank


@pytest.mark.parametrize(
    ("medium", "name"),
    [(None, "GPU"), ("", "GPU"), ("gpu", "GPU"), ("Cpu_Pinned", "CPU_PINNED"), ("STORAGE", "STORAGE"), ("x", "X")],
)
def test_normalise_medium(medium: str | None, name: str) -> None:
    assert normalise_medium(medium) == name


@pytest.mark.parametrize(
    ("medium", "tier"),
    [
        # vLLM
        ("GPU", "GPU"),
        ("gpu", "GPU"),
        ("CPU", "CPU"),
        ("cpu", "CPU"),
        ("STORAGE", "DISK"),
        ("storage", "DISK"),
        (None, "GPU"),  # older engines: no medium at all
        ("", "GPU"),
        # SGLang
        ("CPU_PINNED", "CPU"),
        ("DISK", "DISK"),
        ("EXTERNAL", "EXTERNAL"),
        # the prefixes of the table
        ("GPU_HBM", "GPU"),
        ("cuda:0", "GPU"),
        ("HBM", "GPU"),
        ("DEVICE", "GPU"),
        ("HOST", "CPU"),
        ("host_pinned", "CPU"),
        ("DRAM", "CPU"),
        ("PINNED", "CPU"),
        ("SSD", "DISK"),
        ("nvme0", "DISK"),
        ("FILE", "DISK"),
        ("file_system", "DISK"),
        ("HDD", "DISK"),
        # vLLM 0.26: file system and object store offload (STORAGE from 0.27)
        ("FS", "DISK"),
        ("fs", "DISK"),
        ("OBJ", "EXTERNAL"),
        ("obj", "EXTERNAL"),
        # a block held by a remote pool (locality REMOTE)
        ("REMOTE_GPU", "EXTERNAL"),
        ("REMOTE_CPU", "EXTERNAL"),
        # everything else
        ("REMOTE", "EXTERNAL"),
        ("LMCACHE", "EXTERNAL"),
        ("mooncake", "EXTERNAL"),
        ("S3", "EXTERNAL"),
        ("XGPU", "EXTERNAL"),  # prefixes, not substrings
    ],
)
def test_tier_table(medium: str | None, tier: str) -> None:
    assert medium_tier(medium) == tier
    assert medium_tier(normalise_medium(medium)) == tier  # the normalised name has the same tier


def test_every_tier_name_is_a_medium_of_its_own_tier() -> None:
    """So that ``medium=CPU`` as a tier filter also covers a medium literally named CPU."""
    for tier in TIERS:
        assert medium_tier(tier) == tier


def test_tier_order() -> None:
    assert sorted(["EXTERNAL", "DISK", "GPU", "CPU", "OTHER"], key=tier_rank) == [*TIERS, "OTHER"]


@given(st.text(max_size=20) | st.none())
def test_any_name_has_exactly_one_tier_and_the_memo_stays_bounded(medium: str | None) -> None:
    assert medium_tier(medium) in TIERS
    assert medium_tier(medium) == mediums._tier_of_name(normalise_medium(medium))
    assert len(mediums._tiers) <= mediums._CACHE_MAX


@pytest.mark.parametrize(
    ("medium", "name"), [("GPU", "REMOTE_GPU"), ("cpu", "REMOTE_CPU"), (None, "REMOTE_GPU"), ("FS", "REMOTE_FS")]
)
def test_a_remote_block_has_a_medium_of_its_own_in_the_external_tier(medium: str | None, name: str) -> None:
    """Not in this engine's memory: never counted with its own GPU (or CPU, or disk) blocks."""
    assert mediums.remote_medium(medium) == name
    assert medium_tier(name) == "EXTERNAL"
