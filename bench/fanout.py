"""Scenarios 2 and 3, fan-out: the highest rate every client still gets every batch in time.

For each configuration (1, 10, 100 and 500 WebSocket clients, 100 SSE clients) the publisher
offers rising rates, each held for a few seconds; a step passes when every connection received
every batch of the step, in order, with p99 publish-to-client latency under 50 ms. The rate
doubles until a rate fails three attempts in a row (the machine may be shared), then the
interval between the last pass and the first failure is bisected. The figure is that highest
passing rate, times the number of clients: deliveries per second. The server's CPU (from
/proc/<pid>/stat, every thread) and RSS are read during the step.

The naive bridge (:mod:`bench.naive_bridge`, scenario 3) goes through the same harness with the
same WebSocket client counts, interleaved with kvgateway's so both see the same machine.
"""

from __future__ import annotations

import math
from typing import Any

from bench import payloads
from bench.common import BenchError, Profiler, median, say
from bench.context import Context
from bench.harness import Fleet, Step, Stream, TargetKind, Transport, start_publisher, start_target


def _settings(ctx: Context) -> dict[str, Any]:
    settings: dict[str, Any] = ctx.pick(
        full={"seconds": 2.5, "ws": (1, 10, 100, 500), "sse": (100,), "start": 40_000, "max": 25_600, "bisect": 1},
        quick={"seconds": 1.5, "ws": (1, 10, 100, 500), "sse": (100,), "start": 40_000, "max": 12_800, "bisect": 1},
        smoke={"seconds": 0.5, "ws": (1, 3), "sse": (2,), "start": 100, "max": 100, "bisect": 0},
    )
    return settings


def _start_rate(settings: dict[str, Any], clients: int) -> float:
    """The first rate offered: ``start`` deliveries/s in all, between 25 and 400 batches/s."""
    return float(min(400, max(25, round(settings["start"] / clients))))


MIN_RATE = 5


ATTEMPTS = 3
"""A rate passes when one of this many attempts passes: the machine may be shared, and a rate
the server sustains once is within its capacity; what fails three times in a row is not."""


def _try(stream: Stream, rate: float, seconds: float, steps: list[Step], logs_name: str) -> Step:
    """One rate, attempted up to ``ATTEMPTS`` times (with a fresh fleet if connections were cut)."""
    for attempt in range(1, ATTEMPTS + 1):
        step = stream.step(rate, seconds)
        step.attempt = attempt
        steps.append(step)
        if step.ok:
            return step
        say(f"  {logs_name}: {rate:g}/s failed ({'; '.join(step.reasons)}), attempt {attempt} of {ATTEMPTS}")
        _recover(stream, step)
    return step


def _recover(stream: Stream, step: Step) -> None:
    stream.settle()
    if step.report.open < step.report.connections:
        fleet = stream.fleet
        say(f"  {step.report.connections - step.report.open} connections were closed: reconnecting the clients")
        url, transport, clients, logs, name = fleet.spec  # type: ignore[attr-defined]
        fleet.stop()
        stream.fleet = _fleet(url, transport, clients, logs, name)


def _fleet(url: str, transport: Transport, clients: int, logs: Any, name: str) -> Fleet:
    fleet = Fleet(url, transport, clients, logs, name)
    fleet.spec = (url, transport, clients, logs, name)  # type: ignore[attr-defined]
    return fleet


def measure(ctx: Context, kind: TargetKind, transport: Transport, clients: int, run: int) -> dict[str, Any]:
    """The rate ladder of one configuration on a fresh publisher, target and fleet."""
    settings = _settings(ctx)
    label = f"{kind}-{transport}{clients}"
    logs = ctx.logs / "fanout" / f"{label}-run{run}"
    spec = payloads.standard(ctx.pick(30_000, 30_000, 2_000))
    publisher = start_publisher(payloads.path_of(spec), logs, "publisher")
    target = None
    stream: Stream | None = None
    try:
        target = start_target(kind, publisher, logs)
        url = target.ws_url if transport == "ws" else target.sse_url
        if url is None:
            raise BenchError(f"{kind} has no {transport} endpoint")
        stream = Stream(publisher, target, _fleet(url, transport, clients, logs, label))
        warm = stream.step(25, 1.0, drain=10)
        if not warm.report.all_complete:
            raise BenchError(f"warm-up: {'; '.join(warm.reasons)}")
        # one profile (it costs the gateway a little): the target configuration, first run
        wanted = ctx.profile and kind == "kvgateway" and transport == "ws" and clients == 100 and run == 0
        profiler = Profiler(target.pid, logs / "py-spy.txt") if wanted else None
        steps: list[Step] = []
        best: Step | None = None
        fail: float | None = None
        rate = _start_rate(settings, clients)
        seconds = settings["seconds"]
        while True:
            step = _try(stream, rate, seconds, steps, label)
            if step.ok:
                best = step
                if fail is not None or rate * 2 > settings["max"]:
                    break
                rate *= 2
            else:
                fail = rate
                if best is not None or rate / 2 < MIN_RATE:
                    break
                rate /= 2
        if best is not None and fail is not None:
            low, high = best.rate, fail
            for _ in range(settings["bisect"]):
                mid = float(round(math.sqrt(low * high)))
                if mid <= low or mid >= high:
                    break
                step = _try(stream, mid, seconds, steps, label)
                if step.ok:
                    best, low = step, mid
                else:
                    high = mid
        profile = profiler.stop() if profiler is not None else None
        result: dict[str, Any] = {
            **({"profile": profile} if profile else {}),
            "label": label,
            "target": kind,
            "transport": transport,
            "clients": clients,
            "max_rate": best.rate if best else 0.0,
            "limited_by_ladder": fail is None,
            "deliveries_per_s": round(best.deliveries_per_s) if best else 0,
            "p50_ms": best.report.hist.summary_ms()["p50_ms"] if best else None,
            "p99_ms": best.report.hist.summary_ms()["p99_ms"] if best else None,
            "target_cpu_cores": round(best.target_cpu, 3) if best else None,
            "deliveries_per_cpu_second": round(best.deliveries_per_s / best.target_cpu)
            if best and best.target_cpu > 0
            else None,
            "client_cpu_cores": round(best.client_cpu, 3) if best else None,
            "target_rss_bytes": best.target_rss if best else None,
            "first_failure_rate": fail,
            "steps": [s.to_json() for s in steps],
        }
        say(
            f"  {label}: max {result['max_rate']:g} batches/s = {result['deliveries_per_s']:,} deliveries/s, "
            f"{kind} CPU {result['target_cpu_cores']} cores"
        )
        return result
    finally:
        if stream is not None:
            stream.fleet.stop()
        if target is not None:
            target.stop()
        publisher.stop()


def _summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over runs of one configuration's figures; the run closest to it is kept in full."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {**runs[-1], "runs": len(runs)}
    mid = median(r["deliveries_per_s"] for r in ok)
    chosen = min(ok, key=lambda r: abs(r["deliveries_per_s"] - (mid or 0)))
    return {
        **chosen,
        "deliveries_per_s": mid,
        "max_rate": median(r["max_rate"] for r in ok),
        "runs": len(ok),
        "all_runs": [{k: r[k] for k in ("max_rate", "deliveries_per_s", "target_cpu_cores", "p99_ms")} for r in ok],
    }


def run(ctx: Context, kinds: tuple[TargetKind, ...]) -> dict[str, dict[str, Any]]:
    """Every configuration for each target kind, interleaved; returns one result per kind."""
    settings = _settings(ctx)
    plan: list[tuple[TargetKind, Transport, int]] = []
    for clients in settings["ws"]:
        for kind in kinds:
            plan.append((kind, "ws", clients))
    if "kvgateway" in kinds:
        for clients in settings["sse"]:
            plan.append(("kvgateway", "sse", clients))
    collected: dict[tuple[TargetKind, Transport, int], list[dict[str, Any]]] = {key: [] for key in plan}
    for run_index in range(ctx.runs):
        for kind, transport, clients in plan:
            say(f"fan-out run {run_index + 1}/{ctx.runs}: {kind} {clients} {transport} clients")
            try:
                result = measure(ctx, kind, transport, clients, run_index)
            except BenchError as exc:
                say(f"  failed: {exc}")
                result = {
                    "label": f"{kind}-{transport}{clients}",
                    "target": kind,
                    "transport": transport,
                    "clients": clients,
                    "error": str(exc),
                }
            collected[(kind, transport, clients)].append(result)
    out: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        configs = [_summarise(runs) for (k, _, _), runs in collected.items() if k == kind]
        out[kind] = {
            "step_seconds": settings["seconds"],
            "latency_bound_ms": 50,
            "payload": _payload_info(ctx),
            "configs": configs,
        }
    return out


def _payload_info(ctx: Context) -> dict[str, Any]:
    spec = payloads.standard(ctx.pick(30_000, 30_000, 2_000))
    data = payloads.load_or_generate(spec)
    return {
        "set": spec.name,
        "batches": data.total_batches,
        "mean_payload_bytes": round(data.mean_payload_bytes()),
        "events_per_batch": round(data.events / data.total_batches, 2),
        "blocks_per_batch": round(sum(data.blocks_stored) / data.total_batches, 1),
    }
