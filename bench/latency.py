"""Scenario 4, latency at a steady 1,000 batches/s with 10 WebSocket clients: p50, p99, p99.9.

Latency is publish-to-client, ``ts`` being the publisher's ``time.time()`` at send (same
machine, same clock), measured twice by the clients (bench/clients.py):

- **delivered** (the figures, ``p50_ms`` ...): the kernel's receive time of the client's read
  that brought the batch minus ``ts``: the publisher's and both sides' ZeroMQ queues, the server,
  its write and the loopback, up to the moment the batch is in the client's socket;
- **read** (``read_p50_ms`` ...): the client's ``time.time()`` when it read the batch minus
  ``ts``: the same plus the client process's own turn, which on a 2-core machine waits for a core
  and for its nine other connections' copies of the batch (0.2 to 0.5 ms), not the server's.

The naive bridge serves as the baseline under the same load and the same clients, in
alternation; each run's percentiles are over every delivery of the run, and the figures are
medians over runs.
"""

from __future__ import annotations

from typing import Any

from bench import payloads
from bench.common import BenchError, LogHistogram, median, say
from bench.context import Context
from bench.harness import Fleet, Stream, TargetKind, start_publisher, start_target

RATE = 1000.0
CLIENTS = 10


def trial(ctx: Context, kind: TargetKind, run: int) -> dict[str, Any]:
    seconds = float(ctx.pick(15, 5, 1))
    rate = float(ctx.pick(RATE, RATE, 200))
    logs = ctx.logs / "latency" / f"{kind}-run{run}"
    spec = payloads.standard(ctx.pick(30_000, 30_000, 2_000))
    publisher = start_publisher(payloads.path_of(spec), logs, "publisher")
    target = fleet = None
    try:
        target = start_target(kind, publisher, logs)
        fleet = Fleet(target.ws_url, "ws", CLIENTS, logs, f"{kind}-latency")
        stream = Stream(publisher, target, fleet)
        stream.step(50, 1.0, drain=10)  # warm-up: connections, caches, the first allocations
        step = stream.step(rate, seconds, drain=10)
        if not step.report.all_complete:
            raise BenchError(f"{kind}: not every client got every batch: {'; '.join(step.reasons)}")
        read = {f"read_{key}": value for key, value in read_histogram(fleet).summary_ms().items()}
        return {
            "rate": rate,
            "achieved_rate": round(step.achieved_rate, 1),
            "clients": CLIENTS,
            "seconds": seconds,
            "target_cpu_cores": round(step.target_cpu, 3),
            "client_cpu_cores": round(step.client_cpu, 3),
            **step.report.hist.summary_ms(),
            **read,
        }
    finally:
        if fleet is not None:
            fleet.stop()
        if target is not None:
            target.stop()
        publisher.stop()


def read_histogram(fleet: Fleet) -> LogHistogram:
    """The clients' read latencies of the window (the harness's report merges the delivered ones)."""
    hist = LogHistogram()
    for worker in fleet.workers:
        worker.send({"cmd": "report"})
    for worker in fleet.workers:
        hist.merge(LogHistogram.from_json(worker.reply(timeout=30)["hist_read"]))
    return hist


def run(ctx: Context) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"kvgateway": [], "naive": []}
    for run_index in range(ctx.runs):
        kinds: tuple[TargetKind, ...] = ("kvgateway", "naive")
        for kind in kinds:
            say(f"latency run {run_index + 1}/{ctx.runs}: {kind}")
            result = trial(ctx, kind, run_index)
            say(
                f"  delivered p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, p99.9 {result['p999_ms']} ms;"
                f" read p50 {result['read_p50_ms']}, p99 {result['read_p99_ms']}, p99.9 {result['read_p999_ms']} ms"
            )
            runs[kind].append(result)

    def figures(kind: str) -> dict[str, Any]:
        items = runs[kind]
        return {
            key: median(r[key] for r in items)
            for key in (
                *("p50_ms", "p99_ms", "p999_ms", "max_ms"),
                *("read_p50_ms", "read_p99_ms", "read_p999_ms", "read_max_ms"),
                *("target_cpu_cores", "client_cpu_cores", "achieved_rate"),
            )
        }

    gateway, naive = figures("kvgateway"), figures("naive")
    ratios = {
        key: (gateway[key] / naive[key]) if gateway[key] and naive[key] else None
        for key in ("p50_ms", "p99_ms", "p999_ms", "read_p50_ms", "read_p99_ms", "read_p999_ms")
    }
    return {
        "rate": runs["kvgateway"][0]["rate"],
        "clients": CLIENTS,
        "seconds": runs["kvgateway"][0]["seconds"],
        "kvgateway": gateway,
        "naive": naive,
        "ratio_to_naive": ratios,
        "runs": runs,
    }
