"""Cluster mode: what a resume from JetStream and a new edge's start-up take, against the stream's length.

``python -m bench.cluster_resume [--batches N]``

A simulated engine publishes N batches through ``kvgateway ingest`` into a private nats-server; an
edge with a 100-message ring follows. Then WebSocket clients resume 1,000 / 10,000 / 100,000
messages back (every one read back from JetStream), timed to their hello and to their last
message; and a second edge is started and timed until its /readyz says it has caught up: once
from the first edge's latest index checkpoint (written every ``--checkpoint`` seconds), once with
checkpoints off (it applies the whole stream). Prints one JSON object per measurement.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from websockets.sync.client import connect

from bench.cluster import _nats_binary
from bench.common import Process, free_port, get_json, python_command, seq_of, wait_until


def _resume(port: int, epoch: str, last: int, missed: int) -> dict[str, float | int | bool]:
    started = time.perf_counter()
    url = f"ws://127.0.0.1:{port}/v1/ws?last_event_id={epoch}:{last - missed}"
    with connect(url, max_size=None, open_timeout=120) as ws:
        hello = json.loads(ws.recv(timeout=120))
        hello_s = time.perf_counter() - started
        received = 0
        while received < missed:
            received += len(str(ws.recv(timeout=60)).split("\n"))
    return {
        "missed": missed,
        "recovered": hello["recovered"],
        "hello_s": hello_s,
        "all_s": time.perf_counter() - started,
    }


def _checkpoint_offset(metrics_url: str) -> int:
    """The stream sequence of the last checkpoint the edge wrote (0: none), from its log of writes."""
    import urllib.request

    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    written = [line for line in text.splitlines() if line.startswith("kvgateway_checkpoints_written_total ")]
    applied = [line for line in text.splitlines() if line.startswith("kvgateway_jetstream_applied_offset ")]
    if not written or float(written[0].split()[1]) < 1 or not applied:
        return 0
    return int(float(applied[0].split()[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_resume", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=110_000)
    parser.add_argument("--rate", type=float, default=4_000.0, help="the engine's batches/s while filling the stream")
    parser.add_argument("--checkpoint", type=float, default=5.0, help="the first edge's checkpoint interval (s)")
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="bench-cluster-resume-"))
    store = logs / "nats"
    nats_port, pub, rep, port_a = (free_port() for _ in range(4))
    spec = f"name=sim,endpoint=tcp://127.0.0.1:{pub},replay=tcp://127.0.0.1:{rep}"
    nats = ["--nats", f"nats://127.0.0.1:{nats_port}", "--log-level", "warning"]
    procs = [
        Process([_nats_binary(), "-js", "-a", "127.0.0.1", "-p", str(nats_port), "-sd", str(store)], logs / "nats.log")
    ]
    try:
        time.sleep(0.3)
        engine = ["--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{rep}", "--rate", str(args.rate)]
        engine += ["--batches", str(args.batches), "--start-delay", "3", "--linger=-1"]  # stays up: streams ready
        procs.append(Process(python_command("kvgateway", "simulate", *engine), logs / "engine.log"))
        procs.append(
            Process(python_command("kvgateway", "ingest", "--source", spec, *nats, "--port", "0"), logs / "ingest.log")
        )
        time.sleep(1.5)
        edge = ["edge", "--source", spec, *nats, "--client-queue-bytes", str(2**30)]
        procs.append(
            Process(
                python_command(
                    "kvgateway",
                    *edge,
                    "--port",
                    str(port_a),
                    "--ring-messages",
                    "100",
                    "--nats-checkpoint",
                    str(args.checkpoint),
                ),
                logs / "edge-a.log",
            )
        )

        def filled() -> dict[str, object] | None:
            doc = get_json(f"http://127.0.0.1:{port_a}/v1/sources")
            return doc if seq_of(doc["sources"][0]["last_seq"]) == args.batches - 1 else None

        doc = wait_until(filled, args.batches / 500 + 120, "the stream filled")
        epoch, last = str(doc["epoch"]), int(doc["offset"])
        print(json.dumps({"stream_length": last}))
        for missed in (1_000, 10_000, 100_000):
            if missed < last:
                print(json.dumps(_resume(port_a, epoch, last, missed)))
        # A checkpoint of the whole stream first: the first edge writes one within an interval.
        metrics = f"http://127.0.0.1:{port_a}/metrics"
        wait_until(lambda: _checkpoint_offset(metrics) >= last, args.checkpoint * 3 + 30, "a checkpoint at the end")
        for name, flags in (("new_edge_ready_from_checkpoint_s", []), ("new_edge_ready_whole_stream_s", ["0"])):
            port = free_port()
            started = time.perf_counter()
            checkpoint = ["--nats-checkpoint", *flags] if flags else []
            edge_b = Process(python_command("kvgateway", *edge, "--port", str(port), *checkpoint), logs / f"{name}.log")
            procs.append(edge_b)
            wait_until(lambda port=port: get_json(f"http://127.0.0.1:{port}/readyz")["ready"], 600, "edge B ready")
            print(json.dumps({name: time.perf_counter() - started, "stream_length": last}))
            edge_b.stop()
    finally:
        for process in reversed(procs):
            process.stop()
        shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
