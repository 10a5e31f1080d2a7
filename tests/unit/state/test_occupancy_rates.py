"""stores_per_s / removes_per_s: no ramp-up after a start, and replayed history kept out."""

from __future__ import annotations

import pytest

from kvgateway.state.occupancy import OccupancyIndex, StreamIndex
from tests.support.events import batch, removed, stored


def test_rates_divide_by_the_time_covered_since_the_start() -> None:
    # Started at 1000.0, 10 stores a second for 5 seconds: the rate is 10/s at once, not 50/60.
    index = StreamIndex("a", 0, started=1000.0)
    for second in range(5):
        index.apply(batch(stored(*range(second * 10, second * 10 + 10))), 1000.0 + second + 0.5)
    stats = index.medium_stats(1005.0)["GPU"]
    assert stats.stores_per_s == pytest.approx(50 / 5.0)
    # Once a whole window has passed, the window is the divisor again.
    later = index.medium_stats(1030.0)["GPU"]
    assert later.stores_per_s == pytest.approx(50 / 30.0)
    assert index.medium_stats(1070.0)["GPU"].stores_per_s == pytest.approx(0.0)
    assert index.medium_stats(1059.0)["GPU"].stores_per_s == pytest.approx(50 / 59.0)


def test_rates_right_after_the_start_are_not_divided_by_less_than_a_second() -> None:
    index = StreamIndex("a", 0, started=1000.0)
    index.apply(batch(stored(1, 2, 3)), 1000.1)
    assert index.medium_stats(1000.2)["GPU"].stores_per_s == pytest.approx(3.0)


def test_replayed_batches_change_blocks_and_totals_but_not_rates() -> None:
    occ = OccupancyIndex(started=1000.0)
    # A catch-up replay of 1000 stores the engine made before the gateway started...
    occ.apply("a", 0, batch(stored(*range(1000))), 1000.5, replayed=True)
    occ.apply("a", 0, batch(removed(*range(100))), 1000.5, replayed=True)
    # ...then 4 live stores.
    occ.apply("a", 0, batch(stored(5000, 5001, 5002, 5003)), 1001.5)
    stats = occ.stream("a", 0).medium_stats(1002.0)["GPU"]
    assert stats.blocks == 904 and stats.stores == 1004 and stats.removes == 100
    assert stats.stores_per_s == pytest.approx(4 / 2.0)
    assert stats.removes_per_s == 0.0
