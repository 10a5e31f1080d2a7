"""The gateway's whole per-batch path in one process, without sockets:
``python -m bench.path [--smoke] [--batches N] [--rounds R] [--resident N] [--base DIR | --attribution]
[--pairs N]``.

What the gateway does with each message of scenario 1's flood short of the sockets: split, decode,
the stream's sequencer and outlet, the ring log and its six followers (the index with the prefill
attribution, the status board, the routers' learner, the hub, the activity, the analytics), one
client's subscription whose chunks are taken as its writer takes them (after each burst of 64
messages, as the reader yields). Microseconds of this process's CPU time per batch, the best of
``--rounds`` rounds (each from a fresh gateway, warmed by 1,000 batches), for each payload variant.
The stage table (bench/ingest.py's breakdown) sums the stages alone; this is the path with the
dispatch, wrappers and metrics between them.

``--resident N``: each fresh gateway first holds a fleet beside the flood: N blocks over 8 other
streams in 64-block chains, applied to the index and learned, the learner following the fleet with
its ring full (0.3 N entries learned before them and no longer resident at its front, as in a
churning fleet). The flood's own engine holds 16,384 blocks, whose tables fit in the L3 cache; a
fleet of a million blocks does not, and there each probe of the index and the learner is a trip
to memory. The fill is applied with the attribution off, so that its one token list does not make
the flood's stores refetches.

``--base DIR``: the same figure for another checkout's gateway (its compiled core built in place),
each side in its own process (this file run with that tree as the working directory), the two
alternating and the order reversed every other pair; per variant the ratio new / base of each pair,
their median and range. Same-run ratios: on a loaded machine the figures alone mean little. Both
sides run with one hash seed, so byte hashes sample alike in the analytics.

``--attribution``: the prefill attribution's cost (issue 30), this tree's path with it ("new")
against the same path with the index given no observer ("base", as a gateway without the
attribution), in pairs the same way: the ingest CPU per batch it adds, without the publisher and
the client sharing the cores as they do in ``bench.ab``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from bench import payloads
from bench.common import write_run
from bench.ingest import VARIANTS
from bench.learner import REPO
from bench.lookup import _commit
from kvgateway.config import Settings, SourceConfig
from kvgateway.engine import wire
from kvgateway.engine.sequencer import Sequencer
from kvgateway.engine.wire import Batch, BlockStored
from kvgateway.ingest.outlet import StreamOutlet
from kvgateway.protocol.filters import ClientFilter
from kvgateway.runtime.metrics import Metrics
from kvgateway.serve.query import ClientRequest
from kvgateway.serve.serving import Serving
from kvgateway.serve.subscription import Subscription

RESULTS: Final = REPO / "bench" / "results" / "path"
BURST: Final = 64  # the reader's budget of messages per turn (kvgateway.ingest.reader.BUDGET)
WARM: Final = 1_000
FLEET_STREAMS: Final = 8  # --resident's blocks are spread over this many streams
FLEET_CHAIN: Final = 64  # blocks an announcement of the fleet's
FLEET_GONE: Final = 0.3  # learned and no longer resident, before the fleet's own: the ring's front


def _say(text: str) -> None:
    print(f"[bench.path] {text}", file=sys.stderr, flush=True)


def _fleet(serving: Serving, resident: int) -> None:
    """``resident`` blocks held and learned beside the flood's engine (see ``--resident``)."""
    rng = random.Random(5)
    index, learner = serving.index, serving.routers.learner
    tokens = list(range(1000, 1000 + FLEET_CHAIN * 16))

    def announced() -> Batch:
        hashes: list[int | bytes] = [rng.getrandbits(64) for _ in range(FLEET_CHAIN)]
        return Batch(0.0, [BlockStored(hashes, None, tokens, 16, None, "GPU", None, {})])

    learner.follow_fleet(resident)
    while learner.learned < resident * FLEET_GONE:
        learner.learn_batch("gone", 0, announced())
    observer, index.observer = index.observer, None
    for stream in range(FLEET_STREAMS):
        for _ in range(resident // FLEET_STREAMS // FLEET_CHAIN):
            batch = announced()
            index.apply("fleet", stream, batch, 0.0)
            learner.learn_batch("fleet", stream, batch)
    learner.follow_fleet(index.resident_blocks())
    index.observer = observer


def _gateway(attribution: bool = True, resident: int = 0) -> tuple[Serving, StreamOutlet, Sequencer, Subscription]:
    """A fresh serving half, one stream's outlet and sequencer over it and one client subscribed;
    without ``attribution`` the index is given no observer before its first stream opens; with
    ``resident`` blocks of a fleet beside it."""
    source = SourceConfig(name="bench", endpoint="tcp://127.0.0.1:1", replay="tcp://127.0.0.1:2")
    settings = Settings(sources=(source,), client_queue_bytes=2**30)
    serving = Serving(settings, Metrics())
    if not attribution:
        serving.index.observer = None
    if resident:
        _fleet(serving, resident)
    outlet = StreamOutlet(settings.streams()[0], serving.log, clock=time.time)
    client = serving.subscribe_held(ClientRequest(ClientFilter()), "ws")
    return serving, outlet, Sequencer(has_replay=True), client


def _run(messages: list[list[bytes]], outlet: StreamOutlet, sequencer: Sequencer, client: Subscription) -> None:
    """The reader's live loop over ``messages``, burst by burst, then the writer's takes."""
    clock = time.time
    for start in range(0, len(messages), BURST):
        burst = messages[start : start + BURST]
        for frames in burst:
            received = clock()
            seq, payload = wire.split_message(frames)
            batch = wire.decode_batch(payload)
            outlet.apply(sequencer.on_live(seq, batch, payload), received, sequencer.held)
        outlet.received(len(burst))
        outlet.settle()
        while client.pending:
            client.take()
            client.written()


def measure(variant: str, batches: int, rounds: int, attribution: bool = True, resident: int = 0) -> float:
    """The best round's CPU microseconds per batch, over ``batches`` after the warm-up."""
    form, hashes = VARIANTS[variant]
    stream = payloads.load_or_generate(payloads.standard(30_000, form, hashes)).stream(0)
    wanted = stream[: WARM + batches]
    messages = [[b"", wire.seq_bytes(seq), payload] for seq, payload in enumerate(wanted)]
    warm, timed = messages[:WARM], messages[WARM:]
    best = float("inf")
    for _ in range(rounds):
        _, outlet, sequencer, client = _gateway(attribution, resident)
        _run(warm, outlet, sequencer, client)
        gc.collect()
        started = time.process_time()
        _run(timed, outlet, sequencer, client)
        best = min(best, time.process_time() - started)
    return round(best / len(timed) * 1e6, 2)


Side = tuple[Path, tuple[str, ...]]  # a checkout, and the flags its side runs with


def _side(side: Side, variant: str, batches: int, rounds: int) -> float:
    """:func:`measure` in a process of the side's tree (its gateway and its bench package)."""
    tree, flags = side
    code = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    args = [__file__, "--one", variant, "--batches", str(batches), "--rounds", str(rounds), *flags]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=tree, env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench.path in {tree} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return float(json.loads(proc.stdout)["us_per_batch"])


def against(sides: dict[str, Side], variant: str, batches: int, rounds: int, pairs: int) -> dict[str, Any]:
    """Side "new" against side "base", ``pairs`` pairs alternating: per pair both figures and the ratio."""
    runs = []
    for n in range(pairs):
        order = ("new", "base") if n % 2 == 0 else ("base", "new")
        pair: dict[str, Any] = {side: _side(sides[side], variant, batches, rounds) for side in order}
        pair |= {"ratio": round(pair["new"] / pair["base"], 4), "load": os.getloadavg()[0]}
        _say(f"{variant} pair {n + 1}/{pairs}: {pair}")
        runs.append(pair)
    ratios = [p["ratio"] for p in runs]
    return {
        "new": statistics.median(p["new"] for p in runs),
        "base": statistics.median(p["base"] for p in runs),
        "ratio": statistics.median(ratios),
        "ratio_low": min(ratios),
        "ratio_high": max(ratios),
        "pairs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.path", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: proves it runs, measures nothing")
    parser.add_argument("--batches", type=int, help="timed batches per round (default 9,000; smoke 200)")
    parser.add_argument("--rounds", type=int, help="rounds, the best kept (default 5; smoke 1)")
    parser.add_argument("--base", type=Path, help="another checkout to measure against, alternating")
    parser.add_argument("--attribution", action="store_true", help="the prefill attribution on against off")
    parser.add_argument("--resident", type=int, default=0, help="blocks of a fleet held beside the flood (default 0)")
    parser.add_argument("--pairs", type=int, default=6, help="A/B pairs per variant with --base or --attribution")
    parser.add_argument("--one", choices=tuple(VARIANTS), help=argparse.SUPPRESS)  # a side of a pair
    parser.add_argument("--no-attribution", action="store_true", help=argparse.SUPPRESS)  # its base side
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    batches = args.batches or (200 if args.smoke else 9_000)
    rounds = args.rounds or (1 if args.smoke else 5)
    if min(batches, rounds, args.pairs) < 1:
        parser.error("sizes must be at least 1")
    if args.resident < 0:
        parser.error("--resident must be at least 0")
    if args.base is not None and args.attribution:
        parser.error("--base and --attribution are two different pairs: give one")
    if args.one is not None:
        figure = measure(args.one, batches, rounds, not args.no_attribution, args.resident)
        print(json.dumps({"us_per_batch": figure}))
        return 0
    out: dict[str, Any] = {
        "mode": "smoke" if args.smoke else "full",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "code": _commit(),
        "python": sys.version.split()[0],
        "resident": args.resident,
    }
    fleet = ("--resident", str(args.resident)) if args.resident else ()
    sides: dict[str, Side] | None = None
    if args.base is not None:
        out["base"] = str(args.base)
        sides = {"new": (REPO, fleet), "base": (args.base.resolve(), fleet)}
    elif args.attribution:
        out["base"] = "this tree without the prefill attribution"
        sides = {"new": (REPO, fleet), "base": (REPO, ("--no-attribution", *fleet))}
    if sides is None:
        out["us_per_batch"] = {name: measure(name, batches, rounds, resident=args.resident) for name in VARIANTS}
    else:
        out["ab"] = {name: against(sides, name, batches, rounds, args.pairs) for name in VARIANTS}
    _say(f"wrote {write_run(out, args.results_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
