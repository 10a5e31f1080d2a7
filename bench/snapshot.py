"""A block snapshot served by the real web stack while live clients listen:
``python -m bench.snapshot [--smoke]``.

The gateway's own code (OneProcess, app, uvicorn with uvloop when installed) runs in this process with
``--streams`` configured engines (8) holding ``--blocks`` resident blocks (1,000,000) as chains of
64 blocks of 16 tokens, with learning on (the default cap). No engine process: the batches go
through the gateway's ordered log directly, as ingest would append them, on the same event loop.
A feeder appends live batches at ``--rate`` (500/s, each one BlockStored and one BlockRemoved).

A second process runs ``--live`` WebSocket clients (20) that measure each batch's latency (arrival
minus the batch's ``ts``); after a baseline window a third process connects with
``snapshot=blocks`` and reads the whole state, then its first live message.

Figures: the snapshot's time to the last ``state`` message, its blocks and bytes; the live
clients' p50/p99/max latency during the snapshot against the baseline window before it (a ratio
in the same run); and the snapshot client's first live offset (the hello's + 1: nothing lost).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import uvicorn

from bench.common import write_run
from kvgateway.config.settings import Settings, SourceConfig
from kvgateway.engine.wire import Batch, BlockRemoved, BlockStored
from kvgateway.gateway import OneProcess
from kvgateway.log.records import batch_record
from kvgateway.serve.app import create_app
from kvgateway.serve.server import loop_factory, uvicorn_config

REPO: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = REPO / "bench" / "results" / "snapshot"
CHAIN: Final = 64
BLOCK: Final = 16


def _say(text: str) -> None:
    print(f"bench.snapshot: {text}", file=sys.stderr, flush=True)


def _fill(gateway: OneProcess, streams: int, blocks: int, rng: random.Random) -> None:
    """``blocks`` resident blocks over the streams, one chain of 64 per BlockStored."""
    chains = max(1, blocks // CHAIN)
    for n in range(chains):
        key = (f"e{n % streams}", 0)
        hashes = [rng.getrandbits(63) for _ in range(CHAIN)]
        tokens = [rng.randrange(32000) for _ in range(CHAIN * BLOCK)]
        event = BlockStored(hashes, None, tokens, BLOCK, None, None, None, {})
        gateway.log.append(batch_record(key, n, Batch(time.time(), [event], 0), received=0.0, replayed=True))


async def _feed(gateway: OneProcess, streams: int, rate: float, rng: random.Random) -> None:
    """Live batches at ``rate``/s: one new block stored and one removed, on a random stream."""
    seq = 10**9
    interval = 1.0 / rate
    last: dict[int, int] = {}
    next_at = time.monotonic()
    while True:
        stream = rng.randrange(streams)
        block = rng.getrandbits(63)
        events: list[Any] = [BlockStored([block], None, [1] * BLOCK, BLOCK, None, None, None, {})]
        if stream in last:
            events.append(BlockRemoved([last[stream]], None, {}))
        last[stream] = block
        seq += 1
        now = time.time()
        gateway.log.append(batch_record((f"e{stream}", 0), seq, Batch(now, events, 0), received=now, replayed=False))
        next_at += interval
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


class _Pauses:
    """The longest garbage-collector pause per generation, and the event loop's longest lag (a
    5 ms timer's overshoot), while the clients run: where a live message's wait comes from."""

    def __init__(self) -> None:
        self.gc_ms: dict[int, float] = {}
        self.lag_ms = 0.0
        self._gc_started = 0.0

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            took = (time.perf_counter() - self._gc_started) * 1e3
            generation = info["generation"]
            self.gc_ms[generation] = max(self.gc_ms.get(generation, 0.0), took)

    async def watch_loop(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(0.005)
            self.lag_ms = max(self.lag_ms, (time.perf_counter() - asked - 0.005) * 1e3)

    def report(self) -> dict[str, Any]:
        return {
            "loop_lag_max_ms": round(self.lag_ms, 1),
            "gc_pause_max_ms": {f"gen{g}": round(ms, 1) for g, ms in sorted(self.gc_ms.items())},
        }


async def _serve(args: argparse.Namespace) -> dict[str, Any]:
    sources = tuple(SourceConfig(name=f"e{i}", endpoint=f"tcp://127.0.0.1:{9 + i}") for i in range(args.streams))
    settings = Settings(sources=sources, port=0, client_queue_bytes=1 << 20, log_level="warning")
    gateway = OneProcess(settings)
    rng = random.Random(1)
    started = time.perf_counter()
    _fill(gateway, args.streams, args.blocks, rng)
    fill_seconds = time.perf_counter() - started
    gc.collect()  # the fill's garbage, collected before the clients come (not in their baseline)
    _say(f"{args.blocks} blocks in {fill_seconds:.1f} s; serving")
    config = uvicorn_config(create_app(gateway, gateway.serving), settings)
    config.port = 0
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no start event
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    feeder = asyncio.create_task(_feed(gateway, args.streams, args.rate, rng))
    pauses = _Pauses()
    gc.callbacks.append(pauses.on_gc)
    watcher = asyncio.create_task(pauses.watch_loop())
    command = [sys.executable, "-m", "bench.snapshot", "--client", f"ws://127.0.0.1:{port}/v1/ws"]
    command += ["--live", str(args.live), "--baseline", str(args.baseline), "--streams", str(args.streams)]
    proc = await asyncio.create_subprocess_exec(*command, stdout=subprocess.PIPE, cwd=REPO)
    out, _ = await proc.communicate()
    gc.callbacks.remove(pauses.on_gc)
    watcher.cancel()
    feeder.cancel()
    server.should_exit = True
    await serving
    result: dict[str, Any] = json.loads(out)
    result["server"] = pauses.report()  # over the whole run, baseline included
    result["fill_seconds"] = round(fill_seconds, 2)
    result["resident_blocks"] = sum(len(b) for s in gateway.serving.index.streams() for *_, b, _ in s.block_groups())
    result["learned_blocks"] = len(gateway.serving.routers.learner)
    return result


# --- the clients' process -------------------------------------------------------------------


def _pcts(samples: list[float]) -> dict[str, float | int]:
    if not samples:
        return {"count": 0}
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"count": len(ordered), "p50_ms": pick(0.5) * 1e3, "p99_ms": pick(0.99) * 1e3, "max_ms": ordered[-1] * 1e3}


async def _live(url: str, samples: list[tuple[float, float]], ready: asyncio.Event, stop: asyncio.Event) -> None:
    from websockets.asyncio.client import connect

    async with connect(url, max_size=None) as ws:
        await ws.recv()  # hello
        ready.set()
        while not stop.is_set():
            frame = await ws.recv()
            now = time.time()
            for line in str(frame).split("\n"):
                message = json.loads(line)
                if message.get("type") == "batch":
                    samples.append((now, now - message["ts"]))


async def _snapshot(url: str, streams: int) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    began = time.time()
    blocks = size = lasts = 0
    async with connect(url + "?snapshot=blocks", max_size=None) as ws:
        hello = json.loads(await ws.recv())
        first_live: int | None = None
        while first_live is None:
            frame = str(await ws.recv())
            size += len(frame)
            for line in frame.split("\n"):
                message = json.loads(line)
                if message["type"] == "state":
                    blocks += len(message["blocks"])
                    lasts += message["last"]
                    if lasts == streams:
                        ended = time.time()
                elif first_live is None:
                    first_live = message["offset"]
    return {
        "began": began,
        "ended": ended,
        "seconds": round(ended - began, 3),
        "blocks": blocks,
        "mb": round(size / 1e6, 1),
        "hello_offset": hello["offset"],
        "first_live_offset": first_live,
    }


async def _clients(args: argparse.Namespace) -> dict[str, Any]:
    samples: list[tuple[float, float]] = []
    stop = asyncio.Event()
    readies = [asyncio.Event() for _ in range(args.live)]
    tasks = [asyncio.create_task(_live(args.client, samples, ready, stop)) for ready in readies]
    for ready in readies:
        await ready.wait()
    await asyncio.sleep(args.baseline)
    # Its own process: parsing 98 MB of state here would delay the live clients' timestamps.
    command = [sys.executable, "-m", "bench.snapshot", "--snapshot-client", args.client, "--streams", str(args.streams)]
    proc = await asyncio.create_subprocess_exec(*command, stdout=subprocess.PIPE, cwd=REPO)
    out, _ = await proc.communicate()
    snap = json.loads(out)
    await asyncio.sleep(1.0)
    stop.set()
    for task in tasks:
        task.cancel()
    before = [lat for at, lat in samples if snap["began"] - args.baseline <= at < snap["began"]]
    during = [lat for at, lat in samples if snap["began"] <= at <= snap["ended"]]
    out = {"snapshot": snap, "live_clients": args.live, "baseline": _pcts(before), "during": _pcts(during)}
    if before and during:
        out["p99_ratio_during_vs_baseline"] = round(out["during"]["p99_ms"] / out["baseline"]["p99_ms"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.snapshot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: proves it works, means nothing")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--blocks", type=int, help="resident blocks in all (default 1,000,000; smoke 8,192)")
    parser.add_argument("--rate", type=float, default=500.0, help="live batches/s during the run")
    parser.add_argument("--live", type=int, default=20, help="live WebSocket clients")
    parser.add_argument("--baseline", type=float, default=3.0, help="seconds of baseline before the snapshot")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--client", help=argparse.SUPPRESS)  # the live clients' process
    parser.add_argument("--snapshot-client", help=argparse.SUPPRESS)  # the snapshot client's process
    args = parser.parse_args(argv)
    if args.snapshot_client:
        sys.stdout.write(json.dumps(asyncio.run(_snapshot(args.snapshot_client, args.streams))) + "\n")
        return 0
    if args.client:
        sys.stdout.write(json.dumps(asyncio.run(_clients(args))) + "\n")
        return 0
    args.blocks = args.blocks or (8192 if args.smoke else 1_000_000)
    if args.smoke:
        args.live, args.baseline = 3, 1.0
    factory = loop_factory()
    runner = asyncio.Runner(loop_factory=factory) if factory else asyncio.Runner()
    with runner:
        result = runner.run(_serve(args))
    out = {"mode": "smoke" if args.smoke else "full", "started": time.strftime("%Y-%m-%d %H:%M:%S"), **result}
    out["workload"] = {"streams": args.streams, "blocks": args.blocks, "rate": args.rate, "live": args.live}
    _say(f"wrote {write_run(out, args.results_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
