"""A real Prometheus scrapes a real gateway fed by a real simulated engine.

The simulator skips one range of sequence numbers on the live stream (still replayable), so the
gateway sees exactly one gap; Prometheus must report that count and the same cache occupancy as
the gateway's own GET /v1/occupancy once the traffic has stopped.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support import Proc, Start, free_port, source_spec, wait_until
from tests.support.deploy import RULES, all_promql

pytestmark = pytest.mark.prometheus

BATCHES = 300
RATE = 50
SKIP = (150, 159)  # ten batches, three seconds in: well after the gateway has connected
SOURCE = "sim"


class Prometheus:
    """A Prometheus server on a free loopback port, scraping one target and evaluating
    deploy/prometheus/kvgateway-rules.yml every second."""

    def __init__(self, binary: str, target: str, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": "kvgateway", "metrics_path": "/metrics", "static_configs": [{"targets": [target]}]}
            ],
        }
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        (workdir / "data").mkdir()
        self.proc = Proc(
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
            command=(binary,),
            cwd=workdir,
        )

    def log(self) -> str:
        return self.proc.output()[-4000:]

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            assert self.proc.popen.poll() is None, f"prometheus exited:\n{self.log()}"
            try:
                return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout=timeout, interval=0.2, what="prometheus ready")

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        result = body["data"]["result"]
        assert isinstance(result, list)
        return result

    def value(self, expr: str) -> float | None:
        """The single sample's value, or None while there is none."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, f"{expr}: {len(result)} series"
        return float(result[0]["value"][1])

    def rule_health(self) -> dict[str, str]:
        response = httpx.get(f"{self.url}/api/v1/rules", timeout=5)
        response.raise_for_status()
        groups = response.json()["data"]["groups"]
        return {rule["name"]: rule["health"] for group in groups for rule in group["rules"]}

    def stop(self) -> None:
        self.proc.stop(15)


@pytest.fixture
def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip("the prometheus server is not installed (Debian/Ubuntu: apt-get install prometheus)")
    return path


@pytest.fixture
def start_prometheus(prometheus_binary: str, tmp_path: Path) -> Iterator[Callable[[str], Prometheus]]:
    started: list[Prometheus] = []

    def start(target: str) -> Prometheus:
        server = Prometheus(prometheus_binary, target, tmp_path)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_prometheus_reads_gaps_and_occupancy(procs: Start, start_prometheus: Callable[[str], Prometheus]) -> None:
    http_port, pub_port, replay_port = free_port(), free_port(), free_port()
    gateway = procs(
        "serve",
        "--source",
        source_spec(SOURCE, pub_port, replay_port),
        "--host",
        "127.0.0.1",
        "--port",
        str(http_port),
    )
    gateway.wait_for(r"serving on http://", timeout=30)
    base = f"http://127.0.0.1:{http_port}"

    prometheus = start_prometheus(f"127.0.0.1:{http_port}")
    prometheus.wait_ready()
    wait_until(lambda: prometheus.value('up{job="kvgateway"}') == 1, timeout=30, what="target up")

    engine = procs(
        "simulate",
        "--endpoint",
        f"tcp://*:{pub_port}",
        "--replay-endpoint",
        f"tcp://127.0.0.1:{replay_port}",
        "--rate",
        str(RATE),
        "--batches",
        str(BATCHES),
        "--skip",
        f"{SKIP[0]}-{SKIP[1]}",
    )
    try:
        assert engine.popen.wait(timeout=BATCHES / RATE + 60) == 0, engine.output()
    except subprocess.TimeoutExpired:
        pytest.fail(f"the simulator did not finish:\n{engine.output()}")

    stream = f'source="{SOURCE}", dp_rank="0"'
    # The last batch is delivered once Prometheus has scraped it: every later value is final.
    try:
        wait_until(
            lambda: prometheus.value(f"kvgateway_source_last_seq{{{stream}}}") == BATCHES - 1,
            timeout=30,
            what=f"last seq {BATCHES - 1} in Prometheus",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\ngateway output:\n{gateway.output()}\nprometheus:\n{prometheus.log()}") from None
    # At least one more scrape of the final state: a sample later than the one read now.
    stamp = f"timestamp(kvgateway_source_last_seq{{{stream}}})"
    shown = prometheus.value(stamp)
    wait_until(lambda: (prometheus.value(stamp) or 0) > (shown or 0), timeout=15, interval=0.2, what="one more scrape")

    occupancy = httpx.get(f"{base}/v1/occupancy", timeout=5).json()
    (entry,) = [s for s in occupancy["streams"] if s["source"] == SOURCE and s["dp_rank"] == 0]
    expected_blocks = {medium: stats["blocks"] for medium, stats in entry["mediums"].items()}
    assert expected_blocks.get("GPU", 0) > 0, occupancy

    assert prometheus.value(f"kvgateway_sequence_gaps_total{{{stream}}}") == 1
    assert prometheus.value(f"kvgateway_missed_batches_total{{{stream}}}") == SKIP[1] - SKIP[0] + 1
    assert prometheus.value(f"sum(kvgateway_unrecovered_batches_total{{{stream}}})") == 0
    assert len(prometheus.query(f"kvgateway_unrecovered_batches_total{{{stream}}}")) == 7  # one per reason
    assert prometheus.value(f'kvgateway_replay_requests_total{{{stream}, outcome="recovered"}}') >= 1  # type: ignore[operator]
    assert prometheus.value(f"kvgateway_publisher_restarts_total{{{stream}}}") == 0

    scraped_blocks = {
        series["metric"]["medium"]: float(series["value"][1])
        for series in prometheus.query(f"kvgateway_cache_blocks{{{stream}}}")
    }
    assert scraped_blocks == {medium: float(blocks) for medium, blocks in expected_blocks.items()}
    # and the recording-rule shape the dashboard uses gives the same numbers
    fleet = {
        series["metric"]["medium"]: float(series["value"][1])
        for series in prometheus.query("sum by (medium) (max by (source, dp_rank, medium) (kvgateway_cache_blocks))")
    }
    assert fleet == scraped_blocks

    # The recording rules, evaluated by this Prometheus, agree; no rule fails to evaluate.
    wait_until(
        lambda: prometheus.value('medium:kvgateway_cache_blocks:sum{medium="GPU"}') == scraped_blocks["GPU"],
        timeout=15,
        what="the recording rule medium:kvgateway_cache_blocks:sum",
    )
    health = wait_until(
        lambda: (h := prometheus.rule_health()) and "unknown" not in h.values() and h,
        timeout=15,
        what="every rule evaluated",
    )
    assert set(health.values()) == {"ok"}, health
    assert prometheus.query('ALERTS{alertname=~"KVGatewayUnrecoveredBatches|KVGatewayDecodeErrors"}') == []

    # Every query of the dashboard, the docs and the rules runs without error on real data.
    for where, expr in all_promql():
        response = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": expr}, timeout=5)
        assert response.status_code == 200, f"{where}: {expr}\n{response.text}"
