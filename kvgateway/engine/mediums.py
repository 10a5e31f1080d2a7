"""Medium names and tiers: the one place that decides what an engine's ``medium`` string means.

Engines name their cache mediums themselves: vLLM ``"GPU"``, ``"CPU"``, ``"STORAGE"`` (case
varies; null or absent in engines older than the field, which were GPU-only; 0.26 also ``"FS"``
and ``"OBJ"``, folded into ``"STORAGE"`` in 0.27), SGLang ``"GPU"``, ``"CPU_PINNED"``, ``"DISK"``,
``"EXTERNAL"``. The gateway keeps the engine's own name (upper-cased:
:func:`normalise_medium`) wherever it shows a stream, and maps every name to one of four
:data:`TIERS` (:func:`medium_tier`) for fleet totals and filters:

======== =====================================================================================
tier     medium names (after upper-casing; a name *starting with* one of these prefixes)
======== =====================================================================================
GPU      ``GPU``, ``CUDA``, ``HBM``, ``DEVICE``; and null, absent or empty (older engines)
CPU      ``CPU`` (``CPU_PINNED``, ...), ``HOST``, ``DRAM``, ``PINNED``
DISK     ``DISK``, ``STORAGE``, ``SSD``, ``NVME``, ``FILE``, ``HDD``, ``FS`` (vLLM 0.26's file system)
EXTERNAL ``OBJ`` (vLLM 0.26's object store), ``REMOTE_...`` (below), and anything else
         (``EXTERNAL``, ``LMCACHE``, a name of a future engine, ...)
======== =====================================================================================

A block an engine announces with ``locality: "REMOTE"`` (vLLM 0.26, TensorRT-LLM) is held by a
remote pool (prefill/decode disaggregation), not in this engine's memory. The decoder gives it
the medium ``REMOTE_<medium>`` (:func:`remote_medium`, e.g. ``REMOTE_GPU``), whose tier is
EXTERNAL: it is counted apart from the engine's own GPU, CPU and disk blocks in the index, the
fleet totals and lookups, and a ``medium=GPU`` filter does not match it (``EXTERNAL`` or
``REMOTE_GPU`` does). The event keeps ``locality`` among its further fields.

Both the occupancy index and the hub's ``medium=`` filter use these functions, so a filter and
the index always put an event in the same medium and tier.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

Tier: TypeAlias = Literal["GPU", "CPU", "DISK", "EXTERNAL"]

GPU: Final = "GPU"
CPU: Final = "CPU"
DISK: Final = "DISK"
EXTERNAL: Final = "EXTERNAL"
TIERS: Final[tuple[Tier, ...]] = (GPU, CPU, DISK, EXTERNAL)
"""Every tier, fastest first (the order the gateway lists them in)."""

DEFAULT_MEDIUM: Final = GPU
"""The medium of an event without one: engines before the field existed only had GPU caches."""

REMOTE_PREFIX: Final = "REMOTE_"
"""Starts the medium of a block held by a remote pool: see :func:`remote_medium`."""

_PREFIXES: Final[tuple[tuple[str, Tier], ...]] = (
    ("GPU", GPU),
    ("CUDA", GPU),
    ("HBM", GPU),
    ("DEVICE", GPU),
    ("CPU", CPU),
    ("HOST", CPU),
    ("DRAM", CPU),
    ("PINNED", CPU),
    ("DISK", DISK),
    ("STORAGE", DISK),
    ("SSD", DISK),
    ("NVME", DISK),
    ("FILE", DISK),
    ("HDD", DISK),
    ("FS", DISK),
    ("OBJ", EXTERNAL),
    (REMOTE_PREFIX, EXTERNAL),
)

_CACHE_MAX: Final = 256
"""Bound on the memo of raw medium strings: the wire's strings are not trusted."""
_tiers: dict[str | None, Tier] = {None: GPU, "": GPU}


def normalise_medium(medium: str | None) -> str:
    """The medium name the gateway shows: ``"gpu"`` -> ``"GPU"``; None or empty -> ``"GPU"``."""
    return medium.upper() if medium else DEFAULT_MEDIUM


def _tier_of_name(name: str) -> Tier:
    for prefix, tier in _PREFIXES:
        if name.startswith(prefix):
            return tier
    return EXTERNAL


def medium_tier(medium: str | None) -> Tier:
    """The tier of a medium as an engine sent it (any case; None or empty: GPU)."""
    tier = _tiers.get(medium)
    if tier is None:
        tier = _tier_of_name(normalise_medium(medium))
        if len(_tiers) < _CACHE_MAX:
            _tiers[medium] = tier
    return tier


def remote_medium(medium: str | None) -> str:
    """The medium of a block held by a remote pool (``locality: "REMOTE"``): ``REMOTE_GPU`` and so on."""
    return REMOTE_PREFIX + normalise_medium(medium)


def tier_rank(tier: str) -> int:
    """Sort key of a tier name: GPU, CPU, DISK, EXTERNAL, then anything else."""
    try:
        return TIERS.index(tier)
    except ValueError:
        return len(TIERS)
