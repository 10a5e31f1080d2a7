"""Health endpoints and log lines of a real `kvgateway serve` process."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from tests.support import Proc, Start, free_port, free_ports, source_spec, wait_until

TOKEN = "tok-3f9a1c77e2"


def test_json_logs_health_and_readiness(procs: Start) -> None:
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
        source_spec("live", pub),
        "--source",
        source_spec("gone", dead),
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


def test_ready_when_every_stream_is_connected(procs: Start) -> None:
    http = free_port()
    (pub,) = free_ports(1, spacing=2)
    engine = procs("simulate", "--endpoint", f"tcp://*:{pub}", "--dp-size", "2", "--rate", "20")
    engine.wait_for(r"rank 1 publishing")
    gateway = procs("serve", "--port", str(http), "--source", source_spec("e", pub, dp_size=2))
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


def _records(proc: Proc) -> list[dict[str, Any]]:
    return [json.loads(line) for line in list(proc.lines) if line.startswith("{")]


def test_streams_that_never_connect_are_logged_with_the_true_reason(procs: Start) -> None:
    """An unresolvable host and a closed port: each stream's first failure is a WARNING with its
    own reason, /readyz gives the same reasons, and later changes (up, down) are WARNINGs too."""
    http = free_port()
    (closed,) = free_ports(1)
    gateway = procs(
        "serve",
        "--port",
        str(http),
        "--log-format",
        "json",
        "--source",
        "name=dns,endpoint=tcp://no-such-engine.invalid:5557",
        "--source",
        source_spec("closed", closed),
    )
    gateway.wait_for(r"serving on")

    def down_lines() -> dict[str, dict[str, Any]] | None:
        found = {
            r["message"].split()[1]: r
            for r in _records(gateway)
            if r["message"].startswith("stream ") and " down " in r["message"]
        }
        return found if {"dns[0]", "closed[0]"} <= found.keys() else None

    found = wait_until(down_lines, what="both streams logged down")
    assert found["dns[0]"]["level"] == "warning" and found["closed[0]"]["level"] == "warning"
    assert "cannot resolve host 'no-such-engine.invalid'" in found["dns[0]"]["message"]
    assert "connection refused" in found["closed[0]"]["message"]
    warnings = [r["message"] for r in _records(gateway) if r["level"] == "warning"]
    assert any("host 'no-such-engine.invalid' does not resolve" in m for m in warnings)

    body = httpx.get(f"http://127.0.0.1:{http}/readyz", timeout=5).json()
    reasons = {item["source"]: item["reason"] for item in body["not_ready"]}
    assert reasons["dns"].startswith("cannot resolve host") and "refused" not in reasons["dns"]
    assert "connection refused" in reasons["closed"]

    # the same for programs: /v1/sources' reason_code (ZeroMQ's own word first, the diagnosis's later)
    def codes() -> dict[str, str] | None:
        sources = httpx.get(f"http://127.0.0.1:{http}/v1/sources", timeout=5).json()["sources"]
        found = {s["source"]: s["reason_code"] for s in sources}
        return found if found["dns"] == "unresolved" else None

    assert wait_until(codes, what="the DNS diagnosis's code")["closed"] in ("retrying", "refused")
    # ZeroMQ keeps retrying (every 2 s at most) and says only "retrying": the reason found stays.
    watch_until = time.monotonic() + 5.0
    while time.monotonic() < watch_until:
        body = httpx.get(f"http://127.0.0.1:{http}/readyz", timeout=5).json()
        reason = {item["source"]: item["reason"] for item in body["not_ready"]}["dns"]
        assert reason.startswith("cannot resolve host"), reason
        time.sleep(0.2)  # polling /readyz, not waiting for a condition: the reason must hold throughout

    # The engine comes, then goes: both changes are logged at WARNING (the first failure was).
    engine = procs("simulate", "--endpoint", f"tcp://*:{closed}", "--rate", "20")
    engine.wait_for(r"rank 0 publishing")
    wait_until(lambda: any(r["message"].startswith("stream closed[0] up") for r in _records(gateway)), what="up")
    engine.stop()
    wait_until(
        lambda: [r for r in _records(gateway) if r["message"].startswith("stream closed[0] down")][1:],
        what="down again",
    )
    changes = [r for r in _records(gateway) if r["message"].startswith("stream closed[0]")]
    assert [r["level"] for r in changes][:3] == ["warning", "warning", "warning"], changes
    gateway.stop()


def test_uvicorn_lines_share_the_format_and_access_lines_are_debug_only(procs: Start) -> None:
    (pub,) = free_ports(1)
    outputs: dict[str, list[dict[str, Any]]] = {}
    for level in ("info", "debug"):
        http = free_port()
        gateway = procs(
            "serve",
            "--port",
            str(http),
            "--log-format",
            "json",
            "--log-level",
            level,
            "--source",
            source_spec("e", pub),
        )
        gateway.wait_for(r"serving on")
        base = f"http://127.0.0.1:{http}"
        # Unknown /v1 paths answer JSON, like every other API route; the dashboard's stay plain.
        missing = httpx.get(f"{base}/v1/no-such-thing", timeout=5)
        assert missing.status_code == 404 and missing.json()["error"].startswith("no such endpoint: /v1/no-such-thing")
        wrong = httpx.post(f"{base}/v1/occupancy", timeout=5)
        assert wrong.status_code == 405 and "not allowed" in wrong.json()["error"]
        assert httpx.get(f"{base}/v1/ws", timeout=5).status_code == 426
        assert httpx.get(f"{base}/no-such-page", timeout=5).status_code == 404
        httpx.get(f"{base}/healthz", timeout=5)
        if level == "debug":
            wait_until(lambda g=gateway: "/healthz" in g.output(), what="the access line")
        gateway.stop()
        assert all(line.startswith("{") for line in gateway.lines if line.strip()), gateway.output()
        outputs[level] = _records(gateway)
    for records in outputs.values():
        assert all(r["logger"].startswith("kvgateway") for r in records), {r["logger"] for r in records}
    assert not any("/healthz" in r["message"] for r in outputs["info"])
    access = [r for r in outputs["debug"] if "/healthz" in r["message"]]
    assert access and all(r["logger"] == "kvgateway.http.access" for r in access)
    assert any(r["logger"] == "kvgateway.http" for r in outputs["debug"])  # uvicorn's own lines, renamed
