"""The sequencer against an adversarial publisher model: properties, not examples.

The engine drops live batches (PUB high-water mark) and batches of its own (TensorRT-LLM's queue,
fenced by an AllBlocksCleared), answers replays with holes, cut tails, late or never, evicts old
batches from a bounded buffer, and restarts: at seq 0, clock-seeded far above, or young (the new
process publishes past the old cursor before the gateway reconnects). After a restart the
monitor's disconnect and connect may come late: the new process's live batches, and its answers to
requests sent before (a quiet stream's tail probe, a gap replay) or after the crash, reach the
sequencer first (rule 11). The auditor checks every action as it comes and each epoch as a whole.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvgateway.engine.sequencer import (
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
from kvgateway.engine.wire import Batch
from tests.support import events

CLOCK = 1_700_000_000_000_000_000


def raw(seq: int, proc: int = 0) -> bytes:
    return f"{proc}:{seq}".encode()


# --- properties against an adversarial publisher --------------------------------------------------

RESTART_WINDOW = 20
JUMP_LIMIT = 1000


def pb(proc: int, seq: int, fence: bool = False) -> Batch:
    """Process ``proc``'s batch ``seq`` (dp_rank tells the processes apart)."""
    fenced = [events.cleared()] if fence else []
    return events.batch(*fenced, events.removed(seq), ts=float(seq), dp_rank=proc)


@dataclass
class Proc:
    """One publisher process: what it published, and its bounded replay buffer."""

    base: int
    buffer: int
    batches: dict[int, Batch] = field(default_factory=dict)
    published: list[int] = field(default_factory=list)
    next: int = 0
    brought: set[int] = field(default_factory=set)  # reached the sequencer above its epoch's frontier
    # Reached the sequencer before its restart was detected: this epoch's once it is (rule 8), unless
    # the old epoch took it first (rule 1's limitation, see ``blurred``).
    carried: set[int] = field(default_factory=set)

    def publish(self, proc: int, fence: bool = False) -> int:
        seq = self.next
        self.batches[seq] = pb(proc, seq, fence)
        self.published.append(seq)
        self.next += 1
        return seq

    def buffered(self) -> list[int]:
        """The replay buffer: the last ``buffer`` batches published."""
        return self.published[-self.buffer :]


@dataclass
class Request:
    token: int
    start: int
    purpose: str
    proc: int  # the process it was sent to
    anchored: bool = False  # asked from the last delivered seq: its reply is checked (rule 11)
    dead: bool = False  # that process has gone: never answered
    items: list[int] | None = None  # the reply still to send, once the engine has answered
    held: set[int] | None = None  # the engine's buffer when it answered
    sent: int = 0  # items sent


class PublisherModel(RuleBasedStateMachine):
    """An engine that drops live batches, answers replays with holes, late or never, evicts and restarts."""

    @initialize(buffer=st.integers(1, 30), clock=st.booleans(), pre=st.integers(0, 40))
    def setup(self, buffer: int, clock: bool, pre: int) -> None:
        self.seq = Sequencer(has_replay=True, restart_window=RESTART_WINDOW, jump_limit=JUMP_LIMIT)
        self.buffer = buffer
        base = CLOCK if clock else 0
        self.procs = [Proc(base, buffer, next=base)]
        for _ in range(pre):  # the engine ran before the gateway connected: the catch-up fetches it
            self.proc.publish(0)
        self.queue: deque[tuple[int, int]] = deque()  # the SUB socket's queue: (proc, seq)
        self.request: Request | None = None
        self.unseen = False  # a restart not yet detected
        # Rule 1's known limitation: after a restart, a verification that cannot tell (no answer, a
        # malformed one, or the anchor no longer buffered) leaves the restart to the live stream,
        # which cannot tell it from a gap if the new process's first live seq is above the cursor.
        self.cannot_tell = False
        self.first_new_live: tuple[int, int | None] | None = None  # its first live seq, the old cursor
        self.connection_due = False  # a restart whose disconnect and connect events are still to come
        self.restart_frontier: int | None = None
        # The auditor's view, per epoch (epoch i is process i).
        self.epoch = 0
        self.frontier: int | None = None
        self.last_delivered: int | None = None
        self.delivered: list[set[int]] = [set()]
        self.lost: list[set[int]] = [set()]
        self.first: list[int | None] = [None]
        self.recovery_lost = 0
        self.recovery_new = 0
        self.restarts: list[Restart] = []
        self.taken_early: set[tuple[int, int]] = set()  # (process, seq) an older epoch delivered
        self.read_early: set[tuple[int, int]] = set()  # (process, seq) read live before its connection events
        self.suspects: frozenset[int] = frozenset()  # the sequencer's suspects before the current call
        self.apply(self.seq.on_connected())

    @property
    def proc(self) -> Proc:
        return self.procs[-1]

    @property
    def blurred(self) -> bool:
        """The sequencer may have taken the new process for the old one (rule 1's limitation)."""
        return self.unseen and self.cannot_tell

    # --- the auditor ------------------------------------------------------------------

    def apply(self, actions: list[Action]) -> None:
        for a in actions:
            self.audit(a)
        self.suspects = self.seq.suspects  # as the next call finds them

    def audit(self, a: Action) -> None:
        p = self.procs[self.epoch]
        if isinstance(a, Deliver):
            assert self.frontier is None or a.seq == self.frontier + 1, (a.seq, self.frontier)
            # Rule 11's limitation: the new process's live batches read before the connection events
            # are the old connection's; a verification that then finds the restart leaves them to
            # the old process (docs/protocol.md, "What cannot be told apart").
            early = self.unseen and self.request is not None and self.request.purpose == "verify"
            if self.blurred or early:
                owner = next(i for i, q in enumerate(self.procs) if a.batch == q.batches.get(a.seq))
                assert owner >= self.epoch, a
                assert self.blurred or owner == self.epoch or (owner, a.seq) in self.read_early, a
                self.procs[owner].carried.discard(a.seq)
                self.taken_early.add((owner, a.seq))
            else:
                assert a.seq in p.batches and a.batch == p.batches[a.seq], (a, self.epoch)
            self.delivered[self.epoch].add(a.seq)
            if self.first[self.epoch] is None:
                self.first[self.epoch] = a.seq
            self.frontier = self.last_delivered = a.seq
        elif isinstance(a, Unrecovered):
            # A catch-up nobody answered starts the epoch with a no_answer loss from seq 0.
            unanswered = self.frontier is None and a.first == 0 and a.reason == "no_answer"
            assert unanswered or (self.frontier is not None and a.first == self.frontier + 1), (a, self.frontier)
            assert a.last >= a.first, a
            seqs = set(range(a.first, a.last + 1))
            held = seqs & p.brought
            if a.reason == "restart":
                # Rule 11's limitation: what a restart keeps for the new epoch as a suspect (it may be
                # either process's; the new process's catch-up tells) is lost to the old one, and so
                # is a suspect of the old epoch itself that nothing had told yet (dropped).
                held -= self.seq.suspects | self.suspects
            assert not held, (a, sorted(held))
            if a.reason == "evicted" and not self.blurred:
                req = self.request
                assert req is not None and req.held is not None, a
                assert not seqs & req.held, (a, sorted(seqs & req.held))
            if a.reason == "not_sent" and not self.blurred:
                # Never published; or published, lost, and evicted before the engine was asked: a reply
                # starting at the fence cannot tell those apart, and both are out of the buffer.
                sent = {s for s in seqs if s in p.batches}
                req = self.request
                assert not sent or (req is not None and req.held is not None and not sent & req.held), (a, sent)
            if a.reason == "restart":
                assert self.unseen or self.epoch > 0, a  # the old process's last ones, or the new's first
            self.lost[self.epoch] |= seqs
            self.recovery_lost += len(seqs)
            self.frontier = a.last
        elif isinstance(a, HistoryTruncated):
            assert self.frontier is None and not clock_seeded(a.first) and self.epoch == 0, a
            req = self.request
            if req is not None and req.held is not None:  # what the catch-up found in the buffer
                assert not any(s < a.first for s in req.held), (a, sorted(req.held))
            self.frontier = a.first - 1
        elif isinstance(a, RequestReplay):
            assert self.request is None or self.request.token == a.token - 1
            if a.attempt == 1:
                self.recovery_lost = self.recovery_new = 0
            anchored = a.purpose == "verify" or a.start == self.last_delivered
            self.request = Request(a.token, a.start, a.purpose, len(self.procs) - 1, anchored=anchored)
        elif isinstance(a, CancelReplay):
            assert self.request is not None and a.token == self.request.token
        elif isinstance(a, ReplayFinished):
            assert self.request is not None and a.token == self.request.token
            if a.outcome == "recovered":
                assert self.recovery_lost == 0, a
            elif a.outcome == "partial":
                assert self.recovery_lost > 0 and a.replayed > 0, a
            else:  # nothing (new) came back in this recovery: lost, or no answer at all
                assert a.outcome == "failed" and a.replayed == 0, a
                assert self.blurred or self.recovery_new == 0, (a, self.recovery_new)
            self.request = None
        elif isinstance(a, Restart):
            assert self.unseen, a  # every restart detected exactly once, and only real ones
            self.unseen = self.cannot_tell = False
            self.restarts.append(a)
            self.end_epoch()
            self.epoch += 1
            assert self.epoch == len(self.procs) - 1
            self.proc.brought |= self.proc.carried
            self.proc.carried.clear()
            self.frontier = None if clock_seeded(self.proc.base) else -1
            self.last_delivered = None
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
        # The first the sequencer can judge by the reconnect heuristic (rule 7): after the connection
        # events; before them it has no reconnect to go by (rule 11 leaves that to the replies).
        if proc != self.epoch and self.first_new_live is None and not self.connection_due:
            self.first_new_live = (seq, self.restart_frontier)
        above = self.frontier is None or seq > self.frontier
        known = seq in p.brought
        frontier = -1 if self.frontier is None else self.frontier
        received = max([frontier, *self.procs[self.epoch].brought])
        if self.unseen and self.connection_due and proc != self.epoch and seq - 1 in (frontier, received):
            # Rule 11's limitation: before the connection events, the new process's batch at exactly
            # the next seq (after the cursor, or after all the sequencer received: it opens no gap)
            # is taken for the old one's next, and the verification then checks it against itself.
            # Nothing on the wire tells them apart.
            self.cannot_tell = True
        if proc != self.epoch and self.connection_due:
            self.read_early.add((proc, seq))
        actions = self.seq.on_live(seq, p.batches[seq], raw(seq, proc))
        dropped = any(isinstance(a, Duplicate) and a.seq == seq for a in actions)
        if not self.unseen and proc == self.epoch:
            # Dropped iff already received, or too late to deliver (below the frontier).
            assert dropped == (known or not above), (seq, actions)
        before = self.epoch
        self.apply(actions)
        # The new process's live batches are kept for its epoch (rule 8), whatever the old frontier;
        # before the connection events one at or below the cursor may be taken for a live copy.
        if above and proc == before:
            p.brought.add(seq)
        elif proc != before and not dropped:
            self.keep_for(proc, seq)

    def keep_for(self, proc: int, seq: int) -> None:
        """A batch of a process whose restart was unseen when it reached the sequencer."""
        if (proc, seq) in self.taken_early:
            return
        if proc == self.epoch:  # it revealed the restart: the new epoch's
            self.procs[proc].brought.add(seq)
        else:
            self.procs[proc].carried.add(seq)

    @rule(kind=st.sampled_from(["ok", "ok", "ok", "drop", "not_sent"]), count=st.integers(1, 12))
    def publish(self, kind: str, count: int) -> None:
        proc = len(self.procs) - 1
        if kind == "not_sent" and not clock_seeded(self.proc.base):
            kind = "drop"  # only TensorRT-LLM (clock-seeded) drops batches from its own queue
        for _ in range(count if kind != "ok" else 1):
            if kind == "not_sent":
                self.proc.next += 1  # dropped by the engine's own queue: never published, never held
            else:
                seq = self.proc.publish(proc)
                if kind == "ok":
                    self.queue.append((proc, seq))
                # "drop": lost at the PUB high-water mark, still buffered for replays
        if kind == "not_sent":
            self.queue.append((proc, self.proc.publish(proc, fence=True)))

    @rule(count=st.integers(1, 8))
    def deliver_live(self, count: int) -> None:
        for _ in range(min(count, len(self.queue))):
            self.feed_live(*self.queue.popleft())

    def send(self, req: Request, seq: int) -> None:
        p = self.procs[req.proc]
        # Judged before the sequencer sees it.
        kept = (self.frontier is None or seq > self.frontier) and req.proc == self.epoch and not self.unseen
        req.sent += 1
        if kept and seq not in p.brought:
            self.recovery_new += 1  # a batch this recovery brought that nothing else had
        # An unseen new process's item above the cursor is pending on the new connection: the new
        # epoch's if it reveals the restart or the restart is detected later (rule 8), the old one's if
        # the old epoch delivers it first (rule 1's limitation).
        before = self.epoch
        carried = req.proc != before and (self.frontier is None or seq > self.frontier)
        self.apply(self.seq.on_replay_item(req.token, seq, p.batches[seq], raw(seq, req.proc)))
        if kept:
            p.brought.add(seq)
        elif carried or (req.proc != before and req.proc == self.epoch):  # pending, or it revealed the restart
            self.keep_for(req.proc, seq)

    def engine_answers(self, req: Request) -> list[int]:
        """The engine reads the request: its reply is its buffer from ``start``."""
        if req.items is None:
            p = self.procs[req.proc]
            req.held = set(p.buffered())
            req.items = [s for s in p.buffered() if s >= req.start]
            if req.anchored and self.unseen and req.proc != self.epoch and req.items:
                anchor = self.last_delivered
                if anchor is not None and anchor not in req.held and not clock_seeded(p.base):
                    self.cannot_tell = True  # the anchor is no longer buffered (for a clock-seeded
                    # process the reply is far above it: a jump, always told)
        return req.items

    @precondition(lambda self: self.request is not None and not self.request.dead)
    @rule(count=st.integers(1, 10), drops=st.lists(st.booleans(), max_size=10))
    def answer(self, count: int, drops: list[bool]) -> None:
        req = self.request
        assert req is not None
        items = self.engine_answers(req)
        for i in range(min(count, len(items))):
            seq = items.pop(0)
            # Dropped at the ROUTER's high-water mark: never the first item, nor the first after the
            # anchor a request from it gets back first (the queue is far from its mark there).
            if req.sent >= (2 if req.anchored else 1) and i < len(drops) and drops[i]:
                continue
            self.send(req, seq)
            if self.request is not req:
                return

    @precondition(lambda self: self.request is not None)
    @rule(kind=st.sampled_from(["end", "end", "timeout", "failed"]))
    def finish(self, kind: str) -> None:
        """The reply ends: the rest of it and the end marker come through (``end``), or the tail and
        the end marker are lost or the engine is too slow (``timeout``), or it is malformed."""
        req = self.request
        assert req is not None
        if kind == "end" and req.dead:
            kind = "timeout"  # a dead process never answers
        # A check (rule 11) sent to the new process, which has not yet been told from the old one.
        verify_to_new = req.anchored and self.unseen and req.proc != self.epoch
        if kind == "end":
            items = self.engine_answers(req)
            while items:
                self.send(req, items.pop(0))
                if self.request is not req:
                    return
            suspects, p = self.seq.suspects, self.procs[self.epoch]
            actions = self.seq.on_replay_end(req.token)
            # Rule 11's limitation: a suspect a whole reply did not bring cannot be told (the new
            # process evicted that seq or never sent it, or the ROUTER dropped it): dropped, and lost
            # if it was the new one's and no later reply brings it.
            p.brought -= suspects - self.seq.suspects
            self.apply(actions)
            return
        suspects, p = self.seq.suspects, self.procs[self.epoch]
        actions = self.seq.on_replay_failed(req.token, kind)
        if (
            verify_to_new
            and req.sent == 0
            and not any(isinstance(a, RequestReplay) and a.purpose == req.purpose for a in actions)
        ):
            # No usable answer, and the sequencer stops asking it: the check cannot tell (rule 1's
            # limitation, and rule 11's for a gap or a probe the new process never answered).
            self.cannot_tell = True
        # Rule 11's limitation: a suspect is a batch that came before the connection events and may be
        # either process's; only a whole reply of the new process tells. Without one, the sequencer
        # drops it rather than deliver what may be the old process's in the new epoch: if it was the
        # new one's, a later reply brings it again, or, evicted or unanswered by then, it is lost.
        dropped = suspects - self.seq.suspects
        p.brought -= dropped
        self.apply(actions)

    @precondition(lambda self: self.request is None and not self.queue)
    @rule()
    def quiet(self) -> None:
        self.apply(self.seq.on_quiet())

    def drop_connection(self, keep: int) -> None:
        """The SUB connection goes: what it delivered is read first, the rest in flight is lost."""
        for _ in range(min(keep, len(self.queue))):
            self.feed_live(*self.queue.popleft())
        self.queue.clear()
        self.seq.on_disconnected()

    @precondition(lambda self: not self.unseen and not self.connection_due)
    @rule(keep=st.integers(0, 8))
    def reconnect(self, keep: int) -> None:
        """The SUB socket drops and comes back to the same engine."""
        self.drop_connection(keep)
        self.apply(self.seq.on_connected())

    @precondition(lambda self: not self.unseen and not self.connection_due and self.last_delivered is not None)
    @rule(
        keep=st.integers(0, 8),
        pre=st.integers(0, 40),
        extra=st.integers(0, 40),
        # Late connection events, and requests answered by the new process: what rule 11 cannot
        # tell apart is excused where it arises (``cannot_tell``, ``read_early``, the suspects
        # dropped in ``finish``), nothing more.
        late=st.booleans(),
        retarget=st.booleans(),
    )
    def restart(self, keep: int, pre: int, extra: int, late: bool, retarget: bool) -> None:
        """The process dies and a new one starts: at 0, or (TensorRT-LLM) at the clock, far above. It
        may publish ``pre`` batches before the gateway reconnects (the SUB sees none of them).
        ``late``: the monitor reports the disconnect and the connect later (:meth:`connection_events`);
        the SUB socket already reads the new process. ``retarget``: a request the old process had not
        answered yet is answered by the new one (the DEALER reached it once it bound the port)."""
        if late:
            # The old connection's last ones are read (those it delivered before the crash: the
            # reader is not left with an old backlog once the new process answers), the rest lost.
            for _ in range(min(keep, len(self.queue))):
                self.feed_live(*self.queue.popleft())
            self.queue.clear()
        else:
            self.drop_connection(keep)
        old = self.proc
        req = self.request
        if req is not None:
            # Not a verification: asked at a reconnection, it is answered within a round trip, and a
            # crash inside that, with late connection events too, is left alone (docs/protocol.md).
            req.dead = not (retarget and req.items is None and req.purpose != "verify")
        base = old.next + JUMP_LIMIT + 1 + extra if clock_seeded(old.base) else 0
        self.procs.append(Proc(base, self.buffer, next=base))
        proc = len(self.procs) - 1
        self.unseen = True
        self.cannot_tell = False
        self.first_new_live = None
        self.restart_frontier = self.frontier  # the cursor the new connection's live stream is judged by
        for _ in range(pre):
            self.proc.publish(proc)
        if req is not None and not req.dead:
            req.proc = proc
        if late:
            self.connection_due = True
        else:
            self.apply(self.seq.on_connected())

    @precondition(lambda self: self.connection_due)
    @rule()
    def connection_events(self) -> None:
        """The monitor's late disconnect and connect: the reader drains the SUB socket first, so what
        it holds now (the new process's too) is read as the old connection's."""
        if self.unseen and any(proc != self.epoch for proc, _ in self.queue):
            # Rule 11's limitation: the new process's batches drained at the late disconnect are read
            # as the old connection's; the verification then tells the restart, after them.
            self.cannot_tell = True
        self.drop_connection(len(self.queue))  # before the events: no reconnect heuristic for these
        self.connection_due = False
        self.apply(self.seq.on_connected())

    @invariant()
    def views(self) -> None:
        s = self.seq
        assert s.waiting_for_live == (s.replay_token is None and s.held > 0)
        assert (s.replay_token is None) == (self.request is None)
        # Attributes the sequencer keeps (the reader reads them for every batch), not computed views.
        assert s.held == len(s._pending) + len(s._low_live)
        assert s.replay_token == (None if s._rec is None else s._rec.token)

    def teardown(self) -> None:
        if not hasattr(self, "seq"):
            return
        # Let everything settle: live arrives, every request is answered completely, then quiet.
        if self.connection_due:
            self.connection_events()
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
        if self.unseen:
            # Only rule 1's limitation excuses it: no verification, and no live batch at or below
            # the cursor (a counting process's live seqs above it are told from nothing).
            assert self.cannot_tell, "a detectable restart was never reported"
            if self.first_new_live is not None:
                seq, frontier = self.first_new_live
                assert frontier is not None and seq > frontier, self.first_new_live
                assert not clock_seeded(self.proc.base), self.first_new_live
            assert len(self.restarts) == len(self.procs) - 2
        else:
            assert len(self.restarts) == len(self.procs) - 1


PublisherModel.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    # Deterministic in CI. Hunting with derandomize=False and 13,000 examples found the three cases
    # pinned in test_sequencer.py (a live copy from another process, the item that reveals a restart,
    # a live clear below a replayed batch); none is left at that depth. No database: a failing example
    # saved by a hunt would otherwise be replayed into every later run.
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking in CI: a failure costs seconds, not minutes
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPublisherModel = PublisherModel.TestCase
