"""Where the prefill goes: every block a stream stores into its GPU tier, attributed. Sans-I/O.

The occupancy index's pass (:func:`kvgateway.state._apply_py.apply_batch`) counts the common store
itself (every hash new to the fleet and not evicted lately: ``new``) and tells this module of every
other store before it applies it, and of each GPU remove after
(:class:`~kvgateway.state.occupancy.StoreObserver`), so every store is judged against the fleet as
it was at that moment, in the log's order: a process and an edge following the same log count the
same. Each stored block gets the first origin that holds, in this order:

- ``hit``: this stream already held the block in its GPU tier (only engines that re-announce
  reused blocks show this, such as vLLM with ``kv_cache_report_mode="full"``);
- ``offloaded``: this stream held it in another tier (CPU, disk, external): loaded, not computed;
- ``refetch``: this stream evicted it from its GPU tier within the refetch window (a capacity miss);
- ``elsewhere``: another stream of the fleet held it (any tier): a routing miss;
- ``new``: none of these, the workload's own new content.

Counted in tokens (the event's ``block_size``, else the stream's last known one) for every block.
Stores into other tiers are tier movements and not counted. A stale stream (events lost) is not
attributed: its stores are counted apart as ``unattributed`` until its next clear or restart.

**Same content, other hash.** Engines hashing with different seeds give one prefix different
hashes. Comparing contents costs a digest per block (about as much as the chain learner), so it
starts only once the fleet shows more than one hash family: two streams announcing the same first
block's content (:func:`~kvgateway.state.learner.block_digests`) under different hashes. From then
on, blocks whose event carries ``token_ids`` also get a chain content key (the digests folded along
the chain from its first block), and a block whose content another stream holds under another hash
is ``elsewhere`` too. A chain whose parent's content key is unknown (announced before, or forgotten)
is compared by hash.

**Memory.** Per stream: the GPU evictions within the window, at most :data:`MAX_EVICTED` (compiled
core: C tables at most 3/4 full, of 16-byte slots for u64 hashes (at most 2 MiB a stream at the bound,
about 33 bytes per remembered eviction measured) and of 48-byte slots for 32-byte hashes (at most 6
MiB, about 98 bytes each, where the dict kept each hash's bytes object alive besides: about 106);
pure core: dicts of the hashes, about 130 bytes each with a u64 hash's int, about 4 MiB;
the bound is reached only by evicting more than 546 blocks a second for a whole minute; beyond it the
oldest generation is forgotten first, counted in ``evicted_dropped``), and 30 ten-second buckets of
counts. Fleet-wide, only once content comparison started: at most
:data:`MAX_CONTENT` content keys (about 300 bytes each, 40 MiB at the bound; a key whose block is
still held somewhere gets up to four second chances before it is dropped), and at most
:data:`MAX_ROOTS` first-block digests before (about 150 bytes each). The fleet's holders are the
occupancy index's (one refcount per distinct resident block).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from typing import Any, Final

from kvgateway.engine.mediums import medium_tier
from kvgateway.engine.wire import BlockStored, Hash, Stream
from kvgateway.runtime.metrics import StreamFamilies
from kvgateway.state._apply_py import (
    COMPARE_ALL,
    COMPARE_NONE,
    COMPARE_ROOTS,
    ELSEWHERE,
    HIT,
    NEW,
    OFFLOADED,
    ORIGIN_COUNT,
    RECENT_SECONDS,
    REFETCH,
)
from kvgateway.state.history import ORIGINS
from kvgateway.state.learner import block_digests
from kvgateway.state.occupancy import DEFAULT_REFETCH_WINDOW_SECONDS, MAX_EVICTED, Account, StreamIndex

MAX_CONTENT: Final = 131_072
"""Chain content keys remembered fleet-wide once content comparison started."""
MAX_ROOTS: Final = 4_096
"""First-block digests remembered to notice a second hash family (the table restarts when full)."""
_SECOND_CHANCES: Final = 4
_HASHES_PER_CONTENT: Final = 4
_M64: Final = (1 << 64) - 1


def _zeros() -> list[int]:
    return [0] * ORIGIN_COUNT


def shares(tokens: list[int]) -> dict[str, float | None]:
    """Each origin's share of the tokens (None each when there are none)."""
    total = sum(tokens)
    return {name: round(n / total, 4) if total else None for name, n in zip(ORIGINS, tokens, strict=True)}


def _origin_json(tokens: list[int]) -> dict[str, Any]:
    return {"tokens": dict(zip(ORIGINS, tokens, strict=True)), "shares": shares(tokens)}


def _digests(event: BlockStored, blocks: int) -> list[int]:
    """The content digests of the first ``blocks`` blocks of ``event`` (its extra keys where it sent
    one per block)."""
    size = event.block_size
    extra_keys = event.extra.get("extra_keys") if event.extra else None
    if not isinstance(extra_keys, list) or len(extra_keys) != len(event.block_hashes):
        extra_keys = None
    return block_digests(event.token_ids[: blocks * size], size, event.lora_name, extra_keys)


def _fold(parent: int, digest: int) -> int:
    """A chain's content key: its parent's folded with the block's own digest."""
    return hash((parent, digest)) & _M64


class ContentKeys:
    """Chain content keys, so that one content under two hash families meets (see the module)."""

    __slots__ = ("_chain", "_hashes", "_roots", "active", "max_content")

    def __init__(self, max_content: int = MAX_CONTENT) -> None:
        self.active = False
        self.max_content = max_content
        self._roots: dict[int, Hash] = {}
        self._chain: OrderedDict[Hash, int] = OrderedDict()
        self._hashes: dict[int, list[Hash]] = {}

    def __len__(self) -> int:
        return len(self._chain)

    def keys_of(self, event: BlockStored) -> list[int] | None:
        """The content key of each block of ``event``, or None (no tokens, or an unknown parent)."""
        size, tokens, hashes = event.block_size, event.token_ids, event.block_hashes
        if size <= 0 or len(tokens) != len(hashes) * size:
            return None
        if not self.active and not self._second_family(event):
            return None
        if event.parent_block_hash is None:
            key = 0
        else:
            parent = self._chain.get(event.parent_block_hash)
            if parent is None:
                return None
            key = parent
        keys = []
        for digest in _digests(event, len(hashes)):
            key = _fold(key, digest)
            keys.append(key)
        return keys

    def _second_family(self, event: BlockStored) -> bool:
        """Whether ``event``'s first block shows a second hash family (content comparison starts)."""
        if event.parent_block_hash is not None:
            return False
        first = event.block_hashes[0]
        digest = _digests(event, 1)[0]
        seen = self._roots.setdefault(digest, first)
        if seen == first:
            if len(self._roots) > MAX_ROOTS:
                self._roots = {}
            return False
        # The first family's root is remembered, so this very event meets it.
        key = _fold(0, digest)
        self._chain[seen] = key
        self._hashes[key] = [seen]
        self.active, self._roots = True, {}
        return True

    def others(self, key: int, block_hash: Hash) -> list[Hash]:
        """The other hashes announced with content ``key``."""
        return [h for h in self._hashes.get(key, ()) if h != block_hash]

    def remember(self, hashes: list[Hash], keys: list[int], index: StreamIndex) -> None:
        chain, by_key = self._chain, self._hashes
        for h, key in zip(hashes, keys, strict=True):
            chain[h] = key
            chain.move_to_end(h)
            known = by_key.setdefault(key, [])
            if h not in known and len(known) < _HASHES_PER_CONTENT:
                known.append(h)
            if len(chain) > self.max_content:
                self._forget_one(index)

    def _forget_one(self, index: StreamIndex) -> None:
        chain = self._chain
        for _ in range(_SECOND_CHANCES):
            h = next(iter(chain))
            if not index.fleet_holders(h):
                break
            chain.move_to_end(h)  # still held somewhere: a system prompt must not age out
        h, key = chain.popitem(last=False)
        known = self._hashes.get(key)
        if known is not None and h in known:
            known.remove(h)
            if not known:
                del self._hashes[key]


class Attribution:
    """Attributes every GPU-tier store (see the module). Observes the index: :meth:`stored`, :meth:`removed`."""

    def __init__(
        self,
        refetch_window: float = DEFAULT_REFETCH_WINDOW_SECONDS,
        max_evicted: int = MAX_EVICTED,
        max_content: int = MAX_CONTENT,
    ) -> None:
        self.refetch_window = refetch_window
        self.max_evicted = max_evicted
        self.content = ContentKeys(max_content)
        self._accounts: dict[Stream, Account] = {}
        self._gpu: dict[str | None, bool] = {}
        self.compare = COMPARE_NONE
        """Which stores the index's pass must hand over rather than count as new itself: every one
        with tokens once contents are compared, only a chain's first (which may show a second hash
        family) while more than one stream is known, else none. Kept up to date by :meth:`account`
        and :meth:`stored`, the only places that change it."""

    def account(self, stream: Stream) -> Account:
        account = self._accounts.get(stream)
        if account is None:
            account = self._accounts[stream] = Account(self.refetch_window, self.max_evicted)
            self._compared()
        return account

    def _compared(self) -> None:
        if self.content.active:
            self.compare = COMPARE_ALL
        else:
            self.compare = COMPARE_ROOTS if len(self._accounts) > 1 else COMPARE_NONE

    def _is_gpu(self, medium: str | None) -> bool:
        gpu = self._gpu.get(medium)
        if gpu is None:
            gpu = medium_tier(medium) == "GPU"
            if len(self._gpu) < 256:  # medium names are not trusted: a bounded cache
                self._gpu[medium] = gpu
        return gpu

    def stored(self, index: StreamIndex, event: BlockStored, ts: float, now: float) -> None:
        hashes = event.block_hashes
        if not hashes or not self._is_gpu(event.medium):
            return
        stream = (index.source, index.dp_rank)
        account = self.account(stream)
        if event.block_size > 0:
            account.block_size = event.block_size
        size = account.block_size
        if index.stale:
            account.unattributed_blocks += len(hashes)
            account.unattributed_tokens += len(hashes) * size
            return
        keys = None
        if len(self._accounts) > 1 and event.token_ids:  # one stream: its ids not read (nor made a list)
            keys = self.content.keys_of(event)
            self._compared()  # a second hash family may show here
        evicted = account.evicted
        if keys is None and index.fleet_holds_none(hashes) and evicted.none_of(hashes):
            self._count(stream, account, NEW, len(hashes), now)  # the common case, in C
            return
        counts = _zeros()
        sets = index.tier_sets()
        for i, h in enumerate(hashes):
            counts[self._origin(index, account, h, None if keys is None else keys[i], ts=ts, sets=sets)] += 1
        for origin, n in enumerate(counts):
            if n:
                self._count(stream, account, origin, n, now)
        if keys is not None:
            self.content.remember(hashes, keys, index)

    def _origin(
        self,
        index: StreamIndex,
        account: Account,
        h: Hash,
        key: int | None,
        *,
        ts: float,
        sets: list[tuple[str, AbstractSet[Hash]]],
    ) -> int:
        own = 0
        offloaded = False
        for tier, blocks in sets:
            if h in blocks:
                if tier == "GPU":
                    return HIT
                offloaded = True
                own += 1
        if offloaded:
            return OFFLOADED
        evicted_at = account.evicted.take(h)
        if evicted_at is not None and ts - evicted_at <= self.refetch_window:
            return REFETCH
        if index.fleet_holders(h) > own:
            return ELSEWHERE
        if key is not None:
            for other in self.content.others(key, h):
                if index.fleet_holders(other) > sum(other in blocks for _tier, blocks in sets):
                    return ELSEWHERE
        return NEW

    def _count(self, stream: Stream, account: Account, origin: int, blocks: int, now: float) -> None:
        account.add(origin, blocks, blocks * account.block_size, now)

    def removed(self, index: StreamIndex, medium: str | None, hashes: list[Hash], ts: float) -> None:
        """GPU evictions, remembered for the window (a block still held elsewhere in the stream is
        remembered too: it is a ``hit`` first when stored again)."""
        if not hashes or not self._is_gpu(medium):
            return
        self.account((index.source, index.dp_rank)).evicted.add(hashes, ts)

    def export(self, families: StreamFamilies) -> None:
        """``kvgateway_stored_tokens_total`` per stream and origin, at scrape time (nothing per batch)."""
        for (source, dp_rank), account in sorted(self._accounts.items()):
            labels = (source, str(dp_rank))
            for name, tokens in zip(ORIGINS, account.tokens, strict=True):
                families.add("stored_tokens", (*labels, name), tokens)

    def tracked(self) -> tuple[int, int]:
        """(entries held, their bound): evictions per stream, content keys once comparing."""
        held = sum(a.evicted.size for a in self._accounts.values()) + len(self.content)
        bound = self.max_evicted * len(self._accounts) + (self.content.max_content if self.content.active else 0)
        return held, bound

    def totals(self, streams: Iterable[Stream]) -> list[int]:
        """Tokens per origin since start, summed over ``streams``."""
        out = _zeros()
        for stream in streams:
            account = self._accounts.get(stream)
            if account is not None:
                for i, n in enumerate(account.tokens):
                    out[i] += n
        return out

    def stream_json(self, index: StreamIndex, now: float) -> dict[str, Any]:
        account = self._accounts.get((index.source, index.dp_rank)) or Account()
        recent = account.recent(now)
        return {
            "stale": index.stale,
            "block_size": account.block_size or None,
            "since_start": {**_origin_json(account.tokens), "blocks": dict(zip(ORIGINS, account.blocks, strict=True))},
            "last_5m": _origin_json(recent),
            "routing_miss_share": shares(recent)["elsewhere"],
            "unattributed_tokens": account.unattributed_tokens,
            "unattributed_blocks": account.unattributed_blocks,
            "evicted_tracked": account.evicted.size,
            "evicted_dropped": account.evicted.dropped,
        }

    def to_json(self, indexes: Iterable[StreamIndex], now: float) -> dict[str, Any]:
        """The ``prefill`` part of /v1/analytics: the fleet (the streams given) and the settings."""
        since, recent = _zeros(), _zeros()
        unattributed = stale = 0
        for index in indexes:
            account = self._accounts.get((index.source, index.dp_rank))
            stale += index.stale
            if account is None:
                continue
            for i, (a, b) in enumerate(zip(account.tokens, account.recent(now), strict=True)):
                since[i] += a
                recent[i] += b
            unattributed += account.unattributed_tokens
        return {
            "origins": list(ORIGINS),
            "refetch_window_seconds": self.refetch_window,
            "recent_seconds": RECENT_SECONDS,
            "compared_by": "hash and content" if self.content.active else "hash",
            "fleet": {
                "since_start": _origin_json(since),
                "last_5m": _origin_json(recent),
                "routing_miss_share": shares(recent)["elsewhere"],
                "unattributed_tokens": unattributed,
                "stale_streams": stale,
            },
        }
