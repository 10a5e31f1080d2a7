"""``python -m bench``: run the benchmark scenarios, write JSON results and docs/performance.md.

    python -m bench                      # the full run (well under 30 minutes), updates the docs
    python -m bench --quick              # a couple of minutes, docs untouched
    python -m bench --scenario ingest --scenario catchup --runs 5

Scenarios: ingest (1), fanout (2), naive (3, the naive bridge through fanout's harness), latency (4),
memory (5), catchup (6), streams (7). ``fanout`` and ``naive`` run interleaved when both are chosen.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import RESULTS_SCHEMA, catchup, fanout, ingest, latency, memory, report, streams
from bench.common import (
    NAIVE_LOOP_ENV,
    REPO,
    RESULTS_DIR,
    SOURCE_ENV,
    BenchError,
    Mode,
    code_identity,
    gateway_loop,
    machine_cpu,
    machine_info,
    naive_loop,
    say,
)
from bench.context import Context

SCENARIOS = ("ingest", "fanout", "naive", "latency", "memory", "catchup", "streams")
DOC = REPO / "docs" / "performance.md"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description="kvgateway's benchmark suite.")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a short run (minutes); does not touch the docs")
    size.add_argument("--smoke", action="store_true", help="a tiny run (seconds per scenario): proves it works")
    parser.add_argument(
        "--scenario", action="append", choices=SCENARIOS, metavar="NAME", help=f"one of {', '.join(SCENARIOS)}"
    )
    parser.add_argument("--runs", type=int, help="repetitions per measurement (default: full 3, quick 2, smoke 1)")
    parser.add_argument(
        "--fanout-runs",
        type=int,
        help="repetitions of each fan-out rate ladder (default: --runs if given, else 2 in a full run, 1 otherwise)",
    )
    parser.add_argument(
        "--churn-seconds", type=float, help="memory scenario's churn run (default: full 600, quick 30, smoke 3)"
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where JSON results go")
    docs = parser.add_mutually_exclusive_group()
    docs.add_argument("--docs", type=Path, help="write the results section into this Markdown file")
    docs.add_argument("--no-docs", action="store_true", help="do not write docs/performance.md (full runs do)")
    parser.add_argument("--profile", action="store_true", help="py-spy the gateway in ingest and fan-out")
    parser.add_argument(
        "--naive-loop",
        choices=("asyncio", "uvloop"),
        help="run the naive bridge on this loop (default: the gateway's own, uvloop when installed; same loop, "
        "fair comparison)",
    )
    parser.add_argument(
        "--render-docs",
        action="store_true",
        help="only rewrite docs/performance.md's Results section from the results dir's latest.json",
    )
    parser.add_argument(
        "--gateway-source",
        type=Path,
        metavar="DIR",
        help="run the gateway from the kvgateway package in DIR (a patched copy), not this checkout's",
    )
    args = parser.parse_args(argv)
    for name in ("runs", "fanout_runs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.churn_seconds is not None and args.churn_seconds <= 0:
        parser.error("--churn-seconds must be positive")
    return args


def _meta(
    mode: Mode, runs: int, started: float, cpu0: tuple[int, int], load0: list[float], *, code: dict[str, Any]
) -> dict[str, Any]:
    busy1, total1 = machine_cpu()
    busy = (busy1 - cpu0[0]) / max(1, total1 - cpu0[1])
    return {
        "mode": mode,
        "runs": runs,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "finished": time.strftime("%Y-%m-%d %H:%M", time.localtime()),
        "seconds": round(time.time() - started, 1),
        "load_average_start": load0,
        "load_average_end": list(os.getloadavg()),
        "machine_busy_fraction": round(busy, 3),
        "code": code,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render_docs:
        latest = json.loads((args.results_dir / "latest.json").read_text(encoding="utf-8"))
        target = args.docs or DOC
        report.update_doc(target, report.render(latest))
        say(f"wrote the results section of {target} from {args.results_dir / 'latest.json'}")
        return 0
    if args.naive_loop:
        os.environ[NAIVE_LOOP_ENV] = args.naive_loop
    if args.gateway_source is not None:
        if not (args.gateway_source / "kvgateway" / "__init__.py").is_file():
            raise SystemExit(f"--gateway-source: no kvgateway package in {args.gateway_source}")
        os.environ[SOURCE_ENV] = str(args.gateway_source.resolve())
    mode: Mode = "quick" if args.quick else "smoke" if args.smoke else "full"
    runs = args.runs or {"full": 3, "quick": 2, "smoke": 1}[mode]
    # The ladders are the long part: two in a full run (about 10 minutes), one otherwise.
    fanout_runs = args.fanout_runs or args.runs or (2 if mode == "full" else 1)
    churn = args.churn_seconds or {"full": 600.0, "quick": 30.0, "smoke": 3.0}[mode]
    chosen = [name for name in SCENARIOS if name in (args.scenario or SCENARIOS)]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = args.results_dir / "runs" / f"{stamp}-{mode}"
    results: dict[str, Any] = {
        "schema": RESULTS_SCHEMA,
        "mode": mode,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "options": {
            "runs": runs,
            "fanout_runs": fanout_runs,
            "churn_seconds": churn,
            "scenarios": chosen,
            "gateway_source": os.environ.get(SOURCE_ENV),
            "gateway_loop": gateway_loop(),
            "naive_loop": naive_loop(),
        },
        "machine": machine_info(),
        "scenarios": {},
    }
    say(f"{mode} run of {', '.join(chosen)} ({runs} runs each); results in {run_dir}")
    ctx = Context(mode=mode, runs=runs, logs=run_dir / "logs", churn_seconds=churn, profile=args.profile)

    def record(names: tuple[str, ...], job: Callable[[Context], dict[str, Any]], job_ctx: Context) -> None:
        started, cpu0, load0, code = time.time(), machine_cpu(), list(os.getloadavg()), code_identity()
        try:
            produced = job(job_ctx)
            if code_identity() != code:
                code = {**code, "changed_during_scenario": True}
            meta = _meta(mode, job_ctx.runs, started, cpu0, load0, code=code)
            for name in names:
                results["scenarios"][name] = {"result": produced[name], "meta": meta}
        except BenchError as exc:
            say(f"{'/'.join(names)} failed: {exc}")
            meta = _meta(mode, job_ctx.runs, started, cpu0, load0, code=code)
            for name in names:
                results["scenarios"][name] = {"error": str(exc), "meta": meta}
        _write_json(run_dir / "results.json", results)

    if "ingest" in chosen:
        record(("ingest",), lambda c: {"ingest": ingest.run(c)}, ctx)
    kinds = tuple(kind for kind, name in (("kvgateway", "fanout"), ("naive", "naive")) if name in chosen)
    if kinds:
        fan_ctx = Context(mode=mode, runs=fanout_runs, logs=ctx.logs, churn_seconds=churn, profile=args.profile)
        names = tuple(name for kind, name in (("kvgateway", "fanout"), ("naive", "naive")) if kind in kinds)

        def fan(c: Context) -> dict[str, Any]:
            produced = fanout.run(c, kinds)  # type: ignore[arg-type]
            return {"fanout" if kind == "kvgateway" else "naive": value for kind, value in produced.items()}

        record(names, fan, fan_ctx)
    if "latency" in chosen:
        record(("latency",), lambda c: {"latency": latency.run(c)}, ctx)
    if "memory" in chosen:
        record(("memory",), lambda c: {"memory": memory.run(c)}, ctx)
    if "catchup" in chosen:
        record(("catchup",), lambda c: {"catchup": catchup.run(c)}, ctx)
    if "streams" in chosen:
        record(("streams",), lambda c: {"streams": streams.run(c)}, ctx)

    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    _write_json(run_dir / "results.json", results)
    shown = results
    if mode == "full":
        shown = _merge_latest(args.results_dir / "latest.json", results)
    if args.docs is not None or (mode == "full" and not args.no_docs):
        target = args.docs or DOC
        report.update_doc(target, report.render(shown))
        say(f"wrote the results section of {target}")
    sys.stdout.write(report.render(results) + "\n")
    failed = [name for name, entry in results["scenarios"].items() if "error" in entry]
    say(f"done: {run_dir / 'results.json'}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def _merge_latest(path: Path, results: dict[str, Any]) -> dict[str, Any]:
    """latest.json keeps the newest full-run result of every scenario (a partial run replaces only its own)."""
    merged: dict[str, Any] = {"schema": RESULTS_SCHEMA, "scenarios": {}}
    if path.exists():
        try:
            previous = json.loads(path.read_text(encoding="utf-8"))
            if previous.get("schema") == RESULTS_SCHEMA:
                merged = previous
        except ValueError:
            pass
    merged["machine"] = results["machine"]
    for name, entry in results["scenarios"].items():
        merged["scenarios"][name] = entry
    _write_json(path, merged)
    return merged


if __name__ == "__main__":
    raise SystemExit(main())
