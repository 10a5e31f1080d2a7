"""A real `kvgateway demo` process for the dashboard tests, and the system Chromium's settings."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.support.ports import free_port
from tests.support.processes import ARTIFACTS, Proc

__all__ = ["ARTIFACTS", "CHROMIUM", "CHROMIUM_ARGS", "Demo", "free_port"]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
READY = r"dashboard at (http://\S+)"
IPC_DIR_RE = re.compile(r"ipc://(/\S*?kvgateway-demo-[^/\s]+)/")
START_TIMEOUT_S = 120.0
"""A bound for a loaded machine: a quiet one prints the dashboard's address within about 3 s."""


class Demo:
    """One `python -m kvgateway demo` on a loopback port: simulated streams and the gateway.

    Streams: vllm-a ranks 0 and 1 (GPU, capacity 32768 blocks each; one stream of conversations
    routed at random between them, rank 1 at half the rate, clearing its cache now and then),
    sglang-b rank 0 (GPU 4096 + CPU offload 8192, 512 conversations in flight; `--restart-every N`
    restarts it every N batches) and vllm-c rank 0 (GPU 8192, full report mode; `--silence TALK
    QUIET`). `--streams N` replaces them with a fleet of N streams.
    """

    def __init__(
        self, port: int, *, seed: int = 7, rate: float = 20.0, token: str | None = None, extra: tuple[str, ...] = ()
    ) -> None:
        self.port = port
        self.args = ["demo", "--host", "127.0.0.1", "--port", str(port), "--seed", str(seed), "--rate", str(rate)]
        if token:
            self.args += ["--token", token]
        self.args += list(extra)
        self.proc: Proc | None = None
        self.url = ""

    def start(self) -> Demo:
        self.proc = Proc(*self.args)
        try:
            match = self.proc.wait_for(READY, timeout=START_TIMEOUT_S)
        except AssertionError:
            self.stop()
            raise
        self.url = match.group(1).rstrip("/") + "/"
        return self

    def output(self) -> str:
        return self.proc.output() if self.proc else ""

    def kill(self) -> None:
        """SIGKILL: the gateway gets no chance to say goodbye (its clients see a dead socket)."""
        if self.proc:
            self.proc.kill()
        self._cleanup_ipc()

    def stop(self) -> None:
        if self.proc:
            self.proc.stop()
        self._cleanup_ipc()

    def _cleanup_ipc(self) -> None:
        # A killed demo leaves its private ipc:// socket directory behind.
        for line in self.proc.lines if self.proc else ():
            for directory in IPC_DIR_RE.findall(line):
                if "kvgateway-demo-" in Path(directory).name:
                    shutil.rmtree(directory, ignore_errors=True)
