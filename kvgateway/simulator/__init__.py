"""A KV-event publisher that behaves like the real engines: a realistic workload, replay, faults.

Three layers:

* :mod:`~kvgateway.simulator.workload` -- :class:`Workload`, pure and deterministic: a seeded
  stream of :class:`~kvgateway.engine.wire.Batch` objects that behave like a prefix-caching engine
  (shared system prompts, growing conversations, chained block hashes, LRU eviction, optional CPU
  offload, duplicates, unknown removes, clears). Its docstring gives the block-hash recipe.
* :mod:`~kvgateway.simulator.engine` -- :class:`SimulatedEngine`, one DP rank's publisher on
  ZeroMQ (asyncio): PUB socket plus an optional ROUTER replay socket, with the same bind/connect
  rule, message layout, replay protocol, replay buffer and replay losses as vLLM's
  ``ZmqEventPublisher``, SGLang's and TensorRT-LLM's differences (``engine=``), plus the
  :class:`Faults` it can inject.
* :mod:`~kvgateway.simulator.cli` -- ``kvgateway simulate``: :func:`add_arguments` / :func:`run`,
  N engines for ``--dp-size N``.
"""

from __future__ import annotations

from kvgateway.engine.endpoints import binds, offset_endpoint
from kvgateway.simulator.cli import UsageError, add_arguments, run
from kvgateway.simulator.engine import (
    ENGINE_FLAVOURS,
    EVENT_FORMS,
    MAX_SEQ,
    PUB_HWM,
    REPLAY_HWM,
    REPLAY_LAYOUTS,
    EngineFlavour,
    Faults,
    ReplayLayout,
    SimulatedEngine,
    build_engines,
    garbage_payload,
)
from kvgateway.simulator.workload import (
    CPU,
    GPU,
    HASH_KINDS,
    HashKind,
    Medium,
    Workload,
    block_hash,
)

__all__ = [
    "CPU",
    "ENGINE_FLAVOURS",
    "EVENT_FORMS",
    "GPU",
    "HASH_KINDS",
    "MAX_SEQ",
    "PUB_HWM",
    "REPLAY_HWM",
    "REPLAY_LAYOUTS",
    "EngineFlavour",
    "Faults",
    "HashKind",
    "Medium",
    "ReplayLayout",
    "SimulatedEngine",
    "UsageError",
    "Workload",
    "add_arguments",
    "binds",
    "block_hash",
    "build_engines",
    "garbage_payload",
    "offset_endpoint",
    "run",
]
