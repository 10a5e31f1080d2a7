"""Scenario 7, many streams: what N configured streams cost a gateway whose engines are down.

A fleet of 64 engines with 8 data-parallel ranks is 512 streams. The gateway is started with N
streams against closed loopback ports (every stream connecting and retrying, the worst idle
case: no engine answers), and, as the baseline in the same run, with one stream. Measured: the
time from spawn to every stream listed in ``/v1/sources``, the CPU while idle, RSS and open
descriptors, and a ``/metrics`` scrape (time and size). Per-stream figures are the difference
to the one-stream gateway divided by N - 1.
"""

from __future__ import annotations

import os
import time
import urllib.request
from typing import Any

from bench.common import BenchError, CpuMeter, ServeProcess, free_port_block, median, rss_bytes, say
from bench.context import Context
from kvgateway.ingest.streams import DIAGNOSE_INTERVAL_SECONDS

PORTS_PER_SOURCE = 1000
"""Streams per configured source (``dp_size``, which is at most 1024)."""


def _sizes(ctx: Context) -> list[int]:
    return list(ctx.pick([500, 2000], [2000], [40]))


def _idle_seconds(ctx: Context) -> float:
    """One whole diagnosis period: every stream of an absent engine is diagnosed once in it (every
    30 s, all 2,000 at about the same time, as they started together). A shorter window held the
    diagnoses of every stream or of none, by where it fell (10 s: none; 20 s: all)."""
    return float(ctx.pick(DIAGNOSE_INTERVAL_SECONDS, DIAGNOSE_INTERVAL_SECONDS, 1.0))


def _settle_seconds(ctx: Context) -> float:
    """Before the idle measurement: ZeroMQ's reconnection interval backs off from 0.1 s to 2 s
    against a closed port, and every stream logs its first failure: a start-up burst, not idling."""
    return float(ctx.pick(12.0, 10.0, 0.5))


ZEROMQ_IO_THREAD = "ZMQbg/IO/0"
"""The name libzmq gives its (one) I/O thread: the reconnection attempts themselves run there."""


def thread_ticks(pid: int) -> dict[str, int]:
    """CPU time so far (clock ticks) of ``pid``'s event loop (its main thread), of ZeroMQ's I/O
    thread, and of its other threads together, from ``/proc``."""
    ticks = {"loop": 0, "zeromq_io": 0, "other": 0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                text = stat.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        kind = "loop" if int(tid) == pid else "zeromq_io" if name == ZEROMQ_IO_THREAD else "other"
        ticks[kind] += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _scrape(base: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:
        size = len(response.read())
    return time.perf_counter() - started, size


def _sources(count: int) -> tuple[str, list[str]]:
    """The first source's endpoint, and ``--source`` flags for the rest: consecutive closed ports."""
    base = free_port_block(count)
    specs: list[str] = []
    for index, first in enumerate(range(0, count, PORTS_PER_SOURCE)):
        size = min(PORTS_PER_SOURCE, count - first)
        if index:
            specs += ["--source", f"name=fleet{index},endpoint=tcp://127.0.0.1:{base + first},dp_size={size}"]
    return f"tcp://127.0.0.1:{base}", specs


def streams_reached(sources: list[dict[str, Any]]) -> int:
    """Streams that reached something on their "closed" port: another process's engine listening
    there (a shared machine's other benchmarks). Such a run measured ingest, not idling."""
    return sum(
        1
        for s in sources
        if s["connected"] or s["last_seq"] is not None or s["reason_code"] not in ("retrying", "refused")
    )


def _clean_trial(ctx: Context, streams: int, run: int) -> dict[str, Any]:
    """:func:`trial`, again on other ports when a stream reached another process's port."""
    for _ in range(3):
        result = trial(ctx, streams, run)
        if not result["reached"]:
            return result
        say(f"  {result['reached']:,} of {streams:,} streams reached another process's port: again, on other ports")
    raise BenchError(f"{streams:,} streams: every try found another process on some of their ports")


def trial(ctx: Context, streams: int, run: int) -> dict[str, Any]:
    first, extra = _sources(streams)
    logs = ctx.logs / "streams" / f"n{streams}-run{run}"
    spawned = time.monotonic()
    gateway = ServeProcess(
        logs / "gateway.log", endpoint=first, dp_size=min(streams, PORTS_PER_SOURCE), extra=extra, name="fleet0"
    )
    try:
        gateway.wait_ready(timeout=120)
        listed = len(gateway.sources())
        start_seconds = time.monotonic() - spawned
        if listed != streams:
            raise BenchError(f"/v1/sources lists {listed} streams, expected {streams}")
        time.sleep(_settle_seconds(ctx))
        cpu = CpuMeter(gateway.pid)
        before, watched = thread_ticks(gateway.pid), time.monotonic()
        cpu.start()
        time.sleep(_idle_seconds(ctx))
        idle = cpu.stop()
        after, watched = thread_ticks(gateway.pid), time.monotonic() - watched
        per_tick = 1.0 / os.sysconf("SC_CLK_TCK") / watched  # a clock tick as a share of a core
        gateway.check_alive("the gateway")
        reached = streams_reached(gateway.sources())
        scrapes = [_scrape(gateway.base) for _ in range(3)]
        return {
            "streams": streams,
            "start_seconds": round(start_seconds, 3),
            "idle_cpu_cores": round(idle, 4),
            # ...split by thread: the event loop's, and ZeroMQ's I/O thread's (its reconnections)
            "idle_loop_cores": round((after["loop"] - before["loop"]) * per_tick, 4),
            "idle_zeromq_io_cores": round((after["zeromq_io"] - before["zeromq_io"]) * per_tick, 4),
            "rss_bytes": rss_bytes(gateway.pid),
            "descriptors": _descriptors(gateway.pid),
            "metrics_seconds": round(median(s for s, _ in scrapes) or 0.0, 4),
            "metrics_bytes": scrapes[-1][1],
            "reached": reached,
        }
    finally:
        gateway.stop(timeout=30)


def _per_stream(big: dict[str, Any], one: dict[str, Any]) -> dict[str, float]:
    extra = big["streams"] - one["streams"]
    return {
        key: round((big[key] - one[key]) / extra, 3)
        for key in ("rss_bytes", "descriptors", "metrics_bytes", "idle_cpu_cores", "metrics_seconds")
    }


def run(ctx: Context) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for size in _sizes(ctx):
        trials: list[dict[str, Any]] = []
        baselines: list[dict[str, Any]] = []
        for run_index in range(ctx.runs):
            say(f"streams run {run_index + 1}/{ctx.runs}: 1 stream, then {size:,} (closed ports)")
            baselines.append(_clean_trial(ctx, 1, run_index))
            trials.append(_clean_trial(ctx, size, run_index))
        one = {k: median(t[k] for t in baselines) for k in baselines[0]}
        big = {k: median(t[k] for t in trials) for k in trials[0]}
        rows.append({**big, "one_stream": one, "per_stream": _per_stream(big, one), "runs": trials})
        say(
            f"  {size:,} streams: start {big['start_seconds']:.2f} s, idle {big['idle_cpu_cores'] * 100:.1f}% "
            f"of a core (loop {big['idle_loop_cores'] * 100:.1f}%, "
            f"ZeroMQ I/O {big['idle_zeromq_io_cores'] * 100:.1f}%), {big['descriptors']:,} fds, "
            f"/metrics {big['metrics_seconds'] * 1000:.0f} ms"
        )
    return {"closed_ports": True, "sizes": rows}
