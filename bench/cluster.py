"""Cluster mode against one process: CPU per batch end to end, same payloads, same run.

``python -m bench.cluster [--batches N] [--rate R] [--runs K]``

One source (:mod:`bench.publisher`, the standard payload set) sends N batches at R batches/s to
either ``kvgateway serve`` (one process) or the cluster (``kvgateway ingest`` -> a private
nats-server -> one ``kvgateway edge``). The CPU time of every process of the target, from the first
send until the last batch is in the (edge's) index, divided by N is the CPU per batch; trials
alternate and the figure is the median of the per-pair ratios cluster / single. Prints one JSON
object; needs nats-server on PATH (or /usr/sbin).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from bench import payloads
from bench.common import (
    BenchError,
    Gateway,
    Process,
    cpu_seconds,
    free_port,
    get_json,
    median,
    python_command,
    wait_until,
)
from bench.harness import endpoint_of, start_publisher

TOPIC_SPEC = "topic=kv-events"


def _nats_binary() -> str:
    found = shutil.which("nats-server") or ("/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None)
    if found is None:
        raise BenchError("nats-server is not installed")
    return found


def _last_seq(base: str) -> int:
    sources = get_json(f"{base}/v1/sources")["sources"]
    value = sources[0]["last_seq"]
    return -1 if value is None else int(value)


class _Latency:
    """One WebSocket client of the target: publish-to-client latency of every batch (the payload's
    ``ts`` is the publisher's clock at send; same machine)."""

    def __init__(self, base: str) -> None:
        self.lags: list[float] = []
        self._ws = connect(base.replace("http://", "ws://") + "/v1/ws", max_size=None)
        self._ws.recv(timeout=10)  # the hello
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(Exception):
            for frame in self._ws:
                now = time.time()
                for line in str(frame).split("\n"):
                    message = json.loads(line)
                    if message.get("type") == "batch":
                        self.lags.append(now - message["ts"])

    def close(self) -> dict[str, float]:
        self._ws.close()
        self._thread.join(5)
        lags = sorted(self.lags)
        if not lags:
            return {}
        return {"p50_ms": lags[len(lags) // 2] * 1e3, "p99_ms": lags[int(len(lags) * 0.99)] * 1e3}


def _measure(pids: list[int], publisher: Any, base: str, count: int, rate: float) -> dict[str, Any]:
    """Send, and meter the target's processes until its index holds the last batch."""
    publisher.request({"cmd": "wait_subscribers", "timeout": 30}, timeout=40)
    time.sleep(0.5)
    client = _Latency(base)
    before = [cpu_seconds(pid) for pid in pids]
    started = time.monotonic()
    publisher.request({"cmd": "send", "count": count, "rate": rate}, timeout=count / max(rate, 1) + 120)
    wait_until(lambda: _last_seq(base) >= count - 1, 120, "the last batch in the index")
    seconds = time.monotonic() - started
    cpu = [cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]
    time.sleep(0.2)
    latency = client.close()
    return {"cpu_seconds": cpu, "cpu_us_per_batch": sum(cpu) / count * 1e6, "seconds": seconds, **latency}


def single_trial(data: Path, logs: Path, count: int, rate: float) -> dict[str, Any]:
    publisher = start_publisher(data, logs, "publisher-single")
    gateway = Gateway(logs / "single.log", endpoint=endpoint_of(publisher))
    try:
        gateway.wait_ready()
        return _measure([gateway.pid], publisher, gateway.base, count, rate)
    finally:
        gateway.stop()
        publisher.stop()


def cluster_trial(data: Path, logs: Path, count: int, rate: float) -> dict[str, Any]:
    publisher = start_publisher(data, logs, "publisher-cluster")
    store = Path(tempfile.mkdtemp(prefix="bench-nats-"))
    nats_port, edge_port = free_port(), free_port()
    url = f"nats://127.0.0.1:{nats_port}"
    spec = f"name=bench,endpoint={endpoint_of(publisher)},{TOPIC_SPEC}"
    nats = Process(
        [_nats_binary(), "-js", "-a", "127.0.0.1", "-p", str(nats_port), "-sd", str(store)], logs / "nats.log"
    )
    processes = [nats]
    try:
        time.sleep(0.3)
        common = ["--source", spec, "--nats", url, "--log-level", "warning"]
        processes.append(Process(python_command("kvgateway", "ingest", *common, "--port", "0"), logs / "ingest.log"))
        time.sleep(1.0)  # the ingest creates the stream
        edge = Process(python_command("kvgateway", "edge", *common, "--port", str(edge_port)), logs / "edge.log")
        processes.append(edge)
        base = f"http://127.0.0.1:{edge_port}"
        wait_until(lambda: get_json(f"{base}/healthz")["status"] == "ok", 30, "the edge")
        result = _measure([p.pid for p in processes], publisher, base, count, rate)
        result["by_process"] = dict(zip(("nats-server", "ingest", "edge"), result["cpu_seconds"], strict=True))
        return result
    finally:
        for process in reversed(processes):
            process.stop()
        publisher.stop()
        shutil.rmtree(store, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=2_000.0, help="batches/s (0: flat out)")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    data = payloads.path_of(payloads.standard(min(args.batches, 30_000)))
    logs = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    pairs = []
    for run in range(args.runs):
        single = single_trial(data, logs / f"run{run}", args.batches, args.rate)
        cluster = cluster_trial(data, logs / f"run{run}", args.batches, args.rate)
        pairs.append(
            {"single": single, "cluster": cluster, "ratio": cluster["cpu_us_per_batch"] / single["cpu_us_per_batch"]}
        )
        print(json.dumps(pairs[-1]), file=sys.stderr)
    out = {
        "batches": args.batches,
        "rate": args.rate,
        "single_cpu_us_per_batch": median(p["single"]["cpu_us_per_batch"] for p in pairs),
        "cluster_cpu_us_per_batch": median(p["cluster"]["cpu_us_per_batch"] for p in pairs),
        "ratio": median(p["ratio"] for p in pairs),
        "single_p99_ms": median(p["single"].get("p99_ms") for p in pairs),
        "cluster_p99_ms": median(p["cluster"].get("p99_ms") for p in pairs),
        "runs": pairs,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
