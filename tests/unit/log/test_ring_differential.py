"""The compiled ring and append (``_ring_c``) against their pure-Python reference (``_ring_py``),
driven side by side with the same steps: the same offsets returned, the same entries handed to
every follower (offset, stream, message bytes and id, the batch's presence, filter keys, size, the
record itself while they apply it) and kept afterwards (the record let go), the same ``appended``
calls, the same errors (a wrong notice, which assigns nothing; an offset out of order; a read
older than the ring), and the same bounds after every step (count, bytes, first and last
offsets, what a resume reads); for batches of every wire layout and notices, rings bounded to
nothing, to a few messages or to a few bytes, a log that starts at a later offset (an edge),
filtered variants counted towards the bytes, and a follower that adds another while it is called.

Skipped where the compiled core was not built (an install without a C compiler)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgateway.log import _ring_py, ring
from kvgateway.log.entry import Entry
from kvgateway.log.records import NoticeRecord, Record, batch_record
from kvgateway.protocol.filters import EventFilterKey
from tests.support.cores import compiled_twin
from tests.support.payloads import decode, encoded_event

STREAMS = [("a", 0), ("a", 1), ("b", 0)]
EPOCH = "0123456789abcdef"


def _compiled() -> ModuleType:
    return compiled_twin("kvgateway.log._ring_c", lambda module: ring.Ring is module.Ring)


def seen(entry: Entry) -> tuple[Any, ...]:
    """What a follower or a resume can tell of an entry (its record by identity, or None)."""
    return (
        entry.offset,
        entry.stream,
        entry.message.data,
        entry.message.id,
        entry.batch is not None,
        entry.keys,
        entry.size,
        None if entry.record is None else id(entry.record),
    )


class Side:
    """One core's appender over its ring, and everything it was seen to do, in order."""

    def __init__(self, core: ModuleType, max_messages: int, max_bytes: int, first_offset: int) -> None:
        self.log: list[Any] = []
        self.ring = core.Ring(max_messages, max_bytes, first_offset=first_offset)
        self.appender = core.RingAppender(self.ring, EPOCH, appended=lambda at: self.log.append(("appended", at)))
        self.appender.followers.append(self.first)
        self.appender.followers.append(lambda entry: self.log.append(("second", seen(entry))))
        self.joined = False

    def first(self, entry: Entry) -> None:
        ring = self.ring  # as a follower finds it: the oldest dropped already if the count bound had no room
        self.log.append(("first", seen(entry), len(ring), ring.bytes, ring.first_offset))
        if not self.joined and entry.offset % 3 == 0:  # a follower added while the others are called
            self.joined = True
            self.appender.followers.append(lambda entry: self.log.append(("joined", seen(entry))))

    def step(self, step: tuple[Any, ...]) -> None:
        kind = step[0]
        try:
            if kind == "append":
                self.log.append(("offset", self.appender.append(step[1])))
            elif kind == "variant":
                entries = list(self.ring.since(self.ring.first_offset - 1))
                if entries:
                    entry = entries[step[1] % len(entries)]
                    variant = self.ring.message_for(entry, step[2])
                    self.log.append(("variant", None if variant is None else variant.data, entry.size))
            elif kind == "since":
                after = self.ring.first_offset - 1 + step[1]
                self.log.append(("since", [seen(e) for e in self.ring.since(after)]))
            elif kind == "out_of_order":
                self.ring.append(Entry(self.ring.last_offset + 2, ("a", 0), self.ring_message(), None, (), 1))
            elif kind == "trim":
                self.log.append(("trim", self.ring.trim()))
        except Exception as exc:  # the same error, with the same words
            self.log.append(("raised", type(exc).__name__, str(exc)))
        self.log.append(
            (
                "state",
                len(self.ring),
                self.ring.bytes,
                self.ring.first_offset,
                self.ring.last_offset,
                self.appender.offset,
                self.appender.fed,
                self.appender.epoch,
            )
        )

    @staticmethod
    def ring_message() -> Any:
        from kvgateway.protocol.messages import OutMessage

        return OutMessage(b"{}", "notice", None)


@st.composite
def record_st(draw: st.DrawFn) -> Record:
    stream = draw(st.sampled_from(STREAMS))
    if draw(st.integers(0, 3)) == 0:
        return draw(
            st.sampled_from(
                [
                    NoticeRecord(stream, "up", {"reason": "connected"}),
                    NoticeRecord(stream, "restart", {"seq": 5, "previous": 9, "reason": "seq_reset"}),
                    NoticeRecord(stream, "no_such_kind", {}),  # a wrong notice: refused, nothing assigned
                    NoticeRecord(stream, "restart", {"seq": "five"}),
                ]
            )
        )
    drawn = draw(st.lists(encoded_event(), max_size=4))
    batch = decode(*(value for value, _event, _core in drawn))
    seq = draw(st.integers(0, 2**64 - 1))
    return batch_record(stream, seq, batch, received=draw(st.floats(0, 2e9)), replayed=draw(st.booleans()))


filter_st: st.SearchStrategy[EventFilterKey | None] = st.one_of(
    st.none(),
    st.tuples(
        st.none() | st.frozensets(st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]), min_size=1),
        st.none() | st.frozensets(st.sampled_from(["GPU", "CPU", "cpu", "DISK", "gpu"]), min_size=1),
    ),
)
step_st = st.one_of(
    st.tuples(st.just("append"), record_st()),
    st.tuples(st.just("append"), record_st()),
    st.tuples(st.just("append"), record_st()),
    st.tuples(st.just("variant"), st.integers(0, 20), filter_st),
    st.tuples(st.just("since"), st.integers(-2, 6)),
    st.tuples(st.just("out_of_order")),
    st.tuples(st.just("trim")),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 6) | st.just(10_000),
    st.integers(0, 4_000) | st.just(64 * 2**20),
    st.integers(1, 2**40) | st.just(1),
    st.lists(step_st, max_size=25),
)
def test_the_same_entries_offsets_calls_and_bounds_for_any_steps(
    max_messages: int, max_bytes: int, first_offset: int, steps: list[tuple[Any, ...]]
) -> None:
    compiled = _compiled()
    sides = [Side(core, max_messages, max_bytes, first_offset) for core in (_ring_py, compiled)]
    for step in steps:
        for side in sides:
            side.step(step)
        assert sides[0].log == sides[1].log


@pytest.mark.parametrize("core", ["pure", "compiled"])
def test_the_steps_reach_what_the_differential_test_compares(core: str) -> None:
    """Not vacuous: each side sees entries while they apply (the record there), keeps them without it,
    refuses a wrong notice without assigning its offset, and counts a variant's bytes."""
    side = Side(_ring_py if core == "pure" else _compiled(), 10, 10**6, 1)
    batch = decode(["BlockStored", [1], None, [1, 2], 16, None, "GPU"], ["BlockRemoved", [2], "CPU"])
    record = batch_record(("a", 0), 7, batch, received=1.0, replayed=False)
    side.step(("append", NoticeRecord(("a", 0), "no_such_kind", {})))
    side.step(("append", record))
    side.step(("append", record))
    side.step(("append", record))  # offset 3: the joined follower from here
    bytes_before = side.ring.bytes
    side.step(("variant", 0, (frozenset({"BlockRemoved"}), None)))
    side.step(("variant", 1, (frozenset({"AllBlocksCleared"}), None)))
    kinds = [entry[0] for entry in side.log]
    assert kinds.count("raised") == 1 and ("offset", 1) in side.log and ("offset", 3) in side.log
    assert next(entry for entry in side.log if entry[0] == "first")[1][7] == id(record)
    assert ("joined", (*seen(next(iter(side.ring.since(2))))[:7], id(record))) in side.log
    assert all(e.record is None for e in side.ring.since(0))
    first, second = list(side.ring.since(0))[:2]
    variant = side.ring.message_for(first, (frozenset({"BlockRemoved"}), None))
    assert variant is not None and ("variant", variant.data, first.size) in side.log
    assert ("variant", None, second.size) in side.log
    assert side.ring.bytes == bytes_before + len(variant.data)
