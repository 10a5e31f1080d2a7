"""The reference-counted cache index: which blocks each engine holds, per medium and KV-cache group.

Sans-I/O: the caller passes ``now`` (seconds, any monotonic clock) into every time-dependent call.

A stream is ``(source, dp_rank)``. Within a stream a block is ``(medium, group_idx, hash)``:
the medium is the engine's own name normalised by :func:`kvgateway.engine.mediums.normalise_medium`
(upper case; absent, None or empty = ``"GPU"``), a missing group_idx is group 0. Every medium
belongs to one tier (GPU, CPU, DISK, EXTERNAL: :func:`kvgateway.engine.mediums.medium_tier`); the
snapshots sum the mediums of each tier too.

Engines announce every physical copy, so the index counts references: a store adds one per hash,
a remove takes one away and the block leaves at zero. A remove of a hash the index does not hold
is normal (the gateway joined late, a gap) and only counted.

Memory: nearly every block has a single reference, so the resident hashes live in a set and only
hashes with more than one reference get an entry in a side ``dict`` of extra references. The
pure-Python core's set is a ``set`` of the hashes' objects (60-80 bytes per resident u64 block,
the int included); the compiled core's is a :class:`~kvgateway.state._apply_c.BlockSet`, C tables
of 8-byte slots with no object per hash (11 to 21 bytes per u64 block as a table fills, and as
much again in the fleet's holders; 42 bytes a block in all measured, against 161). Both read as a
``collections.abc.Set``, which is all that leaves the index.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from kvgateway.engine.mediums import DEFAULT_MEDIUM, medium_tier, normalise_medium, tier_rank
from kvgateway.engine.wire import Batch, Hash, Stream
from kvgateway.log.entry import Entry
from kvgateway.log.records import BatchRecord, NoticeRecord
from kvgateway.log.staleness import Staleness
from kvgateway.runtime.extensions import load
from kvgateway.state import _apply_py
from kvgateway.state._apply_py import (
    DEFAULT_REFETCH_WINDOW_SECONDS,
    MAX_EVICTED,
    RATE_WINDOW_SECONDS,
    StoreObserver,
)
from kvgateway.state.digest import MASK

if TYPE_CHECKING:  # one API: the reference's
    from kvgateway.state._apply_py import Account, Evictions, Group, Medium, apply_batch
else:
    _chosen = load("kvgateway.state._apply_c") or _apply_py
    Account, Evictions, Group, Medium = _chosen.Account, _chosen.Evictions, _chosen.Group, _chosen.Medium
    apply_batch = _chosen.apply_batch

__all__ = [
    "DEFAULT_MEDIUM",
    "DEFAULT_REFETCH_WINDOW_SECONDS",
    "MAX_EVICTED",
    "RATE_WINDOW_SECONDS",
    "Account",
    "BlockGroup",
    "Evictions",
    "MediumStats",
    "OccupancyIndex",
    "StoreObserver",
    "StreamIndex",
    "normalise_medium",
]

RATE_DECIMALS: Final = 3
"""Rates are rounded to this many decimals where they are rendered into JSON (a thousandth of a
block per second): a sum of floats is otherwise written as ``1185.1999999999998``."""

logger = logging.getLogger("kvgateway.index")

_ROUTE_CACHE_MAX: Final = 256
"""Bound on cached (raw medium, group_idx) routes: the wire's medium strings are not trusted."""

MAX_MEDIUMS: Final = 32
"""Mediums one stream's index keeps apart (its configured capacities' among them). A medium is a
name from the wire: a faulty engine that sends ever new names would otherwise grow the index, the
history (a preallocated hour per medium) and the metrics' series without bound. Real engines send a
handful (GPU, CPU, a disk, remote pools)."""
MAX_GROUPS: Final = 64
"""Groups (``group_idx``) one medium keeps apart, for the same reason: hybrid models have a few."""
OVERFLOW_MEDIUM: Final = "OTHER"
"""Where a stream's events go past :data:`MAX_MEDIUMS` mediums: one medium for all the rest, its
blocks counted exactly there (a block stored under one extra name and removed under another still
leaves it), announced once by a warning."""
OVERFLOW_GROUP: Final = -1
"""Where a medium's events go past :data:`MAX_GROUPS` groups (no engine numbers a group -1)."""

BlockGroup: TypeAlias = tuple[str, int, int, "AbstractSet[Hash]", "dict[Hash, int]"]
"""One (medium, group_idx) of a stream, from :meth:`StreamIndex.block_groups`: ``(medium name,
group_idx, the medium's last announced block size (0: unknown), resident hashes, extra references)``;
a hash's reference count is ``1 + extra.get(hash, 0)``."""


@dataclass(frozen=True, slots=True)
class MediumStats:
    """One medium of one stream. ``stores``/``removes`` count announced blocks (duplicates included)."""

    blocks: int
    tokens: int
    block_size: int
    stores: int
    removes: int
    stores_per_s: float
    removes_per_s: float
    capacity_blocks: int | None

    tier: str
    """The medium's tier (GPU, CPU, DISK, EXTERNAL)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "blocks": self.blocks,
            "tokens": self.tokens,
            "capacity_blocks": self.capacity_blocks,
            "block_size": self.block_size,
            "stores": self.stores,
            "removes": self.removes,
            "stores_per_s": self.stores_per_s,
            "removes_per_s": self.removes_per_s,
        }


class StreamIndex:
    """The index of one stream ``(source, dp_rank)``.

    ``capacity_blocks`` (medium -> blocks, any case) is the configured cache size, shown beside
    the occupancy; its mediums are listed from the start. Other mediums are listed from their first
    stored block on, and stay listed when they empty; a medium only ever removed from (SGLang
    removes offloaded hashes from DISK and EXTERNAL it never announced) is not listed: it never
    held a block, and its removes are counted in ``unknown_removes``.
    Cumulative counters (``stores``, ``removes``, ``unknown_removes``) and each medium's last known
    block size survive clears and resets; only the resident blocks are dropped.
    """

    __slots__ = (
        "_capacity",
        "_digest",
        "_fleet",
        "_mediums",
        "_overflows",
        "_routes",
        "account",
        "dp_rank",
        "observer",
        "source",
        "staleness",
        "started",
        "unknown_removes",
    )

    def __init__(
        self,
        source: str,
        dp_rank: int,
        capacity_blocks: Mapping[str, int] | None = None,
        started: float | None = None,
        fleet: Group | None = None,
        *,
        observer: StoreObserver | None = None,
    ) -> None:
        self.source = source
        self._fleet = fleet if fleet is not None else Group(Medium())
        self.observer = observer
        """Told of the stores the index's pass does not attribute itself, and of GPU removes."""
        self.account: Account | None = None
        """The stream's account at the observer, opened by its first batch."""
        self.started = started
        """When counting began (the gateway's start): rates divide by the time since, up to the
        window. None: as if a whole window had been watched."""
        self.dp_rank = dp_rank
        self.staleness = Staleness()
        """Whether events are missing, and why (unrecovered, history_truncated, undecodable): set by
        a stale notice, cleared by AllBlocksCleared or a restart (the one rule of the ingest too)."""
        self.unknown_removes = 0
        self._capacity = {normalise_medium(m): n for m, n in (capacity_blocks or {}).items()}
        self._mediums: dict[str, Medium] = {
            m: Medium(self._fleet, medium_tier(m) == "GPU") for m in sorted(self._capacity)
        }
        # (raw medium, raw group_idx) -> group: one dict lookup per event on the hot path.
        self._routes: dict[tuple[str | None, int | None], Group] = {}
        self._digest = False  # every group keeps its digest (see digest())
        self._overflows: set[str] = set()  # the bounds this stream went past (warned once each)

    def route(self, medium: str | None, group_idx: int | None) -> Group:
        """The group of a (raw medium, raw group_idx) not yet in the route cache; past the bounds,
        :data:`OVERFLOW_MEDIUM` or :data:`OVERFLOW_GROUP` (both cores' passes ask here)."""
        name = normalise_medium(medium)
        med = self._mediums.get(name)
        if med is None:
            if len(self._mediums) >= MAX_MEDIUMS and name != OVERFLOW_MEDIUM:
                self._overflowed("mediums", MAX_MEDIUMS, name)
                name = OVERFLOW_MEDIUM
                med = self._mediums.get(name)
            if med is None:
                med = self._mediums[name] = Medium(self._fleet, medium_tier(name) == "GPU")
        group = 0 if group_idx is None else group_idx
        if group not in med.groups and len(med.groups) >= MAX_GROUPS:
            self._overflowed(f"groups in {name}", MAX_GROUPS, str(group))
            group = OVERFLOW_GROUP
        grp = med.group(group)
        if self._digest and grp.digest is None:
            grp.track(name, group)
        if len(self._routes) < _ROUTE_CACHE_MAX:
            self._routes[(medium, group_idx)] = grp
        return grp

    def _overflowed(self, what: str, bound: int, name: str) -> None:
        if what not in self._overflows:  # once per stream and kind: the names are the wire's
            self._overflows.add(what)
            where = OVERFLOW_MEDIUM if what == "mediums" else f"group {OVERFLOW_GROUP}"
            logger.warning(
                "stream %s:%d reports more than %d %s (%r among them): the index counts the rest as %s",
                self.source,
                self.dp_rank,
                bound,
                what,
                name[:64],
                where,
            )

    def apply(self, batch: Batch, now: float, replayed: bool = False) -> None:
        """Apply one delivered batch in order; unknown event types are ignored.

        A ``replayed`` batch is history (a catch-up or a gap filled late): it changes the blocks and
        the cumulative counts, but not the per-second rates, which would otherwise spike after
        every start and every recovered gap."""
        apply_batch(self, batch, now, replayed, routes=self._routes, fleet=self._fleet)  # the compiled core's pass

    def clear_blocks(self) -> None:
        """Every medium and group empty (an AllBlocksCleared, a restart); counters stay."""
        for med in self._mediums.values():
            for grp in med.groups.values():
                grp.clear()

    def reset(self) -> None:
        """The publisher restarted: its cache is gone, and so is any doubt about the old state."""
        self.clear_blocks()
        self.staleness.cleared()

    def mark_stale(self, reason: str = "unrecovered") -> None:
        """Events were lost for good: counts may be wrong until the next AllBlocksCleared or reset."""
        self.staleness.mark(reason)

    @property
    def stale(self) -> bool:
        return self.staleness.reason is not None

    @property
    def stale_reason(self) -> str | None:
        return self.staleness.reason

    def refcount(self, block_hash: Hash, medium: str | None = None, group_idx: int | None = None) -> int:
        """References to one block (0 when not resident)."""
        med = self._mediums.get(normalise_medium(medium))
        grp = None if med is None else med.groups.get(0 if group_idx is None else group_idx)
        return 0 if grp is None else grp.refcount(block_hash)

    def tier_sets(self) -> list[tuple[str, AbstractSet[Hash]]]:
        """(tier, live resident hashes) of every medium and group: valid until the next change."""
        return [(medium_tier(name), grp.blocks) for name, med in self._mediums.items() for grp in med.groups.values()]

    def fleet_holds_none(self, hashes: list[Hash]) -> bool:
        """Whether no stream of the fleet (this one included) holds any of ``hashes``: one C-level test."""
        return self._fleet.blocks.isdisjoint(hashes)

    def fleet_holders(self, block_hash: Hash) -> int:
        """How many (stream, medium, group) of the fleet hold ``block_hash``: O(1)."""
        return self._fleet.refcount(block_hash)

    def holds(self, block_hash: Hash) -> bool:
        """Whether some medium and group of the stream holds ``block_hash``: one set lookup each."""
        for med in self._mediums.values():
            for grp in med.groups.values():
                if block_hash in grp.blocks:
                    return True
        return False

    def resident_blocks(self) -> int:
        """Resident blocks of every medium and group summed: O(groups)."""
        return sum(med.resident() for med in self._mediums.values())

    def groups(self, medium: str | None = None) -> dict[int, int]:
        """Resident blocks per group_idx of one medium (groups seen stay listed)."""
        med = self._mediums.get(normalise_medium(medium))
        return {} if med is None else {g: len(grp.blocks) for g, grp in sorted(med.groups.items())}

    def block_groups(self, *, freeze: bool = False) -> list[BlockGroup]:
        """Every (medium, group_idx) the stream has seen, sorted, with its resident hashes.

        O(groups), nothing is copied. ``freeze=False``: the live set and dict, valid until the
        next :meth:`apply` (a synchronous reader such as a lookup); never change them.
        ``freeze=True``: a snapshot that stays as it is for good: the index copies a group before
        its next change (copy on write), so the copy costs only a group that changes while a
        snapshot holds it, once, on the ingest path (about 30 ms per million blocks).
        """
        out: list[BlockGroup] = []
        for name in sorted(self._mediums):
            med = self._mediums[name]
            for group_idx in sorted(med.groups):
                grp = med.groups[group_idx]
                if freeze:
                    grp.shared = True
                out.append((name, group_idx, med.block_size, grp.blocks, grp.extra))
        return out

    def digest(self, mediums: Collection[str] | None = None) -> tuple[int, int]:
        """The state digest of the stream (kvgateway/state/digest.py) and its resident blocks: of
        every medium, or of those ``mediums`` selects (upper-cased names or tiers, as a client's
        ``medium`` filter: a tier name selects its mediums).

        Lazy: the first call turns tracking on for good (each group computes its sum once, O(blocks),
        then keeps it in O(1) per block event); a stream nobody asks about pays nothing."""
        if not self._digest:
            self._digest = True
            for name, med in self._mediums.items():
                for group_idx, grp in med.groups.items():
                    grp.track(name, group_idx)
        total = blocks = 0
        for name, med in self._mediums.items():
            if mediums is None or name in mediums or medium_tier(name) in mediums:
                for grp in med.groups.values():
                    total += grp.digest or 0
                    blocks += len(grp.blocks)
        return total & MASK, blocks

    def medium_counts(self) -> dict[str, tuple[int, int, int]]:
        """Each medium's (block size, stores, removes): what a checkpoint keeps beside the blocks."""
        return {name: (med.block_size, med.stores, med.removes) for name, med in sorted(self._mediums.items())}

    def restore_medium(self, name: str, block_size: int, stores: int, removes: int) -> None:
        """A medium as a checkpoint had it (its blocks come with :meth:`restore_group`)."""
        med = self._mediums.get(name)
        if med is None:
            med = self._mediums[name] = Medium(self._fleet, medium_tier(name) == "GPU")
        med.block_size, med.stores, med.removes = block_size, stores, removes

    def restore_group(self, name: str, group_idx: int, blocks: set[Hash], extra: dict[Hash, int]) -> None:
        """One (medium, group_idx)'s resident hashes as a checkpoint had them."""
        med = self._mediums.get(name)
        if med is None:
            med = self._mediums[name] = Medium(self._fleet, medium_tier(name) == "GPU")
        grp = med.group(group_idx)
        grp.clear()
        grp.restore(blocks, extra)
        self._fleet.store(list(blocks))
        if self._digest:
            grp.track(name, group_idx)

    def medium_stats(self, now: float) -> dict[str, MediumStats]:
        out: dict[str, MediumStats] = {}
        for name in sorted(self._mediums):
            med = self._mediums[name]
            if med.stores == 0 and name not in self._capacity:
                continue  # never held a block: only removes of hashes it never had
            blocks = med.resident()
            stores_per_s, removes_per_s = med.rates(now, self.started)
            out[name] = MediumStats(
                blocks=blocks,
                tokens=blocks * med.block_size,
                block_size=med.block_size,
                stores=med.stores,
                removes=med.removes,
                stores_per_s=stores_per_s,
                removes_per_s=removes_per_s,
                capacity_blocks=self._capacity.get(name),
                tier=medium_tier(name),
            )
        return out

    def snapshot(self, now: float) -> dict[str, Any]:
        """One entry of :meth:`OccupancyIndex.snapshot`'s ``streams``.

        ``mediums`` by the engine's own names; ``tiers`` sums them per tier (see :func:`tier_totals`).
        """
        mediums = {name: stats.to_json() for name, stats in self.medium_stats(now).items()}
        return {
            "source": self.source,
            "dp_rank": self.dp_rank,
            "stale": self.stale,
            "stale_reason": self.stale_reason,
            "unknown_removes": self.unknown_removes,
            "mediums": mediums,
            "tiers": tier_totals(mediums),
        }


def tier_totals(mediums: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Medium entries (``MediumStats.to_json``, or fleet totals per medium) summed per tier.

    Tiers in GPU, CPU, DISK, EXTERNAL order, only those with a medium listed. Each gives
    ``mediums`` (the names summed, sorted), ``blocks``, ``tokens``, ``stores_per_s``,
    ``removes_per_s``, and ``capacity_blocks``: the sum, or null unless every medium of the tier
    has one (a partial sum would mislead).
    """
    tiers: dict[str, dict[str, Any]] = {}
    for name in sorted(mediums, key=lambda m: (tier_rank(medium_tier(m)), m)):
        stats = mediums[name]
        tier = medium_tier(name)
        total = tiers.get(tier)
        if total is None:
            total = tiers[tier] = {
                "mediums": [],
                "blocks": 0,
                "tokens": 0,
                "capacity_blocks": 0,
                "stores_per_s": 0.0,
                "removes_per_s": 0.0,
            }
        total["mediums"].append(name)
        total["blocks"] += stats["blocks"]
        total["tokens"] += stats["tokens"]
        total["stores_per_s"] += stats["stores_per_s"]
        total["removes_per_s"] += stats["removes_per_s"]
        if stats["capacity_blocks"] is None or total["capacity_blocks"] is None:
            total["capacity_blocks"] = None
        else:
            total["capacity_blocks"] += stats["capacity_blocks"]
    return tiers


def _round_rates(entries: Mapping[str, dict[str, Any]]) -> None:
    """Rates (and sums of them) rounded in place to :data:`RATE_DECIMALS`, once every sum is made."""
    for entry in entries.values():
        entry["stores_per_s"] = round(entry["stores_per_s"], RATE_DECIMALS)
        entry["removes_per_s"] = round(entry["removes_per_s"], RATE_DECIMALS)


class OccupancyIndex:
    """Every stream's index. ``capacity`` maps a stream key ``(source, dp_rank)`` to its
    configured ``capacity_blocks`` (medium -> blocks), as ``config.StreamConfig`` holds them."""

    __slots__ = ("_capacity", "_fleet", "_missing_history", "_started", "_streams", "observer")

    def __init__(
        self,
        capacity: Mapping[Stream, Mapping[str, int]] | None = None,
        started: float | None = None,
        observer: StoreObserver | None = None,
    ) -> None:
        self._capacity = dict(capacity or {})
        self._started = started
        self._missing_history: str | None = None  # see history_missing
        self._streams: dict[Stream, StreamIndex] = {}
        # Who holds each hash, fleet-wide: a refcount of the (stream, medium, group) holding it, kept
        # by the groups' own transitions (a set and a side dict, as a group's).
        self._fleet = Group(Medium())
        self.observer = observer
        """Told of each store and remove as it is applied, every stream's (see :class:`StoreObserver`)."""
        for source, dp_rank in sorted(self._capacity):
            self.stream(source, dp_rank)

    def stream(self, source: str, dp_rank: int) -> StreamIndex:
        """The index of one stream, created on first use."""
        key = (source, dp_rank)
        index = self._streams.get(key)
        if index is None:
            index = self._streams[key] = StreamIndex(
                source, dp_rank, self._capacity.get(key), self._started, self._fleet, observer=self.observer
            )
            if self._missing_history is not None:
                index.mark_stale(self._missing_history)
        return index

    def history_missing(self, reason: str) -> None:
        """The log this index follows no longer holds its beginning, and nothing restored what it
        held: every stream, those known now and those seen later, is stale (``reason``) until its
        next AllBlocksCleared or restart makes it whole."""
        self._missing_history = reason
        for index in self._streams.values():
            index.mark_stale(reason)

    def streams(self) -> Iterator[StreamIndex]:
        """Every stream, sorted by (source, dp_rank)."""
        for key in sorted(self._streams):
            yield self._streams[key]

    def apply(self, source: str, dp_rank: int, batch: Batch, now: float, replayed: bool = False) -> None:
        self.stream(source, dp_rank).apply(batch, now, replayed)

    @property
    def holders(self) -> AbstractSet[Hash]:
        """Every hash some stream, medium and group holds: the fleet's holders, live (the same set
        for the index's lifetime: the learner keeps it). Never change it."""
        return self._fleet.blocks

    def fleet_tally(self) -> tuple[int, int]:
        """(the hashes some stream, medium and group holds; those two or more of them hold): O(1),
        the fleet's holders and their extra references, kept as they change. A fleet count
        (:class:`kvgateway.state.lookup.FleetCount`) answers from it where every stream holds one
        and the same (medium, group_idx)."""
        fleet = self._fleet
        return len(fleet.blocks), len(fleet.extra)

    def holds(self, stream: Stream, block_hash: Hash) -> bool:
        """Whether ``stream`` holds ``block_hash`` in some medium and group (the routers' learner
        asks at each eviction): the fleet's holders first, one set lookup that answers the common
        case (a block no stream holds any more), then the stream's own groups."""
        if block_hash not in self._fleet.blocks:
            return False
        index = self._streams.get(stream)
        return index is not None and index.holds(block_hash)

    def holds_any(self) -> bool:
        """Whether some stream, medium and group holds a block: O(1), the fleet's holders not empty
        (the routers ask it four times a second while a count found none; :meth:`resident_blocks`
        is O(groups): with 2,000 streams 0.35% of a core, idle)."""
        return len(self._fleet.blocks) > 0

    def resident_blocks(self) -> int:
        """Resident blocks of every stream, medium and group summed: O(groups), no hash visited."""
        return sum(index.resident_blocks() for index in self._streams.values())

    def follow(self, entry: Entry) -> None:
        """Apply what the ordered log says (a batch, a restart, a stale mark): the index follows the log."""
        record = entry.record
        if type(record) is BatchRecord:
            index = self._streams.get(record.stream)
            if index is None:
                index = self.stream(*record.stream)
            # StreamIndex.apply's call, made here: two Python frames fewer a batch. Replayed history
            # stays out of the rates.
            apply_batch(index, record.batch, record.received, record.replayed, routes=index._routes, fleet=self._fleet)
        elif type(record) is NoticeRecord:
            if record.kind == "restart":
                self.stream(*record.stream).reset()
            elif record.kind == "stale":
                self.stream(*record.stream).staleness.notice(record.kind, record.fields)

    def snapshot(self, offset: int, now: float, select: Callable[[str, int], bool] | None = None) -> dict[str, Any]:
        """The /v1/occupancy document. ``offset`` is the hub offset the index reflects; ``select``
        (source, dp_rank): the streams listed and summed (None: every stream).

        ``totals`` sums every stream per medium; its ``capacity_blocks`` is null unless every
        stream listing that medium has one configured (a partial sum would mislead). ``tiers``
        sums ``totals`` per tier (:func:`tier_totals`), with ``streams``: how many streams list
        a medium of that tier.
        """
        streams = [
            index.snapshot(now) for index in self.streams() if select is None or select(index.source, index.dp_rank)
        ]
        totals: dict[str, dict[str, Any]] = {}
        for entry in streams:
            for name, stats in entry["mediums"].items():
                total = totals.get(name)
                if total is None:
                    total = totals[name] = {
                        "tier": stats["tier"],
                        "blocks": 0,
                        "tokens": 0,
                        "capacity_blocks": 0,
                        "stores_per_s": 0.0,
                        "removes_per_s": 0.0,
                        "streams": 0,
                    }
                total["blocks"] += stats["blocks"]
                total["tokens"] += stats["tokens"]
                total["stores_per_s"] += stats["stores_per_s"]
                total["removes_per_s"] += stats["removes_per_s"]
                total["streams"] += 1
                if stats["capacity_blocks"] is None or total["capacity_blocks"] is None:
                    total["capacity_blocks"] = None
                else:
                    total["capacity_blocks"] += stats["capacity_blocks"]
        tiers = tier_totals(totals)
        for tier, total in tiers.items():
            total["streams"] = sum(tier in entry["tiers"] for entry in streams)
        # rounded as rendered, after every sum (a sum of rounded parts would drift from the total)
        for entry in streams:
            _round_rates(entry["mediums"])
            _round_rates(entry["tiers"])
        _round_rates(totals)
        _round_rates(tiers)
        return {
            "offset": offset,
            "streams": streams,
            "totals": {name: totals[name] for name in sorted(totals)},
            "tiers": tiers,
        }
