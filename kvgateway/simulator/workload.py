"""The simulated engine's workload: a deterministic stream of realistic KV-event batches.

Block hashes (documented so consumers can verify chains independently)::

    digest = sha256(b"\\x00" if parent is None else b"\\x01" + parent_bytes
                    + b"".join(token.to_bytes(4, "big") for token in block_tokens))

``parent_bytes`` is the parent's 32 raw bytes (``bytes`` kind) or its low 64 bits as 8 big-endian
bytes (``int`` and ``signed`` kinds, two's complement). The block's hash is then the raw digest
(``bytes``), ``int.from_bytes(digest[-8:], "big")`` (``int``, unsigned like vLLM), or the same 64
bits read as signed (``signed``, like SGLang and vLLM < 0.10.2).
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count, islice
from typing import Any, Final, Literal, TypeAlias

from kvgateway.engine import wire
from kvgateway.simulator import encode

HashKind: TypeAlias = Literal["int", "bytes", "signed"]
Medium: TypeAlias = Literal["GPU", "CPU"]

HASH_KINDS: Final = ("int", "bytes", "signed")

GPU: Final = "GPU"
CPU: Final = "CPU"
SGLANG_OFFLOAD_MEDIUMS: Final = ("CPU_PINNED", "DISK", "EXTERNAL")
"""SGLang's tiers below the GPU (its HiCache host memory is pinned CPU memory)."""


_MASK64: Final = (1 << 64) - 1
_VOCAB: Final = 151_000  # a Qwen-sized vocabulary; ids below it are "text"
# Chat-template tokens (Qwen style) so dumps look like the real capture in docs/wire-format.md.
_SYSTEM_HEAD: Final = (151644, 8948, 198)
_USER_HEAD: Final = (151645, 198, 151644, 872, 198)
_ASSISTANT_HEAD: Final = (151645, 198, 151644, 77091, 198)

_SYSTEM_PROMPTS: Final = 12
DEFAULT_CONVERSATIONS: Final = 32
"""Conversations in flight per workload unless told (``conversations``)."""
_MAX_REQUEST_BLOCKS: Final = 256
_OFFLOAD_CHUNK_BLOCKS: Final = 4  # vLLM's offloading connector stores fixed-size chunks
_MAX_ACTIONS_PER_BATCH: Final = 64

# Per-action probabilities (cumulative thresholds in Workload._act).
_P_UNKNOWN_REMOVE: Final = 0.03
_P_DUPLICATE: Final = 0.04
_P_CONTINUE: Final = 0.50
_P_NEW_CONVERSATION: Final = 0.25
_P_REQUEST: Final = 1.0 - _P_UNKNOWN_REMOVE - _P_DUPLICATE
"""The share of actions that are requests: a request's kind is drawn below it."""
ROUTED_REQUESTS_PER_BATCH: Final = 1.5
"""Requests a routed stream serves per batch, on average (about what ``events_per_batch``'s
default gives an unrouted one)."""
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
    return _packed_hash(parent, _pack(tokens), kind)


def _pack(tokens: Sequence[int]) -> bytes:
    """Tokens as 4-byte big-endian words: how the hash reads them, and how a block keeps them."""
    return struct.pack(f">{len(tokens)}I", *tokens)


def _unpack(packed: bytes) -> tuple[int, ...]:
    return struct.unpack(f">{len(packed) // 4}I", packed)


def _packed_hash(parent: wire.Hash | None, packed: bytes, kind: HashKind) -> wire.Hash:
    h = hashlib.sha256()
    if parent is None:
        h.update(b"\x00")
    else:
        h.update(b"\x01")
        h.update(parent if isinstance(parent, bytes) else (parent & _MASK64).to_bytes(8, "big"))
    h.update(packed)
    return _hash_from_digest(h.digest(), kind)


# --- the workload ---------------------------------------------------------------------------


_Block: TypeAlias = tuple[wire.Hash, wire.Hash | None, bytes]
"""One full block: its hash, its parent's hash and its tokens packed (:func:`_pack`; half the
memory of a tuple of ints). A plain tuple of ints and bytes, which the garbage collector stops
tracking after one look, so a fleet's resident blocks cost the process's full collections (the
gateway's, in the demo) nothing; a named tuple or a class would be tracked for good."""
_HASH: Final = 0
_PARENT: Final = 1
_PACKED: Final = 2


@dataclass(slots=True)
class _Conversation:
    """A token sequence as full blocks (hashes computed once) plus the unfinished tail."""

    blocks: list[_Block] = field(default_factory=list)
    tail: list[int] = field(default_factory=list)

    def copy(self) -> _Conversation:
        return _Conversation(list(self.blocks), list(self.tail))

    def tokens(self) -> int:
        return sum(len(b[_PACKED]) // 4 for b in self.blocks) + len(self.tail)


class _Pool:
    """One medium's physical blocks in LRU order; a hash may have several physical copies."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._by_hash: dict[wire.Hash, tuple[int, ...]] = {}  # tuples, untracked like the blocks
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
            copies = tuple(other for other in self._by_hash[old[_HASH]] if other != pid)
            if copies:
                self._by_hash[old[_HASH]] = copies
            else:
                del self._by_hash[old[_HASH]]
            evicted.append(old)
        pid = next(self._ids)
        self._blocks[pid] = block
        self._by_hash[block[_HASH]] = (*self._by_hash.get(block[_HASH], ()), pid)
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


_Request: TypeAlias = tuple[list[_Block], int]
"""One request as the engine sees it: its chain of full blocks and how many of them are prompt."""


class _Users:
    """Who sends the requests: shared system prompts, conversations that come back, one-shot asks.

    Pure and seeded: the same arguments and the same calls give the same requests, so workloads
    that share a request sequence (``Workload``'s ``route_weights``) each hold an identical copy.
    """

    def __init__(
        self, rng: random.Random, system_seed: int, *, hash_kind: HashKind, block_size: int, max_tokens: int, keep: int
    ) -> None:
        self.rng = rng
        self.hash_kind: HashKind = hash_kind
        self.block_size = block_size
        self.max_tokens = max_tokens
        self.keep = keep
        # String seeds are hashed with sha512 by `random`: stable across processes and platforms.
        system_rng = random.Random(f"kvgateway-sim/system/{system_seed}")
        self.system: list[_Conversation] = []
        for _ in range(_SYSTEM_PROMPTS):
            prompt = _Conversation()
            self.extend(prompt, [*_SYSTEM_HEAD, *_text(system_rng, system_rng.randint(24, 700))])
            self.system.append(prompt)
        # Zipf-like popularity: a few system prompts dominate, as in real deployments.
        self.system_weights = [1.0 / (rank + 1) for rank in range(_SYSTEM_PROMPTS)]
        self.conversations: list[_Conversation] = []

    def next(self, r: float) -> _Request:
        """The next request; ``r`` in [0, 1) picks its kind: a conversation's next turn (below
        :data:`_P_CONTINUE`), a new conversation that comes back (below that plus
        :data:`_P_NEW_CONVERSATION`), else a one-shot request on a system prompt."""
        rng = self.rng
        if r < _P_CONTINUE and self.conversations:
            index = rng.randrange(len(self.conversations))
            conv = self.conversations[index]
            user, reply = self._user_turn(), self._reply()
            if conv.tokens() + len(user) + len(reply) <= self.max_tokens:
                self.extend(conv, user)
                prompt_blocks = len(conv.blocks)
                self.extend(conv, reply)
                return conv.blocks, prompt_blocks
            del self.conversations[index]  # too long: that user starts over below
        keep = r < _P_CONTINUE + _P_NEW_CONVERSATION
        conv = rng.choices(self.system, self.system_weights)[0].copy()
        user, reply = self._user_turn(), self._reply()
        if conv.tokens() + len(user) + len(reply) > self.max_tokens:
            return self._truncated(conv, user, reply)
        self.extend(conv, user)
        prompt_blocks = len(conv.blocks)
        self.extend(conv, reply)
        if keep:
            if len(self.conversations) >= self.keep:
                self.conversations.pop(0)
            self.conversations.append(conv)
        return conv.blocks, prompt_blocks

    def _truncated(self, conv: _Conversation, user: list[int], reply: list[int]) -> _Request:
        """Tiny GPU pools: the request cut to fit instead of letting it evict its own blocks."""
        tokens = [*_unpack(b"".join(b[_PACKED] for b in conv.blocks)), *conv.tail, *user, *reply]
        conv = _Conversation()
        split = min(len(tokens) - len(reply), self.max_tokens)
        self.extend(conv, tokens[:split])
        prompt_blocks = len(conv.blocks)
        self.extend(conv, tokens[split : self.max_tokens])
        return conv.blocks, prompt_blocks

    def extend(self, conv: _Conversation, tokens: Sequence[int]) -> None:
        conv.tail.extend(tokens)
        size = self.block_size
        while len(conv.tail) >= size:
            packed = _pack(conv.tail[:size])
            del conv.tail[:size]
            parent = conv.blocks[-1][_HASH] if conv.blocks else None
            conv.blocks.append((_packed_hash(parent, packed, self.hash_kind), parent, packed))

    def _user_turn(self) -> list[int]:
        return [*_USER_HEAD, *_text(self.rng, self.rng.randint(8, 160)), *_ASSISTANT_HEAD]

    def _reply(self) -> list[int]:
        return _text(self.rng, self.rng.randint(16, 256))


def _text(rng: random.Random, n: int) -> list[int]:
    # One randbytes call instead of n randrange calls: several times faster.
    return [v % _VOCAB for v in struct.unpack(f">{n}I", rng.randbytes(4 * n))]


class _Route:
    """Where a routed stream is in the request sequence it shares (see ``Workload._routed_batch``)."""

    __slots__ = ("at", "due", "span", "stream", "streams", "weights")

    def __init__(self, weights: Sequence[float], stream: int) -> None:
        self.weights = tuple(float(w) for w in weights)
        self.stream = stream
        self.streams = range(len(self.weights))
        self.span = ROUTED_REQUESTS_PER_BATCH * sum(self.weights) / self.weights[stream] if self.weights else 0.0
        self.due = 0.0
        self.at = 0

    def walk(self) -> int:
        """How many requests of the sequence the next batch walks (``span`` on average)."""
        self.due += self.span
        steps = max(0, math.ceil(self.due) - self.at)
        self.at += steps
        return steps


def _check_arguments(
    dialect: str, metadata: bool, hash_kind: str, *, block_size: int, gpu_capacity_blocks: int, cpu_capacity_blocks: int
) -> None:
    if dialect not in encode.DIALECTS:
        raise ValueError(f"dialect must be one of {', '.join(encode.DIALECTS)}, not {dialect!r}")
    if metadata and dialect != "sglang":
        raise ValueError("metadata is SGLang's BlockStored field: it needs dialect='sglang'")
    if hash_kind not in HASH_KINDS:
        raise ValueError(f"hash_kind must be one of {', '.join(HASH_KINDS)}, not {hash_kind!r}")
    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    if gpu_capacity_blocks < 1 or cpu_capacity_blocks < 1:
        raise ValueError("pool capacities must be at least 1 block")


def _check_requests(*, clear_every: int, conversations: int, stream: int, weights: Sequence[float]) -> None:
    if clear_every < 0:
        raise ValueError("clear_every must be 0 (never) or positive")
    if conversations < 1:
        raise ValueError("conversations must be at least 1")
    if weights and not (0 <= stream < len(weights) and all(w > 0 for w in weights)):
        raise ValueError("route_weights: a positive weight per stream, and stream must index one")


class Workload:
    """A deterministic stream of realistic KV-event batches from one engine's prefix cache.

    Every call of :meth:`next_batch` is one scheduler step: a few requests arrive, hit their cached
    prefix, store their new blocks (evicting LRU blocks when the GPU pool is full) and, with
    ``cpu_offload``, copy blocks to a CPU pool (some announced as vLLM's legacy placeholders).
    The output depends only on the constructor arguments and the number of calls; ``ts`` and
    ``dp_rank`` are only copied into the batch.

    ``stream`` separates workloads that share ``seed``: they have the same system prompts (so the
    same prefix hashes, like DP ranks of one model) but different requests.
    ``conversations``: how many conversations are in flight; each comes back now and then with its
    next turn on top of its history (the oldest is forgotten when a new one starts).
    ``route_weights``: this stream is one of ``len(route_weights)`` (``stream`` indexes it) that
    take one request sequence, each request sent to a stream at random by these weights, as a
    router that ignores prefixes does; give every peer the same ``seed``, ``block_size``,
    ``gpu_capacity_blocks``, ``conversations`` and weights, and rates in proportion to the weights
    (see :meth:`_routed_batch`). ``events_per_batch`` does not apply to a routed stream.
    ``dialect="sglang"``: events as SGLang fills them: no extra_keys/group_idx, the offload tier's
    medium is ``CPU_PINNED`` (its placeholder stores included), unknown removes also name ``DISK``
    and ``EXTERNAL``; with ``metadata`` every BlockStored carries ``{"cache_salt": ...}`` in
    ``extra`` (encoded by ``encode.encode_batch(..., dialect="sglang")`` as SGLang's metadata map).
    The pools are still addressed as ``"GPU"``/``"CPU"`` in :meth:`resident_counts`.
    ``events_per_batch``: the minimum event count per batch, fixed or drawn from an inclusive
    ``(low, high)`` range; a request's events are never split, so a batch may hold more.
    ``report_hits``: like vLLM's ``kv_cache_report_mode="full"``, a request's reused prefix blocks
    are announced again (stored as another physical copy), so the gateway attributes them ``hit``.

    The prefill attribution's origins (docs/operations.md, "Where the prefill goes") come from:
    ``hit``: ``report_hits`` (and the duplicate stores every workload makes); ``refetch``: more
    ``conversations`` than the GPU pool holds (their histories evicted before they come back);
    ``offloaded``: the same with ``cpu_offload`` (what the CPU pool kept); ``elsewhere``: peers with
    ``route_weights`` (a conversation's next turn on the stream that did not compute its history;
    unrouted workloads of one ``seed`` share only system prompts, stored once in a roomy pool);
    ``new``: any workload.
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
        dialect: encode.Dialect = "vllm",
        metadata: bool = False,
        report_hits: bool = False,
        conversations: int = DEFAULT_CONVERSATIONS,
        route_weights: Sequence[float] = (),
    ) -> None:
        _check_arguments(
            dialect,
            metadata,
            hash_kind,
            block_size=block_size,
            gpu_capacity_blocks=gpu_capacity_blocks,
            cpu_capacity_blocks=cpu_capacity_blocks,
        )
        _check_requests(clear_every=clear_every, conversations=conversations, stream=stream, weights=route_weights)
        low, high = (events_per_batch, events_per_batch) if isinstance(events_per_batch, int) else events_per_batch
        if not 1 <= low <= high:
            raise ValueError("events_per_batch must be a positive count or a (low, high) range with low <= high")
        self.hash_kind: HashKind = hash_kind
        self.dialect: encode.Dialect = dialect
        self.metadata = metadata
        self._sglang = dialect == "sglang"
        self._cpu_name = "CPU_PINNED" if self._sglang else CPU
        self._removed_extra: dict[str, Any] = {} if self._sglang else {"group_idx": 0}
        self.block_size = block_size
        self.cpu_offload = cpu_offload
        self.report_hits = report_hits
        self.clear_every = clear_every
        self._route = _Route(route_weights, stream)
        self.route_weights = self._route.weights
        self._events_range = (low, high)
        self._gpu = _Pool(gpu_capacity_blocks)
        self._cpu = _Pool(cpu_capacity_blocks)
        self._batches = 0
        # String seeds are hashed with sha512 by `random`: stable across processes and platforms.
        self._rng = random.Random(f"kvgateway-sim/requests/{seed}/{stream}")
        # Routed: every peer draws the one shared sequence (and its routing) from the same seed.
        users_rng = random.Random(f"kvgateway-sim/routed/{seed}") if route_weights else self._rng
        self._users = _Users(
            users_rng,
            seed,
            hash_kind=hash_kind,
            block_size=block_size,
            # A request never needs more than half the GPU, so it cannot evict its own blocks.
            max_tokens=max(1, min(_MAX_REQUEST_BLOCKS, gpu_capacity_blocks // 2)) * block_size,
            keep=conversations,
        )

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
        if self.route_weights:
            self._routed_batch(events)
            return wire.Batch(ts=ts, events=events, dp_rank=dp_rank)
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
        r = self._rng.random()
        if r < _P_UNKNOWN_REMOVE:
            self._unknown_remove(events)
            return
        r -= _P_UNKNOWN_REMOVE
        if r < _P_DUPLICATE and len(self._gpu):
            self._duplicate(events)
            return
        r -= _P_DUPLICATE
        chain, prompt_blocks = self._users.next(r)
        self._serve(chain, prompt_blocks, events)

    def _routed_batch(self, events: list[wire.Event]) -> None:
        """One batch of a routed stream: its slice of the shared request sequence, the requests the
        router sent here served, the others only drawn (the conversations grow alike everywhere).

        The slice is :data:`ROUTED_REQUESTS_PER_BATCH` over this stream's share of the weights, so
        peers whose rates are in proportion to their weights walk the sequence at the same pace
        (in time): a conversation's next turn lands on either, and the other already holds its
        history."""
        users, own, route = self._users, self._rng, self._route
        for _ in range(route.walk()):
            r = users.rng.random() * _P_REQUEST
            to = users.rng.choices(route.streams, route.weights)[0]
            chain, prompt_blocks = users.next(r)
            if to != route.stream:
                continue
            if own.random() < _P_UNKNOWN_REMOVE:
                self._unknown_remove(events)
            if own.random() < _P_DUPLICATE and len(self._gpu):
                self._duplicate(events)
            self._serve(chain, prompt_blocks, events)

    def _serve(self, chain: list[_Block], prompt_blocks: int, events: list[wire.Event]) -> None:
        """Schedule one request: reuse the cached prefix, store the rest (prompt, then output)."""
        hit = 0
        while hit < prompt_blocks and chain[hit][_HASH] in self._gpu:
            self._gpu.touch(chain[hit][_HASH])
            hit += 1
        # Like vLLM, matching stops at the first miss: later blocks are recomputed and stored again
        # even if still resident, which is one natural source of duplicate stores.
        if self.report_hits and hit:
            self._store(GPU, chain[:hit], events)  # full report mode: the reused prefix announced again
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
        medium: str = CPU if self.cpu_offload and self._rng.random() < 0.5 else GPU
        if self._sglang and medium == CPU:
            medium = self._rng.choice(SGLANG_OFFLOAD_MEDIUMS)
        h = _hash_from_digest(self._rng.randbytes(32), self.hash_kind)
        events.append(wire.BlockRemoved(block_hashes=[h], medium=medium, extra=dict(self._removed_extra)))

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
                    wire.BlockRemoved(
                        block_hashes=[b[_HASH] for b in evicted],
                        medium=self._medium_name(medium),
                        extra=dict(self._removed_extra),
                    )
                )
            events.append(self._stored_event(part, medium, placeholder=placeholder))

    def _offload_evicted(self, evicted: list[_Block], events: list[wire.Event]) -> None:
        chosen = [b for b in evicted if b[_HASH] not in self._cpu and self._rng.random() < _P_OFFLOAD_EVICTED]
        if not chosen:
            return
        if self._rng.random() < _P_PLACEHOLDER:
            self._store(CPU, chosen, events, placeholder=True)
        else:
            for block in chosen:  # unrelated blocks: one event each, so each keeps its own parent
                self._store(CPU, [block], events)

    def _stored_event(self, blocks: list[_Block], medium: Medium, *, placeholder: bool) -> wire.BlockStored:
        if placeholder:
            # vLLM's offloading connector without self-describing events: no tokens, no parent.
            return wire.BlockStored(
                block_hashes=[b[_HASH] for b in blocks],
                parent_block_hash=None,
                token_ids=[],
                block_size=0,
                medium=self._medium_name(medium),
                extra=self._stored_extra(blocks),
            )
        return wire.BlockStored(
            block_hashes=[b[_HASH] for b in blocks],
            parent_block_hash=blocks[0][_PARENT],
            token_ids=list(_unpack(b"".join(b[_PACKED] for b in blocks))),
            block_size=self.block_size,
            medium=self._medium_name(medium),
            extra=self._stored_extra(blocks),
        )

    def _medium_name(self, medium: Medium) -> str:
        return GPU if medium == GPU else self._cpu_name

    def _stored_extra(self, blocks: list[_Block]) -> dict[str, Any]:
        if not self._sglang:
            return _stored_extra(len(blocks))
        if not self.metadata:
            return {}
        # A stable per-tenant salt: derived from the chain's first block, no random draw.
        first = blocks[0][_HASH]
        tenant = (first[-1] if isinstance(first, bytes) else first & 0xFF) % 4
        return {"cache_salt": f"tenant-{tenant}"}
