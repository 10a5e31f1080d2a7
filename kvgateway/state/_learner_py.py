"""The pure-Python chain learner: the reference the compiled one (``_learner_c.pyx``) mirrors, and
the core that runs without it (:mod:`kvgateway.state.learner` picks one at import).

The learned token chains behind lookups by tokens: "(parent hash, block content) -> block hash",
as the streams announced them, in a table whose size follows the fleet. Sans-I/O.

Every ``BlockStored`` carries ``parent_block_hash``, each block's ``token_ids`` and the resulting
``block_hashes``; :class:`ChainLearner` remembers them so that :func:`kvgateway.state.lookup.lookup_tokens`
can turn a request's tokens into the hashes each stream would give it, without re-implementing
any engine's hash function.

The table is compact (bench/learner.py measures it against the dict of Python ints it replaced:
25 bytes an entry against 79): a ring of fixed-width entries in announcement order (a 64-bit key,
a reference to the block hash the index holds too, a 32-bit link, a 16-bit stream id) and a
chained index into it grown one bucket at a time (linear hashing: two entries a bucket on average,
4 bytes a bucket). Eviction takes the ring's front: O(1) per block, whatever the size of the table
or of the fleet. The price is CPU below the cap: a Python loop over a few array slots per block
where the dict was one C-level insert (about 2.8 times the learning time).
"""

from __future__ import annotations

import hashlib
import itertools
from array import array
from collections.abc import Callable, Container, Sequence
from typing import Any, Final

import msgspec

from kvgateway.config import options
from kvgateway.engine.wire import Batch, BlockStored, Hash, Stream
from kvgateway.runtime.memory import release_free_heap

__all__ = [
    "DEFAULT_MAX_LEARNED_BLOCKS",
    "LEARNED_FLOOR",
    "LEARNED_PER_RESIDENT",
    "ChainLearner",
    "block_digests",
    "extra_keys_of",
    "note_block_size",
    "stream_root",
]

DEFAULT_MAX_LEARNED_BLOCKS: Final = 2_000_000
"""Default ceiling of :class:`ChainLearner` (about 25 bytes per learned block: see bench/learner.py)."""

LEARNED_FLOOR: Final = options.LEARNED_FLOOR  # in config: --max-learned-blocks' help gives it
"""The learner's cap never follows the fleet below this (about 1.6 MB): a fleet that is still
empty, or holds few blocks, can be learned from without the cap chasing every eviction."""

LEARNED_PER_RESIDENT: Final = options.LEARNED_PER_RESIDENT  # in config, as LEARNED_FLOOR
"""The cap follows the fleet at this many entries per resident block (every stream, medium and
group summed): room for every resident block's entry, and a quarter more for blocks announced
since the fleet was last counted and for the chains the engines dropped a moment ago. No more:
an entry whose block no engine holds answers no lookup, and it keeps its hash object alive
(about 36 bytes more than a resident block's entry)."""

_M64: Final = (1 << 64) - 1
_K64: Final = 0x9E3779B97F4A7C15  # odd: multiplication by it is a bijection mod 2**64
_encode: Final = msgspec.msgpack.Encoder().encode
_MAX_SIZES: Final = 4
_RING_MIN: Final = 1024
_GROWTH_SHIFT: Final = 5
"""The ring grows by a 32nd at a time, so that a ring still growing holds at most 3% of free slots.
Each growth is a realloc: an array glibc mapped on its own moves by remapping its pages, one it
took from the heap (below glibc's mmap threshold, which rises to the largest block freed) is
copied; a learner at its cap does not grow (docs/performance.md, round nineteen)."""
_TRIM_FROM: Final = 65_536
"""Ring slots from which a growth by a quarter returns the heap's free pages to the system."""
_LOAD: Final = 2
"""Entries per bucket of the index before it splits one more bucket (chains of 2 on average)."""
_SECOND_CHANCES: Final = 4
"""At most this many resident entries move to the back per eviction: O(1) even when every
entry is resident (a cap set below the resident set)."""
_SHRINK_STEP: Final = 4
"""Evictions per new entry while the table is over a cap that followed the fleet down."""
_NO_STREAM: Final = 0xFFFF
"""The stream id of streams past the 65,535th (never seen in practice): their entries count as
not resident, so they only age out first."""


def _digest(data: bytes, person: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=16, person=person).digest(), "big")


def _plain_extra(extra: Any, lora_name: str | None) -> Any:
    """A block's extra key, with vLLM's LoRA-only entry (``[lora_name]``) folded into the LoRA name."""
    if lora_name is not None and isinstance(extra, list | tuple) and len(extra) == 1 and extra[0] == lora_name:
        return None
    return extra


def block_digests(
    token_ids: Sequence[int], block_size: int, lora_name: str | None = None, extra_keys: Sequence[Any] | None = None
) -> list[int]:
    """The content digest of every full block of ``token_ids`` (a partial last block is dropped).

    A digest of (the block's tokens, LoRA name, extra key): what, besides the parent, decides a
    block's hash in every engine. Blocks past the end of ``extra_keys`` have none.

    On the ingest path (every announced block, about 20 a batch), so it is Python's own tuple
    hash, 64 bits in a quarter of the time of a blake2b: the learned map holds one process's
    digests only, so the per-process hashing of strings does no harm. CPython hashes every int
    from 0 to 2**61 - 2 to itself (every vocabulary's token ids), so only tokens outside that
    range can hash alike (-1 and -2; t and t + 2**61 - 1). Digests that collide must also share
    a parent to meet (the key XORs a mix of it), so an accidental false hit is negligible, and a
    crafted one only misleads the lookup that crafted it.
    """
    if lora_name is None and (extra_keys is None or extra_keys.count(None) == len(extra_keys)):
        # the common case (vLLM sends a None per block), in one comprehension
        return [
            hash((tuple(token_ids[i : i + block_size]), None, None)) & _M64
            for i in range(0, len(token_ids) - block_size + 1, block_size)
        ]
    out = []
    for i in range(len(token_ids) // block_size):
        extra = extra_keys[i] if extra_keys is not None and i < len(extra_keys) else None
        extra = _plain_extra(extra, lora_name)
        if extra is not None:
            extra = _encode(extra)  # hashable, and equal when equal
        out.append(hash((tuple(token_ids[i * block_size : (i + 1) * block_size]), lora_name, extra)) & _M64)
    return out


def _mix(parent: Hash) -> int:
    """A parent hash spread over 64 bits: Python's hash of it (ints: their value mod 2**61 - 1;
    bytes: the per-process hash) times an odd constant, so that the parent reaches the top bits
    (the index's bucket bits are the key's low bits, and the digest's are mixed already)."""
    return (hash(parent) * _K64) & _M64


def _key(digest: int, mix: int) -> int:
    """The table's 64-bit key of a block: its digest XOR its parent's mix; never 0 (0 marks a free
    ring slot). Two blocks meet only when 64 bits collide (or their parents' 61-bit hashes do):
    about one false hit in 10**12 probes with two million entries."""
    return (digest ^ mix) or 1


def stream_root(stream: Stream) -> int:
    """The mix of a stream's first blocks (parent null): engines seed their chains differently."""
    return _digest(_encode(stream), b"kvgw-root") & _M64


def note_block_size(sizes: dict[Stream, list[int]], stream: Stream, size: int) -> None:
    """The stream's block sizes, most recent first (at most :data:`_MAX_SIZES`)."""
    known = sizes.get(stream)
    if known is None:
        sizes[stream] = [size]
    elif known[0] != size:
        if size in known:
            known.remove(size)
        known.insert(0, size)
        del known[_MAX_SIZES:]


def extra_keys_of(event: BlockStored) -> list[Any] | None:
    """The event's per-block ``extra_keys``, where it sent one entry for each block."""
    extra_keys = event.extra.get("extra_keys") if event.extra else None
    if not isinstance(extra_keys, list) or len(extra_keys) != len(event.block_hashes):
        return None
    return extra_keys


class ChainLearner:
    """What the streams announced: "(parent hash, the block's content digest) -> block hash".

    Fed every delivered batch (:meth:`learn_batch`, beside the occupancy index). A ``BlockStored``
    teaches one entry per block when it carries every block's tokens (``len(token_ids) ==
    len(block_hashes) * block_size``, ``block_size > 0``); placeholder offload events (no tokens,
    block size 0) and inconsistent ones teach nothing (counted). A block's extra key is entry i of
    ``extra_keys`` (a list of the wrong length: none for any block of that event).

    One table for every stream, keyed by the block's content digest (:func:`block_digests`) XOR a
    mix of its parent (:func:`_key`), so every level below the first is shared by the streams that
    hash alike and kept apart for those that do not (their parents differ). A first block (parent
    null) is keyed with its stream: engines seed their chains differently (vLLM draws a random
    seed per process unless PYTHONHASHSEED is set), and the table keeps what each stream
    announced. A restarted engine's new roots replace the old ones as it announces them; the old
    chains age out.

    **Size.** At most :attr:`cap` entries: ``min(max_blocks, max(floor, per_resident x the
    fleet's resident blocks))``, the fleet's count given by :meth:`follow_fleet` (until then, the
    floor). ``max_blocks`` is the ceiling (0 turns learning off). The arrays grow with the entries
    (appended, never copied by Python), not with the cap. When the fleet shrinks, each new entry
    evicts up to four old ones until the table is back under the cap, and the arrays are rebuilt
    smaller once it fits in half of them (O(entries), once).

    **Eviction**, one entry at a time when the cap is reached: first in, first out by the last
    announcement (a re-announced block moves to the back). With ``resident`` (a function of the
    announcing stream and the hash: does that stream still hold the block?), the entry at the
    front gets a second chance (moves to the back) while its block is resident, at most
    :data:`_SECOND_CHANCES` times per eviction; so the entries of blocks no engine holds any more
    age out first, and a long-lived prefix (a system prompt that stays on the GPU) is not
    forgotten by churn elsewhere. A block's residency is asked of the stream that announced it
    last (one set lookup per medium and group of one stream: O(1) in the fleet's size); with
    ``held`` (every hash the fleet holds), only of a block some stream holds: at the cap nearly every
    entry at the front is of a block gone from every engine, answered by one set lookup.

    **Layout.** A ring of entries in announcement order, each a 64-bit key, a reference to the
    block hash (the index holds the same object while the block is resident), a 16-bit stream id
    and a 32-bit link: 22 bytes. The index over it is a chained hash table grown one bucket at a
    time (linear hashing: no rehash of the whole table, ever): 4 bytes per bucket, two entries per
    bucket on average. The ring grows by appending while nothing has been evicted since its start
    or its last lap; once full at the cap it is circular.
    """

    __slots__ = (
        "_buckets",
        "_count",
        "_head",
        "_keys",
        "_level",
        "_live",
        "_nexts",
        "_roots",
        "_sids",
        "_sizes",
        "_split",
        "_stream_ids",
        "_streams",
        "_trimmed_at",
        "_vals",
        "cap",
        "evicted",
        "floor",
        "held",
        "inconsistent",
        "learned",
        "max_blocks",
        "per_resident",
        "placeholders",
        "rebuilds",
        "resident",
        "second_chances",
    )

    def __init__(
        self,
        max_blocks: int = DEFAULT_MAX_LEARNED_BLOCKS,
        resident: Callable[[Stream, Hash], bool] | None = None,
        *,
        floor: int = LEARNED_FLOOR,
        per_resident: float = LEARNED_PER_RESIDENT,
        held: Container[Hash] | None = None,
    ) -> None:
        if max_blocks < 0:
            raise ValueError(f"max_blocks must be >= 0, got {max_blocks}")
        if floor < 1 or per_resident <= 0:
            raise ValueError("floor must be at least 1 and per_resident positive")
        self.max_blocks = max_blocks
        self.floor = floor
        self.per_resident = per_resident
        self.cap = min(max_blocks, floor)
        """Entries held at most now (see :meth:`follow_fleet`)."""
        self.resident = resident
        self.held = held
        """Every hash some stream holds (the occupancy index's fleet holders, kept live), or None: an
        entry whose block is not in it is not resident, and ``resident`` is asked only of the rest."""
        self._roots: dict[Stream, int] = {}
        self._sizes: dict[Stream, list[int]] = {}
        self._streams: list[Stream] = []
        self._stream_ids: dict[Stream, int] = {}
        self.learned = 0
        """Entries taught so far (re-announcements included)."""
        self.evicted = 0
        self.second_chances = 0
        self.rebuilds = 0
        """Times the arrays were rebuilt smaller (the fleet shrank): O(entries) each."""
        self.placeholders = 0
        """BlockStored events without tokens (placeholders): nothing learned."""
        self.inconsistent = 0
        """BlockStored events whose token count is not blocks x block_size: nothing learned."""
        # The ring: physical slots, the oldest at _head, _count in use from there (a key of 0 is a
        # slot freed by a re-announcement); _nexts links an entry to the next of its bucket (+1).
        self._keys = array("Q")
        self._vals: list[Hash | None] = []
        self._sids = array("H")
        self._nexts = array("I")
        self._head = self._count = self._live = 0
        self._trimmed_at = _TRIM_FROM
        # The index (linear hashing): 2**_level + _split buckets, each a ring position + 1 (0: empty).
        self._buckets = array("I", bytes(4))
        self._level = 0
        self._split = 0

    def __len__(self) -> int:
        return self._live

    # --- size ----------------------------------------------------------------------------------

    def follow_fleet(self, resident_blocks: int) -> None:
        """The fleet now holds ``resident_blocks`` (every stream, medium and group summed): the cap
        follows it. Cheap; call it now and then (the gateway: every few hundred batches)."""
        self.cap = min(self.max_blocks, max(self.floor, int(resident_blocks * self.per_resident)))

    def _bucket(self, key: int) -> int:
        b = key & ((1 << self._level) - 1)
        return key & ((2 << self._level) - 1) if b < self._split else b

    def _link(self, at: int, key: int) -> None:
        b = self._bucket(key)
        self._nexts[at] = self._buckets[b]
        self._buckets[b] = at + 1

    def _unlink(self, at: int) -> None:
        """Take ring entry ``at`` out of its bucket's chain."""
        key = self._keys[at]
        b = key & ((1 << self._level) - 1)  # _bucket, inline (every eviction)
        if b < self._split:
            b = key & ((2 << self._level) - 1)
        buckets, nexts = self._buckets, self._nexts
        p = buckets[b]
        if p == at + 1:
            buckets[b] = nexts[at]
            return
        while nexts[p - 1] != at + 1:
            p = nexts[p - 1]
        nexts[p - 1] = nexts[at]

    def _find(self, key: int) -> int:
        """The ring position of ``key``, or -1."""
        keys, nexts = self._keys, self._nexts
        p = self._buckets[self._bucket(key)]
        while p:
            if keys[p - 1] == key:
                return p - 1
            p = nexts[p - 1]
        return -1

    def _grow_index(self, splits: int = 16) -> None:
        """``splits`` more buckets, one at a time: the entries of bucket ``_split`` shared between it
        and the new one (a few at once, so that the ingest path calls this every 32 entries)."""
        buckets, nexts, keys = self._buckets, self._nexts, self._keys
        for _ in range(splits):
            low = 1 << self._level
            old = self._split
            buckets.append(0)
            p = buckets[old]
            buckets[old] = 0
            while p:
                following = nexts[p - 1]
                b = old + low if keys[p - 1] & low else old
                nexts[p - 1] = buckets[b]
                buckets[b] = p
                p = following
            self._split += 1
            if self._split == low:
                self._level += 1
                self._split = 0

    def _rebuild(self) -> None:
        """Arrays just large enough for the live entries, copied in order: O(entries)."""
        keys, vals, sids, size = self._keys, self._vals, self._sids, len(self._keys)
        order = [at for at in ((self._head + n) % size for n in range(self._count)) if keys[at]] if size else []
        self._keys = array("Q", [keys[at] for at in order])
        self._vals = [vals[at] for at in order]
        self._sids = array("H", [sids[at] for at in order])
        self._nexts = array("I", bytes(4 * len(order)))
        self._head, self._count = 0, len(order)
        self._level = (len(order) // _LOAD).bit_length()
        self._split = 0
        self._buckets = array("I", bytes(4 << self._level))
        for at, key in enumerate(self._keys):
            self._link(at, key)
        self.rebuilds += 1

    # --- the ring ------------------------------------------------------------------------------

    def _slot(self) -> int:
        """A free ring position at the back: appended while the ring may grow, else the front freed."""
        size = len(self._keys)
        while self._count == size:
            if self._head == 0 and size < self.cap:
                grown = min(self.cap - size, max(_RING_MIN, size >> _GROWTH_SHIFT))
                self._extend(grown)
                size += grown
            else:
                self._pop()
        at = (self._head + self._count) % size
        self._count += 1
        return at

    def _extend(self, slots: int) -> None:
        """``slots`` more free slots at the end of the ring (a 32nd more at a time: amortised O(1)
        per entry, the arrays reallocated by C)."""
        self._keys.frombytes(bytes(8 * slots))
        self._vals.extend(itertools.repeat(None, slots))
        self._sids.frombytes(bytes(2 * slots))
        self._nexts.frombytes(bytes(4 * slots))
        if len(self._keys) >= self._trimmed_at:  # the arrays' old copies back to the system
            release_free_heap()
            self._trimmed_at = len(self._keys) + (len(self._keys) >> 2)

    def _pop(self) -> None:
        """Free the front: a freed slot, or the oldest entry (after at most :data:`_SECOND_CHANCES`
        resident ones moved to the back)."""
        keys, vals, sids, resident, held = self._keys, self._vals, self._sids, self.resident, self.held
        size = len(keys)
        chances = 0
        while True:
            at = self._head
            self._head = (at + 1) % size
            self._count -= 1
            key = keys[at]
            if not key:
                return
            sid = sids[at]
            block_hash = vals[at]
            if (
                resident is not None
                and chances < _SECOND_CHANCES
                and sid != _NO_STREAM
                and block_hash is not None
                and (held is None or block_hash in held)
                and resident(self._streams[sid], block_hash)
            ):
                chances += 1
                self.second_chances += 1
                back = (self._head + self._count) % size
                self._count += 1
                if back != at:  # the ring was not full: the entry moves, and its link with it
                    self._unlink(at)
                    keys[back], vals[back], sids[back] = key, block_hash, sid
                    keys[at], vals[at] = 0, None
                    self._link(back, key)
                continue
            self._unlink(at)  # the bucket's chain is short (two entries on average)
            keys[at] = 0
            vals[at] = None
            self._live -= 1
            self.evicted += 1
            return

    def _insert(self, key: int, block_hash: Hash, sid: int) -> None:
        """One entry at the back; a re-announced key leaves its old place."""
        old = self._find(key)
        if old >= 0:
            self._unlink(old)
            self._keys[old] = 0
            self._vals[old] = None
            self._live -= 1
        at = self._slot()
        self._keys[at] = key
        self._vals[at] = block_hash
        self._sids[at] = sid
        self._link(at, key)
        self._live += 1
        if self._live > _LOAD * len(self._buckets):
            self._grow_index()
        if self._live > self.cap:
            self._shrink()

    def _shrink(self) -> None:
        """Over the cap (it followed the fleet down): a few evictions per new entry, then smaller
        arrays once the table fits in half of them."""
        for _ in range(_SHRINK_STEP):
            if self._live <= self.cap:
                break
            self._pop()
        if self._live <= self.cap and len(self._keys) >= 2 * max(self.cap, _RING_MIN):
            self._rebuild()

    # --- learning ------------------------------------------------------------------------------

    def _root(self, stream: Stream) -> int:
        root = self._roots.get(stream)
        if root is None:
            root = self._roots[stream] = stream_root(stream)
        return root

    def _stream_id(self, stream: Stream) -> int:
        sid = self._stream_ids.get(stream)
        if sid is None:
            sid = len(self._streams) if len(self._streams) < _NO_STREAM else _NO_STREAM
            if sid != _NO_STREAM:
                self._streams.append(stream)
            self._stream_ids[stream] = sid
        return sid

    def block_sizes(self, source: str, dp_rank: int) -> list[int]:
        """The block sizes the stream taught with, most recent first (engines have one; at most 4 kept)."""
        return list(self._sizes.get((source, dp_rank), ()))

    def learn_batch(self, source: str, dp_rank: int, batch: Batch) -> int:
        """Learn from every BlockStored of a delivered batch; returns the entries taught."""
        if not self.max_blocks:
            return 0
        taught = 0
        for event in batch.events:
            if type(event) is BlockStored:
                taught += self.learn(source, dp_rank, event)
        return taught

    def _append_freeing(self, key: int, block_hash: Hash, sid: int, b: int) -> None:
        """:meth:`learn`'s slow path for a new key: the ring is full, so it grows (below the cap) or
        its front is evicted (at the cap), then the entry goes to the back, in bucket ``b``."""
        keys, size, cap = self._keys, len(self._keys), self.cap
        if self._count < size:
            at = (self._head + self._count) % size
        elif self._head == 0 and size < cap:
            at = size
            self._extend(min(cap - size, max(_RING_MIN, size >> _GROWTH_SHIFT)))
            keys = self._keys
        else:
            self._pop()  # at the cap: one slot freed at the front (no bucket split: b holds)
            at = (self._head + self._count) % size
        self._count += 1
        keys[at] = key
        self._vals[at] = block_hash
        self._sids[at] = sid
        self._nexts[at] = self._buckets[b]
        self._buckets[b] = at + 1
        self._live += 1
        if self._live > _LOAD * len(self._buckets):
            self._grow_index()
        if self._live > cap:
            self._shrink()

    def learn(self, source: str, dp_rank: int, event: BlockStored) -> int:
        """Learn one BlockStored's blocks; returns the entries taught (0 for a placeholder)."""
        hashes = event.block_hashes
        size = event.block_size
        tokens = event.token_ids
        if not self.max_blocks or not hashes:
            return 0
        if not tokens or size <= 0:
            self.placeholders += 1
            return 0
        if len(tokens) != len(hashes) * size:
            self.inconsistent += 1
            return 0
        stream = (source, dp_rank)
        note_block_size(self._sizes, stream, size)
        digests = block_digests(tokens, size, event.lora_name, extra_keys_of(event))
        parent = event.parent_block_hash
        mix = self._root(stream) if parent is None else _mix(parent)
        sid = self._stream_id(stream)
        # The ingest path, inlined (_find, _slot, _link): a method call only to free the ring's
        # front, to split a bucket or to shrink.
        keys, vals, sids, nexts, buckets = self._keys, self._vals, self._sids, self._nexts, self._buckets
        lo, split, cap = (1 << self._level) - 1, self._split, self.cap
        hi, grow_at = 2 * lo + 1, _LOAD * len(buckets)
        head, count, live = self._head, self._count, self._live
        k64, m64 = _K64, _M64
        for digest, block_hash in zip(digests, hashes):  # noqa: B905 (one digest per hash: checked above)
            key = (digest ^ mix) or 1  # _key, inline
            mix = (hash(block_hash) * k64) & m64  # _mix, inline: the next block's parent
            b = key & lo
            if b < split:
                b = key & hi
            p = buckets[b]
            while p and keys[p - 1] != key:
                p = nexts[p - 1]
            size = len(keys)
            if not p and count < size and live < cap and live < grow_at:  # the common case
                at = count if not head else (head + count) % size
                count += 1
                live += 1
                keys[at] = key
                vals[at] = block_hash
                sids[at] = sid
                nexts[at] = buckets[b]
                buckets[b] = at + 1
                continue
            self._head, self._count, self._live = head, count, live
            if p:  # re-announced (rare): to the back of the eviction order
                self._insert(key, block_hash, sid)
            else:
                self._append_freeing(key, block_hash, sid, b)
            keys, vals, sids, nexts, buckets = self._keys, self._vals, self._sids, self._nexts, self._buckets
            lo, split = (1 << self._level) - 1, self._split
            hi, grow_at = 2 * lo + 1, _LOAD * len(buckets)
            head, count, live = self._head, self._count, self._live
        self._head, self._count, self._live = head, count, live
        self.learned += len(hashes)
        return len(hashes)

    # --- lookups -------------------------------------------------------------------------------

    def chain(self, source: str, dp_rank: int, digests: Sequence[int]) -> list[Hash]:
        """The hashes the stream announced for these blocks (:func:`block_digests`), as far as learned."""
        vals = self._vals
        mix = self._root((source, dp_rank))
        out: list[Hash] = []
        for digest in digests:
            at = self._find(_key(digest, mix))
            if at < 0:
                break
            block_hash = vals[at]
            assert block_hash is not None  # a live entry
            out.append(block_hash)
            mix = _mix(block_hash)
        return out

    def entries(self) -> list[tuple[Stream, Hash]]:
        """Every live entry as (announcing stream, block hash), oldest announcement first (for tests
        and diagnostics: O(entries))."""
        keys, vals, sids, size = self._keys, self._vals, self._sids, len(self._keys)
        out: list[tuple[Stream, Hash]] = []
        for n in range(self._count):
            at = (self._head + n) % size
            block_hash = vals[at]
            if keys[at] and block_hash is not None:
                sid = sids[at]
                out.append((self._streams[sid] if sid != _NO_STREAM else ("", -1), block_hash))
        return out

    @property
    def slots(self) -> int:
        """Ring slots allocated (live entries, freed slots and room to grow into)."""
        return len(self._keys)

    def nbytes(self) -> int:
        """Bytes of the ring and its index, allocated (the hash objects excluded: the occupancy
        index holds them too while they are resident)."""
        arrays = (self._keys, self._sids, self._nexts, self._buckets)
        return sum(a.buffer_info()[1] * a.itemsize for a in arrays) + 8 * len(self._vals)
