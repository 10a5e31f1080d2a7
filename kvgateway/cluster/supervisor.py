"""``kvgateway serve --workers N``: one machine, many cores, one command.

Starts a private nats-server on loopback (its store under the state directory), one ingest
process and N edge processes that share the HTTP port (SO_REUSEPORT: the kernel spreads new
connections over them). A child that exits is started again; SIGTERM/SIGINT are forwarded and
waited for; every child gets SIGTERM from the kernel if this process dies (PR_SET_PDEATHSIG), so
none is left behind even after a SIGKILL.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvgateway import config, logs
from kvgateway.cluster.commands import exit_with_parent, require_nats
from kvgateway.cluster.options import NatsOptions, options_to_argv

log = logging.getLogger("kvgateway.cluster")

RESTART_DELAY_SECONDS = 1.0
STOP_SECONDS = 10.0


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = field(default=0.0)

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, preexec_fn=exit_with_parent)  # noqa: PLW1509 - prctl only
        self.started_at = time.monotonic()
        log.info("started %s (pid %d)", self.name, self.proc.pid)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server_argv(argv: list[str]) -> list[str]:
    """The serve flags every child shares (sources, HTTP settings, limits, logging): ``argv``
    without ``serve`` and the flags that are the supervisor's own."""
    own = {"--workers", "--state-dir", "--port", "--nats"}
    out: list[str] = []
    items = argv[1:] if argv[:1] == ["serve"] else list(argv)
    i = 0
    while i < len(items):
        name, has_value, _ = items[i].partition("=")
        if name in own:
            i += 1 if has_value else 2
            continue
        out.append(items[i])
        i += 1
    return out


def children(args: argparse.Namespace, argv: list[str], nats_url: str, store: Path | None, port: int) -> list[Child]:
    """nats-server (unless ``store`` is None: an existing one at ``nats_url``), ingest, edges."""
    me = [sys.executable, "-m", "kvgateway"]
    shared = _server_argv(argv)
    nats = options_to_argv(NatsOptions(servers=(nats_url,)))
    out = []
    if store is not None:
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        nats_port = nats_url.rsplit(":", 1)[1]
        out.append(Child("nats-server", [binary, "-js", "-a", "127.0.0.1", "-p", nats_port, "-sd", str(store)]))
    out.append(Child("ingest", [*me, "ingest", *shared, *nats, "--port", "0", "--exit-with-parent"]))
    for n in range(args.workers):
        edge = [*me, "edge", *shared, *nats, "--port", str(port), "--reuse-port", "--exit-with-parent"]
        out.append(Child(f"edge {n + 1}", edge))
    return out


def run(args: argparse.Namespace, argv: list[str]) -> int:
    settings = config.settings_from_args(args)
    logs.setup(settings.log_level, settings.log_format)
    if args.workers < 1:
        raise config.ConfigError("--workers must be >= 1")
    require_nats()
    store: Path | None = None
    if args.nats:
        nats_url = args.nats
    elif shutil.which("nats-server") is None and not Path("/usr/sbin/nats-server").exists():
        log.error("--workers needs nats-server on PATH (Debian: apt-get install nats-server), or --nats URL")
        return 1
    else:
        store = Path(args.state_dir or "kvgateway-state") / "nats"
        store.mkdir(parents=True, exist_ok=True)
        nats_url = f"nats://127.0.0.1:{_free_port()}"
    port = settings.port if settings.port else _free_port()
    procs = children(args, argv, nats_url, store, port)
    stopping: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for child in procs:
        child.start()
        if child.name == "nats-server":
            time.sleep(0.5)  # it listens within milliseconds; the roles retry anyway
    log.info("serving on http://%s:%d/ with %d edge processes", settings.host, port, args.workers)
    while not stopping:
        for child in procs:
            assert child.proc is not None
            code = child.proc.poll()
            if code is not None and not stopping:
                log.warning("%s exited (code %d): starting it again", child.name, code)
                child.restarts += 1
                time.sleep(RESTART_DELAY_SECONDS)
                child.start()
        time.sleep(0.2)
    return _stop_all([c for c in procs if c.name != "nats-server"], [c for c in procs if c.name == "nats-server"])


def _stop_all(roles: list[Child], servers: list[Child]) -> int:
    """Edges and ingest first, nats-server last (they flush to it)."""
    for group in (roles, servers):
        for child in group:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for child in group:
            if child.proc is None:
                continue
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %g s: killed", child.name, STOP_SECONDS)
                child.proc.kill()
                child.proc.wait()
    log.info("stopped (pid %d)", os.getpid())
    return 0
