"""The soak run: ``python -m bench.soak [--minutes 30]`` (``make soak``). Not part of CI.

A real ``kvgateway serve`` runs for ``--minutes`` at a steady rate from real ``kvgateway
simulate`` engines while this process keeps it busy the way production does:

* engine ``a`` (two DP ranks) restarts in-process every ``--restart-batches`` batches (seq back to
  0, empty replay buffer); engine ``b`` is killed with SIGKILL every ``--kill-seconds`` and started
  again on the same ports, so the gateway sees the stream go down, come up and restart;
* ``--readers`` WebSocket clients read everything for the whole run; each checks that the offsets
  it receives are contiguous (no loss, no duplicate, no reordering);
* client churn: about ``--churn`` connections a second, WebSocket and SSE, some filtered, read
  for 1 to 8 s and leave, cleanly or abruptly; a third of them come back a moment later with
  their last id and must be recovered exactly where they left (first offset = last one + 1);
* now and then a client that never reads, which the gateway must cut.

Every ``--sample-seconds`` it samples the gateway process: resident memory (VmRSS), open file
descriptors (/proc/PID/fd, minus the connected clients, which come and go with the churn), OS
threads and CPU time, plus the gateway's own metrics (``kvgateway_asyncio_tasks`` among them);
descriptors and memory are what a task leak would show (each task here owns a connection or a
buffer).

At the end the run must be *flat*: after a warm-up, the median of the last third of the samples is
compared with the median of the first third (RSS within ``--rss-tolerance`` or ``--rss-slack-mib``,
descriptors within ``--fd-slack``, threads constant) and no client may have seen a gap, a
duplicate or a failed resume. The figures go to ``bench/results/soak/<time>/`` and, with
``--report``, into the "Soak" section of docs/performance.md. Exit status 0 when everything held.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import websockets
from prometheus_client.parser import text_string_to_metric_families

from bench.bounded import BOUNDED, bounded_report, filled_at, size_of

REPO: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = REPO / "bench" / "results" / "soak"
PERFORMANCE_DOC: Final = REPO / "docs" / "performance.md"
SECTION: Final = "## Soak"

REPORTED_ONLY: Final = "(reported only)"
_OFFSET = re.compile(rb'"offset":(\d+)')
_CLK_TCK: Final = os.sysconf("SC_CLK_TCK")


# --- processes ------------------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


class Process:
    """``python -m kvgateway ARGS`` with its output in a file (a pipe nobody reads would block it)."""

    def __init__(self, name: str, args: list[str], logs: Path) -> None:
        self.name = name
        self.args = args
        self.log_path = logs / f"{name}.log"
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        handle = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "kvgateway", *self.args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        handle.close()
        self.starts += 1

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.popen is not None
            self.popen.kill()
            self.popen.wait(10)

    def stop(self) -> int | None:
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def proc_sample(pid: int) -> dict[str, float]:
    """RSS (MiB), descriptors, threads and CPU seconds of one process, from /proc."""
    status = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            status[name] = rest.split()
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return {
        "rss_mib": int(status["VmRSS"][0]) / 1024,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(status["Threads"][0]),
        "cpu_s": (int(fields[11]) + int(fields[12])) / _CLK_TCK,
    }


def scrape(base: str) -> dict[str, float]:
    """The gateway's metrics, summed over labels (``name{label=value}`` for the few split ones)."""
    text = httpx.get(f"{base}/metrics", timeout=10, trust_env=False).text
    out: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if not name.startswith("kvgateway_") or name.endswith(("_bucket", "_sum", "_count")):
                continue
            out[name] += sample.value
            reason = sample.labels.get("reason") or sample.labels.get("outcome")
            if reason is not None:
                out[f"{name}{{{reason}}}"] += sample.value
            if name == "kvgateway_publisher_restarts_total":
                out[f"{name}{{{sample.labels['source']}}}"] += sample.value
    return dict(out)


# --- clients ---------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the clients saw: counts, and every violation of the protocol's guarantees."""

    opened: Counter[str] = field(default_factory=Counter)
    messages: int = 0
    resumes: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def violation(self, text: str) -> None:
        if len(self.violations) < 50:
            self.violations.append(text)
        else:
            self.violations[-1] = f"... and more (last: {text})"


class Follower:
    """Checks one connection's offsets: contiguous (unfiltered) or increasing (filtered)."""

    def __init__(self, tally: Tally, label: str, *, contiguous: bool) -> None:
        self.tally = tally
        self.label = label
        self.contiguous = contiguous
        self.epoch: str | None = None
        self.offset: int | None = None
        self.count = 0

    def hello(self, data: bytes, resumed_from: int | None) -> None:
        hello = json.loads(data)
        if hello.get("type") != "hello":
            self.tally.violation(f"{self.label}: first message is not a hello: {data[:100]!r}")
            return
        if resumed_from is not None:
            outcome = "recovered" if hello["recovered"] else "not recovered"
            self.tally.resumes[outcome] += 1
            if hello["recovered"] and hello["offset"] != resumed_from:
                self.tally.violation(f"{self.label}: resumed at {hello['offset']}, asked {resumed_from}")
        self.epoch = hello["epoch"]
        self.offset = hello["offset"]

    def line(self, data: bytes) -> None:
        match = _OFFSET.search(data)
        if match is None:
            if b'"slow_consumer"' not in data:
                self.tally.violation(f"{self.label}: message without an offset: {data[:100]!r}")
            return
        offset = int(match.group(1))
        self.tally.messages += 1
        self.count += 1
        previous = self.offset
        self.offset = offset
        if previous is None:
            return
        if self.contiguous and offset != previous + 1:
            self.tally.violation(f"{self.label}: offset {offset} after {previous}")
        elif offset <= previous:
            self.tally.violation(f"{self.label}: offset {offset} after {previous} (not increasing)")

    @property
    def last_id(self) -> str | None:
        return None if self.epoch is None or self.offset is None else f"{self.epoch}:{self.offset}"


async def ws_session(
    url: str, follower: Follower, *, seconds: float | None, abrupt: bool, resumed_from: int | None, stop: asyncio.Event
) -> None:
    async with websockets.connect(url, max_size=None, open_timeout=10, proxy=None) as ws:
        first = True
        deadline = None if seconds is None else time.monotonic() + seconds
        while not stop.is_set():
            timeout = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if timeout <= 0:
                break
            try:
                frame = await asyncio.wait_for(ws.recv(), timeout)
            except TimeoutError:
                continue
            data = frame.encode() if isinstance(frame, str) else frame
            for line in data.split(b"\n"):
                if first:
                    follower.hello(line, resumed_from)
                    first = False
                else:
                    follower.line(line)
        if abrupt:
            ws.transport.abort()


async def sse_session(
    base: str, query: str, follower: Follower, *, seconds: float, resumed_from: int | None, stop: asyncio.Event
) -> None:
    headers = {} if follower.last_id is None else {"Last-Event-ID": follower.last_id}
    async with (
        httpx.AsyncClient(base_url=base, timeout=10, trust_env=False) as client,
        client.stream("GET", "/v1/events" + query, headers=headers) as response,
    ):
        if response.status_code != 200:
            follower.tally.refused[f"sse {response.status_code}"] += 1
            return
        first = True
        deadline = time.monotonic() + seconds
        lines = response.aiter_lines()
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                line = await asyncio.wait_for(anext(lines), max(0.01, deadline - time.monotonic()))
            except (TimeoutError, StopAsyncIteration):
                break
            if not line.startswith("data: "):
                continue
            data = line[6:].encode()
            if first:
                follower.hello(data, resumed_from)
                first = False
            else:
                follower.line(data)


async def churn_client(base: str, ws_base: str, tally: Tally, rng: random.Random, stop: asyncio.Event) -> None:
    """One short-lived client; a third of them come back with their last id."""
    transport = rng.choice(["ws", "ws", "sse"])
    filtered = rng.random() < 0.3
    query = "?source=a" if filtered else ""
    label = f"churn {transport}{' filtered' if filtered else ''}"
    follower = Follower(tally, label, contiguous=not filtered)
    resume = rng.random() < 0.34
    for attempt in range(2 if resume else 1):
        resumed_from = None if attempt == 0 else follower.offset
        seconds = rng.uniform(1, 8)
        tally.opened[transport] += 1
        try:
            if transport == "ws":
                sep = "&" if query else "?"
                url = ws_base + query + (f"{sep}last_event_id={follower.last_id}" if attempt else "")
                abrupt = rng.random() < 0.5
                await ws_session(url, follower, seconds=seconds, abrupt=abrupt, resumed_from=resumed_from, stop=stop)
            else:
                await sse_session(base, query, follower, seconds=seconds, resumed_from=resumed_from, stop=stop)
        except websockets.exceptions.InvalidStatus as exc:
            tally.refused[f"ws {exc.response.status_code}"] += 1
            return
        except (OSError, websockets.exceptions.ConnectionClosed, httpx.HTTPError) as exc:
            tally.refused[type(exc).__name__] += 1
            return
        if attempt == 0 and resume:
            await asyncio.sleep(rng.uniform(0.2, 2.0))  # away for a moment: well inside the ring


async def never_reader(port: int, tally: Tally, stop: asyncio.Event) -> None:
    """A WebSocket client that never reads; the gateway must cut it (slow consumer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        key = "dGhlIHNhbXBsZSBub25jZQ=="
        request = (
            f"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        await loop.sock_sendall(sock, request.encode())
        tally.opened["never reading"] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 30)
    finally:
        sock.close()


async def drive_clients(
    urls: tuple[str, str, int], args: argparse.Namespace, tally: Tally, stop: asyncio.Event
) -> list[Follower]:
    """Steady readers, churn and never-reading clients until ``stop``; returns the readers."""
    base, ws_base, port = urls
    rng = random.Random(args.seed)
    readers = [Follower(tally, f"reader {i}", contiguous=True) for i in range(args.readers)]
    tasks: set[asyncio.Task[None]] = set()

    async def read_forever(follower: Follower) -> None:
        tally.opened["ws"] += 1
        try:
            await ws_session(ws_base, follower, seconds=None, abrupt=False, resumed_from=None, stop=stop)
        except Exception as exc:
            tally.violation(f"{follower.label} lost its connection: {exc!r}")

    for follower in readers:
        tasks.add(asyncio.ensure_future(read_forever(follower)))
    next_never_reader = time.monotonic() + 30
    while not stop.is_set():
        for _ in range(int(args.churn) + (rng.random() < args.churn % 1)):
            task = asyncio.ensure_future(churn_client(base, ws_base, tally, rng, stop))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if time.monotonic() > next_never_reader:
            next_never_reader = time.monotonic() + 60
            task = asyncio.ensure_future(never_reader(port, tally, stop))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    await asyncio.gather(*tasks, return_exceptions=True)
    return readers


# --- the run -----------------------------------------------------------------------------------------


@dataclass
class Sample:
    t: float
    rss_mib: float
    fds: int
    threads: int
    cpu_s: float
    clients: int
    metrics: dict[str, float]

    @property
    def fds_net(self) -> int:
        """Descriptors minus connected clients: what a leak would make grow."""
        return self.fds - self.clients


async def sampler(gateway: Process, base: str, every: float, samples: list[Sample], stop: asyncio.Event) -> None:
    started = time.monotonic()
    while not stop.is_set():
        try:
            metrics = await asyncio.to_thread(scrape, base)
            process = proc_sample(gateway.pid)
            clients = int(metrics.get("kvgateway_clients", 0))
            samples.append(
                Sample(
                    t=round(time.monotonic() - started, 2),
                    rss_mib=round(process["rss_mib"], 2),
                    fds=int(process["fds"]),
                    threads=int(process["threads"]),
                    cpu_s=process["cpu_s"],
                    clients=clients,
                    metrics=metrics,
                )
            )
        except (OSError, httpx.HTTPError) as exc:
            print(f"soak: sample failed: {exc!r}", file=sys.stderr)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


async def killer(engine: Process, every: float, stop: asyncio.Event, kills: list[float]) -> None:
    """SIGKILL the engine every ``every`` seconds and start it again on the same ports."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        if stop.is_set():
            return
        engine.kill()
        kills.append(time.monotonic())
        await asyncio.sleep(1.0)
        engine.start()


async def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    http, pub_b, rep_b = free_ports(3)
    pub_a, rep_a = _port_pair(avoid={http, pub_b, rep_b})  # engine a: two DP ranks, consecutive ports
    duration = args.minutes * 60
    batches = int(args.rate * (duration + 120))
    restarts_a = ["--restart-at", str(args.restart_batches - 1)] * (batches // args.restart_batches + 1)
    engine_a = Process(
        "engine-a",
        [
            *("simulate", "--endpoint", f"tcp://*:{pub_a}", "--replay-endpoint", f"tcp://*:{rep_a}"),
            *("--dp-size", "2", "--rate", str(args.rate), "--seed", "1", "--cpu-offload", *restarts_a),
        ],
        out,
    )
    engine_b = Process(
        "engine-b",
        [
            *("simulate", "--endpoint", f"tcp://*:{pub_b}", "--replay-endpoint", f"tcp://*:{rep_b}"),
            *("--rate", str(args.rate), "--seed", "2"),
        ],
        out,
    )
    gateway = Process(
        "gateway",
        [
            *("serve", "--host", "127.0.0.1", "--port", str(http)),
            *("--source", f"name=a,endpoint=tcp://127.0.0.1:{pub_a},replay=tcp://127.0.0.1:{rep_a},dp_size=2"),
            *("--source", f"name=b,endpoint=tcp://127.0.0.1:{pub_b},replay=tcp://127.0.0.1:{rep_b}"),
        ],
        out,
    )
    base, ws_base = f"http://127.0.0.1:{http}", f"ws://127.0.0.1:{http}/v1/ws"
    samples: list[Sample] = []
    kills: list[float] = []
    tally = Tally()
    stop = asyncio.Event()
    processes = [engine_a, engine_b, gateway]
    started = time.time()
    try:
        for process in processes:
            process.start()
        await _wait_ready(base, gateway)
        tasks = [
            asyncio.ensure_future(sampler(gateway, base, args.sample_seconds, samples, stop)),
            asyncio.ensure_future(killer(engine_b, args.kill_seconds, stop, kills)),
        ]
        clients = asyncio.ensure_future(drive_clients((base, ws_base, http), args, tally, stop))
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            await asyncio.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
            if not gateway.alive():
                tally.violation(f"the gateway died (exit {gateway.popen.returncode if gateway.popen else None})")
                break
            if samples:
                last = samples[-1]
                print(
                    f"soak: {last.t:7.0f} s  RSS {last.rss_mib:6.1f} MiB  fds {last.fds:4d}  threads {last.threads:3d}"
                    f"  clients {last.clients:3d}  violations {len(tally.violations)}",
                    flush=True,
                )
        stop.set()
        readers = await clients
        await asyncio.gather(*tasks)
        final = await asyncio.to_thread(scrape, base)
    finally:
        stop.set()
        codes = {p.name: p.stop() for p in reversed(processes)}
    log = gateway.log()
    return {
        "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
        "minutes_requested": args.minutes,
        "seconds_run": round(time.time() - started, 1),
        "settings": {k: v for k, v in vars(args).items() if k not in ("report", "render")},
        "machine": {"cpus": os.cpu_count(), "load_at_end": os.getloadavg()[0]},
        "samples": [asdict(s) | {"fds_net": s.fds_net} for s in samples],
        "tally": {
            "opened": dict(tally.opened),
            "messages": tally.messages,
            "resumes": dict(tally.resumes),
            "refused": dict(tally.refused),
            "violations": tally.violations,
            "reader_messages_min": min((r.count for r in readers), default=0),
        },
        "engine_b_kills": len(kills),
        "final_metrics": final,
        "exit_codes": codes,
        "log_tracebacks": log.count("Traceback"),
        "log_errors": sum(1 for line in log.splitlines() if " ERROR " in line),
    }


def _port_pair(avoid: set[int]) -> tuple[int, int]:
    """Two blocks of two consecutive free ports (engine a's PUB and replay ranks)."""
    for _ in range(100):
        base, replay = free_ports(2)
        taken = {base, base + 1, replay, replay + 1}
        if abs(base - replay) < 2 or max(base, replay) > 65000 or taken & avoid:
            continue
        try:
            for port in (base + 1, replay + 1):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base, replay
    raise RuntimeError("no free port pairs")


async def _wait_ready(base: str, gateway: Process) -> None:
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(timeout=2, trust_env=False) as client:
        while time.monotonic() < deadline:
            if not gateway.alive():
                raise RuntimeError(f"the gateway exited:\n{gateway.log()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{base}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError("the gateway did not become ready within 60 s")


# --- verdict and report -----------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    first: float
    last: float
    limit: str
    ok: bool


def thirds(values: list[float]) -> tuple[float, float]:
    third = max(1, len(values) // 3)
    return statistics.median(values[:third]), statistics.median(values[-third:])


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    if len(points) < 3:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den * 3600


def warm_up(result: dict[str, Any]) -> tuple[float, list[str]]:
    """The warm-up: until every bounded structure is full or settled, and at least 10% of the run
    (60 s at least); the structures that never were (the run is too short to judge them)."""
    samples = result["samples"]
    warm = max(60.0, result["seconds_run"] * 0.1)
    filling = []
    for structure in BOUNDED:
        if not any(size_of(s, structure.size) is not None for s in samples):
            continue  # not reported by this gateway
        at = filled_at(samples, structure)
        if at is None:
            filling.append(structure.name)
        else:
            warm = max(warm, at)
    return warm, filling


def verdict(result: dict[str, Any], args: argparse.Namespace) -> tuple[list[Check], list[str]]:
    samples = result["samples"]
    warm, filling = warm_up(result)
    result["warmup_seconds"] = warm
    result["still_filling"] = filling
    steady = [s for s in samples if s["t"] >= warm]
    problems: list[str] = []
    checks: list[Check] = []
    if len(steady) < 6:
        problems.append(f"only {len(steady)} samples after the {warm:.0f} s warm-up: run longer")
        return checks, problems
    result["bounded"] = bounded_report(steady)
    rss_first, rss_last = thirds([s["rss_mib"] for s in steady])
    rss_ok = rss_last <= rss_first * (1 + args.rss_tolerance) or rss_last - rss_first <= args.rss_slack_mib
    limit = f"+{args.rss_tolerance:.0%} or +{args.rss_slack_mib:g} MiB"
    checks.append(Check("RSS (MiB)", rss_first, rss_last, limit, rss_ok))
    fd_first, fd_last = thirds([float(s["fds_net"]) for s in steady])
    checks.append(
        Check("descriptors - clients", fd_first, fd_last, f"+{args.fd_slack}", fd_last - fd_first <= args.fd_slack)
    )
    threads = [s["threads"] for s in steady]
    th_first, th_last = thirds([float(t) for t in threads])
    checks.append(Check("OS threads", th_first, th_last, "max - min <= 2", max(threads) - min(threads) <= 2))
    cpu = [(b["cpu_s"] - a["cpu_s"]) / max(1e-9, b["t"] - a["t"]) * 100 for a, b in itertools.pairwise(steady)]
    cpu_first, cpu_last = thirds(cpu)
    checks.append(Check("CPU (% of a core)", cpu_first, cpu_last, REPORTED_ONLY, True))
    for check in checks:
        if not check.ok:
            problems.append(f"{check.name}: {check.first:.1f} -> {check.last:.1f} (limit {check.limit})")
    if not rss_ok:
        grown = [
            f"{b['name']} {b['start']:,.0f} -> {b['end']:,.0f}" for b in result["bounded"] if b["end"] > b["start"]
        ]

        if grown:
            problems.append("bounded structures grew in the steady part too: " + ", ".join(grown))
    tally = result["tally"]
    if tally["violations"]:
        problems.append(f"{len(tally['violations'])} protocol violations seen by clients: {tally['violations'][:3]}")
    if tally.get("reader_messages_min", 1) == 0:
        problems.append("a steady reader received nothing")
    if tally["resumes"].get("not recovered", 0):
        problems.append(f"{tally['resumes']['not recovered']} resumes inside the ring were not recovered")
    if result["log_tracebacks"]:
        problems.append(f"{result['log_tracebacks']} tracebacks in the gateway's log")
    restarts_b = int(result["final_metrics"].get("kvgateway_publisher_restarts_total{b}", 0))
    if restarts_b != result["engine_b_kills"]:
        problems.append(f"engine b was killed {result['engine_b_kills']} times, {restarts_b} restarts counted")
    if result["exit_codes"].get("gateway") != 0:
        problems.append(f"the gateway exited with {result['exit_codes'].get('gateway')}")
    result["rss_slope_mib_per_hour"] = round(slope_per_hour([(s["t"], s["rss_mib"]) for s in steady]), 2)
    return checks, problems


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def render(result: dict[str, Any], checks: list[Check], problems: list[str]) -> str:
    m = result["final_metrics"]
    tally = result["tally"]
    minutes = result["seconds_run"] / 60
    settings = result["settings"]
    rows = "\n".join(
        f"| {c.name} | {c.first:.1f} | {c.last:.1f} | {c.limit} | "
        f"{'' if c.limit == REPORTED_ONLY else '**yes**' if c.ok else '**NO**'} |"
        for c in checks
    )
    opened = tally["opened"]
    short = ", a validation run, not the 30-minute default" if result["minutes_requested"] < 30 else ""
    defaults = vars(parse_args([]))
    changed = [f"--{k.replace('_', '-')} {v:g}" for k, v in settings.items() if k in defaults and v != defaults[k]]
    changed = [c for c in changed if not c.startswith(("--minutes", "--report"))]
    flags = "settings: " + (", ".join(f"`{c}`" for c in changed) if changed else "the defaults")
    ring_messages = int(m.get("kvgateway_ring_messages", 0))
    ring_mib = m.get("kvgateway_ring_bytes", 0) / 2**20
    opened_line = f"{opened.get('ws', 0):,} / {opened.get('sse', 0):,} / {opened.get('never reading', 0)}"
    restarts_a = int(m.get("kvgateway_publisher_restarts_total{a}", 0))
    restarts_b = int(m.get("kvgateway_publisher_restarts_total{b}", 0))
    verdict_line = "**flat: yes**" if not problems else "**flat: NO** — " + "; ".join(problems)
    bounded = "\n".join(
        f"| {b['name']} | {b['start']:,.0f} | {b['end']:,.0f} | {_number(b['bound_end'])} |"
        for b in result.get("bounded", [])
    )
    filling = result.get("still_filling") or []
    filling_line = f"\nNever full nor settled in this run (judged anyway): {', '.join(filling)}." if filling else ""
    return f"""{SECTION}

`make soak` (`python -m bench.soak --minutes 30`) keeps one gateway busy for half an hour the way
production does, and checks that nothing grows: not part of CI. Three streams from two engines
(`kvgateway simulate`: engine `a` with two DP ranks restarting in-process every
{settings["restart_batches"]:,} batches, engine `b` killed with SIGKILL every {settings["kill_seconds"]:g} s and
started again on the same ports) at {settings["rate"]:g} batches/s per stream; {settings["readers"]} WebSocket
readers for the whole run, each checking that its offsets are contiguous; client churn of about
{settings["churn"]:g} connections a second (WebSocket and SSE, 30% filtered, half of the WebSocket ones
dropped abruptly, a third coming back with their last id and required to be recovered exactly
where they left); and once a minute a client that never reads, which must be cut.

Every {settings["sample_seconds"]:g} s the gateway process is sampled: VmRSS, open descriptors (minus the
connected clients, which come and go), OS threads, CPU time, and its metrics. The warm-up lasts
until every bounded structure (the resume ring, the learned token chains, the cache analytics'
tables, the history) is full, or has settled (grown by at most 2% in 2 minutes), and at least the
first 10% of the run (60 s at least); then the median of the last third of the samples is
compared with the median of the first third, and each bounded structure's size at the start and
the end of that steady part is reported beside its bound, so a bounded fill is told apart from a
leak. The gateway also exposes its asyncio task count (`kvgateway_asyncio_tasks`, about two per
stream and two per client, read with the other metrics); the verdict rests on descriptors, memory
and threads, since every task belongs to a connection, a replay or a stream and a task leak shows
there too.

### Latest run

_{result["started"]}: **{minutes:.1f} minutes actually run** (`--minutes {result["minutes_requested"]:g}`{short}),
{flags}; {result["machine"]["cpus"]} CPUs shared with other work (load average
{result["machine"]["load_at_end"]:.1f} at the end); {len(result["samples"])} samples, the first
{result["warmup_seconds"]:.0f} s as warm-up (every bounded structure full or settled)._

| after warm-up | first third (median) | last third (median) | limit | flat |
| --- | --- | --- | --- | --- |
{rows}

| bounded structure | at the start of the steady part | at its end | bound at its end |
| --- | --- | --- | --- |
{bounded}
{filling_line}

RSS trend over the steady part: {result["rss_slope_mib_per_hour"]:+.1f} MiB/hour (least squares; on a short run
this is mostly noise). Most of the resident memory is the resume ring at its default bounds
(10,000 messages or 64 MiB of JSON): {ring_messages:,} messages, {ring_mib:.1f} MiB at the end.
{verdict_line}.

| traffic | |
| --- | --- |
| batches received by the gateway | {int(m.get("kvgateway_batches_received_total", 0)):,} |
| messages written to clients | {int(m.get("kvgateway_messages_sent_total", 0)):,} |
| connections opened (WebSocket / SSE / never reading) | {opened_line} |
| resumes: recovered / not | {tally["resumes"].get("recovered", 0):,} / {tally["resumes"].get("not recovered", 0)} |
| clients cut as slow consumers | {int(m.get("kvgateway_client_disconnects_total{slow_consumer}", 0))} |
| engine `b` killed and restarted / publisher restarts counted on `b` | {result["engine_b_kills"]} / {restarts_b} |
| publisher restarts counted on `a` (both ranks, in-process) | {restarts_a} |
| batches lost for good (unrecovered) | {int(m.get("kvgateway_unrecovered_batches_total", 0))} |
| protocol violations seen by clients | {len(tally["violations"])} |
| tracebacks / ERROR lines in the gateway's log | {result["log_tracebacks"]} / {result["log_errors"]} |

Samples and logs: `bench/results/soak/<time>/`.
"""


def write_section(text: str, path: Path = PERFORMANCE_DOC) -> None:
    """Replace the Soak section of docs/performance.md (or append it); nothing else is touched."""
    doc = path.read_text(encoding="utf-8") if path.exists() else "# Performance\n"
    lines = doc.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == SECTION), None)
    if start is None:
        doc = doc.rstrip("\n") + "\n\n" + text
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        doc = "".join(lines[:start]) + text + ("\n" + "".join(lines[end:]) if end < len(lines) else "")
    path.write_text(doc, encoding="utf-8")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to run (default 30)")
    parser.add_argument("--sample-seconds", type=float, default=10.0, help="sampling period (default 10)")
    parser.add_argument("--rate", type=float, default=100.0, help="batches/s per stream (default 100)")
    parser.add_argument("--readers", type=int, default=20, help="WebSocket clients for the whole run (default 20)")
    parser.add_argument("--churn", type=float, default=2.0, help="new short-lived clients per second (default 2)")
    parser.add_argument("--restart-batches", type=int, default=6000, help="engine a restarts every N batches")
    parser.add_argument("--kill-seconds", type=float, default=90.0, help="engine b is killed every N s (default 90)")
    parser.add_argument("--rss-tolerance", type=float, default=0.10, help="allowed RSS growth, fraction (0.10)")
    parser.add_argument("--rss-slack-mib", type=float, default=8.0, help="...or this many MiB (default 8)")
    parser.add_argument("--fd-slack", type=int, default=4, help="allowed growth of descriptors - clients (4)")
    parser.add_argument("--seed", type=int, default=0, help="client churn seed")
    parser.add_argument("--no-report", dest="report", action="store_false", help="leave docs/performance.md alone")
    parser.add_argument("--render", metavar="RESULT_JSON", help="only render a saved result.json (no run)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        out = Path(args.render).parent
        result = json.loads(Path(args.render).read_text(encoding="utf-8"))
        args = argparse.Namespace(**{**vars(args), **result["settings"], "report": args.report})
    else:
        out = RESULTS / time.strftime("%Y%m%d-%H%M%S")
        out.mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        print(f"soak: {args.minutes:g} minutes, results in {out.relative_to(REPO)}", flush=True)
        result = asyncio.run(run(args, out))
    checks, problems = verdict(result, args)
    result["checks"] = [asdict(c) for c in checks]
    result["problems"] = problems
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    text = render(result, checks, problems)
    print(text)
    if args.report:
        write_section(text)
        print(f"soak: wrote the {SECTION!r} section of {PERFORMANCE_DOC.relative_to(REPO)}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
