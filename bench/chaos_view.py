"""What one client of :mod:`bench.chaos` knows, without I/O: the messages it received, checked as
they come, and the model a client keeps from them (docs/protocol.md, "Writing a client").

- **Offsets**: an unfiltered client sees every offset once, +1 per message, across reconnects; a
  resume's hello must be ``recovered: true`` at the client's last offset.
- **Deliveries**: per engine stream and engine process (a ``restart`` notice starts the next), the
  batches' seqs and the ``unrecovered_gap`` ranges, to be checked for once-or-lost against 0..last.
- **Blocks**: reference counts per (medium, group, hash) per stream and the stale flag, to be
  compared with an edge's ``GET /v1/blocks`` at the same offset.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

StreamKey = tuple[str, int]
BlockKey = tuple[str, int, str]
Blocks = dict[StreamKey, dict[BlockKey, int]]


@dataclass
class EngineProcess:
    """What a client received of one engine process of one stream."""

    seqs: list[int] = field(default_factory=list)
    gaps: list[tuple[int, int, str]] = field(default_factory=list)  # first, until, reason

    @property
    def top(self) -> int:
        """The highest seq delivered or counted lost (-1: none)."""
        return max([-1, *self.seqs, *(until for _, until, _ in self.gaps)])

    def problems(self, last: int | None) -> list[str]:
        """Once-or-lost over 0..last (``last`` None: the highest seq received or counted lost)."""
        seen: Counter[int] = Counter(self.seqs)
        for first, until, _ in self.gaps:
            seen.update(range(first, until + 1))
        if not seen:
            return [] if last is None or last < 0 else [f"nothing of 0..{last}"]
        top = max(seen) if last is None else last
        out = []
        twice = sorted(seq for seq, n in seen.items() if n > 1)
        if twice:
            out.append(f"{len(twice)} seqs twice (first {twice[:5]})")
        missing = [seq for seq in range(top + 1) if seq not in seen]
        if missing:
            out.append(f"{len(missing)} seqs neither delivered nor counted lost (first {missing[:5]})")
        beyond = sorted(seq for seq in seen if seq > top)
        if beyond:
            out.append(f"{len(beyond)} seqs beyond the process's last {top} (first {beyond[:5]})")
        if self.seqs != sorted(self.seqs):
            out.append("batches out of seq order")
        return out


def medium_of(event: dict[str, Any]) -> str:
    medium = event.get("medium")
    return medium.upper() if isinstance(medium, str) and medium else "GPU"


def group_of(event: dict[str, Any]) -> int:
    group = event.get("group_idx")
    return group if isinstance(group, int) and not isinstance(group, bool) else 0


@dataclass
class ClientView:
    """One client across all its connections."""

    name: str
    epoch: str | None = None
    offset: int | None = None  # the last offset received (a hello's, then each message's)
    last_id: str | None = None
    blocks: Blocks = field(default_factory=dict)
    stale: dict[StreamKey, bool] = field(default_factory=dict)
    processes: dict[StreamKey, list[EngineProcess]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    losses: Counter[str] = field(default_factory=Counter)
    restarts: Counter[str] = field(default_factory=Counter)  # restart notices by reason
    stale_notices: Counter[str] = field(default_factory=Counter)

    # --- connections ---------------------------------------------------------------------------

    def hello(self, message: dict[str, Any], resumed_from: str | None, where: str) -> None:
        """A connection's hello; ``resumed_from``: the id the client asked to resume from."""
        self.counts["hellos"] += 1
        if resumed_from is None:
            if self.offset is not None:
                self.violations.append(f"{self.name}: a fresh hello after offset {self.offset} ({where})")
            self.epoch = message["epoch"]
            self.offset = message["offset"]
            for status in message["sources"]:
                stream = (status["source"], status["dp_rank"])
                self.stale[stream] = bool(status.get("stale"))
                self.blocks.setdefault(stream, {})
            self.last_id = f"{self.epoch}:{self.offset}"
            return
        self.counts["resumes"] += 1
        if not message.get("recovered"):
            self.counts["resumes_not_recovered"] += 1
            self.violations.append(
                f"{self.name}: resume from {resumed_from} on {where} not recovered (hello offset {message['offset']}, "
                f"epoch {message['epoch']})"
            )
            # The client starts over as the protocol says: its model and offsets are from here.
            self.epoch, self.offset = message["epoch"], message["offset"]
            self.last_id = f"{self.epoch}:{self.offset}"
            self.blocks = {stream: {} for stream in self.blocks}
            self.counts["restarted_from_scratch"] += 1
            return
        if message["epoch"] != self.epoch or message["offset"] != self.offset:
            self.violations.append(
                f"{self.name}: recovered hello at {message['epoch']}:{message['offset']} on {where}, "
                f"the client was at {self.epoch}:{self.offset}"
            )

    # --- messages ------------------------------------------------------------------------------

    def apply(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind not in ("batch", "notice") or "offset" not in message:
            return  # a per-client notice (slow_consumer) has no offset
        offset = message["offset"]
        if self.offset is not None and offset != self.offset + 1:
            what = "duplicate" if offset <= self.offset else "gap"
            self.counts[f"offset_{what}s"] += 1
            if len(self.violations) < 200:
                self.violations.append(f"{self.name}: offset {offset} after {self.offset} ({what})")
        self.offset = offset
        self.last_id = message["id"]
        stream = (message["source"], message["dp_rank"])
        blocks = self.blocks.setdefault(stream, {})
        processes = self.processes.setdefault(stream, [EngineProcess()])
        if kind == "batch":
            self.counts["batches"] += 1
            processes[-1].seqs.append(int(message["seq"]))  # engine seqs are decimal strings
            for event in message["events"]:
                self._event(stream, blocks, event)
            return
        self.counts[f"notice_{message['kind']}"] += 1
        notice = message["kind"]
        if notice == "restart":
            self.restarts[message.get("reason", "?")] += 1
            processes.append(EngineProcess())
            blocks.clear()
            self.stale[stream] = False
        elif notice == "unrecovered_gap":
            reason = message.get("reason", "?")
            first, until = int(message["first"]), int(message["until"])
            processes[-1].gaps.append((first, until, reason))
            self.losses[reason] += until - first + 1
        elif notice == "stale":
            self.stale_notices[message.get("reason", "?")] += 1
            self.stale[stream] = True

    def _event(self, stream: StreamKey, blocks: dict[BlockKey, int], event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "AllBlocksCleared":
            blocks.clear()
            self.stale[stream] = False
        elif kind in ("BlockStored", "BlockRemoved"):
            medium, group = medium_of(event), group_of(event)
            step = 1 if kind == "BlockStored" else -1
            for hash_ in event["block_hashes"]:
                key = (medium, group, hash_)
                refs = blocks.get(key, 0) + step
                if refs > 0:
                    blocks[key] = refs
                else:
                    blocks.pop(key, None)  # a remove of a block not held is ignored

    def snapshot(self) -> tuple[Blocks, dict[StreamKey, bool]]:
        return {stream: dict(held) for stream, held in self.blocks.items()}, dict(self.stale)


def edge_blocks(document: dict[str, Any]) -> tuple[Blocks, dict[StreamKey, bool]]:
    """An edge's ``GET /v1/blocks`` in the client model's shape."""
    blocks: Blocks = {}
    stale: dict[StreamKey, bool] = {}
    for entry in document["streams"]:
        stream = (entry["source"], entry["dp_rank"])
        stale[stream] = bool(entry["stale"])
        blocks[stream] = {(b["medium"], b["group_idx"], b["hash"]): b["refs"] for b in entry["blocks"]}
    return blocks, stale


def compare(ours: tuple[Blocks, dict[StreamKey, bool]], theirs: tuple[Blocks, dict[StreamKey, bool]]) -> list[str]:
    """Where an edge's index differs from the client model (empty: equal)."""
    out = []
    (our_blocks, our_stale), (their_blocks, their_stale) = ours, theirs
    for stream in sorted(set(our_blocks) | set(their_blocks)):
        mine, its = our_blocks.get(stream, {}), their_blocks.get(stream, {})
        if mine != its:
            keys = set(mine) | set(its)
            differ = [k for k in keys if mine.get(k) != its.get(k)]
            out.append(
                f"{stream[0]}[{stream[1]}]: {len(differ)} blocks differ (model {len(mine)}, edge {len(its)}; "
                f"e.g. {[(k, mine.get(k), its.get(k)) for k in differ[:3]]})"
            )
        if our_stale.get(stream, False) != their_stale.get(stream, False):
            flags = f"{our_stale.get(stream)} in the model, {their_stale.get(stream)} on the edge"
            out.append(f"{stream[0]}[{stream[1]}]: stale {flags}")
    return out
