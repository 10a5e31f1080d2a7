"""A real nats-server on loopback for the cluster tests (skipped when the binary is missing)."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.processes import Proc
from tests.support.waits import wait_until


def nats_binary() -> str:
    found = shutil.which("nats-server") or ("/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None)
    if found is None:
        pytest.skip("nats-server is not installed (Debian: apt-get install nats-server; .ci/run installs it)")
    return found


class NatsServer:
    """nats-server -js on 127.0.0.1 with its store in ``store``; restartable on the same port."""

    def __init__(self, store: Path) -> None:
        self.binary = nats_binary()
        self.store = store
        self.port = free_port()
        self.proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = ("-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store))
        self.proc = Proc(*args, command=(self.binary,))
        wait_until(self.listening, timeout=10, interval=0.05, what="nats-server listening")

    def listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), 0.2).close()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(10)
        self.proc = None

    def wipe(self) -> None:
        shutil.rmtree(self.store, ignore_errors=True)
