"""kvgateway.state.activity: when each stream's last batch and last live batch were received, from
the log's records (notices change nothing)."""

from __future__ import annotations

from kvgateway.log.ordered import MemoryLog
from kvgateway.log.records import NoticeRecord, batch_record
from kvgateway.state.activity import Activity
from tests.support.events import batch, stored


def test_the_last_batch_and_the_last_live_one_per_stream() -> None:
    log, activity = MemoryLog(), Activity()
    log.follow(activity.follow)
    log.append(batch_record(("a", 0), 1, batch(stored(1)), received=10.0, replayed=False))
    log.append(batch_record(("a", 0), 2, batch(stored(2)), received=12.0, replayed=True))
    log.append(batch_record(("b", 1), 7, batch(), received=11.0, replayed=True))
    log.append(NoticeRecord(("a", 0), "down", {"reason": "gone"}))
    assert activity.last_batch == {("a", 0): 12.0, ("b", 1): 11.0}
    assert activity.last_live == {("a", 0): 10.0}
