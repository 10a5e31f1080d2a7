"""Two checkouts' gateways against each other, trials alternating in one session:
``python -m bench.ab --base DIR [--new DIR] [--figure NAME ...] [--pairs N] [--smoke]``.

The three figures a refactor must not worsen, each measured with the scenario's own trial:

- ``ingest``: scenario 1's gateway trial (map payloads, one WebSocket client receiving every
  batch, quick size: 15,000 batches flat out): gateway CPU microseconds per batch;
- ``fanout``: 100 WebSocket clients, one step of ``--fanout-seconds`` at ``--fanout-rate``
  batches/s (every client must get every batch): deliveries per CPU-second of the gateway;
- ``flood``: the same 100 clients, ``--flood-batches`` queued while the gateway is stopped and
  then sent flat out: deliveries per CPU-second (steadier on a loaded machine than ``fanout``);
- ``latency``: scenario 4's trial (1,000 batches/s to 10 WebSocket clients, 5 s): p99 in ms;
- ``ceiling``: scenario 1's rate flat out over a raw SUB loop's, measured back to back (a ratio
  per side, so the A/B figure is a ratio of same-moment ratios);
- ``catchup``: scenario 6's replay phase (10,000 batches to an exact index) over a raw DEALER's
  fetch of the same replay, back to back; ``catchup_cpu``: its replay phase in the gateway's CPU
  seconds (wall time on a loaded machine is mostly other processes' turns).

Each pair runs the two gateways back to back (``python -m kvgateway`` with each checkout as its
working directory, as ``python -m bench --gateway-source`` does), the order reversed every other
pair, so a machine that slows down or speeds up during the session weighs on both alike. The
figure is the median of the pairs' ratios new / base (for p99 and CPU per batch below 1 is
better, for deliveries per CPU-second above 1), with the lowest and highest pair beside it. Prints
one JSON object, with the load average before and after each figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import catchup, ingest, latency, payloads
from bench.common import REPO, SOURCE_ENV, BenchError, CpuMeter, Mode, Worker, median, pause, resume, say, wait_until
from bench.context import Context
from bench.harness import Fleet, Stream, Target, fanout_step, start_publisher, start_target

FANOUT_CLIENTS = 100

Trial = Callable[[Context, str, int, argparse.Namespace], float]


def _ingest(ctx: Context, side: str, run: int, args: argparse.Namespace) -> float:
    return float(ingest.gateway_trial(ctx, run, "map")["cpu_us_per_batch"])


@contextlib.contextmanager
def _served(ctx: Context, figure: str, run: int, extra: Sequence[str] = ()) -> Iterator[tuple[Worker, Target, Path]]:
    """A publisher of the standard payloads and the gateway under test on it (stopped after)."""
    logs = ctx.logs / figure / f"run{run}"
    spec = payloads.standard(ctx.pick(30_000, 30_000, 2_000))
    publisher = start_publisher(payloads.path_of(spec), logs, "publisher")
    try:
        target = start_target("kvgateway", publisher, logs, extra)
        try:
            yield publisher, target, logs
        finally:
            target.stop()
    finally:
        publisher.stop()


def _clients(ctx: Context) -> int:
    return FANOUT_CLIENTS if ctx.mode != "smoke" else 3


def _fanout(ctx: Context, side: str, run: int, args: argparse.Namespace) -> float:
    rate = args.fanout_rate if ctx.mode != "smoke" else 50.0
    with _served(ctx, "fanout", run) as (publisher, target, logs):
        step = fanout_step(publisher, target, logs, clients=_clients(ctx), rate=rate, seconds=args.fanout_seconds)
    if not step["complete"] or not step["deliveries_per_cpu_second"]:
        raise BenchError(f"fan-out at {rate:g}/s: {'; '.join(step['reasons'])}")
    return float(step["deliveries_per_cpu_second"])


def _flood(ctx: Context, side: str, run: int, args: argparse.Namespace) -> float:
    """Fan-out flat out: ``--flood-batches`` batches queued while the gateway is stopped (SIGSTOP),
    then sent to 100 WebSocket clients as fast as it can; deliveries per CPU-second from SIGCONT
    until every client has every batch. Less at the mercy of the scheduler than a fixed rate,
    whose cost per delivery depends on how many messages each wake-up finds queued."""
    clients = _clients(ctx)
    count = args.flood_batches if ctx.mode != "smoke" else 100
    queue = ("--client-queue-bytes", str(ingest.CLIENT_QUEUE))  # the clients fall behind: not cut
    with _served(ctx, "flood", run, queue) as (publisher, target, logs):
        fleet = Fleet(target.ws_url, "ws", clients, logs, f"flood-ws{clients}")
        try:
            stream = Stream(publisher, target, fleet)
            stream.warm()
            first = stream.next_seq
            fleet.window(first, first + count - 1)
            pause(target.process)
            publisher.request({"cmd": "send", "count": count, "rate": 0}, timeout=120)
            time.sleep(0.3)  # the batches on their way into the stopped gateway's socket
            cpu = CpuMeter(target.pid)
            cpu.start()
            resume(target.process)
            wait_until(lambda: fleet.report().all_complete, 120, "every client to get the flood")
            cpu.stop()
        finally:
            fleet.stop()
    return count * clients / cpu.seconds


def _latency(ctx: Context, side: str, run: int, args: argparse.Namespace) -> float:
    return float(latency.trial(ctx, "kvgateway", run)["p99_ms"])


def _ceiling(ctx: Context, side: str, run: int, args: argparse.Namespace) -> float:
    """Scenario 1's ceiling: the gateway's rate flat out over a raw SUB loop's, the two trials
    back to back for this side (the raw loop is the same on both sides: it is the yardstick)."""
    raw = ingest.raw_trial(ctx, run)
    gateway = ingest.gateway_trial(ctx, run, "map")
    ratio = float(gateway["rate"] / raw["rate"])
    say(f"  {side}: ceiling {gateway['rate']:,.0f} / raw {raw['rate']:,.0f} batches/s = {ratio:.4f}")
    return ratio


def _catchup(ctx: Context, side: str, run: int, args: argparse.Namespace) -> float:
    """Scenario 6: 10,000 batches replayed to an exact index, the replay phase (the engine's
    request to the rebuilt index) over a raw DEALER's fetch of the same replay, back to back."""
    raw = catchup.raw_trial(ctx, run)
    gateway = catchup.gateway_trial(ctx, run)
    ratio = float(gateway["replay_phase_seconds"] / raw["fetch_seconds"])
    say(
        f"  {side}: catch-up replay phase {gateway['replay_phase_seconds']:.3f} s (total "
        f"{gateway['total_seconds']:.3f} s, {gateway['replay_cpu_seconds']:.3f} CPU s) / raw fetch "
        f"{raw['fetch_seconds']:.3f} s = {ratio:.2f}"
    )
    return ratio


def _catchup_cpu(ctx: Context, side: str, run: int, args: argparse.Namespace) -> float:
    """Scenario 6's replay phase in the gateway's CPU seconds (10,000 batches to an exact index)."""
    return float(catchup.gateway_trial(ctx, run)["replay_cpu_seconds"])


FIGURES: dict[str, tuple[Trial, str]] = {
    "ingest": (_ingest, "gateway CPU us per batch, one WS client (lower is better)"),
    "fanout": (_fanout, "deliveries per CPU-second, 100 WS clients (higher is better)"),
    "flood": (_flood, "deliveries per CPU-second, 100 WS clients, flat out (higher is better)"),
    "latency": (_latency, "p99 ms at 1,000 batches/s, 10 WS clients (lower is better)"),
    "ceiling": (_ceiling, "ingest rate flat out over a raw SUB loop's, one WS client (higher is better)"),
    "catchup": (_catchup, "10,000-batch catch-up's replay phase over a raw DEALER's fetch (lower is better)"),
    "catchup_cpu": (_catchup_cpu, "10,000-batch catch-up's replay phase in gateway CPU seconds (lower is better)"),
}


DEFAULT_FIGURES = ("ingest", "fanout", "latency")
"""The three figures of docs/performance.md; ``flood`` on request."""


def _commit(tree: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True, check=False)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "kvgateway"], cwd=tree, capture_output=True, text=True, check=False
    )
    return out.stdout.strip() + (" + local changes" if dirty.stdout.strip() else "")


def _attempt(trial: Trial, ctx: Context, side: str, run: int, args: argparse.Namespace) -> float:
    """One trial; a second attempt if the first failed (the machine is shared: a neighbour's burst
    can starve a step), so one bad moment does not lose the session."""
    try:
        return trial(ctx, side, run, args)
    except BenchError as exc:
        say(f"  {side}: {exc}; once more")
        return trial(replace(ctx, logs=ctx.logs / "again"), side, run, args)


def _figure(name: str, ctx: Context, trees: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    trial, meaning = FIGURES[name]
    load_before = os.getloadavg()
    pairs = []
    for run in range(args.pairs):
        order = ("new", "base") if run % 2 == 0 else ("base", "new")
        values: dict[str, float] = {}
        for side in order:
            os.environ[SOURCE_ENV] = str(trees[side])
            values[side] = _attempt(trial, replace(ctx, logs=ctx.logs / side / str(run)), side, run, args)
        pair = {**values, "ratio": round(values["new"] / values["base"], 4), "load": os.getloadavg()[0]}
        say(f"{name} pair {run + 1}/{args.pairs} ({'/'.join(order)}): {pair}")
        pairs.append(pair)
    ratios = [p["ratio"] for p in pairs]
    return {
        "meaning": meaning,
        "new": median(p["new"] for p in pairs),
        "base": median(p["base"] for p in pairs),
        "ratio": median(ratios),
        "ratio_low": min(ratios),
        "ratio_high": max(ratios),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "pairs": pairs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the checkout to measure against")
    parser.add_argument("--new", type=Path, default=REPO, help="the checkout measured (default: this one)")
    parser.add_argument("--figure", action="append", choices=tuple(FIGURES), help="default: ingest, fanout and latency")
    parser.add_argument("--pairs", type=int, default=3, help="A/B pairs per figure")
    parser.add_argument("--fanout-rate", type=float, default=400.0, help="batches/s of the fan-out step")
    parser.add_argument("--fanout-seconds", type=float, default=4.0, help="length of the fan-out step")
    parser.add_argument("--flood-batches", type=int, default=2000, help="batches of the flat-out fan-out")
    parser.add_argument(
        "--gateway-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a KVGATEWAY_* setting for both gateways (KVGATEWAY_MAX_LEARNED_BLOCKS=0: the learner off)",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here, after every figure")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: proves it runs, measures nothing")
    args = parser.parse_args(argv)
    for setting in args.gateway_env:
        name, sep, value = setting.partition("=")
        if not sep or not name.startswith("KVGATEWAY_"):
            parser.error(f"--gateway-env: expected KVGATEWAY_NAME=VALUE, got {setting!r}")
        os.environ[name] = value
    trees = {"new": args.new.resolve(), "base": args.base.resolve()}
    for side, tree in trees.items():
        if not (tree / "kvgateway" / "__init__.py").is_file():
            parser.error(f"--{side}: no kvgateway package in {tree}")
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    mode: Mode = "smoke" if args.smoke else "quick"
    logs = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    ctx = Context(mode=mode, runs=1, logs=logs, churn_seconds=0.0)
    out: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "new": {"tree": str(trees["new"]), "commit": _commit(trees["new"])},
        "base": {"tree": str(trees["base"]), "commit": _commit(trees["base"])},
        "logs": str(logs),
        "gateway_env": args.gateway_env,
        "figures": {},
    }
    for name in args.figure or DEFAULT_FIGURES:
        out["figures"][name] = _figure(name, ctx, trees, args)
        if args.out is not None:
            args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
