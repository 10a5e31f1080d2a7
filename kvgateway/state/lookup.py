"""Prefix lookup for routers, by block hashes or by tokens, and fleet-wide block facts. Sans-I/O.

``POST /v1/lookup`` asks, for one request's chain of blocks, how many *leading* blocks each stream
``(source, dp_rank)`` holds: the prefix an engine would not have to compute again.

By hashes
    ``{"block_hashes": ["...", ...], "group_idx": null}``: the chain as the stream renders hashes
    (:func:`parse_hash` inverts :func:`kvgateway.protocol.render.hash_text`). :func:`lookup_hashes`.

By tokens
    ``{"token_ids": [...], "lora_name": null, "extra_keys": null, "group_idx": null}``: no engine's
    hash function is re-implemented. Every ``BlockStored`` announces ``parent_block_hash``, each
    block's ``token_ids`` (``block_size`` per block) and the resulting ``block_hashes``;
    :class:`ChainLearner` remembers "(parent hash, the block's tokens, LoRA name, extra key) ->
    hash" (kvgateway/state/learner.py) and :func:`lookup_tokens` walks it per stream, then counts
    like a lookup by hashes.

The answer (both kinds)::

    {"offset": N, "streams": [{"source": "a", "dp_rank": 0, "blocks": 3, "tokens": 48,
      "mediums": {"GPU": {"blocks": 3, "tokens": 48}, "CPU": {"blocks": 1, "tokens": 16}},
      "stale": false}, ...]}

- ``stale``: the stream's index misses events (``/v1/occupancy`` says why): its count may be short
  or long. A router should not trust it over a whole stream's.

- ``blocks``: leading blocks of the chain resident in *some* medium (block 0 on GPU, block 1 only
  on CPU: 2); each medium's ``blocks``: leading blocks resident in that medium. ``mediums`` lists
  the mediums (upper-cased names, as ``/v1/occupancy``) with at least one leading block.
- ``tokens``: ``blocks x block size``: by tokens the block size the chain was learned with; by
  hashes the medium's last announced block size, else the stream's (first known in tier order),
  else ``null`` (only placeholder events seen).
- ``group_idx``: ``null`` (default) counts a block as resident in a medium when *any* KV-cache
  group of that medium holds its hash; an int counts that group only (hybrid models: the full
  attention group gives the exact prefix, any-group is an upper bound when sliding-window or Mamba
  groups dropped early blocks). Events without a group_idx are group 0.
- Streams sorted best first (``blocks``, then ``tokens``, descending; then source, dp_rank), so
  streams with 0 come last. Every stream passed in is listed.

Limits (:class:`LookupLimits`) are checked by :func:`parse_request`, which raises
:class:`BadLookup` with a one-line reason (the route answers 400 with it).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from kvgateway.engine.mediums import medium_tier, tier_rank
from kvgateway.engine.wire import Hash
from kvgateway.state.learner import DEFAULT_MAX_LEARNED_BLOCKS, ChainLearner, block_digests
from kvgateway.state.occupancy import OccupancyIndex, StreamIndex

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_LEARNED_BLOCKS",
    "BadLookup",
    "ChainLearner",
    "FleetCount",
    "HashQuery",
    "LookupLimits",
    "TokenBucket",
    "TokenQuery",
    "block_digests",
    "fleet_facts",
    "lookup",
    "lookup_hashes",
    "lookup_tokens",
    "parse_hash",
    "parse_request",
]


class BadLookup(ValueError):
    """A lookup body the gateway refuses; the text is one line (the route's 400 ``error``)."""


# --- limits and request parsing -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LookupLimits:
    """Bounds on one ``POST /v1/lookup`` body."""

    max_body_bytes: int = 1024 * 1024
    """Bytes of JSON (checked before decoding)."""
    max_blocks: int = 4096
    """Hashes in ``block_hashes`` (a 64k-token context in 16-token blocks)."""
    max_tokens: int = 262_144
    """Entries in ``token_ids``."""
    max_hash_chars: int = 130
    """Characters of one hash string (64-byte hashes in hex are 128; a u64 is 20 digits)."""


DEFAULT_LIMITS: Final = LookupLimits()

_DECIMAL: Final = re.compile(r"0|-?[1-9][0-9]*")
_HEX: Final = re.compile(r"(?:[0-9a-f]{2})+")


def parse_hash(text: str, max_chars: int = DEFAULT_LIMITS.max_hash_chars) -> tuple[Hash, ...]:
    """Every hash the stream renders as ``text`` (the inverse of :func:`kvgateway.protocol.render.hash_text`).

    Decimal digits (``-`` for negative, no leading zero) are an integer hash, an even number of
    lowercase hex digits a bytes hash. A string that is both (``"1234"``: the int 1234 and the
    bytes ``12 34``) gives both: the stream shows them alike, so both count. Anything else (upper
    case, ``+``, spaces, leading zeros, empty) is the rendering of no hash: :class:`BadLookup`.
    """
    if len(text) > max_chars:
        raise BadLookup(f"a hash of {len(text)} characters (at most {max_chars})")
    found: list[Hash] = []
    if _DECIMAL.fullmatch(text):
        found.append(int(text))
    if _HEX.fullmatch(text):
        found.append(bytes.fromhex(text))
    if not found:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise BadLookup(f"{shown!r} is not a hash as the stream renders it (decimal integer or lowercase hex)")
    return tuple(found)


@dataclass(frozen=True, slots=True)
class HashQuery:
    """A lookup by hashes: each position's candidates (:func:`parse_hash`)."""

    chain: list[tuple[Hash, ...]]
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class TokenQuery:
    """A lookup by tokens."""

    token_ids: list[int]
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


_TOKEN_MAX: Final = 2**63


class _Body(msgspec.Struct, forbid_unknown_fields=True):
    block_hashes: list[str] | None = None
    token_ids: list[int] | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


_body_decoder: Final = msgspec.json.Decoder(_Body)


def parse_request(body: bytes, limits: LookupLimits = DEFAULT_LIMITS) -> HashQuery | TokenQuery:
    """A ``POST /v1/lookup`` body, checked against ``limits``; :class:`BadLookup` otherwise.

    Exactly one of ``block_hashes`` (strings) and ``token_ids`` (integers >= 0); ``lora_name``
    (string or null) and ``extra_keys`` (null, or a list with one entry per block: entry i is
    block i's extra key as the engine sends it, blocks past its end have none) go with tokens
    only; ``group_idx`` (null or an int >= 0) with both. Unknown keys are refused.
    """
    if len(body) > limits.max_body_bytes:
        raise BadLookup(f"body of {len(body)} bytes exceeds the {limits.max_body_bytes}-byte limit")
    try:
        parsed = _body_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _wrong_type(body, exc) from None
    except msgspec.DecodeError as exc:
        raise BadLookup(f"invalid JSON: {_one_line(exc)}") from None
    if parsed.group_idx is not None and parsed.group_idx < 0:
        raise BadLookup(f"group_idx: expected null or an integer >= 0, got {parsed.group_idx}")
    if (parsed.block_hashes is None) == (parsed.token_ids is None):
        raise BadLookup("expected exactly one of block_hashes and token_ids")
    if parsed.block_hashes is not None:
        if parsed.lora_name is not None or parsed.extra_keys is not None:
            raise BadLookup("lora_name and extra_keys go with token_ids, not block_hashes")
        hashes = parsed.block_hashes
        if len(hashes) > limits.max_blocks:
            raise BadLookup(f"block_hashes: {len(hashes)} hashes (at most {limits.max_blocks})")
        chain = []
        for i, text in enumerate(hashes):
            try:
                chain.append(parse_hash(text, limits.max_hash_chars))
            except BadLookup as exc:
                raise BadLookup(f"block_hashes[{i}]: {exc}") from None
        return HashQuery(chain, parsed.group_idx)
    tokens = parsed.token_ids
    assert tokens is not None
    if len(tokens) > limits.max_tokens:
        raise BadLookup(f"token_ids: {len(tokens)} tokens (at most {limits.max_tokens})")
    for i, token in enumerate(tokens):
        if not 0 <= token < _TOKEN_MAX:
            raise BadLookup(f"token_ids[{i}]: expected an integer >= 0, got {token}")
    if parsed.extra_keys is not None and len(parsed.extra_keys) > limits.max_tokens:
        raise BadLookup(f"extra_keys: {len(parsed.extra_keys)} entries (at most {limits.max_tokens})")
    return TokenQuery(tokens, parsed.lora_name, parsed.extra_keys, parsed.group_idx)


_HASH_AS_NUMBER: Final = re.compile(r"got `(?:int|float)` - at `\$\.(block_hashes\[\d+\])`$")


def _wrong_type(body: bytes, exc: msgspec.ValidationError) -> BadLookup:
    """The typed decoder stops at the first value of the wrong type, before it reads the rest:
    ``{"block_hashes": [1,2`` is invalid JSON first, and a hash given as a number is the common
    mistake (hashes are 64-bit and more: JSON numbers lose them, so they are decimal strings)."""
    try:
        msgspec.json.decode(body)
    except msgspec.DecodeError as invalid:
        return BadLookup(f"invalid JSON: {_one_line(invalid)}")
    text = _one_line(exc)
    number = _HASH_AS_NUMBER.search(text)
    if number:
        return BadLookup(f'{number[1]}: hashes are decimal strings ("123456789"), got a number')
    return BadLookup(text)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class TokenBucket:
    """A rate limit: ``rate`` lookups per second on average, bursts of ``burst``. Sans-I/O."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at: float | None = None

    def allow(self, now: float) -> bool:
        """Take one token if there is one (``now``: seconds, any monotonic clock)."""
        if self._at is not None and now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        if self._at is None or now > self._at:
            self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


# --- lookup by hashes -----------------------------------------------------------------------


def _prefix(chain: Sequence[tuple[Hash, ...]], sets: list[AbstractSet[Hash]], start: int = 0) -> int:
    """How many leading positions from ``start`` have a candidate in one of ``sets``, plus ``start``."""
    n = start
    if len(sets) == 1:
        held = sets[0]
        for candidates in itertools.islice(chain, start, None):
            for candidate in candidates:
                if candidate in held:
                    break
            else:
                return n
            n += 1
        return n
    for candidates in itertools.islice(chain, start, None):
        if not any(candidate in held for held in sets for candidate in candidates):
            return n
        n += 1
    return n


def _tokens(blocks: int, size: int | None) -> int | None:
    return None if size is None else blocks * size


def _stream_answer(
    index: StreamIndex, chain: Sequence[tuple[Hash, ...]], group_idx: int | None, block_size: int | None
) -> dict[str, Any]:
    """One stream's entry. ``block_size``: the chain's own (by tokens), or None: the mediums'."""
    mediums: dict[str, list[AbstractSet[Hash]]] = {}
    sizes: dict[str, int] = {}
    for medium, group, size, blocks, _extra in index.block_groups():
        if group_idx is None or group == group_idx:
            mediums.setdefault(medium, []).append(blocks)
        sizes[medium] = size
    per_medium = {medium: _prefix(chain, sets) for medium, sets in mediums.items()}
    best = max(per_medium.values(), default=0)
    if best < len(chain) and len(mediums) > 1:
        best = _prefix(chain, [held for sets in mediums.values() for held in sets], best)
    stream_size = block_size
    if stream_size is None:
        known = sorted((tier_rank(medium_tier(m)), m) for m, size in sizes.items() if size > 0)
        stream_size = sizes[known[0][1]] if known else None
    listed = {}
    for medium in sorted(per_medium, key=lambda m: (tier_rank(medium_tier(m)), m)):
        count = per_medium[medium]
        if count:
            medium_size = block_size if block_size is not None else (sizes[medium] or stream_size)
            listed[medium] = {"blocks": count, "tokens": _tokens(count, medium_size)}
    return {
        "source": index.source,
        "dp_rank": index.dp_rank,
        "blocks": best,
        "tokens": _tokens(best, stream_size),
        "mediums": listed,
        "stale": index.stale,
    }


def _sorted(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(entries, key=lambda e: (-e["blocks"], -(e["tokens"] or 0), e["source"], e["dp_rank"]))


def lookup_hashes(
    indexes: Iterable[StreamIndex], chain: Sequence[tuple[Hash, ...]], offset: int, group_idx: int | None = None
) -> dict[str, Any]:
    """The answer for a chain of hash candidates (:func:`parse_hash` of each string), at ``offset``.

    Cost: per stream and medium, one set lookup per leading block (plus one per group and
    candidate): microseconds. Synchronous, on the live index (call it between two applies).
    """
    return {"offset": offset, "streams": _sorted([_stream_answer(i, chain, group_idx, None) for i in indexes])}


# --- lookup by tokens (the learned chains: kvgateway/state/learner.py) ---------------------------


def lookup_tokens(
    indexes: Iterable[StreamIndex], learner: ChainLearner, query: TokenQuery, offset: int
) -> dict[str, Any]:
    """The answer for a lookup by tokens, at ``offset``.

    Per stream and block size it taught with: the learned chain of the query's full blocks, then
    counted like a lookup by hashes; ``tokens`` uses that block size (the stream's best size wins).
    A stream that taught nothing (or not these blocks) has 0. Cost: one tuple hash per block
    and block size (shared by the streams), one dict lookup per stream and learned block.
    """
    digests: dict[int, list[int]] = {}
    entries = []
    for index in indexes:
        best: dict[str, Any] | None = None
        for size in learner.block_sizes(index.source, index.dp_rank):
            if size not in digests:
                digests[size] = block_digests(query.token_ids, size, query.lora_name, query.extra_keys)
            hashes = learner.chain(index.source, index.dp_rank, digests[size])
            entry = _stream_answer(index, [(h,) for h in hashes], query.group_idx, size)
            if best is None or (entry["blocks"], entry["tokens"]) > (best["blocks"], best["tokens"]):
                best = entry
        if best is None:
            best = {
                "source": index.source,
                "dp_rank": index.dp_rank,
                "blocks": 0,
                "tokens": 0,
                "mediums": {},
                "stale": index.stale,
            }
        entries.append(best)
    return {"offset": offset, "streams": _sorted(entries)}


def lookup(
    indexes: Iterable[StreamIndex], learner: ChainLearner, query: HashQuery | TokenQuery, offset: int
) -> dict[str, Any]:
    """Either kind of query (:func:`parse_request`)."""
    if isinstance(query, HashQuery):
        return lookup_hashes(indexes, query.chain, offset, query.group_idx)
    return lookup_tokens(indexes, learner, query, offset)


# --- fleet facts ----------------------------------------------------------------------------


class FleetCount:
    """Blocks held by more than one stream, and the fleet's distinct blocks; computed in steps.

    A block is (group_idx, hash) within a medium: the same hash in another group is another block.
    Per medium name: ``distinct_blocks`` (held by some stream) and ``shared_blocks`` (held by two
    or more streams); overall the same over every medium (a block on A's GPU and B's CPU is shared;
    on A's GPU and A's CPU it is not).

    Cost: O(resident blocks), in C set operations (about 0.1 s per million blocks on one core);
    transient memory: sets of the distinct hashes (about 40 bytes each). Built on frozen snapshots
    (:meth:`kvgateway.state.occupancy.StreamIndex.block_groups`), so :meth:`step` can be interleaved with
    the event loop (at most ``step_blocks`` blocks of one stream's group and medium per step,
    however large the group) and the result is the fleet at construction. Meant to be refreshed
    every scrape interval or so, not per request.

    With ``holders`` (the index the streams belong to), a fleet whose streams all hold one and the
    same (medium, group_idx), as a GPU-only fleet of one KV-cache group does, is answered at once
    from the index's fleet holders (:meth:`OccupancyIndex.fleet_tally`: the hashes some group holds,
    and those two or more groups hold, counted as they change): O(1), no hash visited, nothing
    frozen. The count in steps made a set of every distinct hash each refresh, and froze every
    group, copied on its next change: a burst of transient objects every 15 s that spread the heap
    (docs/performance.md, "5. Memory, round thirteen").
    """

    __slots__ = ("_all", "_left", "_medium", "_steps", "_tally")

    def __init__(
        self, indexes: Iterable[StreamIndex], step_blocks: int = 16384, *, holders: OccupancyIndex | None = None
    ) -> None:
        if step_blocks < 1:
            raise ValueError(f"step_blocks must be at least 1, got {step_blocks}")
        indexes = list(indexes)
        self._medium: dict[str, dict[int, tuple[set[Hash], set[Hash]]]] = {}
        self._all: dict[int, tuple[set[Hash], set[Hash]]] = {}
        self._left = 0
        self._steps: Iterator[None] = iter(())
        self._tally = None if holders is None else _tally(indexes, holders)
        if self._tally is not None:
            return
        todo: list[tuple[int, list[tuple[str, AbstractSet[Hash]]]]] = []
        for index in indexes:
            by_group: dict[int, list[tuple[str, AbstractSet[Hash]]]] = {}
            for medium, group, _size, blocks, _extra in index.block_groups(freeze=True):
                by_group.setdefault(group, []).append((medium, blocks))
            todo.extend(by_group.items())
        for group, parts in todo:  # listed even when empty, as the index lists them
            self._all.setdefault(group, (set(), set()))
            for medium, _blocks in parts:
                self._medium.setdefault(medium, {}).setdefault(group, (set(), set()))
        self._left = sum(len(blocks) for _, parts in todo for _, blocks in parts)
        self._steps = self._count(todo, step_blocks)

    @staticmethod
    def _add(seen_multi: tuple[set[Hash], set[Hash]], blocks: set[Hash]) -> None:
        seen, multi = seen_multi
        multi |= seen & blocks
        seen |= blocks

    def _count(self, todo: list[tuple[int, list[tuple[str, AbstractSet[Hash]]]]], step_blocks: int) -> Iterator[None]:
        for group, parts in todo:
            every = self._all[group]
            mine: set[Hash] = set()  # this stream's hashes of the group so far, any medium
            for medium, blocks in parts:
                per = self._medium[medium][group]
                hashes = iter(blocks)
                while chunk := set(itertools.islice(hashes, step_blocks)):
                    self._add(per, chunk)
                    if len(parts) == 1:
                        self._add(every, chunk)
                    else:  # a hash on this stream's GPU and on its CPU is one block of the stream
                        new = chunk - mine
                        mine |= new
                        self._add(every, new)
                    self._left -= len(chunk)
                    yield

    def step(self) -> bool:
        """Count at most ``step_blocks`` blocks; True when everything is counted."""
        if self._left:
            next(self._steps, None)
        return not self._left

    def result(self) -> dict[str, Any]:
        """``{"distinct_blocks", "shared_blocks", "mediums": {name: {"distinct_blocks", "shared_blocks"}}}``."""
        while not self.step():
            pass
        if self._tally is not None:
            medium, distinct, shared = self._tally
            counts = {"distinct_blocks": distinct, "shared_blocks": shared}
            return {**counts, "mediums": {medium: dict(counts)}}
        return {
            "distinct_blocks": sum(len(seen) for seen, _ in self._all.values()),
            "shared_blocks": sum(len(multi) for _, multi in self._all.values()),
            "mediums": {
                medium: {
                    "distinct_blocks": sum(len(seen) for seen, _ in groups.values()),
                    "shared_blocks": sum(len(multi) for _, multi in groups.values()),
                }
                for medium, groups in sorted(self._medium.items(), key=lambda m: (tier_rank(medium_tier(m[0])), m[0]))
            },
        }


def _tally(indexes: list[StreamIndex], holders: OccupancyIndex) -> tuple[str, int, int] | None:
    """(medium, distinct, shared) from the fleet's holders, where every stream holds the same single
    (medium, group_idx) or none: then a hash's groups are its streams, and the holders' counts are
    the fleet count's. None otherwise (mediums or groups apart: counted in steps)."""
    kinds = {(medium, group) for index in indexes for medium, group, _size, _blocks, _extra in index.block_groups()}
    if len(kinds) != 1:
        return None
    ((medium, _group),) = kinds
    distinct, shared = holders.fleet_tally()
    return medium, distinct, shared


def fleet_facts(indexes: Iterable[StreamIndex]) -> dict[str, Any]:
    """:class:`FleetCount` in one go."""
    return FleetCount(indexes).result()
