"""The compiled core against the pure-Python one, in one process, stage by stage:
``python -m bench.core [--smoke] [--batches N] [--rounds R]``.

The stages the compiled core replaces, as scenario 1's in-process table measures them (bench/
ingest.py's ``_stages``): **render** (the events rendered and encoded to the JSON the log keeps) and
**learn** (a default ``ChainLearner`` fed every batch: it reaches its floor cap of 65,536 entries and
evicts from there). Both cores are loaded side by side (``kvgateway.log._render_py`` and
``_render_c``, ``kvgateway.state._learner_py`` and ``_learner_c``) and timed on the same decoded
batches of each payload variant (map, positional, byte hashes), the two alternating round after
round and the order reversed every other round; each figure is the best round's CPU time of this
process (``time.process_time``: on a shared machine a round that was preempted counts less than in
wall time) in microseconds per batch. The ratio compiled / pure is the figure to read.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from bench import payloads
from bench.common import write_run
from bench.ingest import VARIANTS
from bench.learner import REPO
from bench.lookup import _commit
from kvgateway.engine import wire
from kvgateway.log import messages

RESULTS: Final = REPO / "bench" / "results" / "core"
CORES: Final = ("pure", "compiled")


def _say(text: str) -> None:
    print(f"[bench.core] {text}", file=sys.stderr, flush=True)


def _modules() -> dict[str, dict[str, ModuleType]]:
    out: dict[str, dict[str, ModuleType]] = {"pure": {}, "compiled": {}}
    for part, name in (("render", "kvgateway.log._render"), ("learner", "kvgateway.state._learner")):
        out["pure"][part] = importlib.import_module(name + "_py")
        try:
            out["compiled"][part] = importlib.import_module(name + "_c")
        except ImportError as exc:
            raise SystemExit(f"bench.core: the compiled core is not built here ({exc})") from exc
    return out


def _render(module: ModuleType, batches: list[wire.Batch]) -> None:
    render_events, encode_events = module.render_events, messages.encode_events
    for batch in batches:
        encode_events(render_events(batch.events))


def _learn(module: ModuleType, batches: list[wire.Batch]) -> None:
    learner = module.ChainLearner()
    for batch in batches:
        learner.learn_batch("bench", 0, batch)


STAGES: Final[dict[str, tuple[str, Callable[[ModuleType, list[wire.Batch]], None]]]] = {
    "render": ("render", _render),
    "learn": ("learner", _learn),
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
    _say(f"{name}: {out}")
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
