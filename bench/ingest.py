"""Scenario 1, the ingest ceiling: batches/s through decode, sequencing, index and JSON encoding.

One WebSocket client receives every batch (so rendering and sending are paid, as in real use);
the yardstick is the floor: msgspec's decode plus JSON encode of the same payloads, measured in
this process in the same run, against the gateway's CPU per batch. The raw loop's rate is kept
beside it. Variants: map events (the standard set), positional (array) events, byte hashes, signed
hashes.

The consumer (the gateway, or the baseline: :mod:`bench.raw`'s
SUB loop that only receives) is subscribed, then stopped with SIGSTOP; the publisher sends N
batches flat out (unlimited high-water marks on both sides, so nothing is dropped: they wait in
the publisher's queue and the socket buffers); SIGCONT starts the clock. The consumption rate is
N / (time of the last batch's receipt - SIGCONT). The raw loop records that time itself; for the
gateway it is the last batch's ``ts`` plus the ``lag_seconds`` /v1/sources reports for it (the
gateway's own ``time.time()`` when it received that batch), so polling does not blur it.
Raw and gateway trials alternate, and the figure is the median of the per-pair ratios.

Each variant's gateway runs a second time on the pure-Python core (``KVGATEWAY_NO_EXTENSIONS=1``,
what an install without a C compiler runs), its CPU per batch held against the same floor.

The in-process breakdown (microseconds per batch for each stage, same payloads) is there to
explain the ratio, not to replace it.
"""

from __future__ import annotations

import gc
import json
import time
from typing import Any, Final

import msgspec

from bench import payloads
from bench.common import (
    BenchError,
    CpuMeter,
    Process,
    Profiler,
    ServeProcess,
    Worker,
    median,
    minor_faults,
    pause,
    python_command,
    resume,
    say,
)
from bench.context import Context
from bench.harness import Fleet, endpoint_of, start_publisher
from kvgateway.engine import wire
from kvgateway.protocol import render
from kvgateway.runtime.extensions import PURE
from kvgateway.simulator import encode
from kvgateway.simulator.workload import HashKind


def _batches(ctx: Context) -> int:
    return int(ctx.pick(50_000, 15_000, 1_000))


VARIANTS: dict[str, tuple[encode.EventForm, HashKind]] = {
    "map": ("map", "int"),
    "array": ("array", "int"),
    "bytes": ("map", "bytes"),
    "signed": ("map", "signed"),
}
"""Payload variants: vLLM's map events with u64 hashes (the standard set), positional (array)
events as older engines send them, byte hashes (vLLM's sha256 block hashing), and signed int64
hashes, half of them negative (SGLang's, LMCache's, vLLM's before 0.10.2)."""


def _spec(ctx: Context, variant: str = "map") -> payloads.SetSpec:
    form, hashes = VARIANTS[variant]
    return payloads.standard(ctx.pick(30_000, 30_000, 2_000), form, hashes)


def raw_trial(ctx: Context, run: int) -> dict[str, Any]:
    count = _batches(ctx)
    logs = ctx.logs / "ingest" / f"raw-run{run}"
    publisher = start_publisher(payloads.path_of(_spec(ctx)), logs, "publisher")
    consumer = None
    try:
        consumer = Process(
            python_command("bench.raw", "sub", "--endpoint", endpoint_of(publisher), "--count", str(count)),
            logs / "raw.log",
        )
        publisher.request({"cmd": "wait_subscribers", "timeout": 30}, timeout=40)
        pause(consumer)
        publisher.request({"cmd": "send", "count": count, "rate": 0}, timeout=120)
        time.sleep(0.3)
        cpu = CpuMeter(consumer.pid)
        cpu.start()
        started = resume(consumer)
        consumer.popen.wait(timeout=max(60, count / 1000))
        result = _last_json(consumer)
        seconds = float(result["last"]) - started
        if int(result["last_seq"]) != count - 1:
            raise BenchError(f"raw SUB ended at seq {result['last_seq']}, expected {count - 1}")
        return {"batches": count, "seconds": seconds, "rate": count / seconds}
    finally:
        if consumer is not None:
            consumer.stop()
        publisher.stop()


PURE_CORE: Final = {"KVGATEWAY_NO_EXTENSIONS": "1"}
"""The environment of the gateway run on the pure-Python core: what an install without a C
compiler runs (issue 29: users without a compiler know what they get)."""


def gateway_trial(ctx: Context, run: int, variant: str = "map", *, pure: bool = False) -> dict[str, Any]:
    """The gateway ingesting the variant's batches flat out, one WebSocket client receiving every
    one (so rendering, encoding and sending are paid as in real use). CPU is the gateway process's
    (every thread) from SIGCONT until the client has the last batch.

    Two floods of the same size go to one gateway: the first (``cold_*``) finds a process that has
    just started, whose resume ring, heap and socket queues grow into fresh pages (about two page
    faults a batch, each one the kernel zeroing a page); the second finds them grown, as a gateway
    that has run a while does (a fifth of a fault a batch, the same as after a third flood), and is
    the trial's figure: the floor it is held against is a warm loop too.

    ``pure``: the gateway on the pure-Python core (checked by its ``kvgateway_build_info``)."""
    count = _batches(ctx)
    logs = ctx.logs / "ingest" / f"gateway-{variant}{'-pure' if pure else ''}-run{run}"
    publisher = start_publisher(payloads.path_of(_spec(ctx, variant)), logs, "publisher")
    gateway = None
    fleet = None
    try:
        gateway = ServeProcess(
            logs / "gateway.log",
            endpoint=endpoint_of(publisher),
            extra=("--client-queue-bytes", str(CLIENT_QUEUE)),
            env=PURE_CORE if pure else None,
        )
        gateway.wait_ready()
        if pure and gateway.core() != PURE:
            raise BenchError(f"the gateway meant to run the pure-Python core runs the {gateway.core()} one")
        fleet = Fleet(gateway.ws_url, "ws", 1, logs, "ingest")
        publisher.request({"cmd": "wait_subscribers", "timeout": 30}, timeout=40)
        cold = _flood(gateway, fleet, publisher, 0, count)
        profiler = Profiler(gateway.pid, logs / "py-spy.txt") if ctx.profile and run == 0 else None
        warm = _flood(gateway, fleet, publisher, count, count, profiler=profiler)
        return {**warm, **{f"cold_{name}": value for name, value in cold.items() if name != "profile"}}
    finally:
        if fleet is not None:
            fleet.stop()
        if gateway is not None:
            gateway.stop()
        publisher.stop()


def _flood(
    gateway: ServeProcess, fleet: Fleet, publisher: Worker, first: int, count: int, *, profiler: Profiler | None = None
) -> dict[str, Any]:
    """``count`` batches (seqs ``first`` on) queued while the gateway is stopped, then ingested
    flat out: its CPU per batch, its rate and its page faults per batch."""
    fleet.window(first, first + count - 1)
    pause(gateway)
    sent = publisher.request({"cmd": "send", "count": count, "rate": 0}, timeout=120)
    time.sleep(0.3)
    cpu = CpuMeter(gateway.pid)
    faults = minor_faults(gateway.pid)
    cpu.start()
    started = resume(gateway)
    source = _wait_ingested(gateway, first + count)
    received_last = float(sent["ts_last"]) + float(source["lag_seconds"])
    _wait_delivered(gateway, fleet, count)
    cores = cpu.stop()
    faults = minor_faults(gateway.pid) - faults
    profile = profiler.stop() if profiler is not None else None
    seconds = received_last - started
    counters = source["counters"]
    if counters["gaps"] or counters["batches"] != first + count:
        raise BenchError(f"the gateway saw gaps or extra batches: {counters}")
    return {
        "batches": count,
        "seconds": seconds,
        "rate": count / seconds,
        "cpu_cores": round(cores, 3),
        "cpu_us_per_batch": round(cpu.seconds / count * 1e6, 1),
        "page_faults_per_batch": round(faults / count, 2),
        **({"profile": profile} if profile else {}),
    }


CLIENT_QUEUE = 1024 * 1024 * 1024
"""The client may fall behind during the flood: it must not be cut as a slow consumer."""


def _wait_ingested(gateway: ServeProcess, count: int) -> dict[str, Any]:
    deadline = time.monotonic() + max(120, count / 200)
    source: dict[str, Any] = {}
    while time.monotonic() < deadline:
        time.sleep(0.1)
        gateway.check_alive("the gateway")
        source = gateway.sources()[0]
        if source["last_seq"] == count - 1:
            return source
    raise BenchError(f"the gateway reached seq {source.get('last_seq')} of {count - 1} in time")


def _wait_delivered(gateway: ServeProcess, fleet: Fleet, count: int) -> None:
    deadline = time.monotonic() + max(120, count / 200)
    while time.monotonic() < deadline:
        report = fleet.report()
        if report.all_complete:
            if report.disorder:
                raise BenchError(f"the WebSocket client saw {report.disorder} batches out of order")
            return
        gateway.check_alive("the gateway")
        time.sleep(0.05)
    raise BenchError(f"the WebSocket client did not receive all {count} batches in time")


def _last_json(process: Process) -> dict[str, Any]:
    for line in reversed(process.log_path.read_text().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise BenchError(f"no result from {process.command[3:5]}: {process.tail()}")


def breakdown(ctx: Context, variant: str = "map") -> dict[str, float]:
    """Microseconds per batch for each stage of the gateway's ingest path, in this process (CPU
    time, as the gateway's own figure: wall time counted other processes' time on a loaded machine).

    ``floor`` is not a stage: msgspec's untyped msgpack decode plus its JSON encode of the result,
    the least any Python bridge that re-encodes these payloads pays (not in ``sum``).
    """
    stream = payloads.load_or_generate(_spec(ctx, variant)).stream(0)[: ctx.pick(10_000, 5_000, 500)]
    out: dict[str, float] = {}
    # Every stage's objects are kept for the next one: without this the collector's passes over
    # them (which the gateway, holding one batch at a time, does not pay) would swamp the figures.
    gc.collect()
    gc.disable()
    try:
        return _stages(stream, out)
    finally:
        gc.enable()


def _stages(stream: list[bytes], out: dict[str, float]) -> dict[str, float]:
    from kvgateway.engine.sequencer import Sequencer
    from kvgateway.state.occupancy import OccupancyIndex

    n = len(stream)

    started = time.process_time()
    batches = [wire.decode_batch(p) for p in stream]
    out["decode"] = (time.process_time() - started) / n * 1e6

    sequencer = Sequencer(has_replay=True)
    started = time.process_time()
    for seq, batch in enumerate(batches):
        sequencer.on_live(seq, batch)
    out["sequence"] = (time.process_time() - started) / n * 1e6

    index = OccupancyIndex()
    now = time.time()
    started = time.process_time()
    for batch in batches:
        index.apply("bench", 0, batch, now)
    out["index"] = (time.process_time() - started) / n * 1e6

    # render: what the log keeps of a batch, its events' JSON and their filter keys in one pass
    # (until 3d7c648 two stages, render and filter_keys)
    started = time.process_time()
    rendered = [render.events_json(batch.events)[0] for batch in batches]
    out["render"] = (time.process_time() - started) / n * 1e6

    started = time.process_time()
    for offset, (batch, events) in enumerate(zip(batches, rendered, strict=True)):
        render.batch_message("0123456789abcdef", offset, ("bench", 0), seq=offset, ts=batch.ts, events=events)
    out["json_encode"] = (time.process_time() - started) / n * 1e6
    _followers(batches, out)
    out["sum"] = sum(out.values())

    decode, encode = msgspec.msgpack.decode, msgspec.json.encode
    started = time.process_time()
    for payload in stream:
        encode(decode(payload))
    out["floor"] = (time.process_time() - started) / n * 1e6
    out["digest_upkeep"] = _digest_upkeep(batches)
    return {k: round(v, 2) for k, v in out.items()}


DIGEST_ROUNDS: Final = 3
"""Passes of the index with and without the digest, alternating: the upkeep is the difference of
the best of each (about 1 us a batch compiled since round fifteen, less than one pass's spread)."""


def _digest_upkeep(batches: list[wire.Batch]) -> float:
    """What keeping the state digest adds to ``index`` (microseconds per batch; not in ``sum``: it
    is paid only once a client or /v1/blocks asked for a digest, see docs/performance.md)."""
    from kvgateway.state.occupancy import OccupancyIndex

    best = {False: float("inf"), True: float("inf")}
    now = time.time()
    for _ in range(DIGEST_ROUNDS):
        for tracked in (False, True):
            index = OccupancyIndex()
            if tracked:
                index.stream("bench", 0).digest()  # tracking on from the first batch, as after the first ask
            started = time.process_time()
            for batch in batches:
                index.apply("bench", 0, batch, now)
            best[tracked] = min(best[tracked], time.process_time() - started)
    return (best[True] - best[False]) / len(batches) * 1e6


def _followers(batches: list[wire.Batch], out: dict[str, float]) -> None:
    """The log's other followers, which every batch visits too: the routers' chain learner and
    the cache analytics (both on by default)."""
    from kvgateway.state.analytics import CacheAnalytics
    from kvgateway.state.lookup import ChainLearner

    n = len(batches)
    learner = ChainLearner()
    started = time.process_time()
    for batch in batches:
        learner.learn_batch("bench", 0, batch)
    out["learn"] = (time.process_time() - started) / n * 1e6

    analytics = CacheAnalytics()
    started = time.process_time()  # every thread's: the compiled pass applies on a thread of its own
    for batch in batches:
        analytics.apply(("bench", 0), batch.events, batch.ts)
    analytics.tracked()  # a read: waits until that thread has applied every batch
    out["analytics"] = (time.process_time() - started) / n * 1e6


def floor_us(ctx: Context, variant: str) -> float:
    """msgspec's untyped decode plus JSON encode of the variant's payloads, in this process:
    the least any Python process turning them into JSON pays (microseconds per batch, best of 3).

    In CPU time, as the gateway's figure it is the yardstick of: in wall time a loaded machine
    inflated the floor by up to 3 times (another process's time counted), and the ratio with it
    looked better than it was."""
    stream = payloads.load_or_generate(_spec(ctx, variant)).stream(0)[: ctx.pick(10_000, 5_000, 500)]
    decode, encode = msgspec.msgpack.decode, msgspec.json.encode
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for payload in stream:
            encode(decode(payload))
        best = min(best, time.process_time() - started)
    return best / len(stream) * 1e6


def _variant_runs(ctx: Context, variant: str, raw_rates: list[float] | None) -> dict[str, Any]:
    runs = []
    for run_index in range(ctx.runs):
        floor = floor_us(ctx, variant)
        gateway = gateway_trial(ctx, run_index, variant)
        pure = gateway_trial(ctx, run_index, variant, pure=True)
        entry = {
            "gateway": gateway,
            "pure": pure,
            "floor_us": round(floor, 2),
            "floor_ratio": gateway["cpu_us_per_batch"] / floor,
            "pure_floor_ratio": pure["cpu_us_per_batch"] / floor,
        }
        if raw_rates is not None:
            raw = raw_trial(ctx, run_index)
            raw_rates.append(raw["rate"])
            entry |= {"raw": raw, "ratio": gateway["rate"] / raw["rate"]}
        say(
            f"  {variant}: gateway {gateway['cpu_us_per_batch']:.1f} us/batch, floor {floor:.1f}, "
            f"ratio {entry['floor_ratio']:.2f}; pure-Python core {pure['cpu_us_per_batch']:.1f} us/batch"
        )
        runs.append(entry)
    return {
        "gateway_cpu_us_per_batch": median(r["gateway"]["cpu_us_per_batch"] for r in runs),
        "gateway_cold_cpu_us_per_batch": median(r["gateway"]["cold_cpu_us_per_batch"] for r in runs),
        "gateway_page_faults_per_batch": median(r["gateway"]["page_faults_per_batch"] for r in runs),
        "gateway_cold_page_faults_per_batch": median(r["gateway"]["cold_page_faults_per_batch"] for r in runs),
        "gateway_rate": median(r["gateway"]["rate"] for r in runs),
        "floor_us": median(r["floor_us"] for r in runs),
        "floor_ratio": round(median(r["floor_ratio"] for r in runs) or 0.0, 3),
        "pure_cpu_us_per_batch": median(r["pure"]["cpu_us_per_batch"] for r in runs),
        "pure_floor_ratio": round(median(r["pure_floor_ratio"] for r in runs) or 0.0, 3),
        "breakdown_us": breakdown(ctx, variant),
        "runs": runs,
    }


def run(ctx: Context) -> dict[str, Any]:
    say(f"ingest: {ctx.runs} runs of each variant ({', '.join(VARIANTS)}), {_batches(ctx):,} batches, one WS client")
    raw_rates: list[float] = []
    variants = {name: _variant_runs(ctx, name, raw_rates if name == "map" else None) for name in VARIANTS}
    standard = variants["map"]
    pairs = standard["runs"]
    data = payloads.load_or_generate(_spec(ctx))
    return {
        "batches": _batches(ctx),
        "payload_bytes": round(data.mean_payload_bytes()),
        "events_per_batch": round(data.events / data.total_batches, 2),
        "web_clients": 1,
        "raw_rate": median(raw_rates),
        "gateway_rate": standard["gateway_rate"],
        "ratio": median(p["ratio"] for p in pairs),
        "gateway_cpu_us_per_batch": standard["gateway_cpu_us_per_batch"],
        "floor_us": standard["floor_us"],
        "floor_ratio": standard["floor_ratio"],
        "target_floor_ratio": 2.0,
        "target_ratio": 0.25,  # of the raw SUB loop's rate (issue 29)
        "breakdown_us": standard["breakdown_us"],
        "variants": {name: {k: v for k, v in entry.items() if k != "runs"} for name, entry in variants.items()},
        **({"profile": pairs[0]["gateway"]["profile"]} if "profile" in pairs[0]["gateway"] else {}),
        "runs": pairs,
    }
