"""The compiled core against the pure-Python one, in one process, stage by stage:
``python -m bench.core [--smoke] [--batches N] [--rounds R]``.

The stages the compiled core replaces, as scenario 1's in-process table measures them (bench/
ingest.py's ``_stages``): **render** (``events_json``: the events' JSON and filter keys the log keeps) and
**learn** (a default ``ChainLearner`` fed every batch: it reaches its floor cap of 65,536 entries and
evicts from there) and **analytics** (the cache analytics' pass, a default ``AnalyticsPass``, fed
every batch as the log's follower feeds it). Both cores are loaded side by side
(``kvgateway.protocol._render_py`` and ``_render_c``, ``kvgateway.state._learner_py`` and
``_learner_c``, ``kvgateway.state._analytics_py`` and ``_analytics_c``) and timed on the same decoded
batches of each payload variant (map, positional, byte hashes, signed hashes), the two alternating round after
round and the order reversed every other round; each figure is the best round's CPU time of this
process (``time.process_time``: on a shared machine a round that was preempted counts less than in
wall time) in microseconds per batch. The ratio compiled / pure is the figure to read.

**digest**: what keeping the state digest adds to the index's apply (``kvgateway.state._digest_py``
and ``_digest_c``, each put in place of the index's ``elements_sum`` for its turn): the apply with
tracking on from the first batch, as after a client's first ask, minus the apply without (``index``,
timed in the same rounds). Against the whole ingest path: bench/ingest.py's stage table (its
``sum``, wall time) under each core in the same process, alternating for up to 3 rounds, each with
its own ``digest_upkeep`` (best round of each figure), and ``share`` the upkeep as a fraction of
that ``sum``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from bench import payloads
from bench.common import write_run
from bench.ingest import VARIANTS, _stages
from bench.learner import REPO
from bench.lookup import _commit
from kvgateway.engine import wire
from kvgateway.state import occupancy

RESULTS: Final = REPO / "bench" / "results" / "core"
CORES: Final = ("pure", "compiled")


def _say(text: str) -> None:
    print(f"[bench.core] {text}", file=sys.stderr, flush=True)


def twin_modules(twins: dict[str, str], who: str) -> dict[str, dict[str, ModuleType]]:
    """Each part's pure-Python and compiled module (``<name>_py``, ``<name>_c``), by core; exits
    with one line where the compiled core is not built."""
    out: dict[str, dict[str, ModuleType]] = {"pure": {}, "compiled": {}}
    for part, name in twins.items():
        out["pure"][part] = importlib.import_module(name + "_py")
        try:
            out["compiled"][part] = importlib.import_module(name + "_c")
        except ImportError as exc:
            raise SystemExit(f"{who}: the compiled core is not built here ({exc})") from exc
    return out


def _modules() -> dict[str, dict[str, ModuleType]]:
    twins = {
        "render": "kvgateway.protocol._render",
        "learner": "kvgateway.state._learner",
        "digest": "kvgateway.state._digest",
        "analytics": "kvgateway.state._analytics",
    }
    return twin_modules(twins, "bench.core")


def _render(module: ModuleType, batches: list[wire.Batch]) -> None:
    events_json = module.events_json  # the events' JSON and filter keys, as the log keeps them
    for batch in batches:
        events_json(batch.events)


def _learn(module: ModuleType, batches: list[wire.Batch]) -> None:
    learner = module.ChainLearner()
    for batch in batches:
        learner.learn_batch("bench", 0, batch)


def _analytics(module: ModuleType, batches: list[wire.Batch]) -> None:
    analytics = module.AnalyticsPass()
    stream = ("bench", 0)
    for batch in batches:
        analytics.apply(stream, batch.events, batch.ts)
    analytics.tiers  # noqa: B018 - a read: the compiled pass's thread has applied every batch (timed in CPU)


@contextmanager
def _digest_by(module: ModuleType) -> Iterator[None]:
    """The index's digest sums by ``module`` (pure or compiled) while the block runs."""
    passes = sys.modules[occupancy.Group.__module__]  # the index's pass that runs (either core)
    saved = passes.elements_sum
    passes.elements_sum = module.elements_sum
    try:
        yield
    finally:
        passes.elements_sum = saved


def _apply(batches: list[wire.Batch], tracked: bool) -> None:
    index = occupancy.OccupancyIndex()
    if tracked:
        index.stream("bench", 0).digest()  # tracking on from the first batch, as after the first ask
    now = time.time()
    for batch in batches:
        index.apply("bench", 0, batch, now)


def _index(module: ModuleType, batches: list[wire.Batch]) -> None:
    with _digest_by(module):
        _apply(batches, tracked=False)


def _digest(module: ModuleType, batches: list[wire.Batch]) -> None:
    with _digest_by(module):
        _apply(batches, tracked=True)


STAGES: Final[dict[str, tuple[str, Callable[[ModuleType, list[wire.Batch]], None]]]] = {
    "render": ("render", _render),
    "learn": ("learner", _learn),
    "analytics": ("analytics", _analytics),
    "index": ("digest", _index),  # no digest kept: the same code under both cores, the upkeep's base
    "digest": ("digest", _digest),
}


def variant(name: str, batches_wanted: int, rounds: int, modules: dict[str, dict[str, ModuleType]]) -> dict[str, Any]:
    form, hashes = VARIANTS[name]
    stream = payloads.load_or_generate(payloads.standard(max(batches_wanted, 2_000), form, hashes)).stream(0)
    batches = [wire.decode_batch(payload) for payload in stream[:batches_wanted]]
    best: dict[str, dict[str, float]] = {stage: {} for stage in STAGES}
    gc.collect()
    gc.disable()  # as the stage table: the batches held here are not the gateway's garbage
    try:
        for n in range(rounds):
            order = CORES if n % 2 == 0 else tuple(reversed(CORES))
            for stage, (part, run) in STAGES.items():
                for core in order:
                    started = time.process_time()
                    run(modules[core][part], batches)
                    took = (time.process_time() - started) / len(batches) * 1e6
                    best[stage][core] = min(best[stage].get(core, took), took)
    finally:
        gc.enable()
    out: dict[str, Any] = {"batches": len(batches)}
    for stage, figures in best.items():
        out[stage] = {core: round(us, 2) for core, us in figures.items()}
        out[stage]["ratio"] = round(figures["compiled"] / figures["pure"], 3)
    base = min(best["index"].values())
    upkeep = {core: best["digest"][core] - base for core in CORES}
    out["digest_upkeep"] = {core: round(us, 2) for core, us in upkeep.items()}
    out["digest_upkeep"]["ratio"] = round(upkeep["compiled"] / upkeep["pure"], 3)
    out["ingest_path"] = _ingest_path(stream[:batches_wanted], modules, min(rounds, 3))
    _say(f"{name}: {out}")
    return out


def _ingest_path(stream: list[bytes], modules: dict[str, dict[str, ModuleType]], rounds: int) -> dict[str, Any]:
    """bench/ingest.py's stage table under each core's digest, the cores alternating for ``rounds``
    rounds: the best round's ``sum`` (the ingest path, wall microseconds per batch) and
    ``digest_upkeep``, and the upkeep's share of the sum."""
    best: dict[str, dict[str, float]] = {core: {} for core in CORES}
    for n in range(rounds):
        for core in CORES if n % 2 == 0 else tuple(reversed(CORES)):
            gc.collect()
            gc.disable()  # as bench/ingest.py's breakdown
            try:
                with _digest_by(modules[core]["digest"]):
                    table = _stages(stream, {})
            finally:
                gc.enable()
            for figure in ("sum", "digest_upkeep"):
                best[core][figure] = min(best[core].get(figure, table[figure]), table[figure])
    out: dict[str, Any] = {}
    for core, figures in best.items():
        out[core] = {**figures, "share": round(figures["digest_upkeep"] / figures["sum"], 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.core", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: proves it runs, measures nothing")
    parser.add_argument("--batches", type=int, help="decoded batches per variant (default 5,000; smoke 300)")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 5; smoke 2)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    batches = args.batches or (300 if args.smoke else 5_000)
    rounds = args.rounds or (2 if args.smoke else 5)
    if min(batches, rounds) < 1:
        parser.error("sizes must be at least 1")
    modules = _modules()
    out = {
        "mode": "smoke" if args.smoke else "full",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "code": _commit(),
        "python": sys.version.split()[0],
        "variants": {name: variant(name, batches, rounds, modules) for name in VARIANTS},
    }
    _say(f"wrote {write_run(out, args.results_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
