"""Scenario 5, memory: bytes per resident block, and RSS under long churn.

**Resident blocks.** A fleet of 8 engines (one source, ``dp_size=8``) fills its caches without
evicting until 1,000,000 blocks are resident in all (the gateway's index holds exactly the
engines' state: checked against the workload's own count), fed at 3,200 batches/s (below the
ingest ceiling, so that no backlog's transient memory counts). The gateway process's RSS after
that, minus its RSS when connected and idle, divided by the resident blocks, is the figure: with
the routers' chain learner off (``--max-learned-blocks 0``: the index alone, the figure the
tracemalloc baseline compares with), then with the defaults (the learner keeps an entry per
announced block: what an operator pays out of the box). The resume
ring is cut to 100 messages for this run so that the ring's encoded JSON does not count as index
memory (its bound is a setting: ``ring_bytes``). Beside it, the same batches applied in this
process to an ``OccupancyIndex`` under tracemalloc, and the baseline: a plain Python ``set`` of
the same hashes (the least any Python index of these ints can take).

**Churn.** The gateway with its default settings and 10 WebSocket clients, fed 1,000 batches/s
of a workload that stores and evicts continually, for ``--churn-seconds`` (600 in the full run).
RSS is sampled all along; the figure is RSS at the end against RSS after a tenth of the run
(1 minute of 10, and never before the resume ring is full): flat means the ratio stays near 1.
The routers' chain learner grows with every new block announced until its cap (1.25 per resident
block of the fleet, at least 65,536), so its entries are sampled too, with every bounded structure
(the resume ring, the cache analytics' tables, the history rings: bench/bounded.py) at a tenth of
the run and at its end beside its bound: growth they explain is a bounded cache filling, not a
leak.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from typing import Any

from bench import payloads
from bench.bounded import BOUNDED, bounded_report
from bench.common import BenchError, ServeProcess, median, rss_bytes, say
from bench.context import Context
from bench.harness import Fleet, endpoint_of, start_publisher

STREAMS = 8
RING_MESSAGES = 10_000
"""The gateway's default ring size in messages."""
FILL_RATE = 400
"""Batches/s per stream while filling (3,200/s in all): below the ingest ceiling, so that no queue
builds up in the gateway's socket and its transient memory does not count as the index's."""


def _resident_spec(ctx: Context) -> payloads.SetSpec:
    return payloads.resident(ctx.pick(1_000_000, 200_000, 20_000), streams=STREAMS)


def fill_trial(ctx: Context, run: int, *, learner: bool) -> dict[str, Any]:
    """One fill; ``learner=False`` runs the gateway with ``--max-learned-blocks 0`` (the index alone)."""
    spec = _resident_spec(ctx)
    data = payloads.load_or_generate(spec)
    expected = data.final_resident()
    longest = max(len(s) for s in data.streams)
    logs = ctx.logs / "memory" / f"fill-run{run}{'' if learner else '-index'}"
    publisher = start_publisher(payloads.path_of(spec), logs, "publisher", streams=STREAMS)
    gateway = None
    try:
        gateway = ServeProcess(
            logs / "gateway.log",
            endpoint=endpoint_of(publisher),
            dp_size=STREAMS,
            extra=["--ring-messages", "100", *([] if learner else ["--max-learned-blocks", "0"])],
        )
        gateway.wait_ready()
        publisher.request({"cmd": "wait_subscribers", "timeout": 30}, timeout=40)
        time.sleep(1.0)
        rss_start = rss_bytes(gateway.pid)
        started = time.monotonic()
        publisher.request(
            {"cmd": "send", "count": longest, "rate": ctx.pick(FILL_RATE, FILL_RATE, 0), "exact": True},
            timeout=longest / FILL_RATE * 3 + 120,
        )
        blocks = 0
        deadline = time.monotonic() + max(120, data.total_batches / 500)
        while time.monotonic() < deadline:
            gateway.check_alive("the gateway")
            totals = gateway.occupancy()["totals"]
            blocks = sum(medium["blocks"] for medium in totals.values())
            if blocks >= expected:
                break
            time.sleep(0.5)
        if blocks != expected:
            raise BenchError(f"the index holds {blocks} blocks, the engines {expected}")
        fill_seconds = time.monotonic() - started
        time.sleep(2.0)
        rss_end = rss_bytes(gateway.pid)
        ring_bytes = gateway.metric("kvgateway_ring_bytes")
        return {
            "resident_blocks": blocks,
            "rss_start_bytes": rss_start,
            "rss_end_bytes": rss_end,
            "ring_bytes": ring_bytes,
            "bytes_per_block": round((rss_end - rss_start) / blocks, 1),
            "fill_seconds": round(fill_seconds, 2),
        }
    finally:
        if gateway is not None:
            gateway.stop()
        publisher.stop()


def traced(ctx: Context) -> dict[str, Any]:
    """The index's own allocations in this process, and a plain set of the same hashes."""
    from kvgateway.engine import wire
    from kvgateway.state.occupancy import OccupancyIndex

    data = payloads.load_or_generate(_resident_spec(ctx))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = OccupancyIndex()
        for rank, stream in enumerate(data.streams):
            for payload in stream:
                index.apply("bench", rank, wire.decode_batch(payload), 0.0)
        gc.collect()
        index_bytes = tracemalloc.get_traced_memory()[0] - before
        blocks = sum(sum(index.stream("bench", rank).groups("GPU").values()) for rank in range(len(data.streams)))
        del index
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        plain: list[set[wire.Hash]] = []  # one per stream, as the index keeps them
        for stream in data.streams:
            hashes: set[wire.Hash] = set()
            for payload in stream:
                for event in wire.decode_batch(payload).events:
                    if type(event) is wire.BlockStored:
                        hashes.update(event.block_hashes)
                    elif type(event) is wire.BlockRemoved:
                        hashes.difference_update(event.block_hashes)
                    elif type(event) is wire.AllBlocksCleared:
                        hashes.clear()
            plain.append(hashes)
        gc.collect()
        set_bytes = tracemalloc.get_traced_memory()[0] - before
        plain_blocks = sum(len(hashes) for hashes in plain)
        del plain
    finally:
        tracemalloc.stop()
    return {
        "resident_blocks": blocks,
        "index_bytes_per_block": round(index_bytes / blocks, 1),
        "plain_set_bytes_per_block": round(set_bytes / plain_blocks, 1) if plain_blocks else None,
        "plain_set_blocks": plain_blocks,
    }


def churn(ctx: Context) -> dict[str, Any]:
    seconds = float(ctx.churn_seconds)
    rate = float(ctx.pick(1000, 1000, 200))
    interval = float(ctx.pick(5.0, 1.0, 0.25))
    # A tenth of the run (1 minute of 10), but not before the resume ring (10,000 messages) is full:
    # filling it is the one growth that is expected.
    early_at = min(max(seconds / 10, RING_MESSAGES / rate + 5), seconds / 2)
    logs = ctx.logs / "memory" / "churn"
    spec = payloads.standard(ctx.pick(30_000, 30_000, 2_000))
    publisher = start_publisher(payloads.path_of(spec), logs, "publisher")
    gateway = fleet = None
    try:
        gateway = ServeProcess(logs / "gateway.log", endpoint=endpoint_of(publisher))
        gateway.wait_ready()
        publisher.request({"cmd": "wait_subscribers", "timeout": 30}, timeout=40)
        fleet = Fleet(gateway.ws_url, "ws", 10, logs, "churn")
        count = max(10, int(rate * seconds))
        fleet.window(0, count - 1)
        rss_idle = rss_bytes(gateway.pid)
        publisher.send({"cmd": "send", "count": count, "rate": rate})
        started = time.monotonic()
        samples: list[tuple[float, int]] = []
        learned: list[float] = []  # the chain learner's entries at each sample: it fills to its cap
        bounded: list[dict[str, Any]] = []  # every bounded structure's size and bound at each sample
        names = sorted({m for b in BOUNDED for m in (b.size, b.bound) if isinstance(m, str)})
        while True:
            elapsed = time.monotonic() - started
            gateway.check_alive("the gateway")
            samples.append((round(elapsed, 2), rss_bytes(gateway.pid)))
            metrics = gateway.metrics(names)
            bounded.append({"t": round(elapsed, 2), "metrics": metrics})
            learned.append(metrics["kvgateway_learned_blocks"])
            if elapsed >= seconds:
                break
            time.sleep(min(interval, max(0.01, seconds - elapsed)))
        publisher.reply(timeout=seconds + 120)
        deadline = time.monotonic() + 10
        report = fleet.report()
        while not report.all_complete and time.monotonic() < deadline:
            time.sleep(0.2)
            report = fleet.report()
        early_index = next(i for i, (at, _) in enumerate(samples) if at >= early_at)
        early = samples[early_index][1]
        end = samples[-1][1]
        return {
            "seconds": seconds,
            "rate": rate,
            "clients": 10,
            "early_at_seconds": early_at,
            "rss_idle_bytes": rss_idle,
            "rss_early_bytes": early,
            "rss_end_bytes": end,
            "rss_max_bytes": max(rss for _, rss in samples),
            "growth_ratio": round(end / early, 4),
            "learned_early": learned[early_index],
            "learned_end": learned[-1],
            # the history rings, the analytics' tables, the learner, the ring: early and end, with bounds
            "bounded": bounded_report([bounded[early_index], bounded[-1]]),
            "ring_bytes": gateway.metric("kvgateway_ring_bytes"),
            "all_delivered": report.all_complete,
            "clients_report": report.to_json(),
            "samples": samples,
        }
    finally:
        if fleet is not None:
            fleet.stop()
        if gateway is not None:
            gateway.stop()
        publisher.stop()


def run(ctx: Context) -> dict[str, Any]:
    fills = []
    for run_index in range(ctx.runs):
        say(f"memory run {run_index + 1}/{ctx.runs}: filling the index, learner off, then with defaults")
        fill = fill_trial(ctx, run_index, learner=False)
        defaults = fill_trial(ctx, run_index, learner=True)
        fill["defaults_bytes_per_block"] = defaults["bytes_per_block"]
        fill["defaults_rss_end_bytes"] = defaults["rss_end_bytes"]
        say(
            f"  {fill['resident_blocks']:,} blocks, {fill['bytes_per_block']} bytes/block of RSS "
            f"({defaults['bytes_per_block']} with the chain learner on)"
        )
        fills.append(fill)
    say("memory: the same index in this process under tracemalloc")
    in_process = traced(ctx)
    say(f"memory: {ctx.churn_seconds:g} s of churn")
    churned = churn(ctx)
    say(f"  RSS {churned['rss_early_bytes'] / 2**20:.1f} MiB -> {churned['rss_end_bytes'] / 2**20:.1f} MiB")
    # The fill announces each block once, so the learner's cost per entry is the difference of the
    # two fills per block; the churn's growth net of the entries it learned meanwhile is the leak test.
    per_entry = median(f["defaults_bytes_per_block"] - f["bytes_per_block"] for f in fills) or 0.0
    new_entries = churned["learned_end"] - churned["learned_early"]
    churned["learner_bytes_per_entry"] = round(per_entry, 1)
    churned["growth_ratio_net_of_learner"] = round(
        (churned["rss_end_bytes"] - new_entries * per_entry) / churned["rss_early_bytes"], 4
    )
    return {
        "resident_blocks": fills[0]["resident_blocks"],
        "bytes_per_block": median(f["bytes_per_block"] for f in fills),
        "defaults_bytes_per_block": median(f["defaults_bytes_per_block"] for f in fills),
        "fills": fills,
        "tracemalloc": in_process,
        "ratio_to_plain_set": round(in_process["index_bytes_per_block"] / in_process["plain_set_bytes_per_block"], 3)
        if in_process["plain_set_bytes_per_block"]
        else None,
        "churn": churned,
    }
