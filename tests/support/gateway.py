"""The one way the tests start a gateway (:func:`start_gateway`) and the handle of a gateway
subprocess (:class:`GatewayProcess`: ``kvgateway serve``, or an edge, on a loopback port), its HTTP
endpoints and metrics and the waits on them; plus readers of /v1/sources and /v1/occupancy by base URL."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.metrics import Samples, scrape, stream_counters, total
from tests.support.ports import free_ports
from tests.support.processes import Proc, Start
from tests.support.seqs import sources_seqs
from tests.support.simulator import start_sim
from tests.support.sources import sim_flags, source_spec
from tests.support.waits import until, wait_until

BIG_QUEUE = 256 * 1024 * 1024
"""``--client-queue-bytes`` for a gateway whose test clients must never be cut off."""
WAIT_S = 120.0
"""The gateway's waits (its start, a metric, a stream up or at a seq): bounds for a loaded machine,
where a quiet one needs a second or two; at load 15-30, 30 s was not always enough."""


# --- the gateway ------------------------------------------------------------------------------


@dataclass
class GatewayProcess:
    """A subprocess serving the web protocol on 127.0.0.1:``port``: ``kvgateway serve``, or an
    edge of a cluster (the same protocol, so the same handle); not an in-process gateway."""

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
        return sources_seqs(body)

    def epoch(self) -> str:
        return str(self.get("/healthz").json()["epoch"])

    def offset(self) -> int:
        return int(self.get("/v1/sources").json()["offset"])

    def samples(self) -> Samples:
        return scrape(self.base, token=self.token)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        return total(self.samples(), name, **labels)

    def counters(self, source: str, dp_rank: int = 0) -> dict[str, int]:
        """:func:`tests.support.metrics.stream_counters` of one scrape."""
        return stream_counters(self.samples(), source, dp_rank)

    def wait_metric(self, name: str, value: int, timeout: float = WAIT_S, **labels: str) -> None:
        wait_until(lambda: self.metric(name, **labels) >= value, timeout, 0.1, f"{name}{labels} >= {value}")

    def wait_up(self, source: str, up: bool = True, timeout: float = WAIT_S) -> None:
        wait_until(
            lambda: self.metric("kvgateway_source_up", source=source) == (1 if up else 0),
            timeout,
            0.05,
            f"stream {source} {'up' if up else 'down'}",
        )

    def wait_last_seq(self, source: str, seq: int, timeout: float = WAIT_S) -> None:
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
        async def equal() -> bool:
            return await self.metric_async(name, **labels) == value

        await until(equal, within, f"{name}{labels} == {value}", interval=0.05)

    async def wait_metric_reaches(self, name: str, value: float, within: float = 20.0, **labels: str) -> float:
        """Until the metric is at least ``value``; its value then."""

        async def reached() -> tuple[float] | None:
            current = await self.metric_async(name, **labels)
            return (current,) if current >= value else None  # a tuple: truthy even when 0

        (found,) = await until(reached, within, f"{name}{labels} >= {value}", interval=0.05)
        return float(found)

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
    timeout: float = WAIT_S,
) -> GatewayProcess:
    """``kvgateway serve`` on 127.0.0.1:``port``; returns once it logged that it serves (the
    token through the environment, never argv)."""
    args = ["serve", "--host", "127.0.0.1", "--port", str(port)]
    if client_queue_bytes is not None:
        args += ["--client-queue-bytes", str(client_queue_bytes)]
    for spec in sources:
        args += ["--source", spec]
    proc = start(*args, *extra, env={"KVGATEWAY_TOKEN": token} if token else None)
    proc.wait_for(r"serving on http://", timeout=timeout)
    return GatewayProcess(proc, port, token)


def start_ingest_and_edge(
    start: Start, nats_url: str, sources: Iterable[str], edge_port: int, *ingest_extra: str
) -> tuple[Proc, GatewayProcess]:
    """A cluster of one ``kvgateway ingest`` (probes on any port) and one ``kvgateway edge`` on
    127.0.0.1:``edge_port``, both over ``nats_url`` and the same ``sources``; returns once each
    logged that it runs."""
    flags = [arg for spec in sources for arg in ("--source", spec)]
    ingest = start("ingest", *flags, "--nats", nats_url, "--port", "0", *ingest_extra)
    ingest.wait_for("ingest publishing to", timeout=30)
    edge = start("edge", *flags, "--nats", nats_url, "--host", "127.0.0.1", "--port", str(edge_port))
    edge.wait_for("edge serving on", timeout=30)
    return ingest, GatewayProcess(edge, edge_port)


def start_half_fleet(start: Start) -> GatewayProcess:
    """``kvgateway serve`` with two engines configured and one running: ``up`` (a simulator at 20
    batches/s, with its replay socket) and ``gone`` (nothing listens: down from the start)."""
    http_port, pub, replay, dead_pub = free_ports(4, spacing=2)
    gateway = start_gateway(
        start,
        http_port,
        [source_spec("up", pub, replay), source_spec("gone", dead_pub)],
    )
    start_sim(start, *sim_flags(pub, replay), "--rate=20")
    return gateway


def source_status(base: str, source: str, dp_rank: int = 0) -> dict[str, Any]:
    """The /v1/sources entry of one stream."""
    body = sources_seqs(httpx.get(f"{base}/v1/sources", timeout=10).json())
    (entry,) = [s for s in body["sources"] if s["source"] == source and s["dp_rank"] == dp_rank]
    return dict(entry)


def occupancy_stream(base: str, source: str, dp_rank: int = 0) -> dict[str, Any]:
    """The /v1/occupancy entry of one stream."""
    body = httpx.get(f"{base}/v1/occupancy", timeout=10).json()
    (entry,) = [s for s in body["streams"] if s["source"] == source and s["dp_rank"] == dp_rank]
    return dict(entry)


def occupancy_counts(entry: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The exact (rate-free) numbers of an /v1/occupancy stream entry, per medium."""
    keys = ("blocks", "tokens", "block_size", "stores", "removes")
    return {medium: {k: stats[k] for k in keys} for medium, stats in entry["mediums"].items()}


NOT_ZEROMQ_HINT = "does not speak ZeroMQ: is it the engine's HTTP port?"
"""How the gateway ends the down reason of an endpoint that fails ZeroMQ's handshake."""


def down_lines(proc: Proc, name: str) -> list[dict[str, Any]]:
    """The JSON log records (``--log-format json``) that say the stream ``name``[0] is down."""
    records = [json.loads(line) for line in list(proc.lines) if line.startswith("{")]
    return [r for r in records if r["message"].startswith(f"stream {name}[0] down")]
