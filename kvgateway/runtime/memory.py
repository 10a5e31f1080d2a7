"""The garbage collector's share of the heap: what start-up built is frozen out of it.

CPython's cyclic collector walks every tracked container of a generation when it collects it. A
full (oldest-generation) collection of a started gateway walked some 55,000 objects, nearly all of
them start-up's (modules, functions, classes, the app's routes), and took 30-35 ms on the
benchmark machine: the event loop stood still that long, every client's batches waited, and it was
the whole of the gateway's p99.9 latency at 1,000 batches/s (docs/performance.md). Those objects
live as long as the process, so the collector gains nothing by walking them. ``gc.freeze`` moves
them to a generation it never walks; a full collection then walks what serving built since (a few
thousand objects), and is about a third of the cost.

Objects made later are not frozen on purpose: connections, tasks and streams come and go, often in
reference cycles, and a frozen cycle would never be freed. Refcounting frees frozen objects as
usual; only a cycle among start-up's objects would stay: the garbage start-up itself left, some 240
objects frozen with the rest (:func:`freeze_startup_heap`).
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim`` from the process's own symbols (``dlopen(NULL)``: the C library the
    interpreter runs on), or None. Looked up at the first trim, not at import: the search for the
    library by name (``ctypes.util.find_library``, which runs ``ldconfig -p``) was 2 to 4 ms of
    every start-up, for a call a gateway makes only once the learner's ring has grown."""
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None


def release_free_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``); False where the C
    library has none.

    A large array that grows by ``realloc`` is copied within the heap while it is smaller than
    glibc's mmap threshold (which rises, up to 32 MiB, each time a large block is freed), and the
    old copies stay as free heap: resident memory nobody uses. The learner's ring left about 18
    bytes of it per entry (bench/lookup.py's workload in process: 44 bytes of RSS per entry, 25
    after a trim). A trim takes milliseconds; the learner calls it after its ring grew by a
    quarter, a few dozen times in a gateway's life.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def freeze_startup_heap() -> None:
    """Keep everything alive now out of future collections: called once the process's start-up
    heap is built (modules, the role, the app, uvicorn's server), before the role starts its
    streams (:func:`kvgateway.serve.server.start_up_built`).

    No collection first: one would walk the whole start-up heap (some 59,000 objects, 8 to 20 ms,
    a tenth of a catch-up's start-up) to free what start-up left as garbage, some 240 objects of
    56 KB (argparse's help formatters, classes the standard library and ``dataclass(slots=True)``
    make and replace), which stay frozen instead: a fixed 56 KB, once. The freeze itself moves
    the generations' lists whole; ``gc.get_freeze_count`` would walk them (2 to 4 ms), so nothing
    here counts them."""
    gc.freeze()


class CollectionTimer:
    """Times every garbage collection (``gc.callbacks``) and reports it to ``observe(generation,
    seconds)``: while a collection runs, the event loop stands still, so its duration is a pause of
    every client (``kvgateway_gc_pause_seconds``). Two clock reads per collection, a few dozen a
    second under load."""

    def __init__(self, observe: Callable[[int, float], None]) -> None:
        self._observe = observe
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._observe(info["generation"], time.perf_counter() - self._started)

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
