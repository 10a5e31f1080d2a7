"""The one gateway handle of the tests: a ``kvgateway serve`` subprocess on a loopback port, its
HTTP endpoints and metrics, and the simulator it reads; plus the waits they need."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_ports
from tests.support.processes import Proc

Start = Callable[..., Proc]
"""The ``procs`` fixture: starts a :class:`Proc`, stopped at the end of the test."""

STREAM_SERIES = frozenset(
    {
        "batches_received",
        "sequence_gaps",
        "missed_batches",
        "replayed_batches",
        "unrecovered_batches",
        "publisher_restarts",
        "duplicate_batches",
        "decode_errors",
        "rank_mismatches",
        "unknown_removes",
        "source_up",
        "source_last_seq",
        "ingest_queue_depth",
    }
)
"""The per-stream metrics :meth:`Gateway.counters` reads (histograms and per-type counters aside)."""


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate!r}; last value {last!r}")


def metric_values(base_url: str, name: str, *, token: str | None = None) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of ``name`` from the gateway's /metrics, keyed by its sorted labels."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    text = httpx.get(f"{base_url}/metrics", headers=headers, timeout=5).text
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def metric(base_url: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, value in metric_values(base_url, name).items():
        items = dict(key)
        if all(items.get(k) == v for k, v in labels.items()):
            total += value
    return total


# --- the gateway ------------------------------------------------------------------------------


@dataclass
class Gateway:
    """A ``kvgateway serve`` subprocess on 127.0.0.1:``port``."""

    proc: Proc
    port: int
    token: str | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    @property
    def pid(self) -> int:
        return self.proc.popen.pid

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self.headers(), **kwargs.pop("headers", {})}
        return httpx.get(self.base + path, headers=headers, timeout=10, trust_env=False, **kwargs)

    @property
    def origin(self) -> str:
        return self.base

    def sources(self) -> dict[str, Any]:
        response = self.get("/v1/sources")
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def epoch(self) -> str:
        return str(self.get("/healthz").json()["epoch"])

    def offset(self) -> int:
        return int(self.get("/v1/sources").json()["offset"])

    def samples(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        text = httpx.get(self.base + "/metrics", timeout=10, trust_env=False).text
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return out

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        total = 0.0
        for sample_labels, value in self.samples().get(name, []):
            if all(sample_labels.get(k) == v for k, v in labels.items()):
                total += value
        return total

    def counters(self, source: str, dp_rank: int = 0) -> dict[str, int]:
        """The per-stream ingest metrics of one scrape (without the ``kvgateway_`` prefix and the
        ``_total`` suffix), plus ``replay_<outcome>`` for the replay requests."""
        want = {"source": source, "dp_rank": str(dp_rank)}
        out: dict[str, int] = {}
        for name, samples in self.samples().items():
            key = name.removeprefix("kvgateway_").removesuffix("_total")
            if key not in STREAM_SERIES and key != "replay_requests":
                continue
            for labels, value in samples:
                if {k: labels.get(k) for k in want} == want:
                    if key == "unrecovered_batches":  # one series per reason: their sum
                        out[key] = out.get(key, 0) + int(value)
                    else:
                        out[f"replay_{labels['outcome']}" if key == "replay_requests" else key] = int(value)
        return out

    def wait_metric(self, name: str, value: int, timeout: float = 30.0, **labels: str) -> None:
        wait_until(lambda: self.metric(name, **labels) >= value, timeout, 0.1, f"{name}{labels} >= {value}")

    def wait_up(self, source: str, up: bool = True, timeout: float = 30.0) -> None:
        wait_until(
            lambda: self.metric("kvgateway_source_up", source=source) == (1 if up else 0),
            timeout,
            0.05,
            f"stream {source} {'up' if up else 'down'}",
        )

    def wait_last_seq(self, source: str, seq: int, timeout: float = 30.0) -> None:
        wait_until(
            lambda: self.metric("kvgateway_source_last_seq", source=source) >= seq,
            timeout,
            0.05,
            f"stream {source} delivered seq {seq}",
        )

    # the same from a test's event loop (the HTTP calls in a thread)

    async def offset_async(self) -> int:
        return await asyncio.to_thread(self.offset)

    async def metric_async(self, name: str, **labels: str) -> float:
        return await asyncio.to_thread(self.metric, name, **labels)

    async def wait_metric_async(self, name: str, value: float, within: float = 20.0, **labels: str) -> None:
        deadline = time.monotonic() + within
        while (current := await self.metric_async(name, **labels)) != value:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}{labels} is {current}, expected {value}")
            await asyncio.sleep(0.05)

    async def wait_metric_reaches(self, name: str, value: float, within: float = 20.0, **labels: str) -> float:
        """Until the metric is at least ``value``; its value then."""
        deadline = time.monotonic() + within
        while (current := await self.metric_async(name, **labels)) < value:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}{labels} is {current}, expected {value} or more")
            await asyncio.sleep(0.05)
        return current

    async def wait_clients(self, count: int, within: float = 20.0) -> None:
        await self.wait_metric_async("kvgateway_clients", count, within)

    # the process, as the kernel sees it

    def rss_kib(self) -> int:
        return proc_status(self.pid)["VmRSS"]

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))


def proc_status(pid: int) -> dict[str, int]:
    """The numeric fields of /proc/PID/status (VmRSS in KiB, Threads, ...)."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[name] = int(parts[0])
    return out


def start_gateway(
    start: Start,
    port: int,
    sources: Iterable[str],
    *extra: str,
    token: str | None = None,
    client_queue_bytes: int | None = None,
    timeout: float = 30.0,
) -> Gateway:
    """``kvgateway serve`` on 127.0.0.1:``port``; returns once it logged that it serves (the
    token through the environment, never argv)."""
    args = ["serve", "--host", "127.0.0.1", "--port", str(port)]
    if client_queue_bytes is not None:
        args += ["--client-queue-bytes", str(client_queue_bytes)]
    for spec in sources:
        args += ["--source", spec]
    proc = start(*args, *extra, env={"KVGATEWAY_TOKEN": token} if token else None)
    proc.wait_for(r"serving on http://", timeout=timeout)
    return Gateway(proc, port, token)


def start_sim(start: Start, *args: str, ranks: int = 1, timeout: float = 30.0, wait: bool = True) -> Proc:
    """``kvgateway simulate ARGS``; returns once every rank printed its readiness line (or at once)."""
    proc = start("simulate", *args)
    if wait:
        sim_ready(proc, ranks, timeout)
    return proc


def sim_ready(proc: Proc, ranks: int = 1, timeout: float = 30.0) -> None:
    for rank in range(ranks):
        proc.wait_for(rf"^simulate: rank {rank} publishing ", timeout=timeout)


def start_half_fleet(start: Start) -> Gateway:
    """``kvgateway serve`` with two engines configured and one running: ``up`` (a simulator at 20
    batches/s, with its replay socket) and ``gone`` (nothing listens: down from the start)."""
    http_port, pub, replay, dead_pub = free_ports(4, spacing=2)
    gateway = start_gateway(
        start,
        http_port,
        [
            f"name=up,endpoint=tcp://127.0.0.1:{pub},replay=tcp://127.0.0.1:{replay}",
            f"name=gone,endpoint=tcp://127.0.0.1:{dead_pub}",
        ],
    )
    start_sim(start, "--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{replay}", "--rate=20")
    return gateway
