"""The sequencer against an adversarial publisher model: properties, not examples.

The engine drops live batches (PUB high-water mark) and batches of its own (TensorRT-LLM's queue,
fenced by an AllBlocksCleared), answers replays with holes, cut tails, late or never, evicts old
batches from a bounded buffer, and restarts: at seq 0, clock-seeded far above, or young (the new
process publishes past the old cursor before the gateway reconnects). The auditor checks every
action as it comes and each epoch as a whole.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvgateway.sequencer import (
    Action,
    CancelReplay,
    Deliver,
    Duplicate,
    GapDetected,
    HistoryTruncated,
    ReplayFinished,
    RequestReplay,
    Restart,
    Sequencer,
    Unrecovered,
    clock_seeded,
)
from kvgateway.wire import AllBlocksCleared, Batch, BlockRemoved

CLOCK = 1_700_000_000_000_000_000


def raw(seq: int, proc: int = 0) -> bytes:
    return f"{proc}:{seq}".encode()


# --- properties against an adversarial publisher --------------------------------------------------

RESTART_WINDOW = 20
JUMP_LIMIT = 1000


def pb(proc: int, seq: int, fence: bool = False) -> Batch:
    """Process ``proc``'s batch ``seq`` (dp_rank tells the processes apart)."""
    events: list[Any] = [BlockRemoved(block_hashes=[seq])]
    if fence:
        events.insert(0, AllBlocksCleared())
    return Batch(ts=float(seq), events=events, dp_rank=proc)


@dataclass
class Proc:
    """One publisher process: what it published, and its bounded replay buffer."""

    base: int
    buffer: int
    batches: dict[int, Batch] = field(default_factory=dict)
    published: list[int] = field(default_factory=list)
    next: int = 0
    brought: set[int] = field(default_factory=set)  # reached the sequencer above its frontier

    def publish(self, proc: int, fence: bool = False) -> int:
        seq = self.next
        self.batches[seq] = pb(proc, seq, fence)
        self.published.append(seq)
        self.next += 1
        return seq

    def holds(self, seq: int) -> bool:
        return seq in self.batches and seq in self.published[-self.buffer :]


@dataclass
class Request:
    token: int
    start: int
    purpose: str
    dead: bool = False  # sent to a process that has gone
    items: list[int] | None = None  # the engine's buffer from ``start`` when it answers


class PublisherModel(RuleBasedStateMachine):
    """An engine that drops live batches, answers replays with holes, late or never, evicts and restarts."""

    @initialize(buffer=st.integers(1, 30), clock=st.booleans())
    def setup(self, buffer: int, clock: bool) -> None:
        self.seq = Sequencer(has_replay=True, restart_window=RESTART_WINDOW, jump_limit=JUMP_LIMIT)
        self.buffer = buffer
        base = CLOCK if clock else 0
        self.procs = [Proc(base, buffer, next=base)]
        self.queue: deque[tuple[int, int]] = deque()  # the SUB socket's queue: (proc, seq)
        self.request: Request | None = None
        self.unseen = False  # a restart not yet detected
        # The auditor's view, per epoch (epoch i is process i).
        self.epoch = 0
        self.frontier: int | None = None
        self.delivered: list[set[int]] = [set()]
        self.lost: list[set[int]] = [set()]
        self.first: list[int | None] = [None]
        self.recovery_lost = 0
        self.recovery_replayed = 0
        self.restarts: list[Restart] = []
        self.apply(self.seq.on_connected())

    @property
    def proc(self) -> Proc:
        return self.procs[-1]

    # --- the auditor ------------------------------------------------------------------

    def apply(self, actions: list[Action]) -> None:
        for a in actions:
            self.audit(a)

    def audit(self, a: Action) -> None:
        p = self.procs[self.epoch]
        if isinstance(a, Deliver):
            assert self.frontier is None or a.seq == self.frontier + 1, (a.seq, self.frontier)
            assert a.batch == p.batches[a.seq], (a, self.epoch)
            if a.replayed:
                self.recovery_replayed += 1
            self.delivered[self.epoch].add(a.seq)
            if self.first[self.epoch] is None:
                self.first[self.epoch] = a.seq
            self.frontier = a.seq
        elif isinstance(a, Unrecovered):
            assert self.frontier is not None and a.first == self.frontier + 1 and a.last >= a.first, (a, self.frontier)
            seqs = set(range(a.first, a.last + 1))
            assert not seqs & p.brought, (a, sorted(seqs & p.brought))
            if a.reason == "evicted":
                assert not any(p.holds(s) for s in seqs), a
            if a.reason == "restart":
                assert self.first[self.epoch] is None or self.epoch > 0
            self.lost[self.epoch] |= seqs
            self.recovery_lost += len(seqs)
            self.frontier = a.last
        elif isinstance(a, HistoryTruncated):
            assert self.frontier is None and not clock_seeded(a.first)
            assert not any(p.holds(s) for s in range(p.base, a.first))
            self.frontier = a.first - 1
        elif isinstance(a, RequestReplay):
            assert self.request is None or self.request.token == a.token - 1
            if a.attempt == 1:
                self.recovery_lost = self.recovery_replayed = 0
            self.request = Request(a.token, a.start, a.purpose)
        elif isinstance(a, CancelReplay):
            assert self.request is not None and a.token == self.request.token
        elif isinstance(a, ReplayFinished):
            assert self.request is not None and a.token == self.request.token
            if a.outcome == "recovered":
                assert self.recovery_lost == 0
            elif a.outcome == "partial":
                assert self.recovery_lost > 0 and a.replayed > 0
            else:
                assert a.outcome == "failed" and self.recovery_lost > 0 and a.replayed == 0
            self.request = None
        elif isinstance(a, Restart):
            assert self.unseen, a  # every restart detected exactly once, and only real ones
            self.unseen = False
            self.restarts.append(a)
            self.end_epoch()
            self.epoch += 1
            assert self.epoch == len(self.procs) - 1
            self.frontier = None if clock_seeded(self.proc.base) else -1
            self.delivered.append(set())
            self.lost.append(set())
            self.first.append(None)
        elif isinstance(a, GapDetected):
            assert a.last >= a.first
        else:
            assert isinstance(a, Duplicate)

    def end_epoch(self) -> None:
        delivered, lost = self.delivered[self.epoch], self.lost[self.epoch]
        assert not delivered & lost
        if delivered or lost:
            low = min(delivered | lost)
            assert delivered | lost == set(range(low, max(delivered | lost) + 1))

    # --- the publisher ----------------------------------------------------------------

    def feed_live(self, proc: int, seq: int) -> None:
        p = self.procs[proc]
        above = self.frontier is None or seq > self.frontier
        known = seq in p.brought
        actions = self.seq.on_live(seq, p.batches[seq], raw(seq, proc))
        if not self.unseen and proc == self.epoch:
            assert any(isinstance(a, Duplicate) for a in actions) == known, (seq, actions)
        if above and proc == self.epoch:
            p.brought.add(seq)
        self.apply(actions)

    @rule(kind=st.sampled_from(["ok", "ok", "ok", "drop", "not_sent"]), count=st.integers(1, 12))
    def publish(self, kind: str, count: int) -> None:
        proc = len(self.procs) - 1
        for _ in range(count if kind != "ok" else 1):
            if kind == "not_sent":
                self.proc.next += 1  # dropped by the engine's own queue: never published, never held
            else:
                seq = self.proc.publish(proc)
                if kind == "ok":
                    self.queue.append((proc, seq))
        if kind == "not_sent":
            self.queue.append((proc, self.proc.publish(proc, fence=True)))

    @rule(count=st.integers(1, 8))
    def deliver_live(self, count: int) -> None:
        for _ in range(min(count, len(self.queue))):
            self.feed_live(*self.queue.popleft())

    @precondition(lambda self: self.request is not None and not self.request.dead and not self.unseen)
    @rule(count=st.integers(1, 10), drops=st.lists(st.booleans(), max_size=10))
    def answer(self, count: int, drops: list[bool]) -> None:
        req = self.request
        assert req is not None
        proc = len(self.procs) - 1
        p = self.proc
        if req.items is None:
            req.items = [s for s in p.published[-p.buffer :] if s >= req.start]
            first = True
        else:
            first = False
        for i in range(min(count, len(req.items))):
            seq = req.items.pop(0)
            if not first and i < len(drops) and drops[i]:
                continue  # dropped at the ROUTER's high-water mark (never the first item)
            first = False
            above = self.frontier is None or seq > self.frontier
            self.apply(self.seq.on_replay_item(req.token, seq, p.batches[seq], raw(seq, proc)))
            if above and proc == self.epoch:
                p.brought.add(seq)
            if self.request is not req:
                return

    @precondition(lambda self: self.request is not None)
    @rule(kind=st.sampled_from(["end", "end", "timeout", "failed"]))
    def finish(self, kind: str) -> None:
        req = self.request
        assert req is not None
        if kind == "end" and (req.dead or self.unseen):
            kind = "timeout"
        if kind == "end":
            self.apply(self.seq.on_replay_end(req.token))
        else:
            self.apply(self.seq.on_replay_failed(req.token, kind))

    @precondition(lambda self: self.request is None and not self.queue)
    @rule()
    def quiet(self) -> None:
        self.apply(self.seq.on_quiet())

    @precondition(lambda self: not self.unseen)
    @rule()
    def reconnect(self) -> None:
        """The SUB socket drops and comes back to the same engine: what was in flight is lost."""
        self.queue.clear()
        self.seq.on_disconnected()
        self.apply(self.seq.on_connected())

    @precondition(lambda self: not self.unseen and self.delivered[self.epoch] and (self.frontier or 0) >= 1)
    @rule(kind=st.sampled_from(["reset", "jump", "young"]), extra=st.integers(0, 40), connect=st.booleans())
    def restart(self, kind: str, extra: int, connect: bool) -> None:
        old = self.proc
        self.queue.clear()
        if self.request is not None:
            self.request.dead = True
        # A counting publisher restarts at 0; a clock-seeded one (TensorRT-LLM) far above (kind "jump").
        base = old.next + JUMP_LIMIT + 1 + extra if clock_seeded(old.base) else 0
        self.procs.append(Proc(base, self.buffer, next=base))
        self.unseen = True
        proc = len(self.procs) - 1
        if kind == "young":
            # The new process published before we reconnect (the SUB sees none of it); verify tells.
            for _ in range(min(extra, self.buffer)):
                self.proc.publish(proc)
            self.seq.on_disconnected()
            self.apply(self.seq.on_connected())
            req = self.request
            assert req is not None and req.purpose == "verify" and self.unseen
            items = [s for s in self.proc.published if s >= req.start]
            if items:
                self.apply(
                    self.seq.on_replay_item(req.token, items[0], self.proc.batches[items[0]], raw(items[0], proc))
                )
            else:
                self.apply(self.seq.on_replay_end(req.token))
            assert not self.unseen
            return
        if connect:
            self.seq.on_disconnected()
            self.apply(self.seq.on_connected())
        if self.unseen:
            # Its first batch reaches us live (a reset to 0, or a jump of the clock), and gives it away.
            self.feed_live(proc, self.proc.publish(proc))
            assert not self.unseen

    @invariant()
    def views(self) -> None:
        s = self.seq
        assert s.waiting_for_live == (s.replay_token is None and s.held > 0)
        assert (s.replay_token is None) == (self.request is None)

    def teardown(self) -> None:
        if not hasattr(self, "seq"):
            return
        # Let everything settle: live arrives, every request is answered completely, then quiet.
        for _ in range(200):
            self.deliver_live(len(self.queue))
            req = self.request
            if req is not None:
                if req.dead:
                    self.finish("timeout")
                else:
                    self.answer(10_000, [])
                    if self.request is req:
                        self.finish("end")
            elif self.seq.held:
                self.quiet()
            else:
                break
        assert self.seq.replay_token is None and self.seq.held == 0
        self.end_epoch()
        assert len(self.restarts) == len(self.procs) - 1
        # What the engine still held at the end and was published after we first heard of it is not lost.


PublisherModel.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPublisherModel = PublisherModel.TestCase
