"""Per-stream ordering: gaps, replays, restarts and duplicates, without I/O.

One :class:`Sequencer` per stream (one engine publisher, i.e. one DP rank). The asyncio layer
feeds it what happens (the SUB socket connected or dropped, a live batch, a replay item, a
replay's end or failure, a quiet live stream) and applies the *actions* each call returns, in
order. The sequencer never reads a clock or a socket. It looks inside a batch only to see whether
it starts with ``AllBlocksCleared``, and keeps the raw payload of the last delivered batch to
recognise the engine after a reconnect. A batch of ``None`` is an undecodable payload: its seq
still counts as received and it is delivered (as a skip), never counted as a gap.

Guarantee, per *epoch* (the run of one publisher process, between two :class:`Restart` actions):
seqs are delivered in strictly increasing order, none twice, and every seq from the first one
delivered or accounted for up to the last is either delivered or inside exactly one
:class:`Unrecovered` range, whose reason says why.

What the real publishers do, and so what the rules assume (``../docs/protocol.md`` has more):

- The live stream is in order; it loses batches only at the PUB socket's high-water mark, and a
  subscriber sees only what was published after it connected.
- A replay reply is the engine's buffer from the seq asked for, in order, then an end marker.
  vLLM sends it in one unpaced loop through a ROUTER that silently drops past its high-water
  mark, so a reply can have holes in the middle, lose its tail or its end marker: the engine still
  holds those batches. Only a reply whose *first* seq is above the one asked for proves that the
  engine no longer holds the seqs before it (evicted).

Rules (``cursor``: last seq delivered or accounted for; ``live_top``: highest live seq of the
epoch; *pending*: batches received above the cursor, live or replayed, not yet delivered):

1. **Connect.** The first connection with a replay endpoint asks for the engine's whole buffer
   (a *catch-up* from seq 0), so an idle engine's cache is known at once. A reconnection after
   something was delivered first *verifies* the engine: it asks from the last delivered seq (the
   *anchor*) and compares that batch's payload with the one delivered; while it verifies, live
   batches are pending, none delivered. Same payload: the reply goes on as a gap replay. Another
   payload, or an end marker with nothing (the engine holds nothing that old), is a restart
   (``identity``); so is any batch, live or replayed, under a seq still pending with other bytes
   (from either connection: rule 11). No answer, or the anchor no longer in the buffer,
   cannot tell: the reconnect heuristic of rule 7 applies to the live batches. A reconnection
   counts the cursor as passed by the live stream (``live_top``): the new connection brings only
   later batches.
2. **Catch-up.** The epoch starts at the lowest seq the catch-up brings, live or replayed. Before
   it: nothing, if the epoch began at 0 and that seq is 0; after a restart of a counting
   publisher, :class:`Unrecovered` ``restart``; on a fresh start above 0, :class:`HistoryTruncated`
   (the engine no longer holds the beginning; the index is incomplete) unless that batch starts
   with ``AllBlocksCleared``. A catch-up that got no answer at all (no item, no end marker in any
   attempt) proves nothing of the kind: the seqs before the first live batch are
   :class:`Unrecovered` ``no_answer`` (the engine may still hold them). Seqs seeded with the
   clock (TensorRT-LLM) say nothing about where the process began: no truncation or loss is
   reported for them. Without a replay endpoint the first live
   batch starts the epoch, by the same rule.
3. **Next seq** (``cursor + 1``, live or replayed): deliver it, then every pending batch that is
   now contiguous. A live next seq is delivered at once even while a replay is in flight (not
   while verifying).
4. **Forward gap** (live): the seqs the live stream skipped are reported with
   :class:`GapDetected`. Without a replay in flight, :class:`RequestReplay` from ``cursor + 1``;
   without a replay endpoint the hole is :class:`Unrecovered` ``no_replay`` (``not_sent`` if the
   batch after it starts with ``AllBlocksCleared``: the engine's own fence after dropping events).
   A jump of more than ``jump_limit`` above everything known is a restart (``jump``).
5. **Replay items.** Items at or below the cursor, or already pending, are ignored. Others are kept
   pending (up to ``hold_limit`` in all; beyond it, items ahead of the live stream are not kept:
   live or a later replay brings them) and delivered in seq order as they become contiguous; a
   later live copy is a :class:`Duplicate`.
6. **End of an attempt** (end marker, timeout, malformed reply). For the lowest missing seq:
   evicted (this attempt's first item is above it) and below ``live_top`` (the live stream passed
   it): :class:`Unrecovered` ``evicted`` (``not_sent`` if the batch after them starts with
   ``AllBlocksCleared``). Otherwise, if the attempt brought anything new, or the live stream
   opened a gap after it was asked: ask again from it (a new :class:`RequestReplay`, at most
   ``max_attempts`` per recovery). Otherwise give up on what lies below ``live_top``:
   ``transit`` (the engine answered but the batches never came through) or ``no_answer``, never
   ``not_sent`` (the engine may hold them). Missing seqs above ``live_top`` are left to the live
   stream, which is behind: when it passes them a new gap replay settles them; if it stays
   quiet, :meth:`Sequencer.on_quiet` treats it as passed. A recovery ends with
   :class:`ReplayFinished`: ``recovered`` (nothing lost), ``partial`` (some lost, some brought),
   ``failed`` (lost, and nothing came back, or no answer at all).
7. **Live seq at or below the cursor**: above ``live_top``, it is the live copy of a batch a
   replay delivered first (a duplicate). Otherwise a restart if ``seq <= 1 and seq < cursor``
   (``seq_reset``), ``cursor - seq > restart_window`` (``window``), it is the first live batch
   after an unverified reconnect (``reconnect``), or the batch starts with ``AllBlocksCleared``
   (``cleared``); otherwise a :class:`Duplicate`.
8. **Restart.** An in-flight replay is cancelled; what the old process already sent is delivered,
   holes counted ``restart``; then :class:`Restart`, and the new process is caught up as at start
   (rule 2), its seqs from 0 unless they are clock-seeded. What the new process already sent,
   including the batch that gave the restart away, stays pending for its epoch. During the
   catch-up, only a live batch below a *live* pending one can reveal another restart: replies run
   ahead of a lagging live stream.
9. **Hold overflow**: more than ``hold_limit`` pending batches cancel the replay; holes are
   counted ``overflow`` and everything pending is delivered.

10. **Quiet live stream** (:meth:`Sequencer.on_quiet`, after a couple of seconds without a live
    batch): pending batches above a hole settle it as in rule 6; otherwise, once after each burst
    of live batches, a *tail* replay from ``cursor + 1`` fetches what the PUB socket may have
    dropped at the end of the burst (an idle engine publishes nothing that would reveal it).

11. **Any reply may come from another process, and connection events may come late.** A replay
    socket is reached afresh for each request, so it answers for whichever process binds the port
    now; the monitor may report a reconnection after the new process's batches (a quiet stream's
    tail probe racing the reconnect, a gateway paused across a crash). So every attempt (catch-up
    retries, gaps, tail probes, verifications) asks from the last delivered seq, the anchor, and
    its reply must bring that batch back first, with the same bytes, before anything in it is used:
    other bytes, a first item below the anchor, or an end marker with nothing are a restart
    (``identity``); a first item more than ``jump_limit`` above it is a ``jump``. So is a live
    batch under the anchor's seq with other bytes (a publisher sends one payload per seq). What
    earlier replies brought is the old process's (delivered in its epoch, as in rule 8), and so is
    a live batch one of them brought back with the same bytes; after a ``jump``, so is every batch
    within ``jump_limit`` of the old cursor (the new process counts from far above). The other
    batches of the current connection stay pending for the new epoch (the new process's that came
    before the connection events; a gap they opened is what sent the request), but as
    *suspects*: the restart may have come after them, the connection events late (also when a
    verification or rule 7's heuristic found it: the process a reconnection reached may have
    died since, and a verification's reply may be the old process's). They wait (none is
    delivered, none counts as live) for the new epoch's catch-up, a snapshot of the new process's
    buffer taken after they came: one it brings with other bytes is replaced by its own; one
    it does not bring (above its last item, below its first, or in a hole of the reply) is
    dropped; without a whole reply, or if another restart comes first, all are dropped (a later reply or gap
    brings the new process's own again, unless it has evicted them or never answers: then they
    are lost). A first item above the anchor means it left the buffer: as in rule 1, the engine
    cannot be told apart (the gateway cannot bound how many batches the engine published unseen,
    nor its buffer's length, so no reply can prove that the engine should still hold the
    anchor), and a new live batch at exactly ``cursor + 1`` before the connection events is taken
    as the next.

Replay tokens start at 1 and increase by one per attempt. Items, ends and failures carrying any
other token than the in-flight one are ignored.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

import msgspec

from kvgateway.engine.wire import AllBlocksCleared, Batch

__all__ = [
    "Action",
    "CancelReplay",
    "Deliver",
    "Duplicate",
    "FailureOutcome",
    "GapDetected",
    "HistoryTruncated",
    "LossReason",
    "Outcome",
    "Purpose",
    "ReplayFinished",
    "RequestReplay",
    "Restart",
    "RestartReason",
    "Sequencer",
    "Unrecovered",
    "clock_seeded",
]

Outcome: TypeAlias = Literal["recovered", "partial", "failed", "unavailable"]
FailureOutcome: TypeAlias = Literal["timeout", "failed"]
LossReason: TypeAlias = Literal["not_sent", "evicted", "transit", "no_answer", "no_replay", "restart", "overflow"]
RestartReason: TypeAlias = Literal["seq_reset", "window", "reconnect", "cleared", "jump", "identity"]
Purpose: TypeAlias = Literal["catch_up", "gap", "verify", "tail"]

CLOCK_SEEDED_FLOOR: Final = 10**15
"""Seqs from here on are taken for clock-seeded (TensorRT-LLM starts at ``time.time_ns()``, about
1.7e18); a counting publisher would need 30 years at a million batches a second to get here."""


def clock_seeded(seq: int) -> bool:
    """Whether ``seq`` looks seeded with the clock rather than counted from 0."""
    return seq >= CLOCK_SEEDED_FLOOR


class Deliver(msgspec.Struct, frozen=True, gc=False):
    """Hand this batch downstream (it is the next one of the stream).

    A frozen Struct, where the other actions are frozen dataclasses: one is made for every batch,
    and a dataclass's ``__init__`` (an ``object.__setattr__`` per field) cost 0.35 us of it, this
    0.1. The same equality, repr and match patterns; untracked by the garbage collector (the batch
    it holds is too, and nothing in it leads back to it)."""

    seq: int
    batch: Batch | None
    replayed: bool


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A live batch dropped: already delivered or already pending."""

    seq: int


@dataclass(frozen=True, slots=True)
class GapDetected:
    """The live stream skipped ``first..last`` (inclusive)."""

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
    purpose: Purpose = "gap"
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class CancelReplay:
    """Abandon the in-flight request ``token`` (its later replies are ignored anyway)."""

    token: int


@dataclass(frozen=True, slots=True)
class ReplayFinished:
    """A recovery is over after ``attempts`` requests; it brought ``replayed`` batches.
    Token ``None``: there is no replay endpoint. ``by_restart``: a publisher restart ended it (its
    batches are now the old process's, reported lost with reason ``restart``), not the socket."""

    token: int | None
    outcome: Outcome
    replayed: int
    attempts: int = 1
    by_restart: bool = field(default=False, compare=False)  # how it ended, not what it was


@dataclass(frozen=True, slots=True)
class Unrecovered:
    """Seqs ``first..last`` (inclusive) are lost for good, for ``reason``."""

    first: int
    last: int
    reason: LossReason

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True, slots=True)
class HistoryTruncated:
    """The stream's history before ``first`` is no longer held by the engine: the index lacks it."""

    first: int


@dataclass(frozen=True, slots=True)
class Restart:
    """The publisher restarted (seen at ``seq``); downstream empties this stream's state."""

    seq: int
    previous: int
    reason: RestartReason


Action: TypeAlias = (
    Deliver
    | Duplicate
    | GapDetected
    | RequestReplay
    | CancelReplay
    | ReplayFinished
    | Unrecovered
    | HistoryTruncated
    | Restart
)

# A batch received and not yet delivered: (batch, raw payload, connection generation, from a replay).
_Item: TypeAlias = tuple[Batch | None, bytes, int, bool]


def _starts_cleared(batch: Batch | None) -> bool:
    return batch is not None and bool(batch.events) and isinstance(batch.events[0], AllBlocksCleared)


class _Recovery:
    """One recovery: a catch-up, a gap replay or a verification, over one or more attempts."""

    __slots__ = (
        "after_anchor",
        "attempt",
        "brought",
        "check",
        "first",
        "floor",
        "heard",
        "items",
        "kept",
        "lost",
        "mark",
        "opened",
        "progress",
        "purpose",
        "silent",
        "start",
        "token",
        "top",
    )

    def __init__(self, token: int, start: int, purpose: Purpose) -> None:
        self.purpose: Purpose = purpose
        self.attempt = 0
        self.brought = 0  # new batches this recovery brought, over all attempts
        self.lost = 0
        self.token = token
        self.start = start
        self.items = 0  # this attempt's items
        self.kept: set[int] = set()  # the seqs this attempt's items added to the pending batches
        self.first: int | None = None  # this attempt's first item
        self.top = -1  # this attempt's highest item
        self.after_anchor = False  # the next item is the first after the anchor this attempt matched
        self.floor: int | None = None  # seqs below it (and >= start) are not in the engine's buffer
        self.progress = False  # this attempt brought something new
        self.opened = False  # the live stream skipped seqs after this attempt was asked
        self.mark = start  # the first missing seq when this attempt was asked
        self.heard = False  # any item or end marker came back, in any attempt
        self.silent = 0  # attempts that got no answer at all
        # This attempt's anchor: the last delivered seq and its payload when it was asked. The reply
        # must bring that batch back first, the same bytes, before anything in it is used (rule 11).
        self.check: tuple[int, bytes] | None = None

    def new_attempt(self, token: int, start: int) -> None:
        self.attempt += 1
        self.token = token
        self.start = start
        self.items = 0
        self.kept = set()
        self.top = -1
        self.after_anchor = False
        self.first = self.floor = None
        self.progress = self.opened = False


class Sequencer:
    """The ordering state machine of one stream; see the module docstring for the rules."""

    __slots__ = (
        "_anchor",
        "_echoed",
        "_ever_connected",
        "_gen",
        "_has_replay",
        "_heap",
        "_hold_limit",
        "_jump_limit",
        "_last_token",
        "_live_top",
        "_low_live",
        "_max_attempts",
        "_origin_zero",
        "_pending",
        "_probe_due",
        "_rec",
        "_reconnected",
        "_restart_window",
        "_suspect",
        "cursor",
        "held",
        "replay_token",
    )

    def __init__(
        self,
        *,
        has_replay: bool,
        restart_window: int = 1024,
        hold_limit: int = 10_000,
        jump_limit: int = 10_000_000,
        max_attempts: int = 32,
    ) -> None:
        if restart_window < 0:
            raise ValueError(f"restart_window must be >= 0, got {restart_window}")
        if hold_limit < 1:
            raise ValueError(f"hold_limit must be >= 1, got {hold_limit}")
        if jump_limit < 1:
            raise ValueError(f"jump_limit must be >= 1, got {jump_limit}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self._has_replay = has_replay
        self._restart_window = restart_window
        self._hold_limit = hold_limit
        self._jump_limit = jump_limit
        self._max_attempts = max_attempts
        self.cursor: int | None = None
        self._origin_zero = False  # this epoch's process counted from 0 (known after a restart)
        self._probe_due = False  # live batches came since the last tail probe (see on_quiet)
        self._live_top = -1
        self._pending: dict[int, _Item] = {}
        self._heap: list[int] = []  # orders the pending seqs (stale entries skipped lazily)
        self._rec: _Recovery | None = None
        self._last_token = 0
        self._gen = 0  # bumped at each disconnect: tells the old connection's batches from the new
        self._anchor: tuple[int, bytes] | None = None  # last delivered seq and its payload
        self._low_live: list[tuple[int, Batch | None, bytes]] = []  # live at/below cursor while verifying
        self._ever_connected = False
        self._reconnected = False
        self._suspect: set[int] = set()  # pending live seqs that may be the old process's (rule 11)
        self._echoed: set[int] = set()  # pending live seqs a reply brought back, same bytes (rule 11)
        # Plain attributes, not properties: the reader reads both for every batch, and a property
        # read is a Python frame entered through the descriptor (3.11 specialises none).
        self.held = 0
        """Batches received but not yet delivered (the ingest queue depth): set by each input."""
        self.replay_token: int | None = None
        """The token of the in-flight replay attempt, if any (kept by :meth:`_attempt` and
        :meth:`_finish`, where the recovery's token changes)."""

    # --- views --------------------------------------------------------------------------

    @property
    def check_seq(self) -> int | None:
        """The seq the in-flight attempt's reply must begin with (rule 11's anchor), if it checks one."""
        rec = self._rec
        return None if rec is None or rec.check is None else rec.check[0]

    @property
    def suspects(self) -> frozenset[int]:
        """Pending seqs held back until a whole reply of the new process tells whose they are (rule 11)."""
        return frozenset(self._suspect)

    @property
    def waiting_for_live(self) -> bool:
        """Pending batches wait for the live stream (no replay in flight): see :meth:`on_quiet`."""
        return self._rec is None and bool(self._pending)

    # --- inputs -------------------------------------------------------------------------

    def on_connected(self) -> list[Action]:
        """The SUB socket has a publisher (again): catch up, or verify it is the same one."""
        first, self._ever_connected = not self._ever_connected, True
        out: list[Action] = []
        if self.cursor is not None:
            # The new connection brings only batches published after it: the live stream has passed
            # the cursor. Without this, after an epoch delivered by replays alone (``live_top`` still
            # below the cursor), rule 7 took a restarted process's low live seq for a live copy.
            self._live_top = max(self._live_top, self.cursor)
        if not self._has_replay:
            self._reconnected = not first
            return out
        rec = self._rec
        if self.cursor is None:
            purpose: Purpose = "catch_up"
            start = 0
        elif self._anchor is not None:
            purpose, start = "verify", self._anchor[0]
            # If the verification cannot tell (no answer, anchor evicted) before any live batch came,
            # rule 1 falls back on the reconnect heuristic: the next live batch must still see it.
            self._reconnected = True
        else:  # nothing delivered in this epoch to compare: only the heuristic is left
            self._reconnected = True
            return out
        if rec is None:
            self._begin(purpose, start, out)
        else:
            # The request in flight may have gone to the process that just went away.
            out.append(CancelReplay(rec.token))
            rec.purpose = purpose
            # A silence before the reconnect was the old connection's: this verification gets its own
            # retry (otherwise one silence of the new process ended it and a restart went unseen).
            rec.silent = 0
            self._attempt(start, out)
        return out

    def resume_after(self, seq: int) -> None:
        """Continue a stream that another process delivered up to ``seq`` (a takeover: the cluster's
        ingest reads the last seq it stored). Call before the first connection; the connection is
        then a reconnection that cannot be verified (no anchor payload: rule 1's fallback), so
        the first live batch either continues the stream, its gap replayed from ``seq + 1``, or
        shows a restart."""
        if self._ever_connected or self.cursor is not None:
            raise ValueError("resume_after: only before the first connection")
        self.cursor = seq
        self._live_top = seq
        self._ever_connected = True

    def on_disconnected(self) -> None:
        """The SUB socket lost its publisher: batches from now on come from a new connection."""
        self._gen += 1

    def on_live(self, seq: int, batch: Batch | None, raw: bytes = b"") -> list[Action]:
        """A batch from the SUB socket (``raw``: its payload, to recognise the engine later)."""
        cursor = self.cursor
        rec = self._rec
        if (
            cursor is not None
            and seq == cursor + 1
            and not self._pending
            and seq not in self._suspect
            and (rec is None or rec.purpose != "verify")
        ):
            # The next seq, nothing pending, not verifying (nearly every batch): what the rules below
            # come to for it (rule 3: no gap, no restart, nothing to drain), without their six calls.
            # Nothing pending before or after: ``held`` stays what it was.
            self._reconnected = False
            if seq > self._live_top:  # noqa: PLR1730  # max() is a call: 100 instructions a batch
                self._live_top = seq
            self._probe_due = True
            self.cursor = seq
            self._anchor = (seq, raw)
            if self._heap:  # a test, not a call a batch: the heap is nearly always empty here
                self._heap.clear()  # every entry left is stale (as _drain)
            return [Deliver(seq, batch, False)]
        return self._live(seq, batch, raw)

    def _live(self, seq: int, batch: Batch | None, raw: bytes) -> list[Action]:
        """:meth:`on_live` by the rules themselves (the general case, and the reference its fast
        case is tested against)."""
        out = self._live_by_rules(seq, batch, raw)
        self.held = self._holding()
        return out

    def _live_by_rules(self, seq: int, batch: Batch | None, raw: bytes) -> list[Action]:
        # ``reconnected``: the first live batch since an unverified reconnect. A restart it reveals
        # began at the reconnect, so what the new connection brought (replay items) is the new
        # process's and stays pending for the new epoch instead of being flushed into the old one.
        reconnected, self._reconnected = self._reconnected, False
        out: list[Action] = []
        item: _Item = (batch, raw, self._gen, False)
        if seq in self._suspect:
            self._unsuspect(seq, raw, out)
        if seq in self._pending:
            self._live_pending(seq, raw, item, out)
            return out
        cursor = self.cursor
        rec = self._rec
        verifying = rec is not None and rec.purpose == "verify"
        if cursor is not None and seq <= cursor:
            self._live_behind(seq, item, cursor, out, verifying=verifying, reconnected=reconnected)
            return out
        if cursor is None and rec is None:
            self._start_epoch_live(seq, item, out)
            return out
        if cursor is None:
            # Only a live batch below a live one says the engine went back: a reply runs ahead of a
            # lagging live stream, so live seqs below a replayed batch are the same process's.
            low = self._first_pending()
            # Nor a live batch that may be the old process's (rule 11): it proves nothing of this one.
            if low is not None and (self._pending[low][3] or low in self._suspect):
                low = None
            if low is not None and seq < low and (reason := self._restart_reason(seq, low, batch, reconnected)):
                self._restart(seq, reason, reconnected, out, first_live=seq)
                self._start_epoch_live(seq, item, out)
                return out
        ref = max(self._live_top, -1 if cursor is None else cursor)
        if ref >= 0 and seq - ref > self._jump_limit:
            self._restart(seq, "jump", reconnected, out, first_live=seq)
            self._start_epoch_live(seq, item, out)
            return out
        self._forward(seq, item, verifying, out)
        return out

    def _live_pending(self, seq: int, raw: bytes, item: _Item, out: list[Action]) -> None:
        """A live batch under a seq already pending: its copy, or another process's (rule 11)."""
        if self._other_process(seq, raw):
            # A replayed batch it contradicts came from another process than this live stream's,
            # and so did every reply before (rule 11); so did a live one of this connection.
            held = self._pending[seq]
            by_reply = held[3] or held[2] == self._gen
            self._restart(seq, "identity", True, out, first_live=seq, by_reply=by_reply, other=seq)
            self._start_epoch_live(seq, item, out)
        else:
            out.append(Duplicate(seq))

    def _live_behind(
        self, seq: int, item: _Item, cursor: int, out: list[Action], *, verifying: bool, reconnected: bool
    ) -> None:
        """A live batch at or below the cursor: held while a verification runs, a replayed batch's
        live copy, or a restart (the engine went back, or another process sent the last seq)."""
        batch, raw = item[0], item[1]
        if verifying:
            if len(self._low_live) < self._hold_limit:
                self._low_live.append((seq, batch, raw))
            else:
                out.append(Duplicate(seq))
            return
        # The last delivered seq again with other bytes: another process sent it (a publisher
        # sends one payload per seq), whatever the monitor has reported yet.
        anchor = self._anchor
        other = anchor is not None and seq == anchor[0] and bool(raw and anchor[1]) and raw != anchor[1]
        if seq > self._live_top and not other:  # a replay delivered it first; this is its live copy
            self._live_top = seq
            out.append(Duplicate(seq))
            return
        reason = self._restart_reason(seq, cursor, batch, reconnected) or ("identity" if other else None)
        if reason is None:
            out.append(Duplicate(seq))
        else:
            self._restart(seq, reason, reconnected, out, first_live=seq)
            self._start_epoch_live(seq, item, out)

    def on_replay_item(self, token: int, seq: int, batch: Batch | None, raw: bytes = b"") -> list[Action]:
        """One batch of the replay attempt ``token``."""
        rec = self._rec
        cursor = self.cursor
        pending = self._pending
        if (
            rec is not None
            and token == rec.token
            and rec.first is not None
            and not rec.after_anchor
            and cursor is not None
            and seq == cursor + 1
            and seq not in pending
            and seq not in self._suspect
            and rec.purpose != "verify"
        ):
            # The next seq of the attempt in flight, past its first item, neither pending nor
            # suspect, not verifying (nearly every item of a catch-up): what the rules below come
            # to for it (rule 5: delivered, then what it makes contiguous), without their calls.
            rec.items += 1
            rec.heard = True
            if seq > rec.top:  # noqa: PLR1730  # as above, without max()'s call
                rec.top = seq
            rec.progress = True
            rec.brought += 1
            self.cursor = seq
            self._anchor = (seq, raw)
            out: list[Action] = [Deliver(seq, batch, True)]
            if not pending:
                self._heap.clear()  # every entry left is stale (as _drain)
            elif seq + 1 in pending:  # otherwise _drain would find nothing to deliver
                self._drain(out)
                self.held = self._holding()
            return out
        out = self._replay_item(token, seq, batch, raw)
        self.held = self._holding()
        return out

    def _replay_item(self, token: int, seq: int, batch: Batch | None, raw: bytes) -> list[Action]:
        """:meth:`on_replay_item` by the rules themselves (the general case, and the reference its
        fast case is tested against)."""
        rec = self._rec
        if rec is None or token != rec.token:
            return []
        out: list[Action] = []
        rec.items += 1
        rec.heard = True
        if seq in self._pending and seq not in self._suspect and self._other_process(seq, raw):
            # Before anything else (a first item's check may deliver the pending batch); a suspect
            # is told below. The items this reply brought before are the same process's: the new one's.
            self._restart(seq, "identity", True, out, by_reply=True, same=rec.kept, other=seq)
            self._keep_revealing(seq, batch, raw)
            return out
        if rec.first is None:
            if not self._first_item(rec, seq, batch, raw, out):
                return out
        elif rec.after_anchor:
            self._past_anchor(rec, seq, batch)
        rec.top = max(rec.top, seq)
        if seq in self._suspect:
            self._unsuspect(seq, raw, out)
        cursor = self.cursor
        assert cursor is not None
        if seq in self._pending:
            held = self._pending[seq]
            if not held[3] and raw and held[1] == raw:
                self._echoed.add(seq)  # that live batch is the replying process's (see _restart)
            return out
        if seq <= cursor:
            return out
        if seq == cursor + 1:
            self._deliver(seq, (batch, raw, self._gen, True), out)
            rec.progress = True
            rec.brought += 1
            self._drain(out)
            return out
        if len(self._pending) >= self._hold_limit:
            return out  # not kept: the live stream or a later attempt brings it
        self._put(seq, (batch, raw, self._gen, True))
        rec.kept.add(seq)
        rec.progress = True
        rec.brought += 1
        return out

    def _first_item(self, rec: _Recovery, seq: int, batch: Batch | None, raw: bytes, out: list[Action]) -> bool:
        """A reply's first item: its anchor's check, a jump, where a catch-up starts the epoch.
        False when it revealed a restart (the caller goes no further with this item)."""
        rec.first = seq
        if rec.check is not None:
            if not self._check_identity(rec, rec.check, seq, raw, out):
                self._keep_revealing(seq, batch, raw)
                return False
        elif self.cursor is not None and seq - self.cursor > self._jump_limit:
            # A gap's reply far above the cursor: a clock-seeded engine restarted behind the
            # replay socket (its live stream has not shown it yet). Rule 4's jump, seen here;
            # with no reconnect in between, every batch pending came from the old process.
            self._restart(seq, "jump", False, out)
            self._keep_revealing(seq, batch, raw)
            return False
        elif seq > rec.start:
            rec.floor = seq
        if self.cursor is None:
            # Not from a suspect: one below the catch-up's first item is dropped (rule 11).
            low = min((s for s in self._pending if s not in self._suspect), default=None)
            if low is not None and low < seq:
                self._establish(low, self._pending[low][0], out)
            else:
                self._establish(seq, batch, out)
            # Also when the first item is the lowest pending batch itself (its live copy): without
            # this it, and every later item then kept pending, waited for the end marker.
            self._drain(out)
        return True

    def on_replay_end(self, token: int) -> list[Action]:
        """The end marker of the replay attempt ``token``."""
        out = self._replay_end(token)
        self.held = self._holding()
        return out

    def _replay_end(self, token: int) -> list[Action]:
        rec = self._rec
        if rec is None or token != rec.token:
            return []
        out: list[Action] = []
        rec.heard = True
        if rec.check is not None and rec.items == 0:
            # The engine holds nothing at or after the anchor: a younger process than the one we read
            # (the one read holds the anchor, or later batches once it has evicted it).
            self._restart(rec.check[0], "identity", True, out, by_reply=True)
            return out
        self._settle_suspects(rec)
        self._attempt_over(out)
        return out

    def on_replay_failed(self, token: int, outcome: str) -> list[Action]:
        """The attempt ``token`` ended without its end marker: ``"timeout"`` (nothing more came) or
        ``"failed"`` (a malformed reply, a socket error)."""
        if outcome not in ("timeout", "failed"):
            raise ValueError(f"replay failure outcome must be 'timeout' or 'failed', got {outcome!r}")
        out = self._replay_failed(token, outcome)
        self.held = self._holding()
        return out

    def _replay_failed(self, token: int, outcome: str) -> list[Action]:
        rec = self._rec
        if rec is None or token != rec.token:
            return []
        out: list[Action] = []
        if rec.purpose == "verify":
            if outcome == "timeout" and rec.items == 0 and rec.silent == 0 and rec.attempt < self._max_attempts:
                rec.silent += 1  # no answer yet: ask once more before judging by the live stream
                self._attempt(rec.start, out)
                return out
            self._unverifiable(out)
            if self._rec is not rec:
                return out
        self._attempt_over(out, silent=outcome == "timeout" and rec.items == 0, ended=False)
        return out

    def on_quiet(self) -> list[Action]:
        """The live stream has been quiet for a while (rule 10). With batches pending above a hole,
        it will not bring the hole any more: the hole is treated as passed (rule 6). Otherwise,
        once after each burst, the replay socket is asked for anything after the cursor: the PUB
        socket drops at its high-water mark, and a burst's dropped tail shows in no later live
        batch when the engine goes idle."""
        out = self._on_quiet()
        self.held = self._holding()
        return out

    def _on_quiet(self) -> list[Action]:
        out: list[Action] = []
        if self._rec is not None:
            return out
        if self._pending:
            self._live_top = max([self._live_top, *self._pending])
            self._settle(out)
        elif self._probe_due and self._has_replay and self.cursor is not None:
            self._probe_due = False
            self._begin("tail", self.cursor + 1, out)
        return out

    # --- the rules ----------------------------------------------------------------------

    def _start_epoch_live(self, seq: int, item: _Item, out: list[Action]) -> None:
        """Rules 1-2 for a live batch when nothing of the epoch is known yet."""
        self._live_top = max(self._live_top, seq)
        if self._rec is not None:  # a restart has begun the new process's catch-up
            self._put(seq, item)
            return
        if self._has_replay and seq != 0:  # seq 0 is a process's first batch: nothing precedes it
            self._put(seq, item)
            self._begin("catch_up", 0, out)
            return
        self._establish(seq, item[0], out)
        self._deliver(seq, item, out)

    def _establish(self, start: int, batch: Batch | None, out: list[Action], *, unanswered: bool = False) -> None:
        """Rule 2: the epoch starts at ``start``; say what lies before it. ``unanswered``: the
        catch-up that should have brought it got no answer at all, so nothing says the engine no
        longer holds it (the seqs before are lost ``no_answer``, not a truncated history)."""
        if self._origin_zero and not clock_seeded(start):
            self.cursor = -1
            if start > 0:
                self._account(start - 1, "restart", out)
            return
        self.cursor = start - 1
        if start > 0 and not clock_seeded(start) and not _starts_cleared(batch):
            if unanswered:
                self.cursor = -1
                self._account(start - 1, "no_answer", out)
            else:
                out.append(HistoryTruncated(start))

    def _forward(self, seq: int, item: _Item, verifying: bool, out: list[Action]) -> None:
        """Rules 3-4: a live batch above the cursor (or during a catch-up) that is not pending."""
        self._report_gaps(seq, out)
        self._live_top = max(self._live_top, seq)
        cursor = self.cursor
        if cursor is not None and seq == cursor + 1 and not verifying:
            self._deliver(seq, item, out)
            self._drain(out)
            return
        self._put(seq, item)
        if self._rec is not None:
            if self._holding() > self._hold_limit:
                self._overflow(out)
            return
        self._settle(out)

    def _report_gaps(self, seq: int, out: list[Action]) -> None:
        """GapDetected for the seqs the live stream skipped that nothing else brought."""
        if self._live_top < 0:
            # The first live batch of the epoch: what came before is history, not a gap. But seqs it
            # skips after the cursor while an attempt is in flight were never asked for (rule 6).
            rec, cursor = self._rec, self.cursor
            if rec is not None and cursor is not None and cursor < seq - 1 and seq - 1 not in self._pending:
                rec.opened = True
            return
        low = self._live_top + 1
        if self.cursor is not None:
            low = max(low, self.cursor + 1)
        run, before = low, len(out)
        # Nothing pending (nearly every batch): no generator and sort of an empty dict.
        for held in sorted(s for s in self._pending if low <= s < seq) if self._pending else ():
            if held > run:
                out.append(GapDetected(run, held - 1))
            run = held + 1
        if run < seq:
            out.append(GapDetected(run, seq - 1))
        if self._rec is not None and len(out) > before:
            self._rec.opened = True

    def _settle(self, out: list[Action]) -> None:
        """No replay in flight and something missing below a pending batch: recover or account it."""
        while self._pending:
            assert self.cursor is not None
            low = self._first_pending()
            assert low is not None
            if low == self.cursor + 1:
                if low in self._suspect:
                    return  # it waits for the catch-up that tells whose it is (rule 11)
                self._drain(out)
                continue
            if self.cursor + 1 > self._live_top:
                return  # the live stream is behind and will bring it (rule 6)
            if self._has_replay:
                self._begin("gap", self.cursor + 1, out)
                return
            self._account(low - 1, "no_replay", out)
            out.append(ReplayFinished(None, "unavailable", 0))
            self._drain(out)

    def _check_identity(
        self, rec: _Recovery, check: tuple[int, bytes], seq: int, raw: bytes, out: list[Action]
    ) -> bool:
        """Rules 1 and 11 on the first item of any attempt asked from the anchor; False when it found
        a restart. The same bytes: the engine is the one read (a verification goes on as a gap
        replay; the anchor item itself is at or below the cursor and ignored)."""
        anchor, anchor_raw = check
        verifying = rec.purpose == "verify"
        if seq == anchor and raw == anchor_raw:
            # After a verification's anchor the reply goes on as a gap replay, which rule 1 judges
            # by its live stream; a gap's or a probe's next item may prove a hole unheld (rule 6).
            rec.after_anchor = not verifying
            if verifying:
                self._reconnected = False  # the same engine: no heuristic for the next live batch
                out.extend(Duplicate(s) for s, _, _ in self._low_live)
                self._low_live.clear()
                rec.purpose = "gap"
                self._drain(out)
            return True
        if seq <= anchor:  # another batch under the same seq, or a reply from below what was asked
            # Not a verification: the monitor has not (yet) reported the reconnection, so the
            # batches of the current connection may be the new process's: kept for its epoch.
            self._restart(seq, "identity", True, out, by_reply=True)
            return False
        if seq - anchor > self._jump_limit:
            # A gap's reply far above: a clock-seeded engine restarted behind the replay socket. With
            # no reconnect reported, every pending batch came from the old process.
            self._restart(seq, "jump", verifying, out)
            return False
        # The anchor has left the buffer: the engine cannot be told apart (for a verification, the
        # live stream decides); the seqs below the first item are evicted.
        rec.floor = seq
        if verifying:
            self._unverifiable(out)
        return self._rec is rec

    @staticmethod
    def _past_anchor(rec: _Recovery, seq: int, batch: Batch | None) -> None:
        """The first item after the anchor an attempt matched. A buffer holds no gap after a batch it
        holds, except the seqs an engine never buffered (TensorRT-LLM's dropped queue, fenced by an
        AllBlocksCleared): above the anchor's next seq and a fence, it proves those unheld (rule 6's
        proof, one item later). Without a fence the hole is one of transit, asked again."""
        rec.after_anchor = False
        if seq > rec.start + 1 and _starts_cleared(batch):
            rec.floor = seq

    def _keep_revealing(self, seq: int, batch: Batch | None, raw: bytes) -> None:
        """A replay item that gave a restart away is the new process's: kept for its epoch, and
        counted as brought by the catch-up the restart began (the engine may evict it before then)."""
        self._put(seq, (batch, raw, self._gen, True))
        self._suspect.discard(seq)  # it replaces a suspect under its seq: this one is the new process's
        if self._rec is not None:
            self._rec.brought += 1
            self._rec.progress = True

    def _unsuspect(self, seq: int, raw: bytes, out: list[Action]) -> None:
        """Rule 11: the new process brings ``seq`` (live or replayed) after the restart was found. Other
        bytes than the pending batch's: that one was the old process's, dropped for this one (which
        the caller then takes as new); the same: it was the new one's, and may go on now."""
        self._suspect.discard(seq)
        held = self._pending.get(seq)
        if held is not None and raw and held[1] and held[1] != raw:
            del self._pending[seq]
            return
        if held is not None and not held[3]:
            self._live_top = max(self._live_top, seq)  # the new process's live stream passed it
        if self.cursor is not None:
            self._drain(out)

    def _settle_suspects(self, rec: _Recovery) -> None:
        """Rule 11, after a whole reply of the new epoch: it is the new process's buffer as it was
        after every suspect arrived, so a suspect above its last item was published by the old one
        (dropped: the old epoch has ended; if it was the new one's after all, a gap replay fetches
        it). Those it brought were told as they came (replaced, or confirmed). One it did not bring
        cannot be told: below its first item, the new process no longer holds that seq, or never
        sent it; between its items, the ROUTER may have dropped it. Dropped too, rather than an old
        batch delivered as the new process's (the next attempt or a gap brings the new one's)."""
        self._drop_suspects()

    def _drop_suspects(self) -> None:
        """Drop every suspect from the pending batches."""
        for seq in self._suspect:
            self._pending.pop(seq, None)
        self._suspect.clear()

    def _other_process(self, seq: int, raw: bytes) -> bool:
        """Rule 1's comparison, made by any batch: ``seq`` is pending and comes again with other
        bytes. A publisher sends the same payload for a seq live and replayed, so only another
        process does that, on this connection too when the connection events are late (rule 11)."""
        held = self._pending[seq]
        return bool(raw) and bool(held[1]) and held[1] != raw

    def _unverifiable(self, out: list[Action]) -> None:
        """Rule 1's fallback: a live batch at or below the cursor after the reconnect is a restart."""
        rec = self._rec
        assert rec is not None
        rec.purpose = "gap"
        if not self._low_live:
            self._drain(out)
            return
        assert self.cursor is not None
        seq, batch, _ = self._low_live[0]
        reason = self._restart_reason(seq, self.cursor, batch, True)
        assert reason is not None  # reconnected=True always gives one
        self._restart(seq, reason, True, out)

    def _attempt_over(self, out: list[Action], *, silent: bool = False, ended: bool = True) -> None:
        """Rule 6. ``silent``: the attempt timed out with no answer at all; ``ended``: its end
        marker came (without it, the reply may have lost its tail as well)."""
        rec = self._rec
        assert rec is not None
        # Rule 11's suspects not told apart by a whole reply (this one failed) are dropped: the old
        # process's must not pass for the new one's, whose own a later reply or gap brings again.
        self._drop_suspects()
        # An engine busy publishing, or a request sent while its ROUTER was reconnecting, can leave
        # one attempt unanswered: that one is asked again; a second silence ends the recovery.
        retry_silence = silent and rec.silent == 0
        rec.silent += silent
        if retry_silence and rec.attempt < self._max_attempts:
            self._attempt(rec.start, out)  # nothing changed for this request: the same one again
            return
        if self.cursor is None:
            low = self._first_pending()
            if low is None:  # nothing known at all: wait for the live stream
                self._finish(out)
                return
            # A catch-up nobody answered says nothing of the seqs below the first live batch.
            self._establish(low, self._pending[low][0], out, unanswered=rec.purpose == "catch_up" and not rec.heard)
        self._drain(out)
        assert self.cursor is not None
        # Progress: something new came, or the first missing seq moved up (the reply brought what
        # live had brought too): the next attempt starts higher, so the retries end. A gap the live
        # stream opened after this attempt was asked was never asked for: it gets its own attempt
        # (with late connection events, that one may reach a new process, and its check tells).
        progress = rec.progress or self.cursor + 1 > rec.mark or rec.opened
        while True:
            self._drain(out)
            assert self.cursor is not None
            low = self._first_pending()
            if low is None:
                # Nothing known above the cursor. A reply that lost its end marker after bringing
                # something may have lost its tail too (SGLang's reply stops partway): ask again.
                if not ended and progress and rec.items and rec.attempt < self._max_attempts:
                    self._attempt(self.cursor + 1, out)
                else:
                    self._finish(out)
                return
            nxt = self.cursor + 1
            passed = nxt <= self._live_top
            if rec.floor is not None and rec.start <= nxt < rec.floor:
                if not passed:
                    self._finish(out)
                    return
                self._account(min(low, rec.floor) - 1, "evicted", out)
                continue
            if progress and rec.attempt < self._max_attempts:
                self._attempt(nxt, out)
                return
            if not passed:
                self._finish(out)
                return
            # The anchor that came back first is the check (rule 11), not a sign that the engine
            # holds what is missing: a reply with nothing usable after it is no answer.
            beyond = rec.items - (rec.check is not None and rec.first == rec.check[0])
            self._account(low - 1, "transit" if rec.brought or beyond else "no_answer", out)

    def _overflow(self, out: list[Action]) -> None:
        """Rule 9."""
        rec = self._rec
        assert rec is not None
        out.append(CancelReplay(rec.token))
        self._flush("overflow", lambda seq, item: True, out)
        self._finish(out)

    def _flush(self, reason: LossReason, old: Callable[[int, _Item], bool], out: list[Action]) -> None:
        """Deliver the pending batches that ``old`` selects, holes counted as ``reason``."""
        for seq in sorted(self._pending):
            item = self._pending[seq]
            if not old(seq, item):
                continue
            del self._pending[seq]
            if self.cursor is None:
                self._establish(seq, item[0], out)
            assert self.cursor is not None
            if seq > self.cursor + 1:
                self._account(seq - 1, reason, out)
            self._deliver(seq, item, out)
        self._heap = sorted(self._pending)

    def _restart_reason(self, seq: int, ref: int, batch: Batch | None, reconnected: bool) -> RestartReason | None:
        """Rule 7, for a live ``seq`` at or below ``ref``."""
        if seq <= 1 and seq < ref:
            return "seq_reset"
        if ref - seq > self._restart_window:
            return "window"
        if reconnected:
            return "reconnect"
        if _starts_cleared(batch):
            return "cleared"
        return None

    def _restart(
        self,
        seq: int,
        reason: RestartReason,
        by_connection: bool,
        out: list[Action],
        *,
        first_live: int | None = None,
        by_reply: bool = False,
        same: set[int] | None = None,
        other: int | None = None,
    ) -> None:
        """Rule 8. ``by_connection``: batches of the connection before the last disconnect are the
        old process's; without it (a live batch gave the restart away) everything pending is.
        ``by_reply``: a reply gave it away; the live batches of the current connection kept for the
        new epoch may still be the old process's if the connection events are late (rule 11).
        ``same``: pending seqs known to be the new process's (its reply brought them); ``other``: the
        pending seq the revealing batch contradicted, so the old process's."""
        rec = self._rec
        if rec is not None:
            out.append(CancelReplay(rec.token))
        # What the current connection brought and is kept for the new epoch may be the old process's
        # if the connection events are late, or the restart came after them (after a verification's
        # connect event too: the process it reached may have died since): suspects (rule 11). Not
        # after a jump: the new process publishes far above the old.
        suspects = by_connection and reason != "jump"
        current = self._gen
        same = set() if same is None else set(same)
        old = self._old_process(
            reason, by_connection=by_connection, by_reply=by_reply, first_live=first_live, same=same, other=other
        )
        # Suspects of the epoch that ends were never told to be its process's: neither epoch's.
        self._drop_suspects()
        self._flush("restart", old, out)
        if rec is not None:
            self._finish(out, by_restart=True)
        # Rule 11: the new epoch's catch-up tells them apart (see _settle_suspects).
        self._suspect = set(self._pending) - same if suspects else set()
        self._echoed = set()
        # Live batches at or below the cursor since the reconnect are the new process's own.
        low_live, self._low_live = self._low_live, []
        if by_connection:
            for s, b, raw in low_live:
                if s not in self._pending:
                    self._put(s, (b, raw, current, False))
        out.append(Restart(seq, -1 if self.cursor is None else self.cursor, reason))
        self._reconnected = False  # the restart is found: the heuristic has done its work
        self.cursor = None
        self._anchor = None
        self._origin_zero = reason != "jump"
        # A suspect is not known to be the new process's live stream: counted once it is (_unsuspect).
        self._live_top = max((s for s in self._pending if s not in self._suspect), default=-1)
        # A live seq 0 that gave the restart away is the new process's first batch: no history to fetch.
        if self._has_replay and not (first_live == 0 and not self._pending):
            self._begin("catch_up", 0, out)

    def _old_process(
        self,
        reason: RestartReason,
        *,
        by_connection: bool,
        by_reply: bool,
        first_live: int | None,
        same: set[int],
        other: int | None,
    ) -> Callable[[int, _Item], bool]:
        """At a restart (:meth:`_restart`'s arguments): whether a pending batch is the old process's."""
        current, echoed, cursor, jump_limit = self._gen, self._echoed, self.cursor, self._jump_limit

        def old(seq: int, item: _Item) -> bool:
            if reason == "jump" and cursor is not None:
                # The new process's seqs all lie far above the old cursor, whatever the connection
                # (the connection events may come late): the batches near it are the old process's.
                return seq - cursor <= jump_limit
            # A reply (not a verification) gave it away: the replies before it came from the old
            # process, whatever the connection, and so did a live batch one of them brought back
            # with the same bytes; only the other live batches may be the new one's (rule 11).
            if seq == other:
                return True
            if seq in same:
                return False
            if first_live is not None and not item[3] and seq > first_live:
                # Live before the live batch that revealed the restart, and above it: the new
                # process's live stream goes up, so it was the old one's.
                return True
            return not by_connection or item[2] < current or (by_reply and (item[3] or seq in echoed))

        return old

    def _finish(self, out: list[Action], *, by_restart: bool = False) -> None:
        rec = self._rec
        assert rec is not None
        self._drop_suspects()  # no whole reply told them apart (see _attempt_over)
        if rec.lost == 0 and (rec.heard or rec.brought > 0):
            outcome: Outcome = "recovered"
        elif rec.brought > 0:
            outcome = "partial"
        else:  # lost with nothing brought, or no answer at all
            outcome = "failed"
        out.append(ReplayFinished(rec.token, outcome, rec.brought, rec.attempt, by_restart))
        self._rec = None
        self.replay_token = None

    # --- primitives ---------------------------------------------------------------------

    def _holding(self) -> int:
        """What :attr:`held` says: the batches pending and the low live ones kept. Worked out after
        each input that can change them (the attribute is read for every batch; the fast cases,
        which change neither, leave it)."""
        return len(self._pending) + len(self._low_live)

    def _begin(self, purpose: Purpose, start: int, out: list[Action]) -> None:
        self._rec = _Recovery(0, start, purpose)
        self._attempt(start, out)

    def _attempt(self, start: int, out: list[Action]) -> None:
        rec = self._rec
        assert rec is not None
        self._last_token += 1
        mark = start if self.cursor is None else self.cursor + 1
        # Rule 11: ask from the last delivered seq, whatever the purpose; the reply may come from a
        # process other than the one last read (its DEALER reaches whoever binds the port now). Also
        # when a request is repeated after the cursor moved on: everything up to the anchor is here.
        check = self._anchor
        if check is not None:
            start = check[0]
        rec.new_attempt(self._last_token, start)
        self.replay_token = rec.token
        rec.check = check
        rec.mark = mark
        out.append(RequestReplay(rec.token, start, rec.purpose, rec.attempt))

    def _put(self, seq: int, item: _Item) -> None:
        self._pending[seq] = item
        heapq.heappush(self._heap, seq)

    def _first_pending(self) -> int | None:
        heap = self._heap
        while heap and heap[0] not in self._pending:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _account(self, last: int, reason: LossReason, out: list[Action]) -> None:
        """Count ``cursor + 1 .. last`` as lost; ``not_sent`` when the engine fenced it with a clear."""
        cursor = self.cursor
        assert cursor is not None and last > cursor
        # Only where the engine is not known to hold them: ``transit`` and ``no_answer`` seqs may be in
        # its buffer (a reply reached at or below them, or none came), so a fence does not make them
        # unsent; ``evicted`` ones are not in it, and without a replay endpoint the fence is all we have.
        if reason in ("evicted", "no_replay"):
            after = self._pending.get(last + 1)
            if after is not None and _starts_cleared(after[0]):
                reason = "not_sent"
        out.append(Unrecovered(cursor + 1, last, reason))
        if self._rec is not None:
            self._rec.lost += last - cursor
        self.cursor = last

    def _deliver(self, seq: int, item: _Item, out: list[Action]) -> None:
        batch, raw, _, replayed = item
        out.append(Deliver(seq, batch, replayed))
        self._probe_due |= not replayed
        self.cursor = seq
        self._anchor = (seq, raw)

    def _drain(self, out: list[Action]) -> None:
        pending = self._pending
        if self._rec is not None and self._rec.purpose == "verify":
            return
        while pending:
            assert self.cursor is not None
            nxt = self.cursor + 1
            if nxt in self._suspect:
                return  # maybe the old process's: not before the new epoch's reply says (rule 11)
            item = pending.pop(nxt, None)
            if item is None:
                return
            self._deliver(nxt, item, out)
        self._heap.clear()  # every entry left is stale
