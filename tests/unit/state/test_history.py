"""kvgateway.state.history: bounded rings per stream and medium, sampling alignment, filters, JSON."""

from __future__ import annotations

import itertools
import math

import pytest

from kvgateway.protocol.filters import ClientFilter
from kvgateway.state.history import History, MediumReading, StreamReading

GPU = MediumReading(blocks=10, tokens=160, stores_per_s=2.5, removes_per_s=1.0, capacity_blocks=100)


def reading(source: str = "a", rank: int = 0, blocks: int = 10, **kw: object) -> StreamReading:
    fields: dict[str, object] = {
        "state": "up",
        "lag_seconds": 0.01,
        "batch_age_seconds": 0.5,
        "restarts": 0,
        "mediums": {"GPU": MediumReading(blocks, blocks * 16, 2.5, 1.0, 100)},
    }
    fields.update(kw)
    return StreamReading(source, rank, **fields)  # type: ignore[arg-type]


def test_points_line_up_on_interval_boundaries_and_carry_every_field() -> None:
    history = History(interval=5, horizon=60)
    history.sample(1000.2, [reading(blocks=10)])
    history.sample(1005.9, [reading(blocks=20, restarts=1)])
    doc = history.to_json("ep")
    assert doc["epoch"] == "ep" and doc["interval_seconds"] == 5 and doc["horizon_seconds"] == 60
    [stream] = doc["streams"]
    assert (stream["source"], stream["dp_rank"]) == ("a", 0)
    assert [p["t"] for p in stream["points"]] == [1000.0, 1005.0]
    last = stream["points"][-1]
    assert last["state"] == "up" and last["restarts"] == 1
    assert last["lag_seconds"] == pytest.approx(0.01) and last["batch_age_seconds"] == 0.5
    assert last["mediums"] == {
        "GPU": {"blocks": 20, "tokens": 320, "fill": 0.2, "stores_per_s": 2.5, "removes_per_s": 1.0}
    }


def test_the_same_slot_sampled_twice_keeps_the_newest_reading() -> None:
    history = History(interval=5, horizon=60)
    history.sample(1000.0, [reading(blocks=1)])
    history.sample(1004.9, [reading(blocks=2)])
    history.sample(1001.0, [reading(blocks=3)])  # a clock step back: still the newest point
    points = history.to_json("e")["streams"][0]["points"]
    assert [(p["t"], p["mediums"]["GPU"]["blocks"]) for p in points] == [(1000.0, 3)]


def test_the_ring_is_bounded_and_keeps_the_newest_points() -> None:
    history = History(interval=5, horizon=50)  # 10 slots
    for i in range(25):
        history.sample(1000 + 5 * i, [reading(blocks=i)])
    before = history.nbytes()
    for i in range(25, 40):
        history.sample(1000 + 5 * i, [reading(blocks=i)])
    assert history.nbytes() == before  # preallocated: more points cost nothing
    points = history.to_json("e")["streams"][0]["points"]
    assert [p["mediums"]["GPU"]["blocks"] for p in points] == list(range(30, 40))
    assert all(b["t"] - a["t"] == 5 for a, b in itertools.pairwise(points))


def test_memory_is_reported_per_stream_and_medium() -> None:
    history = History(interval=5, horizon=3600)
    history.sample(0, [reading()])
    one = history.nbytes()
    # 720 slots: t (8) + state (1) + lag, age (4 each) + restarts (4) + tokens per origin (5 x 8);
    # blocks (4) + tokens (8) + rates (4 each)
    assert one == 720 * (8 + 1 + 4 + 4 + 4 + 5 * 8) + 720 * (4 + 8 + 4 + 4)
    history.sample(5, [reading(), reading("b")])
    assert history.nbytes() == 2 * one


def test_missing_values_are_null_and_a_medium_seen_late_has_no_earlier_points() -> None:
    history = History(interval=5, horizon=60)
    history.sample(0, [reading(lag_seconds=None, batch_age_seconds=None, mediums={})])
    cpu = MediumReading(5, 80, 1.0, 0.0, None)
    history.sample(5, [reading(mediums={"GPU": GPU, "CPU_PINNED": cpu})])
    first, second = history.to_json("e")["streams"][0]["points"]
    assert first["lag_seconds"] is None and first["batch_age_seconds"] is None and first["mediums"] == {}
    assert second["mediums"]["CPU_PINNED"]["fill"] is None  # no capacity: no fill
    assert second["mediums"]["GPU"]["fill"] == 0.1


def test_unknown_states_are_recorded_as_unknown() -> None:
    history = History(interval=5, horizon=60)
    history.sample(0, [reading(state="exploded")])
    history.sample(5, [reading(state="down")])
    assert [p["state"] for p in history.to_json("e")["streams"][0]["points"]] == ["unknown", "down"]


def test_filters_as_on_the_stream() -> None:
    history = History(interval=5, horizon=60)
    cpu = MediumReading(5, 80, 1.0, 0.0, None)
    for t in (0, 5):
        history.sample(t, [reading("a", 0, mediums={"GPU": GPU, "CPU_PINNED": cpu}), reading("a", 1), reading("b", 0)])
    only_a1 = history.to_json("e", ClientFilter(sources=frozenset({"a"}), dp_ranks=frozenset({1})))
    assert [(s["source"], s["dp_rank"]) for s in only_a1["streams"]] == [("a", 1)]
    # a tier name passes the tier's mediums, as the stream's medium filter does
    cpu_tier = history.to_json("e", ClientFilter(sources=frozenset({"a"}), mediums=frozenset({"CPU"})))
    assert [set(p["mediums"]) for p in cpu_tier["streams"][0]["points"]] == [{"CPU_PINNED"}] * 2
    assert cpu_tier["streams"][1]["points"][0]["mediums"] == {}


def test_since_and_step() -> None:
    history = History(interval=5, horizon=600)
    for i in range(12):
        history.sample(5 * i, [reading(blocks=i)])
    after = history.to_json("e", since=40)["streams"][0]["points"]
    assert [p["t"] for p in after] == [45, 50, 55]
    coarse = history.to_json("e", step=3)
    assert coarse["interval_seconds"] == 15
    # every third point counted back from the newest: the newest is always there
    assert [p["t"] for p in coarse["streams"][0]["points"]] == [10, 25, 40, 55]


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        History(interval=0)
    with pytest.raises(ValueError, match="interval"):
        History(interval=10, horizon=5)
    assert math.isclose(History(interval=5, horizon=3600).slot_time(1234.5), 1230)


def test_a_big_answer_takes_a_coarser_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgateway.state import history as module

    monkeypatch.setattr(module, "MAX_POINTS", 10)
    history = History(interval=5, horizon=600)
    for i in range(12):
        history.sample(5 * i, [reading("a"), reading("b")])  # 24 points: more than 10
    doc = history.to_json("e")
    assert doc["interval_seconds"] == 15  # the smallest step that keeps to 10 points
    assert sum(len(s["points"]) for s in doc["streams"]) <= 10
    assert [p["t"] for p in doc["streams"][0]["points"]][-1] == 55  # the newest point is kept
    assert history.to_json("e", step=2)["interval_seconds"] == 20  # a multiple of the step asked for


def test_stored_tokens_per_point_are_the_tokens_since_the_point_before() -> None:
    history = History(interval=5, horizon=20)  # 4 slots
    for n in range(6):
        history.sample(5.0 * n, [reading(stored_tokens=(n, 0, 10 * n, 0, 100 * n))])
    points = history.to_json("e")["streams"][0]["points"]
    assert [p["t"] for p in points] == [10.0, 15.0, 20.0, 25.0]
    assert points[0]["stored_tokens"] is None  # the oldest kept: nothing before it to subtract
    assert points[1]["stored_tokens"] == {"hit": 1, "offloaded": 0, "refetch": 10, "elsewhere": 0, "new": 100}
    stepped = history.to_json("e", step=2)["streams"][0]["points"]  # every other point: two intervals each
    assert [(p["t"], p["stored_tokens"]) for p in stepped][-1] == (
        25.0,
        {"hit": 2, "offloaded": 0, "refetch": 20, "elsewhere": 0, "new": 200},
    )
    history.sample(30.0, [reading()])  # nothing counted: no shares for that point
    assert history.to_json("e")["streams"][0]["points"][-1]["stored_tokens"] is None


@pytest.mark.parametrize("interval", [5.0, 1.0, 0.25])
def test_the_next_sample_is_taken_just_inside_the_next_interval_whenever_it_is_asked(interval: float) -> None:
    history = History(interval=interval, horizon=60 * interval)
    for now in (
        1000.0,
        1000.0 + interval * 0.5,
        1000.0 + interval * 0.999,
        1000.0 + interval - 1e-6,
        1000.0 + interval * 0.01,
    ):
        wake = now + history.next_sample_in(now)
        assert history.slot_time(wake) == history.slot_time(now) + interval, now
        assert wake - history.slot_time(wake) >= interval * 0.01, "at the boundary, not a little after it"


def test_a_timer_that_fires_early_is_told_to_wait_for_the_next_interval_again() -> None:
    history = History(interval=5.0, horizon=60.0)
    early = 1009.999  # woken 1 ms before the interval that starts at 1010
    assert history.slot_time(early) == 1005.0
    assert 0 < history.next_sample_in(early) < 0.2
