"""Sequencer.on_live's fast case (the next seq, nothing pending, not verifying) and
Sequencer.on_replay_item's (the attempt's next seq after its first item) against the rules
themselves (Sequencer._live, Sequencer._replay_item): fed the same random mix of live batches
(next, ahead, behind, cleared, another process's), replay items, ends, failures, connections and
quiet checks, the two give the same actions and end in the same state, step by step; and the
views the reader reads as attributes (``held``, ``replay_token``) are what the state says."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgateway.engine.sequencer import Action, Deliver, RequestReplay, Sequencer, _Recovery
from kvgateway.engine.wire import Batch
from tests.support import events


class _RulesOnly(Sequencer):
    """Every live batch and replay item by the rules, never a fast case."""

    __slots__ = ()

    def on_live(self, seq: int, batch: Batch | None, raw: bytes = b"") -> list[Action]:
        return self._live(seq, batch, raw)

    def on_replay_item(self, token: int, seq: int, batch: Batch | None, raw: bytes = b"") -> list[Action]:
        out = self._replay_item(token, seq, batch, raw)
        self.held = len(self._pending) + len(self._low_live)
        return out


class _Counted(Sequencer):
    """The real sequencer, counting the replay items its fast case left to the rules."""

    __slots__ = ("by_rules",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.by_rules = 0

    def _replay_item(self, token: int, seq: int, batch: Batch | None, raw: bytes) -> list[Action]:
        self.by_rules += 1
        return super()._replay_item(token, seq, batch, raw)


def _batch(seq: int, cleared: bool) -> Batch:
    first = (events.cleared(),) if cleared else ()
    return events.batch(*first, events.removed(seq), ts=float(seq), dp_rank=None)


def _state(s: Sequencer) -> dict[str, Any]:
    state = {name: getattr(s, name) for name in Sequencer.__slots__}
    rec = state.pop("_rec")
    if isinstance(rec, _Recovery):
        state["_rec"] = {name: getattr(rec, name) for name in _Recovery.__slots__}
    state["_heap"] = sorted(state["_heap"])  # its order is the heap's own business
    return state


def _views_hold(s: Sequencer) -> bool:
    """The attributes the reader reads for every batch say what the state says."""
    token = None if s._rec is None else s._rec.token
    return s.held == len(s._pending) + len(s._low_live) and s.replay_token == token


STEP = st.one_of(
    st.tuples(st.just("live"), st.sampled_from([1, 1, 1, 1, 2, 3, 0, -1, -5]), st.booleans(), st.integers(0, 2)),
    st.tuples(st.just("item"), st.integers(-3, 6), st.booleans(), st.integers(0, 1)),
    st.tuples(st.just("end"), st.just(0), st.just(False), st.just(0)),
    st.tuples(st.just("failed"), st.just(0), st.just(False), st.just(0)),
    st.tuples(st.just("connected"), st.just(0), st.just(False), st.just(0)),
    st.tuples(st.just("disconnected"), st.just(0), st.just(False), st.just(0)),
    st.tuples(st.just("quiet"), st.just(0), st.just(False), st.just(0)),
)


def _step(s: Sequencer, step: tuple[str, int, bool, int], base: int) -> list[Action]:
    kind, delta, cleared, proc = step
    seq = max(0, base + delta)
    raw = f"{proc}:{seq}".encode()
    if kind == "live":
        return s.on_live(seq, _batch(seq, cleared and delta != 1), raw)
    token = s.replay_token
    if kind == "item" and token is not None:
        return s.on_replay_item(token, seq, _batch(seq, cleared), raw)
    if kind == "end" and token is not None:
        return s.on_replay_end(token)
    if kind == "failed" and token is not None:
        return s.on_replay_failed(token, "timeout")
    if kind == "connected":
        return s.on_connected()
    if kind == "disconnected":
        s.on_disconnected()
    if kind == "quiet":
        return s.on_quiet()
    return []


@settings(max_examples=400, deadline=None)
@given(has_replay=st.booleans(), start=st.sampled_from([0, 5, 10**18]), steps=st.lists(STEP, max_size=60))
def test_the_fast_case_acts_and_ends_as_the_rules_do(
    has_replay: bool, start: int, steps: list[tuple[str, int, bool, int]]
) -> None:
    fast = Sequencer(has_replay=has_replay, restart_window=8)
    rules = _RulesOnly(has_replay=has_replay, restart_window=8)
    top = start
    for step in [("connected", 0, False, 0), *steps]:
        base = top if fast.cursor is None else fast.cursor  # delta 1: the next seq
        assert _step(fast, step, base) == _step(rules, step, base), step
        assert _state(fast) == _state(rules), step
        assert _views_hold(fast) and _views_hold(rules), step
        top = max(top, base + step[1])


def test_a_stream_in_order_takes_the_fast_case_and_delivers_every_batch() -> None:
    fast, rules = Sequencer(has_replay=False), _RulesOnly(has_replay=False)
    for s in (fast, rules):
        s.on_connected()
    for seq in range(50):
        batch, raw = _batch(seq, False), str(seq).encode()
        assert fast.on_live(seq, batch, raw) == rules.on_live(seq, batch, raw)
    assert _state(fast) == _state(rules)
    assert fast.cursor == 49 and fast.held == 0


def test_a_catch_up_takes_the_fast_case_after_its_first_item_and_delivers_every_batch() -> None:
    # As scenario 6: the catch-up asked at connect, the engine's next live batch pending above it,
    # then the reply from seq 0 up to that batch, which the last item makes contiguous.
    fast, rules = _Counted(has_replay=True), _RulesOnly(has_replay=True)
    for s in (fast, rules):
        [request] = s.on_connected()
        assert isinstance(request, RequestReplay) and s.replay_token == request.token
        s.on_live(50, _batch(50, False), b"50")
        assert s.held == 1
    token = fast.replay_token
    assert token is not None
    delivered = []
    for seq in range(50):
        batch, raw = _batch(seq, False), str(seq).encode()
        actions = fast.on_replay_item(token, seq, batch, raw)
        assert actions == rules.on_replay_item(token, seq, batch, raw)
        assert _state(fast) == _state(rules) and _views_hold(fast)
        delivered += [a.seq for a in actions if isinstance(a, Deliver)]
    assert delivered == list(range(51)) and fast.held == 0
    assert fast.by_rules == 1  # the first item only: it starts the epoch
    assert fast.on_replay_end(token) == rules.on_replay_end(token)
    assert _state(fast) == _state(rules) and fast.replay_token is None
