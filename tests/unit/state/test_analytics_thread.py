"""The compiled cache analytics' thread (kvgateway/state/_analytics_c.pyx): the pass queues each
event's hashes and a C thread applies them, so these tests hold it where a thread could go wrong.
A flood read only at its end (the queue wrapped many times, an event larger than the whole queue
split and waited for), hashes of no C table's kind numbered past the point where unheld numbers
are dropped, the views outliving their pass, no thread left behind by passes gone, and a pass
used in a forked child (which has no thread) raising rather than waiting forever. Each against
the pure-Python reference where there is a state to compare. Skipped where the compiled core was
not built."""

from __future__ import annotations

import gc
import os
import random
import signal
import warnings
from pathlib import Path
from types import ModuleType

from kvgateway.engine.wire import AllBlocksCleared, BlockRemoved, BlockStored, Event, Hash
from kvgateway.state import _analytics_py
from kvgateway.state.analytics import SAMPLE, CacheAnalytics
from kvgateway.state.occupancy import OccupancyIndex
from tests.support.cores import compiled_twin, packed
from tests.support.waits import wait_until
from tests.unit.state.test_analytics_differential import STREAMS, analytics_with, shown


def _compiled() -> ModuleType:
    return compiled_twin("kvgateway.state._analytics_c")


def _both(window: float, **bounds: int) -> list[CacheAnalytics]:
    return [analytics_with(module, window, **bounds) for module in (_analytics_py, _compiled())]


def test_a_flood_read_only_at_its_end_is_the_reference() -> None:
    """3,000 batches of the forms the compiled parser keeps (u64, signed and 32-byte hashes), and
    two events of 40,000 32-byte hashes (1.3 MB of records each: more than the whole queue, so the
    main thread waits for room within one event), with no read between: one read at the end."""
    rng = random.Random(7)
    makers = [lambda: rng.getrandbits(64), lambda: rng.getrandbits(63) * rng.choice([1, -1]), lambda: rng.randbytes(32)]
    sides = _both(window=30.0, max_tracked=2_000)
    stored: list[Hash] = []
    for n in range(3_000):
        make = makers[n % 3]
        chain: list[Hash] = [make() for _ in range(rng.randrange(1, 12))]
        if n % 4 == 0:
            chain[0] = SAMPLE * rng.randrange(2**40) if n % 3 != 2 else bytes(8) + rng.randbytes(24)  # followed
        events: list[Event] = [BlockStored(chain, rng.choice([None, 5]), [], 4, None, rng.choice(["GPU", "cpu"]))]
        stored += chain
        gone = [stored.pop(rng.randrange(len(stored))) for _ in range(min(len(stored), rng.randrange(12)))]
        events.append(BlockRemoved(gone, rng.choice(["GPU", "CPU"])))
        if rng.random() < 0.1 and stored:
            events.append(BlockStored(rng.sample(stored, min(5, len(stored))), 5, [], 4, None, "GPU"))  # refetches
        if n in (1_000, 2_000):
            big = [bytes(8) + rng.randbytes(24) for _ in range(40_000)]  # a followed chain: its first is
            events.append(BlockStored(big, None, [], 4, None, "GPU"))
            events.append(BlockRemoved(big[::2], "GPU"))
        if n == 2_500:
            events.append(AllBlocksCleared())
        sides[0].apply(STREAMS[n % 2], events, n * 0.01)
        sides[1].apply(STREAMS[n % 2], packed(events), n * 0.01)
    index = OccupancyIndex()
    assert shown(sides[0], index) == shown(sides[1], index)
    # each large event's newest 2,000 kept (the bound), half of them evicted at once
    assert sides[1].core.tier(STREAMS[0], "GPU").evictions >= 2_000


def test_hashes_of_no_table_kind_numbered_past_the_drop() -> None:
    """More distinct hashes of kind _OTHER (ints above 2**64, bytes of 16) than the numbering keeps
    before dropping the numbers no table holds: the held ones keep theirs, so an equal hash made
    again later (another object) is found, and evicting it counts as the reference counts it."""
    sides = _both(window=1e9, max_tracked=50)
    a = STREAMS[0]
    kept = [
        2**64 + 8 + SAMPLE * i for i in range(10)
    ]  # followed: the first's hash() is 16 (2**64 is 8 modulo 2**61 - 1)
    for side in sides:
        side.apply(a, [BlockStored(list(kept), None, [], 4, None, "GPU")], 1.0)
    for n in range(80):  # 80 x 1,000 distinct wide ints, not followed (the first's hash() is odd)
        wide: list[Hash] = [2**64 + 1 + SAMPLE * (1_000 * n + i) + 1 for i in range(1_000)]
        wide[0] = 2**65 + 1 + n * SAMPLE  # 2**65 is 16 modulo 2**61 - 1
        for side in sides:
            side.apply(a, [BlockStored(list(wide), 3, [], 4, None, "GPU")], 2.0 + n)
    fresh = [int(str(h)) for h in kept[:5]]  # equal, other objects
    assert all(f == k and f is not k for f, k in zip(fresh, kept, strict=False))
    for side in sides:
        side.apply(
            a, [BlockRemoved(fresh, "GPU"), BlockStored([bytes(16), *fresh[:2]], None, [], 4, None, "GPU")], 100.0
        )
    pure, fast = (side.core for side in sides)
    assert fast.tier(a, "GPU").evictions == pure.tier(a, "GPU").evictions == 5
    assert fast.tier(a, "GPU").refetches == pure.tier(a, "GPU").refetches == 2
    assert list(fast.tier(a, "GPU").stored_at.items()) == list(pure.tier(a, "GPU").stored_at.items())
    assert list(fast.tier(a, "GPU").evicted_at.items()) == list(pure.tier(a, "GPU").evicted_at.items())


def test_a_view_outlives_its_pass() -> None:
    """A stats view (what ``tier`` and ``tiers`` hand out) holds the thread's tables: still read
    right after the pass that made it is gone."""
    core = _compiled().AnalyticsPass(60.0)
    core.apply(STREAMS[0], [BlockStored([SAMPLE, 5], None, [], 4, None, None)], 1.0)
    core.apply(STREAMS[0], [BlockRemoved([SAMPLE], None)], 3.5)
    stats = core.tier(STREAMS[0], "GPU")
    del core
    gc.collect()
    assert (stats.evictions, stats.lifetimes, stats.lifetime_sum) == (1, 1, 2.5)
    assert list(stats.stored_at.items()) == [(5, 1.0)]
    assert list(stats.evicted_at) == [SAMPLE] and SAMPLE in stats.evicted_at and 5 not in stats.evicted_at


def _threads() -> int:
    return len(os.listdir(Path("/proc/self/task")))


def test_passes_gone_leave_no_thread_behind() -> None:
    """Each pass that queued a record started a thread; each is stopped and joined when its pass
    (and its views) are gone."""
    compiled = _compiled()
    gc.collect()
    before = _threads()
    cores = [compiled.AnalyticsPass(60.0) for _ in range(40)]
    for core in cores:
        core.apply(STREAMS[0], [BlockStored([SAMPLE], None, [], 4, None, None)], 1.0)
        assert core.tier(STREAMS[0], "GPU").stored_at.keys() == [SAMPLE]  # read: the thread ran
    assert _threads() == before + 40
    del cores, core
    gc.collect()
    assert _threads() == before


def test_a_pass_used_in_a_forked_child_raises() -> None:
    """The thread does not survive a fork: the child's pass says so at once rather than waiting
    for a thread that is not there, and is freed without joining it."""
    core = _compiled().AnalyticsPass(60.0)
    core.apply(STREAMS[0], [BlockStored([SAMPLE], None, [], 4, None, None)], 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads (3.12 warns)
        pid = os.fork()
    if pid == 0:  # the child: exit 0 only for the fork's error, once its pass is freed
        code = 3
        try:
            core.tier(STREAMS[0], "GPU").lifetimes  # noqa: B018 - a read, which waits for the thread
            code = 1
        except RuntimeError as exc:
            code = 0 if "fork" in str(exc) else 2
            del core, exc
            gc.collect()  # its engine freed here, in a process without the thread it started
        finally:
            os._exit(code)
    try:
        done = wait_until(lambda: (reaped := os.waitpid(pid, os.WNOHANG))[0] and reaped, 60, 0.05, "the child's exit")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)  # its pass waited for a thread it does not have
        os.waitpid(pid, 0)
        raise
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert core.tier(STREAMS[0], "GPU").stored_at.keys() == [SAMPLE]  # the parent's goes on
