"""What the garbage collector walks: start-up's heap frozen, the resume ring's entries untracked.

A full collection walks every tracked object; the ring's ten thousand entries (and before
kvgateway.runtime.memory, start-up's 55,000 objects) made it a pause of tens of milliseconds for every
client. These tests keep them out of its reach."""

from __future__ import annotations

import gc
import subprocess
import sys

import msgspec

from kvgateway.log.ordered import MemoryLog
from kvgateway.log.records import NoticeRecord, batch_record
from kvgateway.runtime.memory import CollectionTimer
from kvgateway.runtime.metrics import Metrics
from tests.support.events import batch, removed, stored

STREAM = ("engine", 0)


def _filled_log(batches: int) -> MemoryLog:
    log = MemoryLog(max_messages=batches + 1)
    for seq in range(batches):
        events = [
            stored(seq * 4, seq * 4 + 1, tokens=[1] * 32),
            removed(seq * 4 + 2, medium="CPU"),
        ]
        log.append(batch_record(STREAM, seq, batch(*events, ts=float(seq)), received=0.0, replayed=False))
    log.append(NoticeRecord(STREAM, "restart", {"seq": 0, "previous": 5, "reason": "seq_reset"}))
    return log


def test_ring_entries_and_their_messages_are_untracked() -> None:
    log = _filled_log(50)
    removed_only = (frozenset({"BlockRemoved"}), None)
    entries = list(log.read(0))
    assert len(entries) == 51
    for entry in entries:
        variant = log.message_for(entry, removed_only)
        assert not gc.is_tracked(entry)
        assert not gc.is_tracked(entry.message)
        assert entry.batch is None or not gc.is_tracked(entry.batch)
        assert variant is None or not gc.is_tracked(variant)
        assert entry.record is None  # the decoded batch (tracked lists) is let go once followed
    # The filtered variant is still the right message: built from the untracked event ends.
    batch = entries[0]
    assert batch.batch is not None and len(msgspec.json.decode(batch.message.data)["events"]) == 2
    variant = log.message_for(batch, removed_only)
    assert variant is not None and b'"BlockRemoved"' in variant.data and b'"BlockStored"' not in variant.data


def test_a_fuller_ring_gives_the_collector_nothing_more_to_walk() -> None:
    gc.collect()
    before = len(gc.get_objects())
    log = _filled_log(2_000)
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert len(log.ring) == 2_001
    assert grown < 200, f"{grown} tracked objects for a ring of 2,000 entries"


def test_freezing_start_up_leaves_the_collector_little_to_walk() -> None:
    # In a child process: freezing the test runner's own heap would outlive this test.
    script = (
        "import gc, kvgateway.serve.app, kvgateway.serve.server\n"
        "from kvgateway.runtime.memory import freeze_startup_heap\n"
        "freeze_startup_heap()\n"
        "print(gc.get_freeze_count(), len(gc.get_objects()))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    frozen, tracked = map(int, out.stdout.split())
    assert frozen > 10_000  # the app's modules, classes and functions
    assert tracked < 1_000


def test_the_collection_timer_reports_each_collection_while_installed() -> None:
    seen: list[tuple[int, float]] = []
    timer = CollectionTimer(lambda generation, seconds: seen.append((generation, seconds)))
    timer.install()
    timer.install()  # once only
    gc.disable()  # only the collections asked for here
    try:
        gc.collect(1)
        gc.collect(2)
    finally:
        gc.enable()
        timer.uninstall()
    assert [generation for generation, _ in seen] == [1, 2]
    assert all(0 <= seconds < 1 for _, seconds in seen)
    gc.collect()
    assert len(seen) == 2  # uninstalled: nothing more
    timer.uninstall()  # idempotent


def test_the_metric_takes_the_timers_samples_by_generation() -> None:
    metrics = Metrics()
    timer = CollectionTimer(metrics.observe_gc_pause)
    timer.install()
    gc.disable()
    try:
        gc.collect(2)
    finally:
        gc.enable()
        timer.uninstall()
    count = metrics.registry.get_sample_value("kvgateway_gc_pause_seconds_count", {"generation": "2"})
    young = metrics.registry.get_sample_value("kvgateway_gc_pause_seconds_count", {"generation": "0"})
    assert (count, young) == (1.0, 0.0)
