"""What every scenario shares: ports, real subprocesses, /proc readings, HTTP polling, statistics."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import queue
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

REPO: Final = Path(__file__).resolve().parent.parent
RESULTS_DIR: Final = REPO / "bench" / "results"
CACHE_DIR: Final = RESULTS_DIR / "cache"
TOPIC: Final = "kv-events"
"""The topic vLLM's docs use; every bench stream carries it."""
NAIVE_LOOP_ENV: Final = "KVGW_BENCH_NAIVE_LOOP"
"""``asyncio`` or ``uvloop`` (``python -m bench --naive-loop``): the naive bridge's event loop.
Unset, it runs on the gateway's loop, so the comparison is about the design and not the loop."""


def gateway_loop() -> str:
    """The event loop ``kvgateway serve`` runs on: uvloop when installed, else asyncio's."""
    from kvgateway.serve.server import loop_factory

    return "asyncio" if loop_factory() is None else "uvloop"


def naive_loop() -> str:
    """The naive bridge's loop: the gateway's, unless ``--naive-loop`` chose another."""
    return os.environ.get(NAIVE_LOOP_ENV) or gateway_loop()


SOURCE_ENV: Final = "KVGW_BENCH_SOURCE"
"""A checkout whose ``kvgateway`` package the gateway processes run instead of this one's
(``python -m bench --gateway-source DIR``): how a patch is measured against the baseline. Not
in the gateway's own ``KVGATEWAY_*`` namespace, whose unknown names the gateway refuses."""

Mode: TypeAlias = Literal["smoke", "quick", "full"]
"""How big a run is: ``full`` (the documented figures), ``quick`` (a minute or two), ``smoke``
(seconds per scenario, only proves the suite runs end to end)."""

_CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")


class BenchError(RuntimeError):
    """A scenario could not be measured (a process died, a timeout): one line for the report."""


# --- ports ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port_block(count: int) -> int:
    """A base port with ``base .. base + count - 1`` all free now (a DP source's consecutive ports).

    Half the tries below the kernel's ephemeral range (where no outgoing connection lands in the
    meantime; on a busy machine 2,000 consecutive free ephemeral ports are rare), half in it."""
    for attempt in range(100):
        base = random.randrange(10_000, max(10_001, _ephemeral_low() - count)) if attempt % 2 == 0 else free_port()
        if base + count > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise BenchError(f"no block of {count} free ports")


# --- /proc ------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def minor_faults(pid: int) -> int:
    """Page faults a process (all its threads) took without reading a disk: mostly the kernel
    giving it a fresh page (zeroed), from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[7])


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc/<pid>/statm."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE


@dataclass
class CpuMeter:
    """CPU used by a process between :meth:`start` and :meth:`stop`, as a fraction of one core."""

    pid: int
    _cpu0: float = 0.0
    _wall0: float = 0.0
    cores: float = 0.0
    seconds: float = 0.0

    def start(self) -> None:
        self._cpu0 = cpu_seconds(self.pid)
        self._wall0 = time.monotonic()

    def stop(self) -> float:
        self.seconds = cpu_seconds(self.pid) - self._cpu0
        wall = time.monotonic() - self._wall0
        self.cores = self.seconds / wall if wall > 0 else 0.0
        return self.cores


def code_identity() -> dict[str, Any]:
    """Which kvgateway the gateway processes run: the commit, whether kvgateway/ differs from it,
    and a digest of the package's files (the lead may commit between two scenarios)."""
    import hashlib

    source = Path(os.environ.get(SOURCE_ENV) or REPO)
    digest = hashlib.sha256()
    for path in sorted((source / "kvgateway").rglob("*.py")):
        digest.update(path.relative_to(source).as_posix().encode() + b"\0" + path.read_bytes())
    commit = dirty = None
    with contextlib.suppress(Exception):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=source, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--", "kvgateway"],
                cwd=source,
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout.strip()
        )
    return {"source": str(source), "commit": commit, "kvgateway_modified": dirty, "digest": digest.hexdigest()[:12]}


def machine_info() -> dict[str, Any]:
    """What the figures were measured on; load average at start because the machine may be shared."""
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_total = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    versions: dict[str, str] = {}
    for name in ("kvgateway", "pyzmq", "msgspec", "uvicorn", "starlette", "websockets", "uvloop", "httptools"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[name] = version(name)
    commit = None
    with contextlib.suppress(Exception):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_bytes": mem_total,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()),
        "versions": versions,
        "commit": commit,
    }


# --- statistics -------------------------------------------------------------------------------


def median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


class LogHistogram:
    """Latencies in logarithmic buckets 2% wide, from 1 us to ~1000 s: mergeable across processes,
    and percentiles are read as a bucket's upper edge (never optimistic by more than 2%)."""

    BASE: Final = 1e-6
    FACTOR: Final = 1.02
    SIZE: Final = 1100
    _LOG: Final = math.log(1.02)

    def __init__(self) -> None:
        self.counts = [0] * self.SIZE
        self.total = 0
        self.max = 0.0

    def add(self, seconds: float) -> None:
        self.max = max(self.max, seconds)
        index = 0 if seconds <= self.BASE else min(int(math.log(seconds / self.BASE) / self._LOG), self.SIZE - 1)
        self.counts[index] += 1
        self.total += 1

    def merge(self, other: LogHistogram) -> None:
        for i, n in enumerate(other.counts):
            if n:
                self.counts[i] += n
        self.total += other.total
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0..1) in seconds, or None when empty."""
        if not self.total:
            return None
        rank = max(1, math.ceil(q * self.total))
        seen = 0
        for i, n in enumerate(self.counts):
            seen += n
            if seen >= rank:
                return min(self.BASE * self.FACTOR ** (i + 1), self.max)
        return self.max

    def to_json(self) -> dict[str, Any]:
        return {"buckets": {str(i): n for i, n in enumerate(self.counts) if n}, "total": self.total, "max": self.max}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LogHistogram:
        hist = cls()
        for key, n in data["buckets"].items():
            hist.counts[int(key)] += int(n)
        hist.total = int(data["total"])
        hist.max = float(data["max"])
        return hist

    def summary_ms(self) -> dict[str, float | None]:
        def ms(value: float | None) -> float | None:
            return None if value is None else round(value * 1000, 3)

        return {
            "p50_ms": ms(self.quantile(0.50)),
            "p99_ms": ms(self.quantile(0.99)),
            "p999_ms": ms(self.quantile(0.999)),
            "max_ms": ms(self.max if self.total else None),
            "samples": self.total,
        }


# --- HTTP -------------------------------------------------------------------------------------


def seq_of(value: Any) -> int | None:
    """An engine seq as the gateway sends it (a decimal string, or null) as an int."""
    return None if value is None else int(value)


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError, KeyError):
            last = predicate()
            if last:
                return last
        time.sleep(interval)
    raise BenchError(f"timed out after {timeout:g}s waiting for {what} (last: {str(last)[:200]})")


# --- subprocesses -----------------------------------------------------------------------------


def python_command(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


class Process:
    """A real subprocess whose output goes to a log file (a pipe nobody reads would block it)."""

    def __init__(
        self, command: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None, cwd: Path = REPO
    ) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.command = list(command)
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self.started = time.time()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def check_alive(self, what: str) -> None:
        if not self.alive():
            raise BenchError(f"{what} exited with code {self.popen.returncode}: {self.tail()}")

    def tail(self, lines: int = 5) -> str:
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace").strip().splitlines()
            return " | ".join(text[-lines:])
        return ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._log.close()


class Worker:
    """A bench helper process driven by JSON lines: commands on its stdin, replies on its stdout."""

    def __init__(self, command: Sequence[str], log_path: Path, name: str) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            try:
                self._replies.put(json.loads(line))
            except ValueError:
                continue
        self._replies.put(None)

    def send(self, command: Mapping[str, Any]) -> None:
        assert self.popen.stdin is not None
        try:
            self.popen.stdin.write(json.dumps(command).encode() + b"\n")
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise BenchError(f"{self.name} is gone ({exc}): {self.tail()}") from None

    def reply(self, timeout: float) -> dict[str, Any]:
        try:
            message = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise BenchError(f"{self.name}: no reply within {timeout:g}s: {self.tail()}") from None
        if message is None:
            raise BenchError(f"{self.name} exited (code {self.popen.poll()}): {self.tail()}")
        if "error" in message:
            raise BenchError(f"{self.name}: {message['error']}")
        return message

    def request(self, command: Mapping[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        self.send(command)
        return self.reply(timeout)

    def tail(self, lines: int = 5) -> str:
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace").strip().splitlines()
            return " | ".join(text[-lines:])
        return ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(BenchError):
                self.send({"cmd": "quit"})
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        self._thread.join(2)
        self._log.close()


@contextlib.contextmanager
def stopping(*things: Process | Worker | None) -> Iterator[None]:
    """Stop every given process on the way out, last started first."""
    try:
        yield
    finally:
        for thing in reversed(things):
            if thing is not None:
                thing.stop()


# --- the gateway ------------------------------------------------------------------------------


class ServeProcess(Process):
    """A ``python -m kvgateway serve`` subprocess with one source, on a free loopback port."""

    def __init__(
        self,
        log_path: Path,
        *,
        endpoint: str,
        replay: str | None = None,
        dp_size: int = 1,
        extra: Sequence[str] = (),
        name: str = "bench",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        spec = f"name={name},endpoint={endpoint},topic={TOPIC}"
        if replay is not None:
            spec += f",replay={replay}"
        if dp_size > 1:
            spec += f",dp_size={dp_size}"
        command = python_command(
            "kvgateway", "serve", "--source", spec, "--port", str(self.port), "--log-level", "warning", *extra
        )
        source = os.environ.get(SOURCE_ENV)
        super().__init__(command, log_path, env=env, cwd=Path(source) if source else REPO)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    @property
    def sse_url(self) -> str:
        return f"{self.base}/v1/events"

    def wait_ready(self, timeout: float = 30.0) -> None:
        def healthy() -> bool:
            self.check_alive("the gateway")
            return bool(get_json(f"{self.base}/healthz", timeout=2)["status"] == "ok")

        wait_until(healthy, timeout, "the gateway's /healthz")

    def wait_connected(self, timeout: float = 30.0) -> None:
        def connected() -> bool:
            self.check_alive("the gateway")
            return all(s["connected"] for s in self.sources())

        wait_until(connected, timeout, "the gateway to connect to its source")

    def sources(self) -> list[dict[str, Any]]:
        sources = list(get_json(f"{self.base}/v1/sources")["sources"])
        return [{**source, "last_seq": seq_of(source["last_seq"])} for source in sources]

    def occupancy(self) -> dict[str, Any]:
        return dict(get_json(f"{self.base}/v1/occupancy", timeout=30))

    def core(self) -> str:
        """Which core the gateway runs (``kvgateway_build_info``'s ``core`` label)."""
        for line in self.metrics_text().splitlines():
            if line.startswith("kvgateway_build_info{") and 'core="' in line:
                return line.split('core="', 1)[1].split('"', 1)[0]
        raise BenchError("the gateway's /metrics has no kvgateway_build_info")

    def metrics_text(self) -> str:
        """One scrape of /metrics."""
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=10) as response:
            return str(response.read().decode())

    def metric(self, name: str) -> float:
        """The sum of every sample of one metric on /metrics."""
        return self.metrics([name])[name]

    def metrics(self, names: list[str]) -> dict[str, float]:
        """The sum of every sample of each of ``names``, from one scrape of /metrics."""
        totals = dict.fromkeys(names, 0.0)
        for line in self.metrics_text().splitlines():
            for name in names:
                if line.startswith(name) and (line[len(name)] in " {"):
                    totals[name] += float(line.rsplit(" ", 1)[1])
        return totals


def pause(process: Process) -> None:
    os.kill(process.pid, signal.SIGSTOP)


def resume(process: Process) -> float:
    """SIGCONT; returns the wall-clock time just before it was sent."""
    now = time.time()
    os.kill(process.pid, signal.SIGCONT)
    return now


def log_dir(run_dir: Path, scenario: str) -> Path:
    path = run_dir / scenario
    path.mkdir(parents=True, exist_ok=True)
    return path


def say(message: str) -> None:
    """Progress on stderr (results go to JSON and the docs)."""
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


# --- profiling --------------------------------------------------------------------------------


class Profiler:
    """py-spy sampling a process (``--profile``): collapsed stacks, summarised by function."""

    def __init__(self, pid: int, out: Path, rate: int = 200) -> None:
        import shutil

        self.out = out
        self.popen: subprocess.Popen[bytes] | None = None
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(exe).exists():
            say("--profile: py-spy is not installed (pip install py-spy); no profile taken")
            return
        out.parent.mkdir(parents=True, exist_ok=True)
        self.popen = subprocess.Popen(
            [exe, "record", "-p", str(pid), "-o", str(out), "--format", "raw", "-r", str(rate), "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # py-spy attaches

    def stop(self) -> dict[str, Any] | None:
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return summarise_profile(self.out) if self.out.exists() else None


def summarise_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's raw (collapsed) output."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame_name(frame) for frame in stack.split(";")]
        frames = [f for f in frames if f]
        if not frames:
            continue
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for name in set(frames):
            inclusive[name] = inclusive.get(name, 0) + count

    def share(table: dict[str, int]) -> list[list[Any]]:
        ranked = sorted(table.items(), key=lambda item: -item[1])[:top]
        return [[name, round(100 * n / total, 1)] for name, n in ranked]

    return {"samples": total, "self_pct": share(own), "inclusive_pct": share(inclusive), "file": str(path)}


def _frame_name(frame: str) -> str:
    """``function (path/to/module.py:123)`` -> ``module.function`` (line numbers dropped)."""
    frame = frame.strip()
    if frame.startswith("process ") or frame.startswith("thread "):
        return ""
    name, _, where = frame.partition(" (")
    module = where.split(":", 1)[0].rsplit("/", 1)[-1].removesuffix(".py") if where else ""
    return f"{module}.{name}" if module else name


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from the first line of /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return total - idle, total


def write_run(out: Mapping[str, Any], results_dir: Path) -> Path:
    """A stand-alone bench script's result: ``<results_dir>/<time>-<mode>.json``, and on stdout."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{out['mode']}.json"
    text = json.dumps(out, indent=1) + "\n"
    path.write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return path
