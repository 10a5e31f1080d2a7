"""The one process handle of the tests: a real ``python -m kvgateway ...`` subprocess whose
output lines are collected by a thread; and :class:`Procs`, the processes one test (or module)
started, stopped at its end."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


class Proc:
    """``python -m kvgateway ARGS``. Its stdout (with stderr, unless ``stderr_apart``) is read
    line by line into :attr:`lines`. ``command`` replaces ``python -m kvgateway`` (an installed
    ``kvgateway`` script), ``cwd`` the checkout as the working directory."""

    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        stderr_apart: bool = False,
        command: tuple[str, ...] = (sys.executable, "-m", "kvgateway"),
        cwd: Path = REPO,
    ) -> None:
        self.args = args
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.popen = subprocess.Popen(
            [*command, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stderr_apart else subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=full_env,
            cwd=cwd,
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

    def wait_for(self, pattern: str | re.Pattern[str], timeout: float = 20.0) -> re.Match[str]:
        """The first output line matching ``pattern`` (already printed or within ``timeout``)."""
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
            if match := regex.search(line.rstrip("\n")):
                return match
        raise AssertionError(f"{pattern!r} not seen within {timeout}s; output:\n" + "\n".join(self.lines[-40:]))

    def output(self) -> str:
        return "\n".join(self.lines)

    def finished_output(self, timeout: float = 10.0) -> list[str]:
        """Every stdout line, once the process has exited and its output is read to the end."""
        self.popen.wait(timeout)
        self._thread.join(timeout)
        return list(self.lines)

    def errors(self, timeout: float = 30.0) -> str:
        """The process's stderr (``stderr_apart``), once it has exited."""
        self.popen.wait(timeout)
        assert self.popen.stderr is not None
        return self.popen.stderr.read()

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int:
        """Send ``sig`` (SIGKILL after ``timeout``); the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
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

    @contextmanager
    def held(self) -> Iterator[None]:
        """The process stopped (SIGSTOP) inside the block, as a starved host would stop it: its sockets
        stay bound and a peer's TCP connect still completes (the kernel's), but it runs nothing."""
        self.popen.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.popen.send_signal(signal.SIGCONT)


Start = Callable[..., Proc]
"""What starts a :class:`Proc` for a test (the ``procs`` fixture, a :class:`Procs`): stopped at its end."""


class Procs:
    """The processes started through it (``procs(*args, env=...)``), stopped by :meth:`stop_all`,
    the last started first."""

    def __init__(self) -> None:
        self.started: list[Proc] = []

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> Proc:
        proc = Proc(*args, env=env)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop()
