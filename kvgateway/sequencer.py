"""Per-stream ordering: gaps, replay, restarts and duplicates, without I/O.

One :class:`Sequencer` per stream (one engine publisher, i.e. one DP rank). The asyncio layer
feeds it live batches from the SUB socket and replies from the replay socket; every call returns
a list of *actions* for the layer to apply in order. The sequencer never reads a clock or a socket
and looks inside a batch only to see whether its first event is ``AllBlocksCleared``. A batch of
``None`` is an undecodable payload: its seq still counts as received and it is delivered (as a
skip), never counted as a gap.

Guarantee, per *epoch* (the run of one publisher process, between two :class:`Restart` actions):
seqs are delivered in strictly increasing order, none twice, and every seq from the first one
delivered or accounted for up to the last is either delivered or inside exactly one
:class:`Unrecovered` range.

Rules (``cursor`` is the last seq delivered or accounted for):

1. **Fresh start** (cursor ``None``): seq 0, or no replay endpoint: deliver; history before the
   gateway started is not a gap. Seq > 0 with a replay endpoint: *catch-up*: ask a replay from 0
   and hold the batch. What the catch-up replay cannot give before its first item (or before the
   first held batch, if it gives nothing) is not counted; holes after that are.
2. **Next seq** (``cursor + 1``, live or replayed): deliver, then every held batch that is now
   contiguous. A live next seq is delivered at once even while a replay is in flight.
3. **Forward gap** (live, no replay in flight): :class:`GapDetected`, then with a replay endpoint
   :class:`RequestReplay` from ``cursor + 1`` and hold the batch; without one, the gap is
   :class:`Unrecovered` ("unavailable"), ``ReplayFinished(None, "unavailable", 0)``, deliver.
   A jump of more than ``jump_limit`` is a restart ("jump": TensorRT-LLM seeds its seq with
   ``time_ns``) and starts fresh without catch-up.
4. **Live during a replay**: held (a seq already held is a :class:`Duplicate`); a hole above the
   highest seq known is reported with :class:`GapDetected` (the replay covers it if the engine
   still has it). Holding more than ``hold_limit`` cancels the replay and drains as in 6 with
   reason "overflow".
5. **Replay items**: seq <= cursor is ignored (overlap with live). Held batches older than the item
   are delivered first; a hole before the item is :class:`Unrecovered` ("evicted": the engine's
   buffer no longer had it). Then the item is delivered (``replayed=True``) and contiguous held
   batches follow. An item above the highest live seq with a hole before it is ignored: the live
   stream lags behind the engine (a deep SUB queue) and will still bring the hole and the item;
   counting the hole lost would drop batches that are on their way.
6. **Replay end or failure**: held batches are delivered in order, holes before each counted as
   Unrecovered ("short" after an end marker, "timeout"/"failed" after a failure), then
   :class:`ReplayFinished`. Outcome: "recovered" if nothing of that replay was unrecovered,
   "partial" if some batches were replayed and some lost, otherwise "failed" (end marker) or the
   failure's own outcome ("timeout"/"failed") when nothing was replayed.
7. **Live seq <= cursor**: a restart if ``seq <= 1 and seq < cursor`` ("seq_reset"),
   ``cursor - seq > restart_window`` ("window"), it is the first live batch after
   :meth:`Sequencer.on_reconnect` ("reconnect"), or the batch starts with ``AllBlocksCleared``
   ("cleared"); otherwise a :class:`Duplicate`. A restart first ends an in-flight replay
   (:class:`CancelReplay`, drain with reason "restart", ReplayFinished), then emits
   :class:`Restart`; the cursor becomes -1 (a new publisher starts at 0) and the batch goes through
   rules 2/3, so what the new publisher sent before it is a counted gap.

Replay tokens start at 1 and increase by one per request. Items, ends and failures carrying any
other token than the in-flight one are ignored.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Literal, TypeAlias

from kvgateway.wire import AllBlocksCleared, Batch

__all__ = [
    "Action",
    "CancelReplay",
    "Deliver",
    "Duplicate",
    "FailureOutcome",
    "GapDetected",
    "LossReason",
    "Outcome",
    "ReplayFinished",
    "RequestReplay",
    "Restart",
    "RestartReason",
    "Sequencer",
    "Unrecovered",
]

Outcome: TypeAlias = Literal["recovered", "partial", "failed", "timeout", "unavailable"]
FailureOutcome: TypeAlias = Literal["timeout", "failed"]
LossReason: TypeAlias = Literal["unavailable", "evicted", "short", "timeout", "failed", "overflow", "restart"]
RestartReason: TypeAlias = Literal["seq_reset", "window", "reconnect", "cleared", "jump"]


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand this batch downstream (it is the next one of the stream)."""

    seq: int
    batch: Batch | None
    replayed: bool


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A live batch dropped: already delivered or already held."""

    seq: int


@dataclass(frozen=True, slots=True)
class GapDetected:
    """The live stream skipped ``first..last`` (inclusive); ``count`` batches are missing so far."""

    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True, slots=True)
class RequestReplay:
    """Ask the engine's replay socket for every buffered batch from ``start``."""

    token: int
    start: int


@dataclass(frozen=True, slots=True)
class CancelReplay:
    """Abandon the in-flight request ``token`` (its later replies are ignored anyway)."""

    token: int


@dataclass(frozen=True, slots=True)
class ReplayFinished:
    """A replay is over; ``replayed`` batches were delivered from it. Token ``None``: no endpoint."""

    token: int | None
    outcome: Outcome
    replayed: int


@dataclass(frozen=True, slots=True)
class Unrecovered:
    """Seqs ``first..last`` (inclusive) are lost for good."""

    first: int
    last: int
    reason: LossReason

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True, slots=True)
class Restart:
    """The publisher restarted at ``seq``; downstream empties this stream's state."""

    seq: int
    previous: int
    reason: RestartReason


Action: TypeAlias = (
    Deliver | Duplicate | GapDetected | RequestReplay | CancelReplay | ReplayFinished | Unrecovered | Restart
)


def _starts_cleared(batch: Batch | None) -> bool:
    return batch is not None and bool(batch.events) and isinstance(batch.events[0], AllBlocksCleared)


class Sequencer:
    """The ordering state machine of one stream; see the module docstring for the rules."""

    __slots__ = (
        "_has_replay",
        "_heap",
        "_held",
        "_hold_limit",
        "_jump_limit",
        "_last_token",
        "_live_top",
        "_lost",
        "_reconnected",
        "_replayed",
        "_restart_window",
        "_token",
        "_top",
        "cursor",
    )

    def __init__(
        self,
        *,
        has_replay: bool,
        restart_window: int = 1024,
        hold_limit: int = 10_000,
        jump_limit: int = 10_000_000,
    ) -> None:
        if restart_window < 0:
            raise ValueError(f"restart_window must be >= 0, got {restart_window}")
        if hold_limit < 1:
            raise ValueError(f"hold_limit must be >= 1, got {hold_limit}")
        if jump_limit < 1:
            raise ValueError(f"jump_limit must be >= 1, got {jump_limit}")
        self._has_replay = has_replay
        self._restart_window = restart_window
        self._hold_limit = hold_limit
        self._jump_limit = jump_limit
        self.cursor: int | None = None
        # Highest seq delivered, held or accounted for in this epoch: holes above it are news.
        self._top = -1
        # Highest live seq of this epoch: live is in order, so a missing seq below it never comes live.
        self._live_top = -1
        # Live batches waiting for the replay; the heap orders them (stale entries skipped lazily).
        self._held: dict[int, Batch | None] = {}
        self._heap: list[int] = []
        self._token: int | None = None
        self._last_token = 0
        self._replayed = 0
        self._lost = 0
        self._reconnected = False

    @property
    def held(self) -> int:
        """Live batches held while a replay is in flight (the ingest queue depth)."""
        return len(self._held)

    @property
    def replay_token(self) -> int | None:
        """The token of the in-flight replay, if any."""
        return self._token

    # --- inputs -------------------------------------------------------------------------

    def on_reconnect(self) -> None:
        """The SUB socket reconnected: the next live batch at or below the cursor is a restart."""
        self._reconnected = True

    def on_live(self, seq: int, batch: Batch | None) -> list[Action]:
        """A batch from the SUB socket."""
        reconnected, self._reconnected = self._reconnected, False
        out: list[Action] = []
        cursor = self.cursor
        if cursor is None and self._token is None:
            self._start(seq, batch, self._has_replay, out)
            return out
        if seq in self._held:
            out.append(Duplicate(seq))
            return out
        if cursor is not None:
            if seq <= cursor:
                reason = self._restart_reason(seq, cursor, batch, reconnected)
                if reason is None:
                    out.append(Duplicate(seq))
                else:
                    self._restart(seq, batch, reason, out)
                return out
        else:
            # Catch-up: nothing delivered yet; below every live batch seen, a restart is the likely story.
            low = self._first_held()
            assert low is not None  # a catch-up always holds its first batch
            if seq < low and (reason := self._restart_reason(seq, low, batch, reconnected)) is not None:
                self._restart(seq, batch, reason, out)
                return out
        if seq - self._top > self._jump_limit:
            self._restart(seq, batch, "jump", out)
            return out
        self._forward(seq, batch, out)
        return out

    def on_replay_item(self, token: int, seq: int, batch: Batch | None) -> list[Action]:
        """One batch of the replay ``token``."""
        if token != self._token:
            return []
        out: list[Action] = []
        if self.cursor is not None and seq <= self.cursor:
            return out
        # Live batches older than this item were not in the engine's buffer any more.
        while (low := self._first_held()) is not None and low < seq:
            self._account(low, self._held.pop(low), False, "evicted", out)
        cursor = self.cursor
        if cursor is not None and seq > cursor + 1 and seq > self._live_top:
            # Ahead of a lagging live stream, with a hole the live stream can still fill: leave it to live.
            return out
        self._held.pop(seq, None)  # the replayed copy wins; the live one is the same batch
        self._account(seq, batch, True, "evicted", out)
        self._drain_contiguous(out)
        return out

    def on_replay_end(self, token: int) -> list[Action]:
        """The end marker of the replay ``token``."""
        if token != self._token:
            return []
        out: list[Action] = []
        self._finish("short", None, out)
        return out

    def on_replay_failed(self, token: int, outcome: str) -> list[Action]:
        """The replay ``token`` timed out (``"timeout"``) or failed (``"failed"``: garbage, socket error)."""
        failure: FailureOutcome
        if outcome == "timeout":
            failure = "timeout"
        elif outcome == "failed":
            failure = "failed"
        else:
            raise ValueError(f"replay failure outcome must be 'timeout' or 'failed', got {outcome!r}")
        if token != self._token:
            return []
        out: list[Action] = []
        self._finish(failure, failure, out)
        return out

    # --- the rules ----------------------------------------------------------------------

    def _start(self, seq: int, batch: Batch | None, catch_up: bool, out: list[Action]) -> None:
        """Rule 1: the first batch of the gateway's view of this publisher."""
        self._live_top = seq
        if seq == 0 or not catch_up:
            self._deliver(seq, batch, False, out)
            return
        out.append(RequestReplay(self._new_token(), 0))
        self._put(seq, batch)

    def _forward(self, seq: int, batch: Batch | None, out: list[Action]) -> None:
        """Rules 2-4: a live batch above the cursor (or during catch-up) that is not held."""
        self._live_top = max(self._live_top, seq)
        cursor = self.cursor
        if cursor is not None and seq == cursor + 1:
            self._deliver(seq, batch, False, out)
            self._drain_contiguous(out)
            return
        if self._token is not None:
            self._hold(seq, batch, out)
            return
        assert cursor is not None  # no replay in flight and not fresh
        self._note_gap(seq - 1, out)
        if self._has_replay:
            out.append(RequestReplay(self._new_token(), cursor + 1))
            self._put(seq, batch)
            return
        out.append(Unrecovered(cursor + 1, seq - 1, "unavailable"))
        out.append(ReplayFinished(None, "unavailable", 0))
        self._deliver(seq, batch, False, out)

    def _hold(self, seq: int, batch: Batch | None, out: list[Action]) -> None:
        """Rule 4."""
        self._note_gap(seq - 1, out)
        self._put(seq, batch)
        if len(self._held) > self._hold_limit:
            assert self._token is not None
            out.append(CancelReplay(self._token))
            self._finish("overflow", "failed", out)

    def _restart_reason(self, seq: int, ref: int, batch: Batch | None, reconnected: bool) -> RestartReason | None:
        """Rule 7, for a live ``seq`` at or below ``ref`` (the cursor)."""
        if seq <= 1 and seq < ref:
            return "seq_reset"
        if ref - seq > self._restart_window:
            return "window"
        if reconnected:
            return "reconnect"
        if _starts_cleared(batch):
            return "cleared"
        return None

    def _restart(self, seq: int, batch: Batch | None, reason: RestartReason, out: list[Action]) -> None:
        if self._token is not None:
            # Deliver what the old publisher already sent before forgetting it.
            out.append(CancelReplay(self._token))
            self._finish("restart", "failed", out)
        previous = self.cursor
        assert previous is not None  # only reachable after something was delivered or held (then drained)
        out.append(Restart(seq, previous, reason))
        self._top = self._live_top = -1
        if reason == "jump":
            # A time-seeded seq says nothing about what came before it: start fresh, no catch-up.
            self.cursor = None
            self._start(seq, batch, False, out)
        else:
            self.cursor = -1
            self._forward(seq, batch, out)

    def _finish(self, reason: LossReason, failure: FailureOutcome | None, out: list[Action]) -> None:
        """Rule 6: drain every held batch, then report the replay's outcome."""
        while (low := self._first_held()) is not None:
            self._account(low, self._held.pop(low), False, reason, out)
        self._heap.clear()
        if self._lost == 0 and (failure is None or self._replayed > 0):
            outcome: Outcome = "recovered"
        elif self._replayed > 0:
            outcome = "partial"
        else:
            outcome = "failed" if failure is None else failure
        out.append(ReplayFinished(self._token, outcome, self._replayed))
        self._token = None
        self._replayed = 0
        self._lost = 0

    # --- primitives ---------------------------------------------------------------------

    def _new_token(self) -> int:
        self._last_token += 1
        self._token = self._last_token
        self._replayed = 0
        self._lost = 0
        return self._last_token

    def _put(self, seq: int, batch: Batch | None) -> None:
        self._held[seq] = batch
        heapq.heappush(self._heap, seq)
        self._top = max(self._top, seq)

    def _first_held(self) -> int | None:
        heap = self._heap
        while heap and heap[0] not in self._held:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _note_gap(self, last: int, out: list[Action]) -> None:
        """Report the seqs above everything known up to ``last`` as a live gap."""
        if last > self._top:
            out.append(GapDetected(self._top + 1, last))
            self._top = last

    def _account(self, seq: int, batch: Batch | None, replayed: bool, reason: LossReason, out: list[Action]) -> None:
        """Deliver ``seq``, counting the hole between the cursor and it as lost for ``reason``."""
        cursor = self.cursor
        # A catch-up's very first batch has no cursor: the history before it is not a loss.
        # The hole lies below a live batch already seen, so GapDetected reported it then (or, in a
        # catch-up, it is history before the first live batch).
        if cursor is not None and seq > cursor + 1:
            out.append(Unrecovered(cursor + 1, seq - 1, reason))
            self._lost += seq - 1 - cursor
        self._deliver(seq, batch, replayed, out)

    def _deliver(self, seq: int, batch: Batch | None, replayed: bool, out: list[Action]) -> None:
        out.append(Deliver(seq, batch, replayed))
        self.cursor = seq
        self._top = max(self._top, seq)
        if replayed:
            self._replayed += 1

    def _drain_contiguous(self, out: list[Action]) -> None:
        held = self._held
        while held:
            assert self.cursor is not None
            nxt = self.cursor + 1
            if nxt not in held:
                return
            self._deliver(nxt, held.pop(nxt), False, out)
        self._heap.clear()  # every entry left is stale
