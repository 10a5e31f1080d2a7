"""The serving side's state path per batch, stage by stage, in one process:
``python -m bench.state [--smoke] [--batches N] [--rounds R] [--base REV]``.

What every batch the log delivers costs the serving side's state (the stages the ordered log's
followers run), on the same decoded batches of scenario 1's payloads (one engine, map events, u64
hashes, about 38 announced blocks a batch; ``--variant`` for the others), each figure the best
round's CPU time of this process (``time.process_time``) in microseconds per batch, the figures
alternating round after round and the order reversed every other round:

- ``before``: ``REV``'s index (default 8a83c3d, the commit before the prefill attribution), loaded
  from git into a module of its own: the index's apply alone, no fleet holders, no attribution;
- ``previous`` (only with ``--previous REV``): ``REV``'s index and attribution, loaded from git the
  same way, run as ``attributed`` is, over this tree's pass: for a commit whose index and
  attribution speak this tree's pass interface (``StoreObserver``, ``Account``); across a change of
  that interface, compare two trees with ``python -m bench.ab`` or two runs of this bench instead;
- ``index``: this tree's index without an observer (the index's apply and the fleet's holders);
- ``attributed``: the same with the prefill attribution observing it, as the gateway runs it;
- ``digest``: the same with every group's state digest kept (after a client's first ask);
- ``learner``: the routers' chain learner (default floor cap, 65,536 entries: this workload fills it
  and evicts from there) fed each batch after the index, with the gateway's residency question;
  the index's part timed apart and left out.

Each of ``index``, ``attributed``, ``digest`` and ``learner`` runs on both cores (``pure``,
``compiled``: the pure-Python reference modules and their compiled twins, swapped in for the
turn); ``before`` has only its own. The ratios to read: ``attributed / before`` (issue 30's cost,
at most 1.05 of the path before), and compiled against pure.

``bytes_per_resident_block``: tracemalloc's bytes after all the batches, per resident block, of
``before``'s index and of this tree's without and with the attribution, on each core; and
``with_hashes``, this tree's with the batches decoded while traced (the hashes' ints counted, as
the gateway holds them: the evictions keep an evicted block's int alive in the pure core only).

``ingest_path``: scenario 1's in-process stage table (bench/ingest.py, its ``sum``, wall time, best
of 3) under the core this process runs (``KVGATEWAY_NO_EXTENSIONS=1`` for the pure one), and
``attribution_share``: that core's ``attributed`` minus ``before`` as a fraction of it (the
process around the stages, receive and send, is not in the sum: the share of the gateway's whole
CPU per batch is smaller).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from bench import payloads
from bench.common import write_run
from bench.core import twin_modules
from bench.ingest import VARIANTS, _stages
from bench.learner import REPO
from bench.lookup import _commit
from kvgateway.engine import wire
from kvgateway.runtime import extensions
from kvgateway.state import attribution, occupancy

RESULTS: Final = REPO / "bench" / "results" / "state"
BASE_REV: Final = "8a83c3d"
CORES: Final = ("pure", "compiled")
TWINS: Final = {
    "learner": "kvgateway.state._learner",
    "digest": "kvgateway.state._digest",
    "apply": "kvgateway.state._apply",
}
"""The compiled core's modules this path uses, each swapped in for its core's turn."""


def _say(text: str) -> None:
    print(f"[bench.state] {text}", file=sys.stderr, flush=True)


MOVED: Final = {
    "kvgateway.log.ordered": (
        "kvgateway.log.records",
        {"BatchRecord", "NoticeRecord", "Record", "STATUS", "batch_record", "make_entry"},
    ),
    "kvgateway.log.ring": ("kvgateway.log.entry", {"Entry"}),
}
"""Names a base's modules import from where they were before they moved (round twenty: the log's
records and its entry got modules of their own): the module each is imported from now."""
_IMPORT_LINE: Final = re.compile(r"^from (?P<module>[\w.]+) import (?P<names>[\w, ]+)$", re.MULTILINE)


def _moved(source: str) -> str:
    """``source`` with each one-line import of a moved name pointed where the name is now."""

    def point(match: re.Match[str]) -> str:
        module, names = match["module"], [n.strip() for n in match["names"].split(",") if n.strip()]
        if module not in MOVED:
            return match[0]
        target, moved = MOVED[module]
        lines = [
            f"from {where} import {', '.join(sorted(group))}"
            for where, group in (
                (target, [n for n in names if n in moved]),
                (module, [n for n in names if n not in moved]),
            )
            if group
        ]
        return "\n".join(lines)

    return _IMPORT_LINE.sub(point, source)


def load_base(rev: str, name: str = "occupancy", replace: tuple[str, str] | None = None) -> ModuleType:
    """``rev``'s state module ``name`` as a module of its own (what it imports is still where it
    was; ``replace``: one import to point elsewhere, such as at ``rev``'s own occupancy)."""
    proc = subprocess.run(
        ["git", "show", f"{rev}:kvgateway/state/{name}.py"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench.state: cannot read {rev}'s {name} module from git: {proc.stderr.strip()}")
    path = Path(tempfile.mkdtemp(prefix="kvgw-base-state-")) / f"{name}_{rev}.py"
    source = _moved(proc.stdout)
    path.write_text(source.replace(*replace) if replace else source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"{name}_{rev}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def modules() -> dict[str, dict[str, ModuleType]]:
    return twin_modules(TWINS, "bench.state")


@contextmanager
def core_of(chosen: dict[str, ModuleType]) -> Iterator[None]:
    """The index's pass by ``chosen``'s apply module, its digest sums by ``chosen``'s digest module,
    while the block runs."""
    names = ("Account", "Evictions", "Group", "Medium", "apply_batch")
    saved = [getattr(occupancy, name) for name in names]
    saved_account = attribution.Account
    saved_sum = chosen["apply"].elements_sum
    for name in names:
        setattr(occupancy, name, getattr(chosen["apply"], name))
    attribution.Account = chosen["apply"].Account
    chosen["apply"].elements_sum = chosen["digest"].elements_sum
    try:
        yield
    finally:
        for name, value in zip(names, saved, strict=True):
            setattr(occupancy, name, value)
        attribution.Account = saved_account
        chosen["apply"].elements_sum = saved_sum


def _apply(index: Any, batches: list[wire.Batch]) -> float:
    now = time.time()
    started = time.process_time()
    for batch in batches:
        index.apply("bench", 0, batch, now)
    return time.process_time() - started


class Bases:
    """The commits the tree is measured against: ``before`` (the index alone, before the prefill
    attribution) and ``previous`` (the index with the attribution as the previous commit had it)."""

    def __init__(self, before: str, previous: str | None) -> None:
        self.before = load_base(before)
        self.previous: ModuleType | None = None
        self.previous_attribution: ModuleType | None = None
        if previous is not None:
            self.previous = load_base(previous, "occupancy")
            self.previous_attribution = load_base(
                previous,
                "attribution",
                ("from kvgateway.state.occupancy import", f"from occupancy_{previous} import"),
            )


def _before(bases: Bases, chosen: dict[str, ModuleType], batches: list[wire.Batch]) -> float:
    return _apply(bases.before.OccupancyIndex(), batches)


def _previous(bases: Bases, chosen: dict[str, ModuleType], batches: list[wire.Batch]) -> float:
    assert bases.previous is not None and bases.previous_attribution is not None
    with core_of(chosen):
        observer = bases.previous_attribution.Attribution()
        return _apply(bases.previous.OccupancyIndex(observer=observer), batches)


def _index(bases: Bases, chosen: dict[str, ModuleType], batches: list[wire.Batch]) -> float:
    with core_of(chosen):
        return _apply(occupancy.OccupancyIndex(), batches)


def _attributed(bases: Bases, chosen: dict[str, ModuleType], batches: list[wire.Batch]) -> float:
    with core_of(chosen):
        return _apply(occupancy.OccupancyIndex(observer=attribution.Attribution()), batches)


def _digest(bases: Bases, chosen: dict[str, ModuleType], batches: list[wire.Batch]) -> float:
    with core_of(chosen):
        index = occupancy.OccupancyIndex(observer=attribution.Attribution())
        index.stream("bench", 0).digest()  # tracking on from the first batch, as after the first ask
        return _apply(index, batches)


def _learner(bases: Bases, chosen: dict[str, ModuleType], batches: list[wire.Batch]) -> float:
    """The learner's share alone: each batch applied to the index first (untimed), then learned."""
    with core_of(chosen):
        index = occupancy.OccupancyIndex(observer=attribution.Attribution())
        learner = chosen["learner"].ChainLearner(resident=index.holds, held=index.holders)  # as the gateway
        now = time.time()
        clock = time.process_time
        took = 0.0
        for batch in batches:
            index.apply("bench", 0, batch, now)
            started = clock()
            learner.learn_batch("bench", 0, batch)
            took += clock() - started
        return took


STAGES: Final[dict[str, Callable[[Bases, dict[str, ModuleType], list[wire.Batch]], float]]] = {
    "before": _before,
    "previous": _previous,
    "index": _index,
    "attributed": _attributed,
    "digest": _digest,
    "learner": _learner,
}


def variant(
    name: str, wanted: int, rounds: int, bases: Bases, mods: dict[str, dict[str, ModuleType]]
) -> dict[str, Any]:
    form, hashes = VARIANTS[name]
    stream = payloads.load_or_generate(payloads.standard(max(wanted, 2_000), form, hashes)).stream(0)
    batches = [wire.decode_batch(payload) for payload in stream[:wanted]]
    best: dict[str, dict[str, float]] = {stage: {} for stage in STAGES}
    gc.collect()
    gc.disable()  # the batches held here are not the gateway's garbage
    try:
        for n in range(rounds):
            order = CORES if n % 2 == 0 else tuple(reversed(CORES))
            for stage, run in STAGES.items():
                if stage == "previous" and bases.previous is None:
                    continue
                for core in order[:1] if stage == "before" else order:
                    took = run(bases, mods[core], batches) / len(batches) * 1e6
                    key = "base" if stage == "before" else core
                    best[stage][key] = min(best[stage].get(key, took), took)
                gc.collect()
    finally:
        gc.enable()
    out: dict[str, Any] = {"batches": len(batches), "blocks_per_batch": _blocks(batches)}
    for stage, figures in best.items():
        if figures:
            out[stage] = {key: round(us, 2) for key, us in figures.items()}
    before = best["before"]["base"]
    out["attributed_over_before"] = {core: round(best["attributed"][core] / before, 3) for core in CORES}
    out["holders_over_before"] = {core: round(best["index"][core] / before, 3) for core in CORES}
    if best["previous"]:
        out["attributed_over_previous"] = {
            core: round(best["attributed"][core] / best["previous"][core], 3) for core in CORES
        }
    out["bytes_per_resident_block"] = memory(bases, mods, batches, stream[:wanted])
    running = extensions.core()
    gc.collect()
    gc.disable()  # as bench/ingest.py's breakdown
    try:
        path = min(_stages(stream[:wanted], {})["sum"] for _ in range(3))
    finally:
        gc.enable()
    out["ingest_path"] = {"core": running, "sum_us": path}
    mine = "pure" if running == extensions.PURE else "compiled"
    out["ingest_path"]["attribution_share"] = round((best["attributed"][mine] - before) / path, 3)
    _say(f"{name}: {out}")
    return out


def memory(
    bases: Bases, mods: dict[str, dict[str, ModuleType]], batches: list[wire.Batch], payloads: list[bytes]
) -> dict[str, Any]:
    """Bytes per resident block (tracemalloc, the batches decoded before tracing): ``before``'s index,
    and this tree's on each core without and with the attribution (its evictions at their bound
    or what the workload evicted within the window, whichever is less).

    ``with_hashes``: the same with each batch decoded while traced, as the gateway holds them: the
    hashes' ints count where the index (or the evictions, after their block left) keeps them alive."""
    out: dict[str, Any] = {}

    def traced(make: Callable[[], Any], decoding: bool = False) -> tuple[float, int]:
        gc.collect()
        tracemalloc.start()
        index = make()
        if decoding:
            now = time.time()
            for payload in payloads:
                index.apply("bench", 0, wire.decode_batch(payload), now)
        else:
            _apply(index, batches)
        gc.collect()
        size = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        blocks = index.resident_blocks()
        return round(size / blocks, 1), blocks

    out["before"], out["resident_blocks"] = traced(bases.before.OccupancyIndex)
    for name, chosen in mods.items():
        with core_of(chosen):
            out[f"index_{name}"] = traced(occupancy.OccupancyIndex)[0]
            out[f"attributed_{name}"] = traced(lambda: occupancy.OccupancyIndex(observer=attribution.Attribution()))[0]
            hashed = out.setdefault("with_hashes", {})
            hashed[f"index_{name}"] = traced(occupancy.OccupancyIndex, decoding=True)[0]
            hashed[f"attributed_{name}"] = traced(
                lambda: occupancy.OccupancyIndex(observer=attribution.Attribution()), decoding=True
            )[0]
    return out


def _blocks(batches: list[wire.Batch]) -> float:
    n = sum(len(e.block_hashes) for b in batches for e in b.events if type(e) in (wire.BlockStored, wire.BlockRemoved))
    return round(n / max(1, len(batches)), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.state", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: proves it runs, measures nothing")
    parser.add_argument("--batches", type=int, help="decoded batches per variant (default 5,000; smoke 300)")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 5; smoke 2)")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), help="payloads (default: map)")
    parser.add_argument("--base", default=BASE_REV, help=f"the index before attribution (default {BASE_REV})")
    parser.add_argument("--previous", help="a commit before this change, of the same pass interface (default: none)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    batches = args.batches or (300 if args.smoke else 5_000)
    rounds = args.rounds or (2 if args.smoke else 5)
    if min(batches, rounds) < 1:
        parser.error("sizes must be at least 1")
    bases, mods = Bases(args.base, args.previous), modules()
    out = {
        "mode": "smoke" if args.smoke else "full",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "code": _commit(),
        "base": args.base,
        "previous": args.previous,
        "python": sys.version.split()[0],
        "variants": {name: variant(name, batches, rounds, bases, mods) for name in args.variant or ["map"]},
    }
    _say(f"wrote {write_run(out, args.results_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
