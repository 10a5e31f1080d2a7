"""Chaos soak of the cluster mode: steady traffic, one fault at a time, then exactness checked.

``python -m bench.chaos [--minutes 30] [--seed 0] [--fault-every 30-60] [--rate 25] [--clients 4]``

Three simulated engines (``kvgateway simulate``: ``alpha``; ``beta`` with two DP ranks; ``gamma``,
which restarts every ``--restart-every`` seconds and stays down 2 s) publish ``--rate`` batches/s
per rank for ``--minutes`` through a real nats-server, two ``kvgateway ingest`` processes (sharing
the streams through leases) and two ``kvgateway edge`` processes. ``--clients`` WebSocket clients
(asyncio, ``websockets``) connect to the edges before the engines start, and on every disconnect
resume on the other edge with their last message id. Every ``--fault-every`` seconds (uniform,
seeded) one fault, the three kinds in shuffled rounds: SIGKILL of an ingest (a new one is
started), SIGKILL of an edge (a new one on the same port), nats-server stopped and started again
on the same store. No fault in the last 20 s of traffic.

When the engines have published everything and both edges show every stream's last batch (or
:data:`SETTLE_SECONDS` have passed: an edge still short of a stream's last batch is a violation,
named with what it shows), the checks (each violation makes the exit code 1):

1. every engine seq was delivered once or counted lost: per stream and engine process, the batches
   and the ``unrecovered_gap`` ranges cover 0..the process's last seq, none twice;
2. every resume was exact: ``recovered: true`` at the client's offset, then offsets +1 per message;
3. every edge's ``GET /v1/blocks`` equals each client's model (:mod:`bench.chaos_view`) at the same
   offset.

Prints one JSON object on stdout and a short summary on stderr; logs stay in a temporary directory
(printed). Needs nats-server on PATH (or /usr/sbin).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import urllib.error
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websockets

from bench.chaos_view import ClientView, compare, edge_blocks
from bench.cluster import _nats_binary
from bench.common import BenchError, Process, free_port, free_port_block, get_json, python_command, seq_of

FAULTS = ("kill_ingest", "kill_edge", "restart_nats")
QUIET_END_SECONDS = 20.0
"""No fault this close to the end of the traffic: the last one has time to heal."""
RESTART_DOWN_SECONDS = 2.0
SETTLE_SECONDS = 120.0


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Engine:
    name: str
    dp_size: int
    restart_at: int | None = None  # the seq after which it restarts (as often as listed)
    restarts: int = 0

    def lasts(self, batches: int) -> list[int]:
        """The last seq of each of its processes, per rank, after ``batches`` batches."""
        if self.restart_at is None or not self.restarts:
            return [batches - 1]
        per = self.restart_at + 1
        return [self.restart_at] * self.restarts + [batches - self.restarts * per - 1]


def _engines(args: argparse.Namespace) -> list[Engine]:
    seconds = args.minutes * 60
    restarts = max(0, int(seconds // args.restart_every) - (1 if seconds % args.restart_every == 0 else 0))
    return [
        Engine("alpha", 1),
        Engine("beta", 2),
        Engine("gamma", 1, restart_at=int(args.rate * args.restart_every) - 1, restarts=restarts),
    ]


@dataclass
class Cluster:
    """The processes under test, each restartable."""

    logs: Path
    engines: list[Engine]
    store: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="chaos-nats-")))
    nats_port: int = field(default_factory=free_port)
    specs: list[str] = field(default_factory=list)
    nats: Process | None = None
    ingests: list[Process] = field(default_factory=list)
    ingest_ports: dict[int, int] = field(default_factory=dict)  # pid -> HTTP port
    edge_ports: list[int] = field(default_factory=list)
    edges: dict[int, Process] = field(default_factory=dict)  # port -> process
    engine_procs: list[Process] = field(default_factory=list)
    started: Counter[str] = field(default_factory=Counter)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    def _log(self, kind: str) -> Path:
        self.started[kind] += 1
        return self.logs / f"{kind}{self.started[kind]}.log"

    def start_nats(self) -> None:
        command = [_nats_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.nats_port), "-sd", str(self.store)]
        self.nats = Process(command, self._log("nats"))

    def start_ingest(self) -> Process:
        port = free_port()
        command = python_command("kvgateway", "ingest", *self.specs, "--nats", self.url, "--port", str(port))
        process = Process([*command, "--log-level", "info"], self._log("ingest"))
        self.ingests.append(process)
        self.ingest_ports[process.pid] = port
        return process

    def start_edge(self, port: int) -> Process:
        command = python_command("kvgateway", "edge", *self.specs, "--nats", self.url, "--port", str(port))
        process = Process([*command, "--log-level", "info"], self._log("edge"))
        self.edges[port] = process
        return process

    def start_engines(self, args: argparse.Namespace, ports: dict[str, tuple[int, int]]) -> None:
        batches = int(args.rate * args.minutes * 60)
        for i, engine in enumerate(self.engines):
            pub, replay = ports[engine.name]
            command = python_command(
                "kvgateway",
                "simulate",
                "--endpoint",
                f"tcp://*:{pub}",
                "--replay-endpoint",
                f"tcp://*:{replay}",
                "--dp-size",
                str(engine.dp_size),
                "--rate",
                str(args.rate),
                "--batches",
                str(batches),
                "--seed",
                str(args.seed * 10 + i),
                "--linger",
                "-1",
                "--cpu-offload",
                "--gpu-blocks",
                "512",
                "--cpu-blocks",
                "1024",
                "--clear-every",
                str(max(1, int(args.rate * 45))),
            )
            if engine.restart_at is not None and engine.restarts:
                for _ in range(engine.restarts):
                    command += ["--restart-at", str(engine.restart_at)]
                command += ["--restart-down", str(RESTART_DOWN_SECONDS)]
            self.engine_procs.append(Process(command, self._log(f"engine-{engine.name}-")))

    def all_processes(self) -> list[Process]:
        return [*self.engine_procs, *self.edges.values(), *self.ingests, *([self.nats] if self.nats else [])]

    def stop(self) -> None:
        for process in self.all_processes():
            process.stop(5)
        shutil.rmtree(self.store, ignore_errors=True)


async def _poll(predicate: Any, within: float, what: str, interval: float = 0.2) -> Any:
    """Await ``predicate()`` (run in a thread: it may do HTTP) until it is truthy."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError, KeyError, TypeError):
            last = await asyncio.to_thread(predicate)
            if last:
                return last
        await asyncio.sleep(interval)
    raise BenchError(f"timed out after {within:g}s waiting for {what} (last: {str(last)[:200]})")


async def _settle(ports: list[int], expected: dict[tuple[str, int], int]) -> dict[int, dict[str, list[int | None]]]:
    """Wait, every edge at once and :data:`SETTLE_SECONDS` in all, until each shows every stream's
    last batch; of each edge that does not, the streams it shows short of it: [shown, last]. (One
    edge after another took twice the bound, past the test's own timeout: a stalled edge was then
    reported by nobody.)"""

    async def short_of(port: int) -> dict[str, list[int | None]]:
        try:
            await _poll(lambda: _last_seqs(port) == expected, SETTLE_SECONDS, f"edge {port} settled")
            return {}
        except BenchError as exc:
            say(str(exc))
        shown: dict[tuple[str, int], int | None] = {}
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError, KeyError, TypeError):
            shown = await asyncio.to_thread(_last_seqs, port)
        return {
            f"{name}[{rank}]": [shown.get((name, rank)), last]
            for (name, rank), last in expected.items()
            if shown.get((name, rank)) != last
        }

    found = await asyncio.gather(*(short_of(port) for port in ports))
    return {port: streams for port, streams in zip(ports, found, strict=True) if streams}


def _healthy(port: int) -> bool:
    return bool(get_json(f"http://127.0.0.1:{port}/healthz", timeout=2)["status"] == "ok")


async def _kill(process: Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGKILL)
    await asyncio.to_thread(process.popen.wait, 10)
    process.stop()  # closes its log


# --- clients ---------------------------------------------------------------------------------


@dataclass
class Client:
    view: ClientView
    urls: list[str]
    at: int  # index into urls of the edge it reads now
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    want: int | None = None  # an offset at which to capture the model
    captured: asyncio.Future[Any] | None = None
    disconnects: Counter[str] = field(default_factory=Counter)
    resume_seconds: list[float] = field(default_factory=list)  # from a disconnect to the next hello

    def _handle(self, line: str) -> None:
        message = json.loads(line)
        self.view.apply(message)
        if self.want is not None and self.view.offset == self.want and self.captured is not None:
            if not self.captured.done():
                self.captured.set_result(self.view.snapshot())
            self.want = None

    async def run(self) -> None:
        dropped: float | None = None
        while True:
            url = self.urls[self.at]
            resume = self.view.last_id if self.view.offset is not None else None
            target = url + (f"?last_event_id={resume}" if resume else "")
            try:
                async with websockets.connect(target, max_size=None, open_timeout=5, ping_interval=None) as ws:
                    frame = await asyncio.wait_for(ws.recv(), 10)
                    lines = str(frame).split("\n")
                    self.view.hello(json.loads(lines[0]), resume, url)
                    if dropped is not None:
                        self.resume_seconds.append(time.monotonic() - dropped)
                        dropped = None
                    for line in lines[1:]:
                        self._handle(line)
                    self.connected.set()
                    async for frame in ws:
                        for line in str(frame).split("\n"):
                            self._handle(line)
                    self.disconnects["closed"] += 1
            except (OSError, TimeoutError, websockets.exceptions.WebSocketException) as exc:
                self.disconnects[type(exc).__name__] += 1
            dropped = time.monotonic() if dropped is None else dropped
            self.at = 1 - self.at  # resume on the other edge
            await asyncio.sleep(0.2)

    async def model_at(self, offset: int, within: float) -> Any:
        """The client's model right after ``offset`` (None if it passed it or never got there)."""
        if self.view.offset == offset:
            return self.view.snapshot()
        if self.view.offset is None or self.view.offset > offset:
            return None
        self.captured = asyncio.get_running_loop().create_future()
        self.want = offset
        try:
            return await asyncio.wait_for(self.captured, within)
        except TimeoutError:
            return None
        finally:
            self.want = None


# --- faults ----------------------------------------------------------------------------------


class Chaos:
    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.log: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self._round: list[str] = []
        self._measuring: list[asyncio.Future[None]] = []

    def next_kind(self) -> str:
        if not self._round:
            self._round = list(FAULTS)
            self.rng.shuffle(self._round)
        return self._round.pop()

    async def inject(self, kind: str, at: float) -> None:
        cluster = self.cluster
        started = time.monotonic()
        entry: dict[str, Any] = {"at_s": round(at, 1), "kind": kind}
        watch = self.rng.choice(cluster.edge_ports)  # an edge that survives this fault
        before = await asyncio.to_thread(_last_seqs, watch)
        if kind == "kill_ingest":
            victim = self.rng.choice(cluster.ingests)
            cluster.ingests.remove(victim)
            await _kill(victim)
            entry["killed"] = victim.log_path.name
            fresh = cluster.start_ingest()
            await _poll(lambda: _healthy(cluster.ingest_ports[fresh.pid]), 60, "the new ingest")
        elif kind == "kill_edge":
            port = next(p for p in cluster.edge_ports if p != watch)
            victim = cluster.edges[port]
            await _kill(victim)
            entry["killed"] = victim.log_path.name
            cluster.start_edge(port)
            await _poll(lambda: _healthy(port), 60, "the new edge")
        else:
            assert cluster.nats is not None
            await asyncio.to_thread(cluster.nats.stop, 10)
            await asyncio.sleep(self.rng.uniform(0.5, 3.0))
            cluster.start_nats()
        entry["healed_s"] = round(time.monotonic() - started, 2)
        self.counts[kind] += 1
        self.log.append(entry)
        self._measuring.append(asyncio.ensure_future(self._flowing(entry, len(self.log), watch, before, started)))

    async def _flowing(
        self, entry: dict[str, Any], number: int, watch: int, before: dict[tuple[str, int], int | None], started: float
    ) -> None:
        """How long until every stream moves on again, as the edge that stayed shows it (measured
        beside the schedule, so that a slow takeover does not delay the next fault)."""
        try:
            await _poll(lambda: _all_moved(before, _last_seqs(watch)), 60, "every stream moving again")
            entry["flowing_s"] = round(time.monotonic() - started, 2)
        except BenchError:
            entry["flowing_s"] = None
        say(
            f"fault {number}: {entry['kind']} at {entry['at_s']:.0f}s ({entry.get('killed', 'nats-server')}), "
            f"healed in {entry['healed_s']}s, every stream moving after {entry['flowing_s']}s"
        )

    async def run(self, t0: float, until: float, every: tuple[float, float]) -> None:
        """Faults at seeded times from ``t0`` (each after the one before has healed) up to ``until``."""
        at = 0.0
        while True:
            at += self.rng.uniform(*every)
            if at > until:
                break
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            await self.inject(self.next_kind(), time.monotonic() - t0)
        await asyncio.gather(*self._measuring)


# --- the run ---------------------------------------------------------------------------------


def _last_seqs(port: int) -> dict[tuple[str, int], int | None]:
    sources = get_json(f"http://127.0.0.1:{port}/v1/sources")["sources"]
    return {(s["source"], s["dp_rank"]): seq_of(s["last_seq"]) for s in sources}


def _all_moved(before: dict[tuple[str, int], int | None], now: dict[tuple[str, int], int | None]) -> bool:
    return all(now.get(stream) != seq for stream, seq in before.items())


async def _index_checks(clients: list[Client], ports: list[int]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each edge's index against each client's model at a common offset."""
    results, violations = [], []
    for port in ports:
        for client in clients:
            outcome: dict[str, Any] = {"edge": port, "client": client.view.name}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                document = await asyncio.to_thread(get_json, f"http://127.0.0.1:{port}/v1/blocks", 30)
                model = await client.model_at(document["offset"], 15)
                if model is None:
                    await asyncio.sleep(0.1)
                    continue
                theirs = edge_blocks(document)
                differences = compare(model, theirs)
                outcome.update(
                    offset=document["offset"],
                    blocks=sum(len(b) for b in theirs[0].values()),
                    equal=not differences,
                    differences=differences[:10],
                )
                violations += [f"edge {port} vs {client.view.name} at {document['offset']}: {d}" for d in differences]
                break
            else:
                outcome["equal"] = False
                violations.append(f"edge {port} vs {client.view.name}: never at a common offset within 60 s")
            results.append(outcome)
    return results, violations


def _deliveries(client: Client, engines: list[Engine], batches: int) -> tuple[dict[str, Any], list[str]]:
    """Check 1 for one client: once-or-lost per stream and engine process, over 0..the last seq
    the process's stream shows (the gateway's promise). Beyond it, an engine process that was
    restarted may have published batches no consumer could see (queued when it closed its sockets,
    or published while its stream was unread and gone with the process before a takeover): counted
    as ``unseen``. The last process lingers, holding every batch: its whole run must be there."""
    out: dict[str, Any] = {}
    violations = []
    for engine in engines:
        lasts = engine.lasts(batches)
        for rank in range(engine.dp_size):
            stream = (engine.name, rank)
            processes = client.view.processes.get(stream, [])
            name = f"{client.view.name} {engine.name}[{rank}]"
            if len(processes) != len(lasts):
                violations.append(f"{name}: {len(processes)} engine processes seen, {len(lasts)} ran")
            unseen: list[tuple[int, int, int]] = []  # process, first, last
            for i, process in enumerate(processes):
                violations += [f"{name} process {i}: {p}" for p in process.problems(None)]
                if len(processes) != len(lasts):
                    continue
                top, last = process.top, lasts[i]
                if top > last:
                    violations.append(f"{name} process {i}: seq {top} beyond its last, {last}")
                elif top < last and i == len(lasts) - 1:
                    violations.append(f"{name} process {i}: seqs {top + 1}..{last} never came (the engine holds them)")
                elif top < last:
                    unseen.append((i, top + 1, last))
            out[f"{engine.name}[{rank}]"] = {
                "processes": len(processes),
                "batches": sum(len(p.seqs) for p in processes),
                "lost": sum(until - first + 1 for p in processes for first, until, _ in p.gaps),
                "unseen": sum(last - first + 1 for _, first, last in unseen),
                "unseen_ranges": unseen,
            }
    return out, violations


async def soak(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    engines = _engines(args)
    cluster = Cluster(logs, engines)
    ports: dict[str, tuple[int, int]] = {}
    for engine in engines:
        base = free_port_block(2 * engine.dp_size)
        ports[engine.name] = (base, base + engine.dp_size)
        spec = f"name={engine.name},endpoint=tcp://127.0.0.1:{base},replay=tcp://127.0.0.1:{base + engine.dp_size}"
        cluster.specs += ["--source", f"{spec},dp_size={engine.dp_size},topic=kv-events"]
    rng = random.Random(args.seed)
    chaos = Chaos(cluster, rng)
    tasks: list[asyncio.Task[None]] = []
    try:
        cluster.start_nats()
        for _ in range(2):
            cluster.start_ingest()
        for process in cluster.ingests:
            await _poll(lambda p=process: _healthy(cluster.ingest_ports[p.pid]), 60, "an ingest")  # type: ignore[misc]
        cluster.edge_ports = [free_port(), free_port()]
        for port in cluster.edge_ports:
            cluster.start_edge(port)
        for port in cluster.edge_ports:
            await _poll(lambda p=port: _healthy(p), 60, "an edge")  # type: ignore[misc]
        urls = [f"ws://127.0.0.1:{port}/v1/ws" for port in cluster.edge_ports]
        clients = [Client(ClientView(f"client{i}"), urls, i % 2) for i in range(args.clients)]
        tasks = [asyncio.ensure_future(client.run()) for client in clients]
        for client in clients:
            await asyncio.wait_for(client.connected.wait(), 30)
        say(f"cluster up (logs in {logs}); engines start: {args.rate:g} batches/s per rank for {args.minutes:g} min")
        t0 = time.monotonic()
        cluster.start_engines(args, ports)
        traffic = args.minutes * 60 + RESTART_DOWN_SECONDS * engines[2].restarts
        await chaos.run(t0, traffic - QUIET_END_SECONDS, args.fault_every)
        await asyncio.sleep(max(0.0, t0 + traffic - time.monotonic()))
        batches = int(args.rate * args.minutes * 60)
        expected = {(e.name, r): e.lasts(batches)[-1] for e in engines for r in range(e.dp_size)}
        say("traffic over; waiting for every edge to show each stream's last batch")
        unsettled = await _settle(cluster.edge_ports, expected)
        await asyncio.sleep(2.0)
        index_results, index_violations = await _index_checks(clients, cluster.edge_ports)
        violations: list[str] = [
            f"edge {port} never showed {stream}'s last batch within {SETTLE_SECONDS:g}s: "
            f"it shows seq {shown}, the engine's last {last}"
            for port, streams in unsettled.items()
            for stream, (shown, last) in streams.items()
        ]
        deliveries = {}
        for client in clients:
            accounted, problems = _deliveries(client, engines, batches)
            deliveries[client.view.name] = accounted
            violations += problems + client.view.violations
        violations += index_violations
        first = clients[0].view
        resumes = sum(c.view.counts["resumes"] for c in clients)
        return {
            "minutes": args.minutes,
            "seed": args.seed,
            "rate_per_rank": args.rate,
            "fault_every_s": list(args.fault_every),
            "faults": {kind: chaos.counts[kind] for kind in FAULTS},
            "fault_log": chaos.log,
            "engine_batches_per_rank": batches,
            "engine_processes": {e.name: len(e.lasts(batches)) for e in engines},
            "clients": args.clients,
            "resumes": resumes,
            "resumes_recovered": resumes - sum(c.view.counts["resumes_not_recovered"] for c in clients),
            "resume_seconds_max": round(max((t for c in clients for t in c.resume_seconds), default=0.0), 2),
            "disconnects": dict(sum((c.disconnects for c in clients), Counter())),
            "batches_received": {c.view.name: c.view.counts["batches"] for c in clients},
            "messages_by_kind": {k: v for k, v in first.counts.items() if k.startswith(("notice_", "batches"))},
            "losses_by_reason": dict(first.losses),
            "unseen": sum(stream["unseen"] for stream in deliveries[first.name].values()),
            "restarts_by_reason": dict(first.restarts),
            "stale_by_reason": dict(first.stale_notices),
            "deliveries": deliveries,
            "index_checks": index_results,
            "unsettled": {str(port): streams for port, streams in unsettled.items()},
            "violations": violations[:200],
            "violation_count": len(violations),
            "ok": not violations,
            "logs": str(logs),
            "load_average": os.getloadavg(),
        }
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(cluster.stop)


def _span(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    try:
        span = (float(low), float(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A-B seconds, got {text!r}") from None
    if not 0 < span[0] <= span[1]:
        raise argparse.ArgumentTypeError(f"expected 0 < A <= B, got {text!r}")
    return span


def summary(result: dict[str, Any]) -> str:
    faults = ", ".join(f"{kind} {n}" for kind, n in result["faults"].items())
    losses = ", ".join(f"{k} {v}" for k, v in result["losses_by_reason"].items()) or "none"
    equal = sum(1 for check in result["index_checks"] if check.get("equal"))
    lines = [
        f"chaos soak: {result['minutes']:g} min, seed {result['seed']}: {'OK' if result['ok'] else 'VIOLATIONS'}",
        f"  faults: {faults}",
        f"  resumes: {result['resumes']} ({result['resumes_recovered']} recovered); batches per client: "
        f"{sorted(set(result['batches_received'].values()))}; lost: {losses}; unseen: {result['unseen']}",
        f"  index checks: {equal} of {len(result['index_checks'])} equal",
    ]
    lines += [f"  ! {v}" for v in result["violations"][:20]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="minutes of engine traffic (default 30)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the faults and the workloads (default 0)")
    parser.add_argument("--fault-every", type=_span, default=(30.0, 60.0), help="A-B seconds between faults (30-60)")
    parser.add_argument("--rate", type=float, default=25.0, help="batches/s per engine rank (default 25)")
    parser.add_argument("--restart-every", type=float, default=90.0, help="gamma restarts this often, s (90)")
    parser.add_argument("--clients", type=int, default=4, help="WebSocket clients (default 4)")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0 or args.clients < 1 or args.restart_every <= 0:
        parser.error("--minutes, --rate, --restart-every and --clients must be positive")
    logs = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    try:
        result = asyncio.run(soak(args, logs))
    except BenchError as exc:
        print(f"chaos soak failed: {exc} (logs in {logs})", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    print(summary(result), file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
