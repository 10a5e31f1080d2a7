# cython: language_level=3, boundscheck=False, wraparound=False, annotation_typing=False
"""The compiled pass of the index: :mod:`kvgateway.state._apply_py`'s ``Group``, ``Medium`` and
``apply_batch``, step for step, as extension types.

The same sets and dicts (a group's ``blocks`` and ``extra``, the fleet's holders), the same
operations on them in the same order, the same calls to the observer: the index's state, snapshots,
digests and the attribution's counts are the reference's (checked by
tests/unit/state/test_apply_differential.py). What changes is the cost around the set operations:
the groups' and mediums' fields are C struct members, their methods C calls, and the per-event loop
runs without the interpreter.

Counts are Python objects where a value comes from the wire or a clock unbounded (a block size, a
second), so no value a Python int holds can overflow here.
"""

from collections import Counter
import math

from kvgateway.engine.wire import AllBlocksCleared, BlockRemoved, BlockStored
from kvgateway.state._apply_py import (
    COMPARE_ALL,
    COMPARE_NONE,
    DEFAULT_REFETCH_WINDOW_SECONDS,
    MAX_EVICTED,
    RATE_WINDOW_SECONDS,
)
from kvgateway.state.digest import MASK, elements_sum, prefix_state

_NEVER = -(2**62)
cdef Py_ssize_t _WINDOW = RATE_WINDOW_SECONDS
cdef int _COMPARE_ALL = COMPARE_ALL


cdef class Evictions:
    """The compiled twin of :class:`kvgateway.state._apply_py.Evictions` (see there): the same two
    dicts, filled and tested one hash at a time in C."""

    cdef public object window
    cdef public object bound
    cdef public dict current
    cdef public dict previous
    cdef public object since
    cdef public object dropped

    def __init__(self, window=DEFAULT_REFETCH_WINDOW_SECONDS, bound=MAX_EVICTED):
        self.window = window
        self.bound = bound
        self.current = {}
        self.previous = {}
        self.since = -math.inf
        self.dropped = 0

    @property
    def size(self):
        return len(self.current) + len(self.previous)

    cpdef add(self, hashes, ts):
        cdef dict current
        bound = self.bound
        if ts - self.since > self.window:
            self.previous, self.current, self.since = self.current, {}, ts
        current = self.current
        for h in hashes:  # the reference's update(fromkeys): a repeat sets the same value again
            current[h] = ts
        if len(self.current) + len(self.previous) > bound:
            self.dropped += len(self.previous)
            self.previous = {}
            if len(self.current) > bound:
                self.dropped += len(self.current)
                self.current = {}

    cpdef bint none_of(self, hashes) except -1:
        cdef dict current = self.current
        cdef dict previous = self.previous
        for h in hashes:
            if h in current or h in previous:
                return False
        return True

    def take(self, h):
        evicted_at = self.current.pop(h, None)
        previous = self.previous.pop(h, None)
        return previous if evicted_at is None else evicted_at


cdef bint _fresh(set fleet, object evicted, object hashes) except -1:
    """No hash held anywhere in the fleet nor evicted lately (the reference's two tests, one loop)."""
    cdef dict current
    cdef dict previous
    if type(evicted) is not Evictions:
        return fleet.isdisjoint(hashes) and evicted.none_of(hashes)
    current = (<Evictions>evicted).current
    previous = (<Evictions>evicted).previous
    for h in hashes:
        if h in fleet:
            return False
    for h in hashes:
        if h in current or h in previous:
            return False
    return True


cdef class Group:
    """The compiled twin of :class:`kvgateway.state._apply_py.Group` (see there)."""

    cdef public set blocks
    cdef public dict extra
    cdef public Medium medium
    cdef public bint shared
    cdef public Group fleet
    cdef public object digest
    cdef public object prefix

    def __init__(self, medium, fleet=None):
        self.blocks = set()
        self.extra = {}
        self.medium = medium
        self.shared = False
        self.fleet = fleet
        self.digest = None
        self.prefix = 0

    def track(self, medium, group_idx):
        self.prefix = prefix_state(medium, group_idx)
        self.digest = elements_sum(self.prefix, self.blocks)

    cdef void _own(self):
        self.blocks = set(self.blocks)
        self.extra = dict(self.extra)
        self.shared = False

    cpdef store(self, hashes):
        cdef Group fleet = self.fleet
        cdef set blocks
        cdef dict extra
        cdef list entered
        cdef Py_ssize_t before
        if fleet is not None and fleet.blocks.isdisjoint(hashes):
            self.store_new(hashes)  # the common case: held nowhere in the fleet
            return
        if self.shared:
            self._own()
        blocks = self.blocks
        if self.digest is not None:
            self.digest = (self.digest + elements_sum(self.prefix, set(hashes).difference(blocks))) & MASK
        if blocks.isdisjoint(hashes):
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

    cdef void _repeats(self, hashes) except *:
        cdef dict extra = self.extra
        for h, n in Counter(hashes).items():
            if n > 1:
                extra[h] = extra.get(h, 0) + n - 1

    cpdef store_new(self, hashes):
        cdef set blocks
        cdef set held
        cdef Py_ssize_t before
        if self.shared:
            self._own()
        blocks = self.blocks
        if self.digest is not None:
            self.digest = (self.digest + elements_sum(self.prefix, set(hashes))) & MASK
        before = len(blocks)
        if self.fleet is None:
            blocks.update(hashes)
        else:  # both sets in one loop (a repeat adds nothing to either, as the reference's update)
            held = self.fleet.blocks
            for h in hashes:
                blocks.add(h)
                held.add(h)
        if len(blocks) - before != len(hashes):
            self._repeats(hashes)

    cpdef Py_ssize_t remove(self, hashes) except -1:
        cdef set was
        cdef Py_ssize_t unknown
        if self.digest is None:
            return self._take(hashes)
        was = self.blocks.intersection(hashes)
        unknown = self._take(hashes)
        self.digest = (self.digest - elements_sum(self.prefix, was.difference(self.blocks))) & MASK
        return unknown

    cdef Py_ssize_t _take(self, hashes) except -1:
        cdef set blocks, gone, held
        cdef dict extra
        cdef Group fleet
        cdef Py_ssize_t before, unknown
        cdef list left
        if self.shared:
            self._own()
        blocks = self.blocks
        extra = self.extra
        if not extra or extra.keys().isdisjoint(hashes):
            before = len(blocks)
            fleet = self.fleet
            if fleet is None:
                blocks.difference_update(hashes)
            elif not fleet.extra:
                # every hash this group held leaves the fleet too (no other group holds any): one
                # loop, the reference's set differences hash by hash
                held = fleet.blocks
                for h in hashes:
                    if h in blocks:
                        blocks.discard(h)
                        held.discard(h)
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

    def refcount(self, h):
        return 1 + self.extra.get(h, 0) if h in self.blocks else 0

    def clear(self):
        if self.fleet is not None and self.blocks:
            self.fleet.remove(list(self.blocks))
        self.blocks = set()
        self.extra = {}
        self.shared = False
        if self.digest is not None:
            self.digest = 0


cdef class Medium:
    """The compiled twin of :class:`kvgateway.state._apply_py.Medium` (see there)."""

    cdef public Group fleet
    cdef public bint gpu
    cdef public dict groups
    cdef public object block_size
    cdef public object stores
    cdef public object removes
    cdef public list bucket_sec
    cdef public list bucket_stores
    cdef public list bucket_removes
    cdef public object cur_sec
    cdef public object cur_stores
    cdef public object cur_removes

    def __init__(self, fleet=None, gpu=False):
        self.fleet = fleet
        self.gpu = gpu
        self.groups = {}
        self.block_size = 0
        self.stores = 0
        self.removes = 0
        self.bucket_sec = [_NEVER] * _WINDOW
        self.bucket_stores = [0] * _WINDOW
        self.bucket_removes = [0] * _WINDOW
        self.cur_sec = _NEVER
        self.cur_stores = 0
        self.cur_removes = 0

    cpdef Group group(self, group_idx):
        cdef Group grp = self.groups.get(group_idx)
        if grp is None:
            grp = self.groups[group_idx] = Group(self, self.fleet)
        return grp

    cpdef roll(self, sec):
        if sec < self.cur_sec:
            return
        i = self.cur_sec % _WINDOW
        self.bucket_sec[i] = self.cur_sec
        self.bucket_stores[i] = self.cur_stores
        self.bucket_removes[i] = self.cur_removes
        self.cur_sec = sec
        self.cur_stores = self.cur_removes = 0

    def rates(self, now, started=None):
        covered = RATE_WINDOW_SECONDS
        if started is not None:
            covered = min(float(RATE_WINDOW_SECONDS), max(1.0, now - started))
        now_sec = math.floor(now)
        oldest = now_sec - RATE_WINDOW_SECONDS
        stores = removes = 0
        if oldest < self.cur_sec <= now_sec:
            stores, removes = self.cur_stores, self.cur_removes
        for sec, s, r in zip(self.bucket_sec, self.bucket_stores, self.bucket_removes, strict=True):
            if oldest < sec <= now_sec:
                stores += s
                removes += r
        return stores / covered, removes / covered

    def resident(self):
        return sum(len((<Group>grp).blocks) for grp in self.groups.values())


cdef bint _new_store(index, event, account, int compare, Group fleet) except -1:
    """:func:`kvgateway.state._apply_py._new_store`, the sets tested in one C loop."""
    size = event.block_size
    if size > 0:
        account.block_size = size
    return (
        index.staleness.reason is None
        and not (event.token_ids and (compare == _COMPARE_ALL or (compare and event.parent_block_hash is None)))
        and _fresh(fleet.blocks, account.evicted, event.block_hashes)
    )


def apply_batch(index, batch, now, bint replayed, *, dict routes, Group fleet):
    """:func:`kvgateway.state._apply_py.apply_batch`, step for step."""
    cdef Group grp
    cdef Medium med
    cdef Py_ssize_t n
    cdef long long fresh = 0
    cdef int compare
    cdef bint live = not replayed
    sec = math.floor(now)
    observer = index.observer
    account = index.account
    if account is None and observer is not None:
        account = index.account = observer.account((index.source, index.dp_rank))
    compare = COMPARE_NONE if observer is None else observer.comparing()
    tokens = 0
    for event in batch.events:
        kind = type(event)
        if kind is BlockStored or kind is BlockRemoved:
            extra = event.extra
            group_idx = extra.get("group_idx") if extra else None
            if type(group_idx) is not int:
                group_idx = None
            grp = routes.get((event.medium, group_idx))
            if grp is None:
                grp = index.route(event.medium, group_idx)
            hashes = event.block_hashes
            n = len(hashes)
            med = grp.medium
            if live and sec != med.cur_sec:
                med.roll(sec)
            if kind is BlockStored:
                if account is None or not med.gpu or not n:
                    grp.store(hashes)
                elif _new_store(index, event, account, compare, fleet):
                    fresh += n
                    tokens += n * account.block_size
                    grp.store_new(hashes)
                else:
                    if observer is not None:
                        observer.stored(index, event, batch.ts, now)
                        compare = observer.comparing()
                    grp.store(hashes)
                size = event.block_size
                if size > 0:
                    med.block_size = size
                med.stores += n
                if live:
                    med.cur_stores += n
            else:
                index.unknown_removes += grp.remove(hashes)
                if account is not None and med.gpu and n:
                    evicted = account.evicted
                    if type(evicted) is Evictions:
                        (<Evictions>evicted).add(hashes, batch.ts)
                    else:
                        evicted.add(hashes, batch.ts)
                med.removes += n
                if live:
                    med.cur_removes += n
        elif kind is AllBlocksCleared:
            index.clear_blocks()
            index.staleness.cleared()
    if fresh and account is not None:
        account.add_new(fresh, tokens, now)
