"""Sequencer.on_live's fast case (the next seq, nothing pending, not verifying) against the rules
themselves (Sequencer._live): fed the same random mix of live batches (next, ahead, behind,
cleared, another process's), replay items, ends, failures, connections and quiet checks, the two
give the same actions and end in the same state, step by step."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgateway.engine.sequencer import Action, Sequencer, _Recovery
from kvgateway.engine.wire import Batch
from tests.support import events


class _RulesOnly(Sequencer):
    """Every live batch by the rules, never the fast case."""

    __slots__ = ()

    def on_live(self, seq: int, batch: Batch | None, raw: bytes = b"") -> list[Action]:
        return self._live(seq, batch, raw)


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
