"""Shared test helpers: free loopback ports, real subprocesses of the CLI, metric readers."""

from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, *, spacing: int = 1) -> list[int]:
    """``count`` ports, each with ``spacing - 1`` free neighbours above it (for DP ranges)."""
    found: list[int] = []
    while len(found) < count:
        base = free_port()
        if base + spacing >= 65535:
            continue
        taken = {p for b in found for p in range(b, b + spacing)}
        if any(p in taken for p in range(base, base + spacing)):
            continue
        ok = True
        for port in range(base + 1, base + spacing):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            found.append(base)
    return found


class Proc:
    """A real ``python -m kvgateway ...`` subprocess whose output lines are collected."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "kvgateway", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=full_env,
            cwd=REPO,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))
            self._queue.put(line)

    def wait_for(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        regex = re.compile(pattern)
        for line in list(self.lines):
            if match := regex.search(line):
                return match
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self.popen.poll() is not None and self._queue.empty():
                    break
                continue
            if match := regex.search(line):
                return match
        raise AssertionError(f"{pattern!r} not seen within {timeout}s; output:\n" + "\n".join(self.lines[-40:]))

    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self, timeout: float = 10.0) -> int:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._thread.join(2)
        return self.popen.returncode

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)


@pytest.fixture
def procs() -> Iterator[Callable[..., Proc]]:
    """Start CLI subprocesses; every one is stopped at the end of the test."""
    started: list[Proc] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Proc:
        proc = Proc(*args, env=env)
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        proc.stop()


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


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate!r}; last value {last!r}")
