"""Health endpoints and log lines of a real `kvgateway serve` process."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx

from tests.conftest import Proc, free_port, free_ports, wait_until

TOKEN = "tok-3f9a1c77e2"


def test_json_logs_health_and_readiness(procs: Callable[..., Proc]) -> None:
    http = free_port()
    pub, dead = free_ports(2)
    # One engine that is up (a simulator) and one that never answers.
    engine = procs("simulate", "--endpoint", f"tcp://*:{pub}", "--rate", "50")
    engine.wait_for(r"rank 0 publishing")
    gateway = procs(
        "serve",
        "--port",
        str(http),
        "--token",
        TOKEN,
        "--log-format",
        "json",
        "--source",
        f"name=live,endpoint=tcp://127.0.0.1:{pub}",
        "--source",
        f"name=gone,endpoint=tcp://127.0.0.1:{dead}",
    )
    gateway.wait_for(r"serving on")
    base = f"http://127.0.0.1:{http}"

    health = httpx.get(f"{base}/healthz", timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "ok"

    def not_ready() -> dict[str, object] | None:
        response = httpx.get(f"{base}/readyz", timeout=5)
        body = response.json()
        live_up = all(item["source"] != "live" for item in body["not_ready"])
        return body if response.status_code == 503 and live_up else None

    body = wait_until(not_ready, what="readyz listing only the dead engine")
    assert body["ready"] is False and body["streams"] == 2
    assert [(item["source"], item["dp_rank"]) for item in body["not_ready"]] == [("gone", 0)]
    assert body["not_ready"][0]["reason"]
    # The token guards /v1/*, and an auth failure is one log line without the token.
    assert httpx.get(f"{base}/v1/sources?token=wrong-{TOKEN}", timeout=5).status_code == 401
    wait_until(lambda: "auth failure" in gateway.output(), what="auth failure logged")
    gateway.stop()

    lines = [line for line in gateway.lines if line.startswith("{")]
    assert lines, gateway.output()
    records = [json.loads(line) for line in lines]
    assert all({"ts", "level", "logger", "message"} <= record.keys() for record in records)
    messages = [record["message"] for record in records]
    summary = next(m for m in messages if m.startswith("gateway started:"))
    assert "live[0]=tcp://127.0.0.1" in summary and "auth token" in summary
    assert any(m.startswith("stream live[0] up") for m in messages)
    assert any("auth failure" in m for m in messages)
    assert TOKEN not in gateway.output()


def test_ready_when_every_stream_is_connected(procs: Callable[..., Proc]) -> None:
    http = free_port()
    (pub,) = free_ports(1, spacing=2)
    engine = procs("simulate", "--endpoint", f"tcp://*:{pub}", "--dp-size", "2", "--rate", "20")
    engine.wait_for(r"rank 1 publishing")
    gateway = procs("serve", "--port", str(http), "--source", f"name=e,endpoint=tcp://127.0.0.1:{pub},dp_size=2")
    gateway.wait_for(r"serving on")
    response = wait_until(
        lambda: (r := httpx.get(f"http://127.0.0.1:{http}/readyz", timeout=5)).status_code == 200 and r,
        what="ready",
    )
    assert response.json() == {"ready": True, "streams": 2, "not_ready": []}
    engine.stop()
    # The engine is gone: both ranks go down, and readiness says so with a reason.
    body = wait_until(
        lambda: (r := httpx.get(f"http://127.0.0.1:{http}/readyz", timeout=5)).status_code == 503 and r.json(),
        what="not ready after the engine stopped",
    )
    assert sorted((item["source"], item["dp_rank"]) for item in body["not_ready"]) == [("e", 0), ("e", 1)]
    assert all(item["reason"] for item in body["not_ready"])
