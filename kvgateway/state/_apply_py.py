"""The index's per-batch pass, pure Python: the reference its compiled twin (``_apply_c.pyx``)
mirrors step for step (tests/unit/state/test_apply_differential.py). One stream's groups
(:class:`Group`: resident hashes with reference counts, the fleet's holders, the state digest), its
mediums' counters (:class:`Medium`), its GPU evictions of the refetch window (:class:`Evictions`),
and :func:`apply_batch`, one pass over a batch's events that applies every store and remove, keeps
the fleet's holders and counts the prefill attribution's common case at once.

The common store (every hash new to the fleet and not evicted lately from this stream: the
workload's own new content) is counted ``new`` inside the pass, with the set test the group's
store needs anyway, once per batch; every other store is handed to the observer before it is
applied (:meth:`StoreObserver.stored`), and every GPU remove is remembered in the stream's
evictions after it (what :meth:`StoreObserver.removed` does), so each store is judged against the
fleet as it was at that event.

Sans-I/O; :mod:`kvgateway.state.occupancy` builds the index around it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol

from kvgateway.engine.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored, Hash, Stream
from kvgateway.log.staleness import Staleness
from kvgateway.state.digest import MASK, elements_sum, prefix_state

__all__ = [
    "BUCKET_SECONDS",
    "DEFAULT_REFETCH_WINDOW_SECONDS",
    "MAX_EVICTED",
    "RATE_WINDOW_SECONDS",
    "RECENT_SECONDS",
    "Account",
    "Evictions",
    "Group",
    "Medium",
    "StoreObserver",
    "StreamView",
    "apply_batch",
]

RATE_WINDOW_SECONDS: Final = 60
"""``stores_per_s``/``removes_per_s`` average the 60 one-second buckets ending with the current one,
or the time since the index started when that is shorter (no ramp-up after a start)."""

_NEVER: Final = -(2**62)

DEFAULT_REFETCH_WINDOW_SECONDS: Final = 60.0
MAX_EVICTED: Final = 32_768
"""GPU evictions remembered per stream for the refetch window (the oldest go first)."""

COMPARE_NONE: Final = 0
COMPARE_ROOTS: Final = 1
COMPARE_ALL: Final = 2
"""What :attr:`StoreObserver.compare` says: no store's contents are compared; only those of a
chain's first event (the observer watches for a second hash family); every store with tokens."""

HIT, OFFLOADED, REFETCH, ELSEWHERE, NEW = range(5)
"""The origins of a stored block, in order of precedence (:mod:`kvgateway.state.attribution`):
indexes into an :class:`Account`'s counts (``kvgateway.state.history.ORIGINS`` names them)."""
ORIGIN_COUNT: Final = 5
RECENT_SECONDS: Final = 300
BUCKET_SECONDS: Final = 10
_BUCKETS: Final = RECENT_SECONDS // BUCKET_SECONDS


class StoreObserver(Protocol):
    """Told of every store the pass does not attribute itself before the index applies it, and of
    every GPU remove after (the prefill attribution, :mod:`kvgateway.state.attribution`): it sees
    the state the event changes."""

    compare: int
    """Which stores the pass hands over (``COMPARE_*``): an attribute, not a call, because the pass
    reads it once a batch and after every store it hands over."""

    def account(self, stream: Stream) -> Account: ...

    # ``index``: the stream's StreamIndex (kvgateway/state/occupancy.py, which imports this module)
    def stored(self, index: Any, event: BlockStored, ts: float, now: float) -> None: ...

    def removed(self, index: Any, medium: str | None, hashes: list[Hash], ts: float) -> None: ...


class StreamView(Protocol):
    """What the pass reads and sets of one stream's index (:class:`~kvgateway.state.occupancy.StreamIndex`)."""

    source: str
    dp_rank: int
    observer: StoreObserver | None
    account: Account | None
    unknown_removes: int
    staleness: Staleness

    def route(self, medium: str | None, group_idx: int | None) -> Group: ...

    def clear_blocks(self) -> None: ...


class Evictions:
    """One stream's GPU evictions of the last window, for the prefill attribution's ``refetch``:
    ``hash -> engine time`` in two generations of one window each (the current one and the one
    before), so that an eviction costs a C-level dict update, a lookup two, and expiry drops a whole
    generation."""

    __slots__ = ("bound", "current", "dropped", "previous", "since", "window")

    def __init__(self, window: float = DEFAULT_REFETCH_WINDOW_SECONDS, bound: int = MAX_EVICTED) -> None:
        self.window = window
        self.bound = bound
        self.current: dict[Hash, float] = {}
        self.previous: dict[Hash, float] = {}
        self.since = -math.inf
        """The engine time the current generation started."""
        self.dropped = 0
        """Evictions forgotten at the bound before the window ended."""

    @property
    def size(self) -> int:
        return len(self.current) + len(self.previous)

    def add(self, hashes: list[Hash], ts: float) -> None:
        """Evicted at engine time ``ts`` (the index's pass calls it for every GPU remove)."""
        bound = self.bound
        if ts - self.since > self.window:  # the previous generation is older than the window now
            self.previous, self.current, self.since = self.current, {}, ts
        self.current.update(dict.fromkeys(hashes, ts))
        if len(self.current) + len(self.previous) > bound:
            self.dropped += len(self.previous)
            self.previous = {}
            if len(self.current) > bound:
                self.dropped += len(self.current)
                self.current = {}

    def none_of(self, hashes: list[Hash]) -> bool:
        return self.current.keys().isdisjoint(hashes) and self.previous.keys().isdisjoint(hashes)

    def take(self, h: Hash) -> float | None:
        """When ``h`` was last evicted (None: not remembered); forgets it."""
        evicted_at = self.current.pop(h, None)
        previous = self.previous.pop(h, None)
        return previous if evicted_at is None else evicted_at


def _zeros() -> list[int]:
    return [0] * ORIGIN_COUNT


class Account:
    """One stream's attributed stores: tokens and blocks per origin since start, tokens in
    ten-second buckets for the last five minutes, the stream's last known block size and its GPU
    evictions of the refetch window. Here, beside the pass, because the pass counts its common
    case (``new``) into it once a batch and reads it per event: the compiled twin makes both C."""

    __slots__ = (
        "block_size",
        "blocks",
        "bucket_at",
        "buckets",
        "evicted",
        "tokens",
        "unattributed_blocks",
        "unattributed_tokens",
    )

    def __init__(self, window: float = DEFAULT_REFETCH_WINDOW_SECONDS, bound: int = MAX_EVICTED) -> None:
        self.tokens = _zeros()
        self.blocks = _zeros()
        self.unattributed_tokens = 0
        self.unattributed_blocks = 0
        self.block_size = 0
        self.evicted = Evictions(window, bound)
        self.bucket_at = [-1] * _BUCKETS
        self.buckets = [_zeros() for _ in range(_BUCKETS)]

    def add(self, origin: int, blocks: int, tokens: int, now: float) -> None:
        self.tokens[origin] += tokens
        self.blocks[origin] += blocks
        at = int(now // BUCKET_SECONDS)
        slot = at % _BUCKETS
        if self.bucket_at[slot] != at:
            self.bucket_at[slot] = at
            self.buckets[slot] = _zeros()
        self.buckets[slot][origin] += tokens

    def add_new(self, blocks: int, tokens: int, now: float) -> None:
        """Stores the pass found new (held nowhere, not evicted lately), a batch's at once."""
        self.add(NEW, blocks, tokens, now)

    def recent(self, now: float) -> list[int]:
        """Tokens per origin over the last :data:`RECENT_SECONDS` (whole buckets)."""
        at = int(now // BUCKET_SECONDS)
        out = _zeros()
        for bucket_at, counts in zip(self.bucket_at, self.buckets, strict=True):
            if at - _BUCKETS < bucket_at <= at:
                for i, n in enumerate(counts):
                    out[i] += n
        return out


class Group:
    """Resident hashes of one (medium, group_idx): refcount = 1 + ``extra.get(hash, 0)``.

    ``shared``: ``blocks`` and ``extra`` were handed out by :meth:`StreamIndex.block_groups` with
    ``freeze=True``; the group copies them before its next change (copy on write).
    ``fleet``: the fleet's holders (a group counting the groups that hold each hash), told of every
    hash entering or leaving this group; None for the fleet's own group.

    ``digest``: None, or (once :meth:`track` was called) the sum of the resident hashes' digest
    elements (kvgateway/state/digest.py), kept up to date by every change from then on."""

    __slots__ = ("blocks", "digest", "extra", "fleet", "medium", "prefix", "shared")

    def __init__(self, medium: Medium, fleet: Group | None = None) -> None:
        self.blocks: set[Hash] = set()
        self.extra: dict[Hash, int] = {}
        self.medium = medium
        self.shared = False
        self.fleet = fleet
        self.digest: int | None = None
        self.prefix = 0

    def track(self, medium: str, group_idx: int) -> None:
        """Keep the digest from now on: computed once from the resident hashes (O(blocks))."""
        self.prefix = prefix_state(medium, group_idx)
        self.digest = elements_sum(self.prefix, self.blocks)

    def restore(self, blocks: Iterable[Hash], extra: Mapping[Hash, int]) -> None:
        """The hashes and extra references a checkpoint had (the fleet's holders are the caller's)."""
        self.blocks = set(blocks)
        self.extra = dict(extra)
        self.shared = False

    def _own(self) -> None:
        self.blocks = set(self.blocks)
        self.extra = dict(self.extra)
        self.shared = False

    def store(self, hashes: list[Hash]) -> None:
        fleet = self.fleet
        if fleet is not None and fleet.blocks.isdisjoint(hashes):
            self.store_new(hashes)  # the common case: held nowhere in the fleet
            return
        if self.shared:
            self._own()
        blocks = self.blocks
        if self.digest is not None:  # the hashes that become resident (refs 0 -> 1), counted once
            self.digest = (self.digest + elements_sum(self.prefix, set(hashes).difference(blocks))) & MASK
        if blocks.isdisjoint(hashes):
            # All new here, some held elsewhere. A length mismatch means repeats inside the list.
            before = len(blocks)
            blocks.update(hashes)
            if len(blocks) - before != len(hashes):
                self._repeats(hashes)
                hashes = list(dict.fromkeys(hashes))
            if fleet is not None:
                fleet.store(hashes)
            return
        extra = self.extra
        entered = []
        for h in hashes:
            if h in blocks:
                extra[h] = extra.get(h, 0) + 1
            else:
                blocks.add(h)
                entered.append(h)
        if fleet is not None:
            fleet.store(entered)

    def _repeats(self, hashes: list[Hash]) -> None:
        """Extra references for the hashes ``hashes`` names more than once (all of them new here)."""
        extra = self.extra
        for h, n in Counter(hashes).items():
            if n > 1:
                extra[h] = extra.get(h, 0) + n - 1

    def store_new(self, hashes: list[Hash]) -> None:
        """:meth:`store` of hashes the fleet holds none of (the caller tested it): this group holds
        none either, so neither set needs testing again."""
        if self.shared:
            self._own()
        blocks = self.blocks
        if self.digest is not None:
            self.digest = (self.digest + elements_sum(self.prefix, set(hashes))) & MASK
        before = len(blocks)
        blocks.update(hashes)
        if len(blocks) - before != len(hashes):  # repeats inside the list: extra references
            self._repeats(hashes)
            hashes = list(dict.fromkeys(hashes))
        if self.fleet is not None:
            self.fleet.blocks.update(hashes)  # held nowhere else: one C call

    def remove(self, hashes: list[Hash]) -> int:
        """Take one reference per hash; returns how many hashes were not resident."""
        if self.digest is None:
            return self._take(hashes)
        was = self.blocks.intersection(hashes)
        unknown = self._take(hashes)
        self.digest = (self.digest - elements_sum(self.prefix, was.difference(self.blocks))) & MASK  # refs 1 -> 0
        return unknown

    def _take(self, hashes: list[Hash]) -> int:
        if self.shared:
            self._own()
        blocks = self.blocks
        extra = self.extra
        if not extra or extra.keys().isdisjoint(hashes):
            # No extra references involved: a set difference has the sequential semantics
            # (a repeated hash drops the block once; its second mention is unknown).
            before = len(blocks)
            fleet = self.fleet
            if fleet is None:
                blocks.difference_update(hashes)
            elif not fleet.extra and blocks.issuperset(hashes):
                # the common case: every hash leaves, and no other group holds any: two C calls
                blocks.difference_update(hashes)
                fleet.blocks.difference_update(hashes)
            else:
                gone = blocks.intersection(hashes)
                blocks.difference_update(gone)
                fleet.remove(list(gone))
            return len(hashes) - (before - len(blocks))
        unknown = 0
        left = []
        for h in hashes:
            n = extra.get(h)
            if n is not None:
                if n == 1:
                    del extra[h]
                else:
                    extra[h] = n - 1
            elif h in blocks:
                blocks.remove(h)
                left.append(h)
            else:
                unknown += 1
        if self.fleet is not None:
            self.fleet.remove(left)
        return unknown

    def refcount(self, h: Hash) -> int:
        return 1 + self.extra.get(h, 0) if h in self.blocks else 0

    def clear(self) -> None:
        if self.fleet is not None and self.blocks:
            self.fleet.remove(list(self.blocks))
        # New objects rather than .clear(): frees the tables, and the dict would otherwise keep its size.
        self.blocks = set()
        self.extra = {}
        self.shared = False
        if self.digest is not None:
            self.digest = 0


class Medium:
    """Counters, block size and per-second rate buckets of one medium of one stream."""

    __slots__ = (
        "block_size",
        "bucket_removes",
        "bucket_sec",
        "bucket_stores",
        "cur_removes",
        "cur_sec",
        "cur_stores",
        "fleet",
        "gpu",
        "groups",
        "removes",
        "stores",
    )

    def __init__(self, fleet: Group | None = None, gpu: bool = False) -> None:
        self.fleet = fleet
        self.gpu = gpu
        """The medium is of the GPU tier: its stores are attributed, its removes are evictions."""
        self.groups: dict[int, Group] = {}
        self.block_size = 0
        self.stores = 0
        self.removes = 0
        # Ring of one-second buckets indexed by second % window; bucket_sec says which second a slot holds.
        self.bucket_sec = [_NEVER] * RATE_WINDOW_SECONDS
        self.bucket_stores = [0] * RATE_WINDOW_SECONDS
        self.bucket_removes = [0] * RATE_WINDOW_SECONDS
        # The current second is counted in plain attributes (cheap to bump) and rolled into the ring.
        self.cur_sec = _NEVER
        self.cur_stores = 0
        self.cur_removes = 0

    def group(self, group_idx: int) -> Group:
        grp = self.groups.get(group_idx)
        if grp is None:
            grp = self.groups[group_idx] = Group(self, self.fleet)
        return grp

    def roll(self, sec: int) -> None:
        """Close the current second's bucket and open ``sec``'s."""
        if sec < self.cur_sec:  # a clock step backwards: keep filling the newest bucket
            return
        i = self.cur_sec % RATE_WINDOW_SECONDS
        self.bucket_sec[i] = self.cur_sec
        self.bucket_stores[i] = self.cur_stores
        self.bucket_removes[i] = self.cur_removes
        self.cur_sec = sec
        self.cur_stores = self.cur_removes = 0

    def rates(self, now: float, started: float | None = None) -> tuple[float, float]:
        """Per-second rates over the window, or over the time since ``started`` (at least one
        second) when the index has not watched a whole window yet: the last 60 s divided by 60
        would ramp up for a minute after every gateway start."""
        covered: float = RATE_WINDOW_SECONDS
        if started is not None:
            covered = min(float(RATE_WINDOW_SECONDS), max(1.0, now - started))
        now_sec = math.floor(now)
        oldest = now_sec - RATE_WINDOW_SECONDS
        stores = removes = 0
        if oldest < self.cur_sec <= now_sec:
            stores, removes = self.cur_stores, self.cur_removes
        for sec, s, r in zip(self.bucket_sec, self.bucket_stores, self.bucket_removes, strict=True):
            if oldest < sec <= now_sec:  # the ring never holds cur_sec: roll() only moves forward
                stores += s
                removes += r
        return stores / covered, removes / covered

    def resident(self) -> int:
        return sum(len(grp.blocks) for grp in self.groups.values())


def _new_store(stale: bool, event: BlockStored, size: int, account: Account, compare: int, *, fleet: Group) -> bool:
    """Whether a GPU store is the common case the pass counts itself (the stream is not stale, no
    content to compare, every hash held nowhere in the fleet and not evicted lately: ``new``); the
    account learns the event's block size (``size``) either way, as the observer's ``stored`` does."""
    if size > 0:
        account.block_size = size
    return (
        not stale
        and not (compare and event.token_ids and (compare == COMPARE_ALL or event.parent_block_hash is None))
        and fleet.blocks.isdisjoint(event.block_hashes)
        and account.evicted.none_of(event.block_hashes)
    )


def apply_batch(
    index: StreamView,
    batch: Batch,
    now: float,
    replayed: bool,
    *,
    routes: dict[tuple[str | None, int | None], Group],
    fleet: Group,
) -> None:
    """Apply one delivered batch to ``index`` in order (:meth:`StreamIndex.apply`); ``routes``: its
    (raw medium, raw group_idx) -> group cache; ``fleet``: the fleet's holders."""
    sec, live = math.floor(now), not replayed
    observer, account = index.observer, index.account
    if account is None and observer is not None:  # the stream's first batch opens its account
        account = index.account = observer.account((index.source, index.dp_rank))
    compare = COMPARE_NONE if observer is None else observer.compare
    stale = index.staleness.reason is not None  # changed inside the pass only by a clear
    fresh = tokens = 0  # the stores found new here, counted once at the end
    for event in batch.events:
        if type(event) is BlockStored or type(event) is BlockRemoved:
            group_idx = event.extra.get("group_idx") if event.extra else None
            group_idx = group_idx if type(group_idx) is int else None
            grp = routes.get((event.medium, group_idx))
            if grp is None:
                grp = index.route(event.medium, group_idx)
            hashes = event.block_hashes
            med = grp.medium
            if live and sec != med.cur_sec:
                med.roll(sec)
            if type(event) is BlockStored:
                size = event.block_size  # read once: the account and the medium both learn it
                if account is None or not med.gpu or not hashes:
                    grp.store(hashes)
                elif _new_store(stale, event, size, account, compare, fleet=fleet):
                    fresh += len(hashes)
                    tokens += len(hashes) * account.block_size
                    grp.store_new(hashes)
                else:
                    if observer is not None:
                        observer.stored(index, event, batch.ts, now)
                        compare = observer.compare  # a second hash family may show at any store
                    grp.store(hashes)
                if size > 0:
                    med.block_size = size
                med.stores += len(hashes)
                if live:
                    med.cur_stores += len(hashes)
            else:
                index.unknown_removes += grp.remove(hashes)
                if account is not None and med.gpu and hashes:
                    account.evicted.add(hashes, batch.ts)  # what StoreObserver.removed does, one call less
                med.removes += len(hashes)
                if live:
                    med.cur_removes += len(hashes)
        elif type(event) is AllBlocksCleared:
            index.clear_blocks()
            index.staleness.cleared()
            stale = index.staleness.reason is not None
    if fresh and account is not None:
        account.add_new(fresh, tokens, now)
