"""A vLLM-compatible KV-event publisher: a realistic workload, replay, and fault injection.

Three layers:

* :class:`Workload` -- pure and deterministic: a seeded stream of :class:`~kvgateway.wire.Batch`
  objects that behave like a prefix-caching engine (shared system prompts, growing conversations,
  chained block hashes, LRU eviction, optional CPU offload, duplicates, unknown removes, clears).
* :class:`SimulatedEngine` -- one DP rank's publisher on ZeroMQ (asyncio): PUB socket plus an
  optional ROUTER replay socket, with the same bind/connect rule, message layout, replay protocol
  and replay buffer as vLLM's ``ZmqEventPublisher``, plus the :class:`Faults` it can inject.
* ``kvgateway simulate`` -- :func:`add_arguments` / :func:`run`, N engines for ``--dp-size N``.

Block hashes (documented so consumers can verify chains independently)::

    digest = sha256(b"\\x00" if parent is None else b"\\x01" + parent_bytes
                    + b"".join(token.to_bytes(4, "big") for token in block_tokens))

``parent_bytes`` is the parent's 32 raw bytes (``bytes`` kind) or its low 64 bits as 8 big-endian
bytes (``int`` and ``signed`` kinds, two's complement). The block's hash is then the raw digest
(``bytes``), ``int.from_bytes(digest[-8:], "big")`` (``int``, unsigned like vLLM), or the same 64
bits read as signed (``signed``, like SGLang and vLLM < 0.10.2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import random
import re
import signal
import struct
import sys
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count, islice
from typing import Any, Final, Literal, TypeAlias

import zmq
import zmq.asyncio

from kvgateway import wire
from kvgateway.endpoints import binds, offset_endpoint

log = logging.getLogger(__name__)

HashKind: TypeAlias = Literal["int", "bytes", "signed"]
ReplayLayout: TypeAlias = Literal["topic", "plain"]
Medium: TypeAlias = Literal["GPU", "CPU"]

HASH_KINDS: Final = ("int", "bytes", "signed")
EVENT_FORMS: Final = ("map", "array")
REPLAY_LAYOUTS: Final = ("topic", "plain")

GPU: Final = "GPU"
CPU: Final = "CPU"
MAX_SEQ: Final = (1 << 64) - 2
"""Highest usable seq: 2**64 - 1 is 0xFF*8, the replay end marker."""

_MASK64: Final = (1 << 64) - 1
_VOCAB: Final = 151_000  # a Qwen-sized vocabulary; ids below it are "text"
# Chat-template tokens (Qwen style) so dumps look like the real capture in docs/wire-format.md.
_SYSTEM_HEAD: Final = (151644, 8948, 198)
_USER_HEAD: Final = (151645, 198, 151644, 872, 198)
_ASSISTANT_HEAD: Final = (151645, 198, 151644, 77091, 198)

_SYSTEM_PROMPTS: Final = 12
_CONVERSATIONS: Final = 32
_MAX_REQUEST_BLOCKS: Final = 256
_OFFLOAD_CHUNK_BLOCKS: Final = 4  # vLLM's offloading connector stores fixed-size chunks
_MAX_ACTIONS_PER_BATCH: Final = 64

# Per-action probabilities (cumulative thresholds in Workload._act).
_P_UNKNOWN_REMOVE: Final = 0.03
_P_DUPLICATE: Final = 0.04
_P_CONTINUE: Final = 0.50
_P_NEW_CONVERSATION: Final = 0.25
_P_OFFLOAD_REQUEST: Final = 0.5
_P_OFFLOAD_EVICTED: Final = 0.25
_P_PLACEHOLDER: Final = 0.3


# --- hashing ----------------------------------------------------------------------------------


def _hash_from_digest(digest: bytes, kind: HashKind) -> wire.Hash:
    if kind == "bytes":
        return digest
    low = int.from_bytes(digest[-8:], "big")
    if kind == "signed" and low >= 1 << 63:
        return low - (1 << 64)
    return low


def block_hash(parent: wire.Hash | None, tokens: Sequence[int], kind: HashKind = "int") -> wire.Hash:
    """The simulator's chained hash of one block (see the module docstring for the recipe)."""
    h = hashlib.sha256()
    if parent is None:
        h.update(b"\x00")
    else:
        h.update(b"\x01")
        h.update(parent if isinstance(parent, bytes) else (parent & _MASK64).to_bytes(8, "big"))
    h.update(struct.pack(f">{len(tokens)}I", *tokens))
    return _hash_from_digest(h.digest(), kind)


# --- the workload ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Block:
    hash: wire.Hash
    parent: wire.Hash | None
    tokens: tuple[int, ...]


@dataclass(slots=True)
class _Conversation:
    """A token sequence as full blocks (hashes computed once) plus the unfinished tail."""

    blocks: list[_Block] = field(default_factory=list)
    tail: list[int] = field(default_factory=list)

    def copy(self) -> _Conversation:
        return _Conversation(list(self.blocks), list(self.tail))

    def tokens(self) -> int:
        return sum(len(b.tokens) for b in self.blocks) + len(self.tail)


class _Pool:
    """One medium's physical blocks in LRU order; a hash may have several physical copies."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._by_hash: dict[wire.Hash, list[int]] = {}
        self._ids = count()

    def __contains__(self, h: wire.Hash) -> bool:
        return h in self._by_hash

    def __len__(self) -> int:
        return len(self._blocks)

    def touch(self, h: wire.Hash) -> None:
        self._blocks.move_to_end(self._by_hash[h][0])

    def add(self, block: _Block) -> list[_Block]:
        """Insert one physical copy as most recently used; returns the LRU blocks evicted for room."""
        evicted: list[_Block] = []
        while len(self._blocks) >= self.capacity:
            pid, old = self._blocks.popitem(last=False)
            copies = self._by_hash[old.hash]
            copies.remove(pid)
            if not copies:
                del self._by_hash[old.hash]
            evicted.append(old)
        pid = next(self._ids)
        self._blocks[pid] = block
        self._by_hash.setdefault(block.hash, []).append(pid)
        return evicted

    def sample(self, rng: random.Random) -> _Block | None:
        if not self._blocks:
            return None
        return next(islice(self._blocks.values(), rng.randrange(len(self._blocks)), None))

    def clear(self) -> None:
        self._blocks.clear()
        self._by_hash.clear()

    def counts(self) -> dict[wire.Hash, int]:
        return {h: len(ids) for h, ids in self._by_hash.items()}


def _stored_extra(n: int) -> dict[str, Any]:
    # What vLLM 0.26 sends beyond the core fields (kv_cache_spec_sliding_window is None and omitted).
    return {"extra_keys": [None] * n, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}


class Workload:
    """A deterministic stream of realistic KV-event batches from one engine's prefix cache.

    Every call of :meth:`next_batch` is one scheduler step: a few requests arrive, hit their cached
    prefix, store their new blocks (evicting LRU blocks when the GPU pool is full) and, with
    ``cpu_offload``, copy blocks to a CPU pool (some announced as vLLM's legacy placeholders).
    The output depends only on the constructor arguments and the number of calls; ``ts`` and
    ``dp_rank`` are only copied into the batch.

    ``stream`` separates workloads that share ``seed``: they have the same system prompts (so the
    same prefix hashes, like DP ranks of one model) but different requests.
    ``events_per_batch``: the minimum event count per batch, fixed or drawn from an inclusive
    ``(low, high)`` range; a request's events are never split, so a batch may hold more.
    """

    def __init__(
        self,
        seed: int,
        *,
        hash_kind: HashKind = "int",
        block_size: int = 16,
        gpu_capacity_blocks: int = 2048,
        cpu_offload: bool = False,
        cpu_capacity_blocks: int = 8192,
        clear_every: int = 0,
        events_per_batch: int | tuple[int, int] = (2, 6),
        stream: int = 0,
    ) -> None:
        if hash_kind not in HASH_KINDS:
            raise ValueError(f"hash_kind must be one of {', '.join(HASH_KINDS)}, not {hash_kind!r}")
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        if gpu_capacity_blocks < 1 or cpu_capacity_blocks < 1:
            raise ValueError("pool capacities must be at least 1 block")
        if clear_every < 0:
            raise ValueError("clear_every must be 0 (never) or positive")
        low, high = (events_per_batch, events_per_batch) if isinstance(events_per_batch, int) else events_per_batch
        if not 1 <= low <= high:
            raise ValueError("events_per_batch must be a positive count or a (low, high) range with low <= high")
        self.hash_kind: HashKind = hash_kind
        self.block_size = block_size
        self.cpu_offload = cpu_offload
        self.clear_every = clear_every
        self._events_range = (low, high)
        # A request never needs more than half the GPU, so it cannot evict its own blocks.
        self._max_tokens = max(1, min(_MAX_REQUEST_BLOCKS, gpu_capacity_blocks // 2)) * block_size
        self._gpu = _Pool(gpu_capacity_blocks)
        self._cpu = _Pool(cpu_capacity_blocks)
        self._batches = 0
        # String seeds are hashed with sha512 by `random`: stable across processes and platforms.
        system_rng = random.Random(f"kvgateway-sim/system/{seed}")
        self._rng = random.Random(f"kvgateway-sim/requests/{seed}/{stream}")
        self._system: list[_Conversation] = []
        for _ in range(_SYSTEM_PROMPTS):
            prompt = _Conversation()
            self._extend(prompt, [*_SYSTEM_HEAD, *self._text(system_rng, system_rng.randint(24, 700))])
            self._system.append(prompt)
        # Zipf-like popularity: a few system prompts dominate, as in real deployments.
        self._system_weights = [1.0 / (rank + 1) for rank in range(_SYSTEM_PROMPTS)]
        self._conversations: list[_Conversation] = []

    # -- public ------------------------------------------------------------------------------

    @property
    def batches(self) -> int:
        """How many batches have been generated."""
        return self._batches

    def next_batch(self, ts: float, dp_rank: int | None) -> wire.Batch:
        self._batches += 1
        events: list[wire.Event] = []
        if self.clear_every and self._batches % self.clear_every == 0:
            # A prefix-cache reset: everything this publisher announced is gone.
            self._gpu.clear()
            self._cpu.clear()
            events.append(wire.AllBlocksCleared())
        target = self._rng.randint(*self._events_range)
        for _ in range(_MAX_ACTIONS_PER_BATCH):
            if len(events) >= target:
                break
            self._act(events)
        return wire.Batch(ts=ts, events=events, dp_rank=dp_rank)

    def reset_cache(self) -> None:
        """Forget every resident block without an event, as a restarted engine process does."""
        self._gpu.clear()
        self._cpu.clear()

    def resident_counts(self, medium: Medium = "GPU") -> dict[wire.Hash, int]:
        """Physical copies per hash now resident in ``medium`` (what a reference counter should hold)."""
        return (self._gpu if medium == GPU else self._cpu).counts()

    # -- requests ----------------------------------------------------------------------------

    def _act(self, events: list[wire.Event]) -> None:
        rng = self._rng
        r = rng.random()
        if r < _P_UNKNOWN_REMOVE:
            self._unknown_remove(events)
            return
        r -= _P_UNKNOWN_REMOVE
        if r < _P_DUPLICATE and len(self._gpu):
            self._duplicate(events)
            return
        r -= _P_DUPLICATE
        if r < _P_CONTINUE and self._conversations:
            index = rng.randrange(len(self._conversations))
            conv = self._conversations[index]
            user, reply = self._user_turn(), self._reply()
            if conv.tokens() + len(user) + len(reply) <= self._max_tokens:
                self._extend(conv, user)
                prompt_blocks = len(conv.blocks)
                self._extend(conv, reply)
                self._serve(conv.blocks, prompt_blocks, events)
                return
            del self._conversations[index]  # too long: that user starts over below
        keep = r < _P_CONTINUE + _P_NEW_CONVERSATION
        conv = rng.choices(self._system, self._system_weights)[0].copy()
        user, reply = self._user_turn(), self._reply()
        total = conv.tokens() + len(user) + len(reply)
        if total > self._max_tokens:
            # Tiny GPU pools: truncate the request instead of letting it evict its own blocks.
            tokens = [t for b in conv.blocks for t in b.tokens] + conv.tail + user + reply
            conv = _Conversation()
            split = min(len(tokens) - len(reply), self._max_tokens)
            self._extend(conv, tokens[:split])
            prompt_blocks = len(conv.blocks)
            self._extend(conv, tokens[split : self._max_tokens])
            self._serve(conv.blocks, prompt_blocks, events)
            return
        self._extend(conv, user)
        prompt_blocks = len(conv.blocks)
        self._extend(conv, reply)
        self._serve(conv.blocks, prompt_blocks, events)
        if keep:
            if len(self._conversations) >= _CONVERSATIONS:
                self._conversations.pop(0)
            self._conversations.append(conv)

    def _serve(self, chain: list[_Block], prompt_blocks: int, events: list[wire.Event]) -> None:
        """Schedule one request: reuse the cached prefix, store the rest (prompt, then output)."""
        hit = 0
        while hit < prompt_blocks and chain[hit].hash in self._gpu:
            self._gpu.touch(chain[hit].hash)
            hit += 1
        # Like vLLM, matching stops at the first miss: later blocks are recomputed and stored again
        # even if still resident, which is one natural source of duplicate stores.
        if hit < prompt_blocks:
            self._store(GPU, chain[hit:prompt_blocks], events)
        if prompt_blocks < len(chain):
            self._store(GPU, chain[prompt_blocks:], events)
        if self.cpu_offload and hit < len(chain) and self._rng.random() < _P_OFFLOAD_REQUEST:
            # Chunks are aligned to the request's start, so the first chunk can re-announce blocks
            # already offloaded (vLLM's connector does the same with shared prefixes).
            first = hit - hit % _OFFLOAD_CHUNK_BLOCKS
            for start in range(first, len(chain), _OFFLOAD_CHUNK_BLOCKS):
                chunk = chain[start : start + _OFFLOAD_CHUNK_BLOCKS]
                self._store(CPU, chunk, events, placeholder=self._rng.random() < _P_PLACEHOLDER)

    def _duplicate(self, events: list[wire.Event]) -> None:
        """Another physical copy of a resident block (e.g. two requests computed it at once)."""
        block = self._gpu.sample(self._rng)
        if block is not None:
            self._store(GPU, [block], events)

    def _unknown_remove(self, events: list[wire.Event]) -> None:
        """A remove of a hash never announced: consumers must tolerate it."""
        medium = CPU if self.cpu_offload and self._rng.random() < 0.5 else GPU
        h = _hash_from_digest(self._rng.randbytes(32), self.hash_kind)
        events.append(wire.BlockRemoved(block_hashes=[h], medium=medium, extra={"group_idx": 0}))

    def _store(
        self, medium: Medium, blocks: list[_Block], events: list[wire.Event], *, placeholder: bool = False
    ) -> None:
        """Insert ``blocks`` (a parent chain unless ``placeholder``), announcing evictions first."""
        pool = self._gpu if medium == GPU else self._cpu
        # Pieces no larger than the pool, so an eviction never precedes its own block's store.
        for start in range(0, len(blocks), pool.capacity):
            part = blocks[start : start + pool.capacity]
            evicted: list[_Block] = []
            for block in part:
                evicted.extend(pool.add(block))
            if evicted:
                if medium == GPU and self.cpu_offload:
                    self._offload_evicted(evicted, events)
                events.append(
                    wire.BlockRemoved(block_hashes=[b.hash for b in evicted], medium=medium, extra={"group_idx": 0})
                )
            events.append(self._stored_event(part, medium, placeholder=placeholder))

    def _offload_evicted(self, evicted: list[_Block], events: list[wire.Event]) -> None:
        chosen = [b for b in evicted if b.hash not in self._cpu and self._rng.random() < _P_OFFLOAD_EVICTED]
        if not chosen:
            return
        if self._rng.random() < _P_PLACEHOLDER:
            self._store(CPU, chosen, events, placeholder=True)
        else:
            for block in chosen:  # unrelated blocks: one event each, so each keeps its own parent
                self._store(CPU, [block], events)

    def _stored_event(self, blocks: list[_Block], medium: Medium, *, placeholder: bool) -> wire.BlockStored:
        n = len(blocks)
        if placeholder:
            # vLLM's offloading connector without self-describing events: no tokens, no parent.
            return wire.BlockStored(
                block_hashes=[b.hash for b in blocks],
                parent_block_hash=None,
                token_ids=[],
                block_size=0,
                medium=medium,
                extra=_stored_extra(n),
            )
        return wire.BlockStored(
            block_hashes=[b.hash for b in blocks],
            parent_block_hash=blocks[0].parent,
            token_ids=[t for b in blocks for t in b.tokens],
            block_size=self.block_size,
            medium=medium,
            extra=_stored_extra(n),
        )

    # -- tokens ------------------------------------------------------------------------------

    def _extend(self, conv: _Conversation, tokens: Sequence[int]) -> None:
        conv.tail.extend(tokens)
        size = self.block_size
        while len(conv.tail) >= size:
            chunk = tuple(conv.tail[:size])
            del conv.tail[:size]
            parent = conv.blocks[-1].hash if conv.blocks else None
            conv.blocks.append(_Block(block_hash(parent, chunk, self.hash_kind), parent, chunk))

    @staticmethod
    def _text(rng: random.Random, n: int) -> list[int]:
        # One randbytes call instead of n randrange calls: several times faster.
        return [v % _VOCAB for v in struct.unpack(f">{n}I", rng.randbytes(4 * n))]

    def _user_turn(self) -> list[int]:
        return [*_USER_HEAD, *self._text(self._rng, self._rng.randint(8, 160)), *_ASSISTANT_HEAD]

    def _reply(self) -> list[int]:
        return self._text(self._rng, self._rng.randint(16, 256))


# --- faults ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Faults:
    """Deliberate misbehaviour of one publisher.

    ``skip``: inclusive seq ranges published to the replay buffer but not sent live (a lossy
    network or a slow subscriber at the HWM). ``restart_at``: after publishing that seq the next
    seq is 0 and the replay buffer is empty, like a new process; each entry fires once, so list a
    seq k times to restart there k times (every N + 1 batches). ``garbage_at``:
    that seq's payload is undecodable, live and in replay. ``skip`` and ``garbage_at`` apply each
    time the seq comes round (again after a restart). ``replay_delay``: replay requests are answered
    this many seconds late (live publishing goes on meanwhile). ``replay_dead``: the ROUTER is bound
    but requests are read and dropped. ``start_seq``: the first seq (TensorRT-LLM starts at its
    ``time.time_ns()``).
    """

    skip: tuple[tuple[int, int], ...] = ()
    restart_at: tuple[int, ...] = ()
    garbage_at: tuple[int, ...] = ()
    replay_delay: float = 0.0
    replay_dead: bool = False
    start_seq: int = 0

    def __post_init__(self) -> None:
        for low, high in self.skip:
            if not 0 <= low <= high:
                raise ValueError(f"bad skip range {low}-{high}")
        if any(s < 0 for s in (*self.restart_at, *self.garbage_at)):
            raise ValueError("restart_at and garbage_at seqs must not be negative")
        if self.replay_delay < 0:
            raise ValueError("replay_delay must not be negative")
        if not 0 <= self.start_seq <= MAX_SEQ:
            raise ValueError(f"start_seq must be between 0 and {MAX_SEQ}")

    def skips(self, seq: int) -> bool:
        return any(low <= seq <= high for low, high in self.skip)


def garbage_payload(seq: int) -> bytes:
    """Undecodable bytes (0xC1 is never valid msgpack) standing in for seq's payload."""
    return b"\xc1garbage for seq " + str(seq).encode()


# --- endpoints ------------------------------------------------------------------------------


def _is_ipv6(endpoint: str) -> bool:
    return endpoint.startswith("tcp://") and ("[" in endpoint or "::" in endpoint)


# --- the engine -----------------------------------------------------------------------------

_IDLE_SLICE: Final = 0.05  # longest sleep between checks of stop() and replay requests
_YIELD_EVERY: Final = 32  # rate 0: batches between yields to the event loop
_REPLAY_YIELD_EVERY: Final = 256
PUB_HWM: Final = 100_000  # vLLM's default hwm
_PUBLISHED_KEPT: Final = 100_000


class SimulatedEngine:
    """One DP rank's vLLM-compatible publisher (PUB + optional ROUTER replay) on asyncio.

    Endpoints are used as given: use :func:`build_engines` (or :func:`offset_endpoint`) for the
    per-rank offsets. ``seed`` and ``hash_kind`` build the default workload (its ``stream`` is
    ``dp_rank``) and are ignored when ``workload`` is given. The PUB socket binds or connects by
    :func:`binds`; the replay ROUTER always binds. Replay requests are served by the publishing
    loop itself, as in vLLM, so a long replay delays live publishing (the loop yields to other
    tasks every few hundred replies). After :meth:`run` returns, only :meth:`serve_replays`
    answers replays.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "kv-events",
        dp_rank: int = 0,
        rate: float = 100.0,
        batches: int | None = None,
        form: wire.EventForm = "map",
        hash_kind: HashKind = "int",
        replay_layout: ReplayLayout = "topic",
        buffer_steps: int = 10_000,
        seed: int = 0,
        faults: Faults | None = None,
        workload: Workload | None = None,
        context: zmq.asyncio.Context | None = None,
        hwm: int = PUB_HWM,
    ) -> None:
        if rate < 0:
            raise ValueError("rate must not be negative")
        if batches is not None and batches < 0:
            raise ValueError("batches must not be negative")
        if buffer_steps < 0:
            raise ValueError("buffer_steps must not be negative")
        if hwm < 0:
            raise ValueError("hwm must not be negative")
        self._hwm = hwm
        if form not in EVENT_FORMS:
            raise ValueError(f"form must be one of {', '.join(EVENT_FORMS)}")
        if replay_layout not in REPLAY_LAYOUTS:
            raise ValueError(f"replay_layout must be one of {', '.join(REPLAY_LAYOUTS)}")
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.dp_rank = dp_rank
        self.rate = rate
        self.batches = batches
        self.form: wire.EventForm = form
        self.replay_layout: ReplayLayout = replay_layout
        self.faults = faults if faults is not None else Faults()
        self.workload = workload if workload is not None else Workload(seed, hash_kind=hash_kind, stream=dp_rank)
        self._topic_bytes = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        # A full replay must fit in the ROUTER's queue, or libzmq silently cuts it (default 1000).
        self._replay_hwm = max(1000, buffer_steps + 16)
        self._next_seq = self.faults.start_seq
        self._restarts_left = Counter(self.faults.restart_at)
        self._garbage = frozenset(self.faults.garbage_at)
        self._published: deque[int] = deque(maxlen=_PUBLISHED_KEPT)
        self._done = 0
        self._pending: deque[tuple[float, bytes, int]] = deque()  # delayed replays: due, identity, start
        self._own_context = context is None
        self._context = context if context is not None else zmq.asyncio.Context()
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._bound_endpoint = endpoint
        self._replay_bound: str | None = None
        self._stopping = False
        self._closed = False

    # -- state -------------------------------------------------------------------------------

    @property
    def published(self) -> list[int]:
        """Seqs sent live so far, in order (skipped seqs are absent; the last 100,000 are kept)."""
        return list(self._published)

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def batches_done(self) -> int:
        """Batches generated so far, including skipped and garbage ones."""
        return self._done

    @property
    def buffered_seqs(self) -> list[int]:
        return [seq for seq, _ in self._buffer]

    @property
    def bound_endpoint(self) -> str:
        """The PUB address in use (with the real port when bound to a wildcard port)."""
        return self._bound_endpoint

    @property
    def replay_bound_endpoint(self) -> str | None:
        return self._replay_bound

    @property
    def pub_binds(self) -> bool:
        return binds(self.endpoint)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Create, bind and connect the sockets; raises ``zmq.ZMQError`` (e.g. address in use)."""
        if self._pub is not None:
            return
        pub = self._context.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, self._hwm)
        if _is_ipv6(self.endpoint):
            pub.setsockopt(zmq.IPV6, 1)
        try:
            if self.pub_binds:
                pub.bind(self.endpoint)
                self._bound_endpoint = _last_endpoint(pub, self.endpoint)
            else:
                pub.connect(self.endpoint)
        except zmq.ZMQError:
            pub.close(linger=0)
            raise
        self._pub = pub
        if self.replay_endpoint is not None:
            replay = self._context.socket(zmq.ROUTER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.setsockopt(zmq.SNDHWM, self._replay_hwm)
            if _is_ipv6(self.replay_endpoint):
                replay.setsockopt(zmq.IPV6, 1)
            try:
                replay.bind(self.replay_endpoint)
            except zmq.ZMQError:
                replay.close(linger=0)
                raise
            self._replay = replay
            self._replay_bound = _last_endpoint(replay, self.replay_endpoint)

    def stop(self) -> None:
        """Ask :meth:`run` / :meth:`serve_replays` to return (within about 50 ms). Safe from signal handlers."""
        self._stopping = True

    async def close(self) -> None:
        self._stopping = True
        if self._closed:
            return
        self._closed = True
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
        if self._own_context:
            self._context.term()

    async def run(self) -> None:
        """Publish until ``batches`` are done or :meth:`stop`, answering replays in between."""
        await self.start()
        loop = asyncio.get_running_loop()
        interval = 1.0 / self.rate if self.rate > 0 else 0.0
        due = loop.time()
        while not self._stopping and (self.batches is None or self._done < self.batches):
            await self._service_replays()
            if interval:
                now = loop.time()
                if now < due:
                    await self._idle(due - now)
                    continue
                # Keep the long-run rate exact, but do not burst to catch up after a long stall.
                due = max(due + interval, now - 1.0)
            await self._publish_one()
            if not interval and self._done % _YIELD_EVERY == 0:
                await asyncio.sleep(0)

    async def serve_replays(self, seconds: float | None = None) -> None:
        """Only answer replay requests, for ``seconds`` (None: until :meth:`stop`)."""
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        while not self._stopping:
            await self._service_replays()
            remaining = _IDLE_SLICE if deadline is None else deadline - loop.time()
            if remaining <= 0:
                return
            await self._idle(remaining)

    # -- publishing --------------------------------------------------------------------------

    async def _publish_one(self) -> None:
        assert self._pub is not None
        seq = self._next_seq
        batch = self.workload.next_batch(time.time(), self.dp_rank)
        payload = garbage_payload(seq) if seq in self._garbage else wire.encode_batch(batch, self.form)
        self._buffer.append((seq, payload))
        if not self.faults.skips(seq):
            await self._pub.send_multipart([self._topic_bytes, wire.seq_bytes(seq), payload])
            self._published.append(seq)
        self._done += 1
        if self._restarts_left[seq] > 0:
            # A new process: seq from 0, nothing to replay, an empty KV cache.
            self._restarts_left[seq] -= 1
            self._next_seq = 0
            self._buffer.clear()
            self._pending.clear()
            self.workload.reset_cache()
        else:
            self._next_seq = min(seq + 1, MAX_SEQ)

    async def _idle(self, limit: float) -> None:
        """Sleep up to ``limit`` seconds (at most one slice), waking early for a replay request."""
        timeout = min(limit, _IDLE_SLICE)
        if self._pending:
            timeout = max(0.0, min(timeout, self._pending[0][0] - asyncio.get_running_loop().time()))
        if self._replay is None:
            await asyncio.sleep(timeout)
        else:
            await self._replay.poll(timeout=int(timeout * 1000) + 1)

    # -- replay ------------------------------------------------------------------------------

    async def _service_replays(self) -> None:
        replay = self._replay
        if replay is None:
            return
        loop = asyncio.get_running_loop()
        while _readable(replay):
            frames = await replay.recv_multipart()
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != wire.SEQ_BYTES:
                log.warning(
                    "rank %d: ignored a replay request of %d frames (%s); expected identity, empty, 8-byte seq",
                    self.dp_rank,
                    len(frames),
                    "/".join(str(len(f)) for f in frames),
                )
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            if self.faults.replay_dead:
                log.debug("rank %d: dropped a replay request from seq %d (replay_dead)", self.dp_rank, start)
                continue
            if self.faults.replay_delay > 0:
                self._pending.append((loop.time() + self.faults.replay_delay, identity, start))
                continue
            await self._answer(identity, start)
        while self._pending and self._pending[0][0] <= loop.time():
            _, identity, start = self._pending.popleft()
            await self._answer(identity, start)

    async def _answer(self, identity: bytes, start: int) -> None:
        assert self._replay is not None
        topic_frames = [self._topic_bytes] if self.replay_layout == "topic" else []
        sent = 0
        for seq, payload in list(self._buffer):
            if seq < start:
                continue
            await self._replay.send_multipart([identity, b"", *topic_frames, wire.seq_bytes(seq), payload])
            sent += 1
            if sent % _REPLAY_YIELD_EVERY == 0:
                await asyncio.sleep(0)
        end_topic = [b""] if self.replay_layout == "topic" else []
        await self._replay.send_multipart([identity, b"", *end_topic, wire.END_SEQ_BYTES, b""])
        log.debug("rank %d: replayed %d batches from seq %d", self.dp_rank, sent, start)


def _readable(sock: zmq.asyncio.Socket) -> bool:
    events = sock.getsockopt(zmq.EVENTS)
    return isinstance(events, int) and bool(events & zmq.POLLIN)


def _last_endpoint(sock: zmq.asyncio.Socket, fallback: str) -> str:
    value = sock.getsockopt(zmq.LAST_ENDPOINT)
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text or fallback


def build_engines(
    dp_size: int,
    endpoint: str,
    *,
    replay_endpoint: str | None = None,
    topic: str = "kv-events",
    rate: float = 100.0,
    batches: int | None = None,
    form: wire.EventForm = "map",
    hash_kind: HashKind = "int",
    replay_layout: ReplayLayout = "topic",
    buffer_steps: int = 10_000,
    seed: int = 0,
    faults: Faults | None = None,
    workload_options: dict[str, Any] | None = None,
    context: zmq.asyncio.Context | None = None,
    hwm: int = PUB_HWM,
) -> list[SimulatedEngine]:
    """One engine per DP rank with vLLM's endpoint offsets; ranks share the seed's system prompts.

    ``workload_options`` are passed to every rank's :class:`Workload` (``stream`` is the rank).
    """
    if dp_size < 1:
        raise ValueError("dp_size must be at least 1")
    options = dict(workload_options or {})
    options.setdefault("hash_kind", hash_kind)
    engines: list[SimulatedEngine] = []
    for rank in range(dp_size):
        engines.append(
            SimulatedEngine(
                offset_endpoint(endpoint, rank),
                replay_endpoint=None if replay_endpoint is None else offset_endpoint(replay_endpoint, rank),
                topic=topic,
                dp_rank=rank,
                rate=rate,
                batches=batches,
                form=form,
                replay_layout=replay_layout,
                buffer_steps=buffer_steps,
                hwm=hwm,
                faults=faults,
                workload=Workload(seed, stream=rank, **options),
                context=context,
            )
        )
    return engines


# --- command line ---------------------------------------------------------------------------

_ENDPOINT_RE: Final = re.compile(r"^(tcp://.+:(\d+|\*)|ipc://.+|inproc://.+)$")


def _endpoint_arg(value: str) -> str:
    if not _ENDPOINT_RE.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a ZeroMQ endpoint (tcp://HOST:PORT, tcp://*:PORT, ipc://PATH or inproc://NAME)"
        )
    port = value.rpartition(":")[2]
    if value.startswith("tcp://") and port.isdigit() and int(port) > 65535:
        raise argparse.ArgumentTypeError(f"port {port} is above 65535")
    return value


def _int_arg(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if number < minimum or (maximum is not None and number > maximum):
            bound = f"at least {minimum}" if maximum is None else f"between {minimum} and {maximum}"
            raise argparse.ArgumentTypeError(f"{value} must be {bound}")
        return number

    return parse


def _seconds_arg(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number >= 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number >= 0")
    return number


def _linger_arg(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if number == -1:
        return number
    if not number >= 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be >= 0, or -1 for forever")
    return number


def _range_arg(value: str) -> tuple[int, int]:
    low_text, sep, high_text = value.partition("-")
    try:
        low = int(low_text)
        high = int(high_text) if sep else low
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a range like 10-20 (or a single seq)") from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"{value!r} must be A-B with 0 <= A <= B")
    return low, high


def _events_arg(value: str) -> tuple[int, int]:
    low, high = _range_arg(value)
    if low < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: at least 1 event per batch")
    return low, high


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``kvgateway simulate`` options."""
    parser.description = (
        "Run vLLM-compatible KV-event publishers (one per DP rank) with a realistic workload, "
        "a replay endpoint and optional fault injection."
    )
    out = parser.add_argument_group("endpoints")
    out.add_argument(
        "--endpoint",
        type=_endpoint_arg,
        default="tcp://*:5557",
        help="PUB endpoint; binds on '*', '::', ipc:// and inproc://, otherwise connects, like vLLM "
        "(default: %(default)s; rank r uses port + r)",
    )
    out.add_argument(
        "--replay-endpoint",
        type=_endpoint_arg,
        default=None,
        help="ROUTER replay endpoint, always bound (default: none; rank r uses port + r)",
    )
    out.add_argument("--topic", default="kv-events", help="topic frame of every message (default: %(default)s)")
    out.add_argument("--dp-size", type=_int_arg(1, 1024), default=1, help="data-parallel ranks (default: 1)")

    pub = parser.add_argument_group("publishing")
    pub.add_argument("--rate", type=_seconds_arg, default=100.0, help="batches/s per rank, 0 = flat out (default: 100)")
    pub.add_argument("--batches", type=_int_arg(0), default=None, help="stop after N batches per rank (default: never)")
    pub.add_argument("--format", choices=EVENT_FORMS, default="map", help="event encoding (default: map, vLLM >= 0.24)")
    pub.add_argument(
        "--hash", choices=HASH_KINDS, default="int", help="block hash type (default: int, unsigned 64-bit)"
    )
    pub.add_argument(
        "--replay-layout",
        choices=REPLAY_LAYOUTS,
        default="topic",
        help="replay replies with a topic frame (vLLM >= 0.26) or without (older vLLM, SGLang) (default: topic)",
    )
    pub.add_argument(
        "--buffer-steps", type=_int_arg(0), default=10_000, help="batches kept for replay (default: 10000)"
    )
    parser.add_argument(
        "--hwm",
        type=_int_arg(0),
        default=PUB_HWM,
        help="PUB send high-water mark: beyond it batches are dropped silently, as vLLM's are (default: 100000)",
    )
    pub.add_argument(
        "--linger",
        type=_linger_arg,
        default=2.0,
        help="after the last batch keep answering replays this many seconds, -1 = forever (default: 2)",
    )

    work = parser.add_argument_group("workload")
    work.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    work.add_argument("--block-size", type=_int_arg(1, 4096), default=16, help="tokens per block (default: 16)")
    work.add_argument("--gpu-blocks", type=_int_arg(1), default=2048, help="GPU cache size in blocks (default: 2048)")
    work.add_argument("--cpu-offload", action="store_true", help="also copy blocks to a CPU pool (medium CPU)")
    work.add_argument("--cpu-blocks", type=_int_arg(1), default=8192, help="CPU pool size in blocks (default: 8192)")
    work.add_argument(
        "--clear-every", type=_int_arg(0), default=0, help="AllBlocksCleared every N batches (default: 0, never)"
    )
    work.add_argument(
        "--events-per-batch", type=_events_arg, default=(2, 6), help="minimum events per batch, N or A-B (default: 2-6)"
    )

    faults = parser.add_argument_group("fault injection (applied to every rank)")
    faults.add_argument(
        "--skip",
        type=_range_arg,
        action="append",
        default=[],
        metavar="A-B",
        help="do not send seqs A..B live (still replayable); repeatable",
    )
    faults.add_argument(
        "--restart-at",
        type=_int_arg(0),
        action="append",
        default=[],
        metavar="N",
        help="after seq N, restart at seq 0 with an empty replay buffer; repeatable",
    )
    faults.add_argument(
        "--garbage-at", type=_int_arg(0), action="append", default=[], metavar="N", help="undecodable payload for seq N"
    )
    faults.add_argument("--replay-delay", type=_seconds_arg, default=0.0, metavar="S", help="answer replays S s late")
    faults.add_argument("--replay-dead", action="store_true", help="bind the replay ROUTER but never answer")
    faults.add_argument(
        "--start-seq", type=_int_arg(0, MAX_SEQ), default=0, metavar="N", help="first seq (TensorRT-LLM style)"
    )
    faults.add_argument(
        "--start-delay",
        type=_seconds_arg,
        default=0.0,
        metavar="S",
        help="open the sockets, then stay silent S s (answering replays) before the first batch",
    )


def _engines_from_args(args: argparse.Namespace, context: zmq.asyncio.Context) -> list[SimulatedEngine]:
    from kvgateway.cli import UsageError

    if args.replay_endpoint is None and (args.replay_dead or args.replay_delay > 0):
        raise UsageError("--replay-dead and --replay-delay need --replay-endpoint")
    if args.cpu_offload and args.cpu_blocks < _OFFLOAD_CHUNK_BLOCKS:
        raise UsageError(f"--cpu-blocks must be at least {_OFFLOAD_CHUNK_BLOCKS} with --cpu-offload")
    try:
        faults = Faults(
            skip=tuple(args.skip),
            restart_at=tuple(args.restart_at),
            garbage_at=tuple(args.garbage_at),
            replay_delay=args.replay_delay,
            replay_dead=args.replay_dead,
            start_seq=args.start_seq,
        )
        engines = build_engines(
            args.dp_size,
            args.endpoint,
            replay_endpoint=args.replay_endpoint,
            topic=args.topic,
            rate=args.rate,
            batches=args.batches,
            form=args.format,
            replay_layout=args.replay_layout,
            buffer_steps=args.buffer_steps,
            hwm=args.hwm,
            seed=args.seed,
            faults=faults,
            workload_options={
                "hash_kind": args.hash,
                "block_size": args.block_size,
                "gpu_capacity_blocks": args.gpu_blocks,
                "cpu_offload": args.cpu_offload,
                "cpu_capacity_blocks": args.cpu_blocks,
                "clear_every": args.clear_every,
                "events_per_batch": args.events_per_batch,
            },
            context=context,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    # vLLM does not notice overlapping port ranges (5557/5558 with 2 ranks); we refuse them.
    seen: dict[str, str] = {}
    for engine in engines:
        for role, ep in (("publish", engine.endpoint), ("replay", engine.replay_endpoint)):
            if ep is None or (role == "publish" and not engine.pub_binds) or ep.endswith((":*", ":0")):
                continue
            what = f"rank {engine.dp_rank}'s {role} endpoint"
            if ep in seen:
                raise UsageError(f"{what} {ep} collides with {seen[ep]}")
            seen[ep] = what
    return engines


async def _simulate(args: argparse.Namespace) -> int:
    context = zmq.asyncio.Context()
    engines: list[SimulatedEngine] = []
    loop = asyncio.get_running_loop()
    stopped = False

    def on_signal() -> None:
        nonlocal stopped
        stopped = True
        for engine in engines:
            engine.stop()

    try:
        engines = _engines_from_args(args, context)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        for engine in engines:
            try:
                await engine.start()
            except zmq.ZMQError as exc:
                replay = "" if engine.replay_endpoint is None else f" / {engine.replay_endpoint}"
                sys.stderr.write(
                    f"kvgateway simulate: error: rank {engine.dp_rank} cannot open {engine.endpoint}{replay}: {exc}\n"
                )
                return 1
        for engine in engines:
            how = "on" if engine.pub_binds else "to"
            suffix = "" if engine.pub_binds else " (connect)"
            print(
                f"simulate: rank {engine.dp_rank} publishing {how} {engine.bound_endpoint}{suffix}"
                f" replay {engine.replay_bound_endpoint or 'none'}",
                flush=True,
            )
        if args.start_delay > 0:
            # Bound and answering replays, but silent: a consumer connects and catches up on nothing.
            await asyncio.gather(*(engine.serve_replays(args.start_delay) for engine in engines))
        await asyncio.gather(*(engine.run() for engine in engines))
        if not stopped and args.linger != 0:
            seconds = None if args.linger < 0 else args.linger
            await asyncio.gather(*(engine.serve_replays(seconds) for engine in engines))
        for engine in engines:
            print(
                f"simulate: rank {engine.dp_rank} stopped after {engine.batches_done} batches"
                f" (next seq {engine.next_seq})",
                flush=True,
            )
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        for engine in engines:
            await engine.close()
        context.term()


def run(args: argparse.Namespace) -> int:
    """``kvgateway simulate``: returns the exit code (0 after SIGINT/SIGTERM too)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="kvgateway simulate: %(levelname)s: %(message)s")
    with contextlib.suppress(BrokenPipeError):  # stdout closed by the reader: nothing left to tell
        return asyncio.run(_simulate(args))
    return 0
