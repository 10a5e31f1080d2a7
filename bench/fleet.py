"""The demo's fleet at a dashboard's pace: ``python -m bench.fleet [--streams 64] [--seconds 55] [--runs N]``.

``kvgateway demo --streams N`` (N simulated engines and the gateway in one process) is read as a
dashboard reads it: ``/``, ``/v1/sources`` and ``/v1/occupancy`` in turn, once a second. Each run
gives every path's slowest and median answer, the worst lag ``/v1/sources`` reported, the share
of batches delivered more than a second after their engine made them, the RSS (its highest, and
its growth after the warm-up), and how long SIGINT took to end the process.

Issue 21's targets (:data:`SLOWEST_TARGETS`, :data:`TARGETS`) hold on a quiet machine: they were tests/integration/
test_demo_fleet.py's bounds, which on a machine loaded 15-30 measured the load (``/`` in 8-11 s),
so the test now asserts what is served and this script measures how fast. The baseline in the
same run is the same demo with one stream, the two alternating: on a shared machine only the
ratios (N streams over one) compare across runs.

``--smoke``: 2 and 1 streams for 3 s, one run (proves it works; tests/bench/test_bench_fleet.py).
Not a scenario of ``python -m bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    BenchError,
    Process,
    code_identity,
    free_port,
    get_json,
    median,
    python_command,
    rss_bytes,
    say,
    wait_until,
    write_run,
)

PATHS = ("/", "/v1/sources", "/v1/occupancy")
LAG_SECONDS = 1.0
"""A batch delivered later than this after its engine made it is late."""
SLOWEST_TARGETS = {"/": 2.0, "/v1/sources": 1.0, "/v1/occupancy": 1.0}
"""Issue 21, each path's slowest answer for 64 streams on a quiet 2-core machine. The page's own
file gets 2 s: Starlette serves it in about six hops to a worker thread and back, each waiting
for the OS to run it."""
TARGETS = {"worst_lag_s": 1.0, "late_share": 0.01, "rss_mb": 400.0, "rss_growth_mb": 120.0, "exit_s": 2.0}
"""Issue 21's other targets, for the same fleet and machine."""


def _lag_buckets(base: str) -> tuple[float, float]:
    """(batches delivered, those delivered within :data:`LAG_SECONDS`), fleet-wide, from /metrics."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=60) as response:
        text = response.read().decode()
    total = within = 0.0
    for line in text.splitlines():
        if not line.startswith("kvgateway_event_lag_seconds_bucket{"):
            continue
        le = re.search(r'le="([^"]+)"', line)
        value = float(line.rsplit(" ", 1)[1])
        if le is not None and le[1] == "+Inf":
            total += value
        elif le is not None and float(le[1]) == LAG_SECONDS:
            within += value
    return total, within


def _timed_get(url: str) -> tuple[float, bytes]:
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as response:
        body = response.read()
    return time.perf_counter() - began, body


def _watch(demo: Process, base: str, seconds: float, warm: float) -> dict[str, Any]:
    """A dashboard's pace for ``seconds``: every path once a second, the RSS after each round."""
    took: dict[str, list[float]] = {path: [] for path in PATHS}
    worst_lag = 0.0
    rss: list[tuple[float, float]] = []
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        for path in PATHS:
            spent, body = _timed_get(base + path)
            took[path].append(spent)
            if path == "/v1/sources":
                lags = (s["lag_seconds"] or 0.0 for s in json.loads(body)["sources"])
                worst_lag = max([worst_lag, *lags])
        demo.check_alive("the demo")
        rss.append((elapsed, rss_bytes(demo.pid) / 2**20))
        time.sleep(1.0)  # a dashboard's pace
    delivered, within = _lag_buckets(base)
    warmed = [mb for at, mb in rss if at >= warm] or [rss[-1][1]]
    return {
        "slowest_s": {path: round(max(times), 4) for path, times in took.items()},
        "median_s": {path: round(median(times) or 0.0, 4) for path, times in took.items()},
        "requests": sum(len(times) for times in took.values()),
        "worst_lag_s": round(worst_lag, 3),
        "delivered": delivered,
        "late_share": round((delivered - within) / delivered, 4) if delivered else None,
        "rss_mb": round(max(mb for _, mb in rss), 1),
        "rss_growth_mb": round(max(warmed) - warmed[0], 1),
    }


def trial(streams: int, seconds: float, warm: float, logs: Path) -> dict[str, Any]:
    """One demo of ``streams`` streams, watched for ``seconds``, then ended with SIGINT."""
    port = free_port()
    command = python_command("kvgateway", "demo", "--host", "127.0.0.1", "--port", str(port), "--streams", str(streams))
    demo = Process(command, logs / f"demo-{streams}.log")
    try:
        base = f"http://127.0.0.1:{port}"

        def serving() -> Any:
            demo.check_alive("the demo")
            return get_json(f"{base}/healthz")

        wait_until(serving, 120, "the demo's /healthz")
        found = _watch(demo, base, seconds, warm)
        demo.popen.send_signal(signal.SIGINT)
        began = time.perf_counter()
        try:
            code = demo.popen.wait(timeout=120)
        except subprocess.TimeoutExpired as exc:
            raise BenchError("the demo still ran 120 s after SIGINT") from exc
        if code != 0:
            raise BenchError(f"the demo exited with code {code} after SIGINT: {demo.tail()}")
        return {"streams": streams, **found, "exit_s": round(time.perf_counter() - began, 3)}
    finally:
        demo.stop()


def _ratios(big: dict[str, Any], one: dict[str, Any]) -> dict[str, float | None]:
    """N streams over one, from the same run: each path's slowest and median answer, the exit."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else round(a / b, 2)

    out = {f"slowest {path}": ratio(big["slowest_s"][path], one["slowest_s"][path]) for path in PATHS}
    out |= {f"median {path}": ratio(big["median_s"][path], one["median_s"][path]) for path in PATHS}
    out["exit"] = ratio(big["exit_s"], one["exit_s"])
    return out


def _met(run: dict[str, Any]) -> bool:
    """Whether one run of the fleet met every target of :data:`TARGETS`."""
    slowest = all(run["slowest_s"][path] < limit for path, limit in SLOWEST_TARGETS.items())
    return slowest and all((run[key] or 0.0) < limit for key, limit in TARGETS.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="2 streams for 3 s, one run: proves it works")
    parser.add_argument("--streams", type=int, help="the fleet's streams (default 64; smoke 2)")
    parser.add_argument("--seconds", type=float, help="how long each demo is watched (default 55; smoke 3)")
    parser.add_argument("--runs", type=int, help="runs of each size (default 2; smoke 1)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR / "fleet")
    args = parser.parse_args(argv)
    streams = args.streams or (2 if args.smoke else 64)
    seconds = args.seconds or (3.0 if args.smoke else 55.0)
    warm = min(25.0, seconds / 2)  # by then the smallest caches are full and the ring has its size
    runs = args.runs or (1 if args.smoke else 2)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    sizes = {"fleet": streams, "one": 1}
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sizes}
    for run in range(runs):
        for side in list(sizes) if run % 2 == 0 else list(reversed(sizes)):
            result = trial(sizes[side], seconds, warm, args.results_dir / "logs" / str(run))
            say(f"{side} run {run + 1}: {result}")
            results[side].append(result)
    ratios = [_ratios(big, one) for big, one in zip(results["fleet"], results["one"], strict=True)]
    out = {
        "mode": "smoke" if args.smoke else "full",
        "started": started,
        "code": code_identity(),
        "streams": streams,
        "seconds": seconds,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "targets": {"slowest_s": SLOWEST_TARGETS, **TARGETS},
        "met": [_met(run) for run in results["fleet"]],
        "ratios": {key: median(r[key] for r in ratios) for key in ratios[0]},
        "runs": results,
    }
    say(f"wrote {write_run(out, args.results_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
