"""The routers' chain learner against a previous commit's, in process, in the same run:
``python -m bench.learner [--smoke] [--old REV]``. The pure-Python core's learner
(kvgateway/state/_learner_py.py) is measured beside them: "pure" in every figure, and "current" is
the one that runs (the compiled core where it was built).

The previous learner is ``REV``'s lookup module (default 9b2743e: the dict of 128-bit
Python ints with a fixed cap), loaded from git into a module of its own; the current one is
kvgateway/state/learner.py. Both learn the same events; every figure is a pair measured one beside the
other (interleaved repetitions, the best of each kept), so a shared machine slows both alike.

**Fill** (bench/lookup.py's workload: ``--streams`` engines, ``--blocks`` resident blocks as
64-block chains of 16 random tokens, each engine hashing with its own seed): each learner learns
every block once, below its cap.

- bytes per learned entry (tracemalloc; the hash objects exist before tracing and count in
  neither: the occupancy index holds them too);
- microseconds of learning per announced block;
- lookups by tokens over the whole fleet with each learner: the same answers (checked for every
  query: a whole chain, half a chain then a miss, a miss), p50/p99.

**At the cap** (``--cap-streams`` engines, 64 by default, as the demo's fleet): every engine
holds ``--cap-resident`` blocks in all and churns (stores a new 16-block chain, drops its oldest);
each learner is capped at 1.25 entries per resident block (the current one follows the fleet
there by itself, as in the gateway), with the gateway's residency question
(previous: ``Routers.resident`` of REV (now RouterState), every stream's every group per evicted
entry; current: the fleet's holders, then the announcing stream's groups; and the current one twice
more, asked as the commit before asked, the stream's groups alone, and never asked), is filled past
its cap, then timed for ``--cap-blocks`` announced blocks: microseconds per announced block, index
work included and reported apart.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from bench.common import write_run
from bench.lookup import BLOCK_SIZE, VOCAB, Workload, _commit, _percentiles, workload_arguments, workload_sizes
from kvgateway.engine.wire import Batch, BlockRemoved, BlockStored, Hash
from kvgateway.runtime.extensions import core
from kvgateway.state import _learner_py
from kvgateway.state.learner import LEARNED_PER_RESIDENT, ChainLearner
from kvgateway.state.lookup import TokenQuery, lookup_tokens
from kvgateway.state.occupancy import OccupancyIndex

REPO: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = REPO / "bench" / "results" / "learner"
OLD_REV: Final = "9b2743e"
CAP_CHAIN: Final = 16
KINDS: Final = ("previous", "pure", "current")
"""REV's learner, the pure-Python core's (kvgateway/state/_learner_py.py) and the one that runs
(compiled where it was built: ``core`` in the results says which)."""


def _say(text: str) -> None:
    print(f"[bench.learner] {text}", file=sys.stderr, flush=True)


MOVED: Final = {"wire": "engine.wire", "mediums": "engine.mediums", "occupancy": "state.occupancy"}
"""The modules the lookup module of 9b2743e imports, by their names then and now (the folders)."""

OLD_LOOKUP_PATHS = ("kvgateway/state/lookup.py", "kvgateway/lookup.py")
"""Where a revision keeps the lookup module: in the state/ folder, or at the top before the folders."""


def load_old(rev: str) -> ModuleType:
    """``rev``'s lookup module as a module of its own. What it imports has not changed but has moved
    (:data:`MOVED`)."""
    for where in OLD_LOOKUP_PATHS:
        proc = subprocess.run(["git", "show", f"{rev}:{where}"], cwd=REPO, capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            break
    else:
        raise SystemExit(f"bench.learner: cannot read {rev}'s lookup module from git: {proc.stderr.strip()}")
    folder = Path(tempfile.mkdtemp(prefix="kvgw-old-learner-"))
    path = folder / f"lookup_{rev}.py"
    source = proc.stdout
    for old, new in MOVED.items():  # the modules it imports, where they live now
        source = source.replace(f"from kvgateway.{old} import", f"from kvgateway.{new} import")
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"lookup_{rev}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _learn_all(learner: Any, events: list[tuple[int, BlockStored]]) -> float:
    gc.disable()
    try:
        start = time.perf_counter()
        for stream, event in events:
            learner.learn("engine", stream, event)
        return time.perf_counter() - start
    finally:
        gc.enable()


def fill(old: ModuleType, streams: int, blocks: int, chain: int, *, queries: int, rounds: int) -> dict[str, Any]:
    work = Workload(streams, blocks, chain, samples=queries)
    events = list(work.events())
    resident = sum(len(e.block_hashes) for _, e in events)
    cap = max(2 * resident, 1)

    def make(kind: str) -> Any:
        if kind == "previous":
            return old.ChainLearner(cap)
        return (_learner_py.ChainLearner if kind == "pure" else ChainLearner)(cap, floor=cap)

    memory: dict[str, float] = {}
    for kind in KINDS:
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        learner = make(kind)
        _learn_all(learner, events)
        gc.collect()
        memory[kind] = round((tracemalloc.get_traced_memory()[0] - base) / len(learner), 1)
        tracemalloc.stop()
        del learner
    learn_us: dict[str, float] = {}
    learners: dict[str, Any] = {}
    for _ in range(3):
        for kind in KINDS:
            learners[kind] = learner = make(kind)
            took = _learn_all(learner, events) / resident * 1e6
            learn_us[kind] = round(min(learn_us.get(kind, took), took), 3)
    _say(f"fill: {resident} blocks; bytes/entry {memory}; learning us/block {learn_us}")

    occupancy = OccupancyIndex()
    for stream, event in events:
        occupancy.apply("engine", stream, Batch(0.0, [event], stream), 0.0)
    indexes = list(occupancy.streams())
    rng = random.Random(11)
    token_queries: list[list[int]] = []
    for i, (_stream, sample, _hashes) in enumerate(work.samples):
        tokens = sample
        kind_of = i % 3  # a whole chain, half a chain then a miss, a miss
        if kind_of == 1:
            cut = chain // 2 * BLOCK_SIZE
            tokens = sample[:cut] + [rng.randrange(VOCAB) for _ in range(len(sample) - cut)]
        elif kind_of == 2:
            tokens = [rng.randrange(VOCAB) for _ in range(len(sample))]
        token_queries.append(tokens)
    same = 0
    for tokens in token_queries:
        answers = [lookup_tokens(indexes, learners[k], TokenQuery(tokens), 0) for k in KINDS]
        if answers[0] != answers[1] or answers[0] != answers[2]:
            raise SystemExit("bench.learner: the current learner answers a lookup by tokens otherwise")
        same += 1
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    clock = time.perf_counter
    for _ in range(rounds):
        for tokens in token_queries:
            for kind in KINDS:
                query = TokenQuery(tokens)
                start = clock()
                lookup_tokens(indexes, learners[kind], query, 0)
                times[kind].append(clock() - start)
    lookups = {kind: _percentiles(samples) for kind, samples in times.items()}
    _say(f"lookups by tokens: {same} answers alike; {lookups}")
    return {
        "resident_blocks": resident,
        "streams": streams,
        "bytes_per_entry": memory,
        "bytes_per_entry_ratio": round(memory["current"] / memory["previous"], 3),
        "learn_us_per_block": learn_us,
        "learn_ratio": round(learn_us["current"] / learn_us["previous"], 3),
        "lookups_by_tokens": lookups,
        "queries": len(token_queries),
        "rounds": rounds,
        "same_answers": same,
    }


class Churn:
    """``streams`` engines, each holding ``per_stream`` blocks as 16-block chains, churning FIFO."""

    def __init__(self, streams: int, per_stream: int, seed: int = 3) -> None:
        self.rng = random.Random(seed)
        self.streams = streams
        self.per_stream = per_stream
        self.held: list[list[list[Hash]]] = [[] for _ in range(streams)]
        self.n = 0

    def next(self, stream: int) -> list[Any]:
        """The events of one step of ``stream``: a new chain stored, the oldest removed when full."""
        tokens = [self.rng.randrange(VOCAB) for _ in range(CAP_CHAIN * BLOCK_SIZE)]
        hashes: list[Hash] = [self.rng.getrandbits(64) for _ in range(CAP_CHAIN)]
        events: list[Any] = [BlockStored(hashes, None, tokens, BLOCK_SIZE, None, "GPU", None, None)]
        held = self.held[stream]
        held.append(hashes)
        if len(held) * CAP_CHAIN > self.per_stream:
            events.append(BlockRemoved(held.pop(0), "GPU", None))
        return events


CAP_KINDS: Final = (*KINDS, "current_streams_asked", "current_unasked")
"""At the cap, two more runs of the current learner: asked the residency question as the previous
commit asked it (the announcing stream's groups, no fleet-wide test first), and never asked."""


def _cap_learner(old: ModuleType, kind: str, index: OccupancyIndex, cap: int) -> Any:
    if kind == "current_streams_asked":
        return ChainLearner(cap, floor=1, resident=lambda s, h: index.stream(*s).holds(h))
    if kind == "current_unasked":
        return ChainLearner(cap, floor=1)
    if kind == "previous":

        def resident_old(block_hash: Hash) -> bool:
            # 9b2743e's Routers.resident, verbatim
            return any(block_hash in held for stream in index.streams() for _, _, _, held, _ in stream.block_groups())

        return old.ChainLearner(cap, resident=resident_old)
    learner = _learner_py.ChainLearner if kind == "pure" else ChainLearner
    return learner(cap, floor=1, resident=index.holds, held=index.holders)  # as serve/router_state.py does


class _CapRun:
    """One learner beside its own index, filled past its cap by the churn."""

    def __init__(self, old: ModuleType, kind: str, cap: int) -> None:
        self.kind = kind
        self.index = OccupancyIndex()
        self.learner = _cap_learner(old, kind, self.index, cap)
        self.learn_s = self.index_s = 0.0
        self.steps = 0

    def feed(self, stream: int, batch: Batch, clock: Callable[[], float] | None = None) -> None:
        if clock is None:
            self.index.apply("engine", stream, batch, 0.0)
            self.learner.learn_batch("engine", stream, batch)
        else:
            start = clock()
            self.index.apply("engine", stream, batch, 0.0)
            mark = clock()
            self.learner.learn_batch("engine", stream, batch)
            self.index_s += mark - start
            self.learn_s += clock() - mark
        self.steps += 1
        if self.kind != "previous" and self.steps % 256 == 0:
            self.learner.follow_fleet(self.index.resident_blocks())  # as RouterState.follow does

    def full(self, cap: int, resident: int) -> bool:
        """Past the cap, the fleet at its size (and the current learner's ring grown to its cap: a
        ring that wrapped grows on its next lap)."""
        learner = self.learner
        return learner.learned > cap + resident and (self.kind == "previous" or learner.slots >= learner.cap)


def at_cap(old: ModuleType, streams: int, resident: int, blocks: int) -> dict[str, Any]:
    """Both learners fed the same churn in lockstep, each call timed: a shared machine's load falls
    on both alike."""
    per_stream = max(CAP_CHAIN, resident // streams)
    cap = int(LEARNED_PER_RESIDENT * per_stream * streams)
    out: dict[str, Any] = {"streams": streams, "resident_blocks": per_stream * streams, "cap": cap}
    runs = [_CapRun(old, kind, cap) for kind in CAP_KINDS]
    churn = Churn(streams, per_stream)
    step = 0
    while not all(run.full(cap, per_stream * streams) for run in runs):
        stream = step % streams
        batch = Batch(0.0, churn.next(stream), stream)
        for run in runs:
            run.feed(stream, batch)
        step += 1
    before = [(run.learner.evicted, run.learner.second_chances) for run in runs]
    timed = max(1, blocks // CAP_CHAIN)
    gc.collect()
    gc.disable()
    try:
        for n in range(timed):
            stream = (step + n) % streams
            batch = Batch(0.0, churn.next(stream), stream)
            for run in runs[n % len(runs) :] + runs[: n % len(runs)]:  # each first in turn
                run.feed(stream, batch, time.perf_counter)
    finally:
        gc.enable()
    announced = timed * CAP_CHAIN
    for run, (evicted, chances) in zip(runs, before, strict=True):
        learner = run.learner
        out[run.kind] = {
            "learner_us_per_block": round(run.learn_s / announced * 1e6, 3),
            "index_us_per_block": round(run.index_s / announced * 1e6, 3),
            "entries": len(learner),
            "evicted_per_block": round((learner.evicted - evicted) / announced, 3),
            "second_chances_per_block": round((learner.second_chances - chances) / announced, 3),
            "slots": learner.slots if run.kind != "previous" else None,
            "learner_cap": learner.cap if run.kind != "previous" else cap,
        }
        _say(f"at the cap, {run.kind}: {out[run.kind]}")
    out["ratio"] = round(out["current"]["learner_us_per_block"] / out["previous"]["learner_us_per_block"], 4)
    out["current_vs_pure"] = round(out["current"]["learner_us_per_block"] / out["pure"]["learner_us_per_block"], 4)
    for kind in ("current", "current_streams_asked", "current_unasked"):
        out[f"{kind}_us_per_20_block_batch"] = round(20 * out[kind]["learner_us_per_block"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.learner", description=__doc__.split("\n\n")[0])
    workload_arguments(parser)  # the fill's workload
    parser.add_argument("--old", default=OLD_REV, help=f"the commit to compare with (default {OLD_REV})")
    parser.add_argument("--cap-streams", type=int, default=64, help="at the cap: engines (default 64)")
    parser.add_argument("--cap-resident", type=int, help="at the cap: resident blocks in all (default 64,000)")
    parser.add_argument("--cap-blocks", type=int, help="at the cap: announced blocks timed (default 32,000)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    blocks, queries, rounds = workload_sizes(args)
    cap_resident = args.cap_resident or (2048 if args.smoke else 64_000)
    cap_blocks = args.cap_blocks or (512 if args.smoke else 32_000)
    if min(args.streams, blocks, args.chain, queries, rounds, args.cap_streams, cap_resident, cap_blocks) < 1:
        parser.error("sizes must be at least 1")
    old = load_old(args.old)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    out = {
        "mode": "smoke" if args.smoke else "full",
        "started": started,
        "code": _commit(),
        "previous": args.old,
        "python": sys.version.split()[0],
        "core": core(),
        "fill": fill(old, args.streams, blocks, args.chain, queries=queries, rounds=rounds),
        "at_cap": at_cap(old, args.cap_streams, cap_resident, cap_blocks),
    }
    _say(f"wrote {write_run(out, args.results_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
