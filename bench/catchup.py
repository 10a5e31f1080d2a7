"""Scenario 6, catch-up: from gateway start to a fully rebuilt index, from a 10,000-batch replay.

The engine (:mod:`bench.publisher` with a replay ROUTER and ``buffer_steps`` 10,000) has already
published 9,999 batches when the gateway starts; it publishes the 10,000th (seq 9,999) as soon as
the gateway subscribes. Seeing a first live seq above 0, the gateway asks the engine for a replay
from seq 0 and gets all 10,000 batches. The clock runs from the gateway's spawn until
/v1/sources shows last_seq 9,999 *and* /v1/occupancy shows exactly the engine's resident blocks
(the workload's own count at that point). Time stamps from the engine side split it into start-up
(spawn to the replay request) and the replay phase (request to rebuilt index); the replay phase is
also taken in the gateway's CPU seconds (from the bench's last look before the request), the
figure a loaded machine does not stretch, and so is the whole (``cpu_seconds``: spawn to rebuilt
index, every thread of the gateway). Scraped once the index is rebuilt, ``gc_seconds`` and
``gc_collections`` are the garbage collections the gateway timed in the catch-up
(``kvgateway_gc_pause_seconds``: from the role's start on, so not a freeze's at start-up).

Baseline: a raw DEALER process (:mod:`bench.raw`) fetching the same 10,000-batch replay from an
engine in the same state, timed from its spawn, and from its request.

Both processes start from compiled bytecode, as an installed package does (:func:`from_bytecode`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any, Final

from bench import payloads
from bench.common import CACHE_DIR, BenchError, Process, ServeProcess, cpu_seconds, median, python_command, say
from bench.context import Context
from bench.harness import endpoint_of, replay_of, start_publisher
from bench.ingest import _last_json

BYTECODE_DIR: Final = CACHE_DIR / "bytecode"
"""The spawned processes' compiled modules (``PYTHONPYCACHEPREFIX``): a tree of its own, so that
nothing is written into a checkout (the one ``--gateway-source`` names may be another's)."""


@contextlib.contextmanager
def from_bytecode() -> Iterator[None]:
    """Processes spawned inside start from compiled bytecode, as an installed package does (pip
    compiles it at install, the image's too). The gateway runs from a checkout, and where
    ``PYTHONDONTWRITEBYTECODE`` is set (this machine's environment sets it) every spawn compiled
    the package's modules from source again: 40% of a start-up's instructions, which no installed
    gateway spends (docs/performance.md, section 6, round ten). Here the processes write and read
    their bytecode under :data:`BYTECODE_DIR`; the first start of a checkout compiles it
    (:func:`prime`)."""
    names = ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")
    saved = {name: os.environ.get(name) for name in names}
    os.environ["PYTHONPYCACHEPREFIX"] = str(BYTECODE_DIR)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def prime(ctx: Context) -> None:
    """A gateway started (against no engine) and the raw DEALER's module loaded, unmeasured: their
    bytecode is compiled before the first measured start."""
    logs = ctx.logs / "catchup" / "prime"
    with from_bytecode():
        gateway = ServeProcess(logs / "gateway.log", endpoint="tcp://127.0.0.1:9")
        dealer = Process(python_command("bench.raw", "--help"), logs / "dealer.log")
    try:
        gateway.wait_ready()
        dealer.popen.wait(timeout=120)
    finally:
        gateway.stop()
        dealer.stop()


def _count(ctx: Context) -> int:
    return int(ctx.pick(10_000, 10_000, 1_000))


def _spec(ctx: Context) -> payloads.SetSpec:
    return payloads.standard(ctx.pick(30_000, 30_000, 2_000))


def gateway_trial(ctx: Context, run: int) -> dict[str, Any]:
    count = _count(ctx)
    data = payloads.load_or_generate(_spec(ctx))
    expected = data.expected[0][str(count)]
    logs = ctx.logs / "catchup" / f"gateway-run{run}"
    publisher = start_publisher(payloads.path_of(_spec(ctx)), logs, "engine", replay=True, buffer_steps=count)
    gateway = None
    try:
        publisher.request({"cmd": "send", "count": count - 1, "rate": 0}, timeout=120)  # nobody listens yet
        publisher.send({"cmd": "send", "count": 1, "rate": 0, "when_subscribed": True})
        spawned = time.time()
        with from_bytecode():
            gateway = ServeProcess(logs / "gateway.log", endpoint=endpoint_of(publisher), replay=replay_of(publisher))
        http_ready: float | None = None
        seq_done: float | None = None
        mediums: dict[str, int] = {}
        source: dict[str, Any] = {}
        cpu_at: list[tuple[float, float]] = []  # (time, the gateway's CPU seconds) at each look
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            gateway.check_alive("the gateway")
            cpu_at.append((time.time(), cpu_seconds(gateway.pid)))
            try:
                source = gateway.sources()[0]
            except OSError:
                time.sleep(0.01)
                continue
            if http_ready is None:
                http_ready = time.time()
            if source["last_seq"] == count - 1:
                seq_done = seq_done or time.time()
                streams = gateway.occupancy()["streams"]
                mediums = {name: m["blocks"] for name, m in streams[0]["mediums"].items() if m["blocks"]}
                if mediums == expected:
                    break
            time.sleep(0.02)
        else:
            raise BenchError(f"not rebuilt in time: last_seq {source.get('last_seq')}, occupancy {mediums}")
        done, cpu_done = time.time(), cpu_seconds(gateway.pid)
        collections = gateway.metrics(["kvgateway_gc_pause_seconds_sum", "kvgateway_gc_pause_seconds_count"])
        trigger = publisher.reply(timeout=30)
        replays = publisher.request({"cmd": "replays"})["replays"]
        # The catch-up request at connect may reach the engine before it published the last
        # batch, which then arrives live: 9,999 replayed items are as right as 10,000.
        if len(replays) != 1 or replays[0]["items"] not in (count - 1, count):
            raise BenchError(f"expected one replay of {count} batches, the engine served {replays}")
        counters = source["counters"]
        return {
            "batches": count,
            "total_seconds": round(done - spawned, 4),
            "http_ready_seconds": round((http_ready or done) - spawned, 4),
            "live_trigger_seconds": round(float(trigger["t_start"]) - spawned, 4),
            "replay_request_seconds": round(float(replays[0]["received"]) - spawned, 4),
            "replay_phase_seconds": round(done - float(replays[0]["received"]), 4),
            "engine_answer_seconds": round(float(replays[0]["answered"]) - float(replays[0]["received"]), 4),
            "replay_cpu_seconds": round(cpu_done - _cpu_before(cpu_at, float(replays[0]["received"])), 4),
            "cpu_seconds": round(cpu_done, 4),
            "gc_seconds": round(collections["kvgateway_gc_pause_seconds_sum"], 4),
            "gc_collections": int(collections["kvgateway_gc_pause_seconds_count"]),
            "occupancy": mediums,
            "expected": expected,
            "replayed": counters["replayed"],
            "unrecovered": counters["unrecovered"],
        }
    finally:
        if gateway is not None:
            gateway.stop()
        publisher.stop()


def _cpu_before(samples: list[tuple[float, float]], moment: float) -> float:
    """The gateway's CPU seconds at the last look before ``moment`` (its first look if none was):
    the replay phase in CPU time, which a loaded machine does not stretch as it stretches wall time."""
    before = [cpu for at, cpu in samples if at <= moment]
    return before[-1] if before else samples[0][1]


def raw_trial(ctx: Context, run: int) -> dict[str, Any]:
    count = _count(ctx)
    logs = ctx.logs / "catchup" / f"raw-run{run}"
    publisher = start_publisher(payloads.path_of(_spec(ctx)), logs, "engine", replay=True, buffer_steps=count)
    dealer = None
    try:
        publisher.request({"cmd": "send", "count": count, "rate": 0}, timeout=120)
        spawned = time.time()
        with from_bytecode():
            dealer = Process(
                python_command("bench.raw", "dealer", "--endpoint", str(replay_of(publisher)), "--start", "0"),
                logs / "dealer.log",
            )
        dealer.popen.wait(timeout=120)
        result = _last_json(dealer)
        if result["items"] != count:
            raise BenchError(f"the raw DEALER got {result['items']} batches, expected {count}")
        return {
            "batches": count,
            "total_seconds": round(float(result["end"]) - spawned, 4),
            "fetch_seconds": round(float(result["end"]) - float(result["sent"]), 4),
        }
    finally:
        if dealer is not None:
            dealer.stop()
        publisher.stop()


def run(ctx: Context) -> dict[str, Any]:
    prime(ctx)
    pairs = []
    for run_index in range(ctx.runs):
        say(f"catch-up run {run_index + 1}/{ctx.runs}: raw DEALER, then the gateway")
        raw = raw_trial(ctx, run_index)
        gateway = gateway_trial(ctx, run_index)
        say(
            f"  raw {raw['total_seconds']:.3f}s (fetch {raw['fetch_seconds']:.3f}s), gateway "
            f"{gateway['total_seconds']:.3f}s (replay phase {gateway['replay_phase_seconds']:.3f}s)"
        )
        pairs.append(
            {
                "raw": raw,
                "gateway": gateway,
                "ratio_total": gateway["total_seconds"] / raw["total_seconds"],
                "ratio_replay": gateway["replay_phase_seconds"] / raw["fetch_seconds"],
            }
        )
    return {
        "batches": _count(ctx),
        "gateway_total_seconds": median(p["gateway"]["total_seconds"] for p in pairs),
        "gateway_replay_phase_seconds": median(p["gateway"]["replay_phase_seconds"] for p in pairs),
        "gateway_replay_cpu_seconds": median(p["gateway"]["replay_cpu_seconds"] for p in pairs),
        "gateway_cpu_seconds": median(p["gateway"]["cpu_seconds"] for p in pairs),
        "gateway_startup_seconds": median(p["gateway"]["replay_request_seconds"] for p in pairs),
        "gateway_gc_seconds": median(p["gateway"]["gc_seconds"] for p in pairs),
        "raw_total_seconds": median(p["raw"]["total_seconds"] for p in pairs),
        "raw_fetch_seconds": median(p["raw"]["fetch_seconds"] for p in pairs),
        "ratio_total": median(p["ratio_total"] for p in pairs),
        "ratio_replay": median(p["ratio_replay"] for p in pairs),
        "rebuilt_exactly": all(p["gateway"]["occupancy"] == p["gateway"]["expected"] for p in pairs),
        "runs": pairs,
    }
