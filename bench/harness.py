"""The pieces the streaming scenarios assemble: a publisher, a server under test, client fleets.

A *target* is the server under test: kvgateway (``python -m kvgateway serve``) or the naive
bridge (``python -m bench.naive_bridge``), both real processes subscribed to the same
:mod:`bench.publisher`. A *fleet* is a few :mod:`bench.clients` processes holding many
connections between them; a *step* publishes a window of seqs at a fixed rate and checks that
every connection received every batch of it, and how late.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from bench.common import (
    BenchError,
    CpuMeter,
    LogHistogram,
    Process,
    ServeProcess,
    Worker,
    cpu_seconds,
    free_port,
    naive_loop,
    python_command,
    rss_bytes,
    wait_until,
)

TargetKind: TypeAlias = Literal["kvgateway", "naive"]
Transport: TypeAlias = Literal["ws", "sse"]

LATENCY_BOUND = 0.050
"""A step passes when p99 publish-to-client latency is below this (and nothing is missing)."""


def start_publisher(
    payloads: Path, logs: Path, name: str, *, replay: bool = False, streams: int = 1, buffer_steps: int = 10_000
) -> Worker:
    """A publisher on free loopback ports; :func:`endpoint_of` / :func:`replay_of` say where."""
    port = free_port() if streams == 1 else _port_block(streams)
    endpoint = f"tcp://127.0.0.1:{port}"
    command = ["--payloads", str(payloads), "--endpoint", endpoint, "--streams", str(streams)]
    command += ["--buffer-steps", str(buffer_steps)]
    replay_endpoint = None
    if replay:
        replay_port = free_port() if streams == 1 else _port_block(streams)
        replay_endpoint = f"tcp://127.0.0.1:{replay_port}"
        command += ["--replay", replay_endpoint]
    worker = Worker(python_command("bench.publisher", *command), logs / f"{name}.log", name)
    worker.reply(timeout=120)  # {"ready": ...} once the payloads are loaded and the sockets bound
    worker.endpoint = endpoint  # type: ignore[attr-defined]
    worker.replay_endpoint = replay_endpoint  # type: ignore[attr-defined]
    return worker


def _port_block(count: int) -> int:
    from bench.common import free_port_block

    return free_port_block(count)


def endpoint_of(publisher: Worker) -> str:
    return str(publisher.endpoint)  # type: ignore[attr-defined]


def replay_of(publisher: Worker) -> str | None:
    value = publisher.replay_endpoint  # type: ignore[attr-defined]
    return None if value is None else str(value)


@dataclass
class Target:
    kind: TargetKind
    process: Process
    ws_url: str
    sse_url: str | None

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        self.process.stop()


def start_target(kind: TargetKind, publisher: Worker, logs: Path, extra: Sequence[str] = ()) -> Target:
    """The server under test, subscribed to ``publisher`` (waits until the publisher sees it)."""
    if kind == "kvgateway":
        gateway = ServeProcess(logs / "gateway.log", endpoint=endpoint_of(publisher), extra=extra)
        try:
            gateway.wait_ready()
        except BenchError:
            gateway.stop()
            raise
        target = Target(kind, gateway, gateway.ws_url, gateway.sse_url)
    else:
        port = free_port()
        options = ["--loop", naive_loop()]  # the gateway's loop unless --naive-loop said otherwise
        process = Process(
            python_command("bench.naive_bridge", "--endpoint", endpoint_of(publisher), "--port", str(port), *options),
            logs / "naive.log",
        )

        def listening() -> bool:
            process.check_alive("the naive bridge")
            return "listening" in process.log_path.read_text()

        try:
            wait_until(listening, 30, "the naive bridge to listen")
        except BenchError:
            process.stop()
            raise
        target = Target(kind, process, f"ws://127.0.0.1:{port}/", None)
    try:
        publisher.request({"cmd": "wait_subscribers", "timeout": 30}, timeout=40)
    except BenchError:
        target.stop()
        raise
    return target


def client_processes(clients: int) -> int:
    """How many client processes share ``clients`` connections."""
    if clients <= 10:
        return 1
    if clients <= 100:
        return 2
    return 4


@dataclass
class FleetReport:
    connections: int
    open: int
    complete: int
    disorder: int
    notices: int
    close_codes: list[int]
    received: int
    hist: LogHistogram

    @property
    def all_complete(self) -> bool:
        return self.complete == self.connections

    def to_json(self) -> dict[str, Any]:
        return {
            "connections": self.connections,
            "open": self.open,
            "complete": self.complete,
            "received": self.received,
            "disorder": self.disorder,
            "notices": self.notices,
            "close_codes": self.close_codes,
            **self.hist.summary_ms(),
        }


class Fleet:
    """``clients`` connections to ``url`` over ``transport``, spread over a few processes."""

    def __init__(self, url: str, transport: Transport, clients: int, logs: Path, name: str) -> None:
        self.clients = clients
        count = client_processes(clients)
        shares = [clients // count + (1 if i < clients % count else 0) for i in range(count)]
        self.workers: list[Worker] = []
        try:
            for i, share in enumerate(shares):
                command = python_command(
                    "bench.clients", "--url", url, "--transport", transport, "--connections", str(share)
                )
                self.workers.append(Worker(command, logs / f"{name}-clients{i}.log", f"{name} clients {i}"))
            for worker in self.workers:
                ready = worker.reply(timeout=180)
                if ready.get("failed"):
                    raise BenchError(f"{ready['failed']} {transport} connections failed: {ready.get('errors')}")
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        return [worker.pid for worker in self.workers]

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    def window(self, first: int, last: int) -> None:
        for worker in self.workers:
            worker.send({"cmd": "window", "first": first, "last": last})
        for worker in self.workers:
            worker.reply(timeout=30)

    def report(self) -> FleetReport:
        for worker in self.workers:
            worker.send({"cmd": "report"})
        hist = LogHistogram()
        totals = {"connections": 0, "open": 0, "complete": 0, "disorder": 0, "notices": 0, "received": 0}
        codes: set[int] = set()
        for worker in self.workers:
            part = worker.reply(timeout=30)
            for key in totals:
                totals[key] += int(part[key])
            codes.update(part["close_codes"])
            hist.merge(LogHistogram.from_json(part["hist"]))
        return FleetReport(hist=hist, close_codes=sorted(codes), **totals)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


@dataclass
class Step:
    """One offered rate held for a while, and what the clients saw."""

    rate: float
    batches: int
    achieved_rate: float
    ok: bool
    report: FleetReport
    target_cpu: float
    client_cpu: float
    target_rss: int
    drain_seconds: float
    reasons: list[str] = field(default_factory=list)
    attempt: int = 1

    @property
    def deliveries_per_s(self) -> float:
        return self.achieved_rate * self.report.connections if self.ok else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "attempt": self.attempt,
            "batches": self.batches,
            "achieved_rate": round(self.achieved_rate, 1),
            "ok": self.ok,
            "reasons": self.reasons,
            "deliveries_per_s": round(self.deliveries_per_s, 1),
            "target_cpu_cores": round(self.target_cpu, 3),
            "client_cpu_cores": round(self.client_cpu, 3),
            "target_rss_bytes": self.target_rss,
            "drain_seconds": round(self.drain_seconds, 3),
            **self.report.to_json(),
        }


class Stream:
    """A publisher and a target with a fleet on it: runs steps, keeping track of the seqs."""

    def __init__(self, publisher: Worker, target: Target, fleet: Fleet) -> None:
        self.publisher = publisher
        self.target = target
        self.fleet = fleet
        self.next_seq = 0

    def step(self, rate: float, seconds: float, *, drain: float = 2.0, bound: float = LATENCY_BOUND) -> Step:
        count = max(10, math.ceil(rate * seconds))
        first, last = self.next_seq, self.next_seq + count - 1
        self.fleet.window(first, last)
        target_cpu = CpuMeter(self.target.pid)
        client_cpu0 = self.fleet.cpu_seconds()
        target_cpu.start()
        started = time.monotonic()
        self.publisher.send({"cmd": "send", "count": count, "rate": rate})
        sent = self.publisher.reply(timeout=seconds * 4 + 60)
        cores = target_cpu.stop()
        client_cores = (self.fleet.cpu_seconds() - client_cpu0) / max(time.monotonic() - started, 1e-9)
        rss = rss_bytes(self.target.pid)
        self.next_seq = last + 1
        if sent["first_seq"][0] != first:
            raise BenchError(f"publisher at seq {sent['first_seq'][0]}, expected {first}")
        published = time.monotonic()
        deadline = published + drain
        while True:
            report = self.fleet.report()
            if report.all_complete or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        drain_seconds = time.monotonic() - published
        self.target.process.check_alive(self.target.kind)
        reasons: list[str] = []
        if not report.all_complete:
            reasons.append(f"{report.connections - report.complete} of {report.connections} clients incomplete")
        if report.open < report.connections:
            reasons.append(f"{report.connections - report.open} connections closed {report.close_codes}")
        if report.disorder:
            reasons.append(f"{report.disorder} out of order")
        p99 = report.hist.quantile(0.99)
        if p99 is None or p99 >= bound:
            reasons.append(f"p99 {p99 * 1000 if p99 is not None else float('nan'):.1f} ms")
        achieved = (count - 1) / sent["seconds"] if sent["seconds"] > 0 else rate
        return Step(
            rate=rate,
            batches=count,
            achieved_rate=achieved,
            ok=not reasons,
            report=report,
            target_cpu=cores,
            client_cpu=client_cores,
            target_rss=rss,
            drain_seconds=drain_seconds,
            reasons=reasons,
        )

    def warm(self) -> None:
        """A slow step first (connections, caches, the first allocations); every client must get it."""
        warm = self.step(25, 1.0, drain=10, bound=1.0)
        if not warm.report.all_complete:
            raise BenchError(f"warm-up: {'; '.join(warm.reasons)}")

    def settle(self, limit: float = 20.0) -> None:
        """After an overloaded step: wait until the backlog stops arriving, so the next step starts clean."""
        deadline = time.monotonic() + limit
        last_received = -1
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            report = self.fleet.report()
            if report.all_complete or report.open == 0:
                return
            if report.received != last_received:
                last_received = report.received
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > 0.6:
                return
            time.sleep(0.2)


def fanout_step(
    publisher: Worker, target: Target, logs: Path, *, clients: int, rate: float, seconds: float
) -> dict[str, Any]:
    """``clients`` WebSocket clients on ``target``, a warm-up, then one step of ``seconds`` at
    ``rate``: the deliveries per CPU-second of the process serving them (latency reported, not
    judged)."""
    fleet = Fleet(target.ws_url, "ws", clients, logs, f"{target.kind}-ws{clients}")
    try:
        stream = Stream(publisher, target, fleet)
        stream.warm()
        step = stream.step(rate, seconds, drain=10, bound=1.0)
        deliveries = step.achieved_rate * step.report.received / max(step.batches, 1)
        return {
            "complete": step.report.all_complete,
            "reasons": step.reasons,
            "deliveries_per_s": round(deliveries),
            "cpu_cores": round(step.target_cpu, 3),
            "deliveries_per_cpu_second": round(deliveries / step.target_cpu) if step.target_cpu > 0 else None,
            **step.report.hist.summary_ms(),
        }
    finally:
        fleet.stop()
