"""``kvgateway serve --workers N``: one machine, many cores, one command.

Starts a private nats-server on loopback (its store and its log under the state directory), one
ingest process and N edge processes that share the HTTP port (SO_REUSEPORT: the kernel spreads new
connections over them). A child that exits is started again, after a growing pause when it keeps
failing at start, and the supervisor gives up (one line, exit code 1) when it fails at start
MAX_FAILED_STARTS times in a row; SIGTERM/SIGINT are forwarded and waited for; every child gets
SIGTERM from the kernel if this process dies (PR_SET_PDEATHSIG), so none is left behind even after
a SIGKILL.

The children import the package this process runs, never a ``kvgateway/`` folder in the working
directory: they run with ``-P`` (no working directory on sys.path) and this package's root first on
PYTHONPATH (the checkout itself when run from one without an install).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import kvgateway
from kvgateway.cluster.commands import exit_with_parent, require_nats
from kvgateway.config.cluster import NatsOptions
from kvgateway.config.errors import ConfigError
from kvgateway.config.loading import Loaded
from kvgateway.config.options import CLIENT_ONLY, CLUSTER_BY_KEY, OPTION_BY_KEY, OPTIONS
from kvgateway.config.settings import Settings
from kvgateway.runtime import logging_setup
from kvgateway.runtime.startup import StartupError
from kvgateway.serve.server import listen

logger = logging.getLogger("kvgateway.cluster")

RESTART_DELAY_SECONDS = 1.0
START_GRACE_SECONDS = 10.0
"""A child that exits sooner than this after its start failed to start."""
MAX_FAILED_STARTS = 4
"""Failed starts in a row (pauses of 1, 2, 4 s between them) before the supervisor gives up."""
STOP_SECONDS = 10.0


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    output: str = "its output is above"  # where its own words about a failure are
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    failed_starts: int = 0
    started_at: float = field(default=0.0)
    due: float | None = None  # when to start it again

    def start(self) -> None:
        self.due = None
        self.proc = subprocess.Popen(self.argv, env=self.env, preexec_fn=exit_with_parent)  # noqa: PLW1509 - prctl
        self.started_at = time.monotonic()
        logger.info("started %s (pid %d)", self.name, self.proc.pid)

    def exited(self, now: float) -> float | None:
        """Count an exit: the pause before the next start, or None to give up."""
        self.restarts += 1
        self.failed_starts = self.failed_starts + 1 if now - self.started_at < START_GRACE_SECONDS else 0
        if self.failed_starts >= MAX_FAILED_STARTS:
            return None
        return RESTART_DELAY_SECONDS * float(2 ** max(0, self.failed_starts - 1))


def child_env() -> dict[str, str]:
    """The environment of a role: this package's root first on PYTHONPATH (see the module's note)."""
    root = str(Path(kvgateway.__file__).resolve().parent.parent)
    path = [root, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server_argv(argv: list[str], *, drop: frozenset[str] = frozenset()) -> list[str]:
    """The serve flags every child shares (sources, HTTP settings, limits, logging): ``argv``
    without ``serve``, the flags that are the supervisor's own and the settings in ``drop``."""
    own = {OPTION_BY_KEY[key].flag_name for key in (*CLUSTER_BY_KEY, "port", *drop)}
    switches = {option.flag_name for option in OPTIONS if option.is_switch}  # no value follows
    out: list[str] = []
    items = argv[1:] if argv[:1] == ["serve"] else list(argv)
    i = 0
    while i < len(items):
        name, has_value, _ = items[i].partition("=")
        if name in own:
            i += 1 if has_value or name in switches else 2
            continue
        out.append(items[i])
        i += 1
    return out


def nats_log(store: Path) -> Path:
    """The private nats-server's log (its banner and notices stay off the user's terminal)."""
    return store.parent / "nats-server.log"


def children(workers: int, argv: list[str], nats: NatsOptions, store: Path | None, port: int) -> list[Child]:
    """nats-server (unless ``store`` is None: existing ones at ``nats.servers``), ingest, edges."""
    me = [sys.executable, "-P", "-m", "kvgateway"]  # -P: the working directory cannot shadow the package
    env = child_env()
    shared = _server_argv(argv)
    # The servers only: they are the supervisor's choice (its private nats-server, or --nats). Every
    # other NATS setting stays the children's to read from the file (--config, in ``shared``) and
    # the environment they inherit, as a lone ingest or edge reads it: ``serve`` takes none of them
    # as a flag, so a flag with its default here would override what the file or a variable says.
    nats_flags = [arg for url in nats.servers for arg in ("--nats", url)]
    out = []
    if store is not None:
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        nats_port = nats.servers[0].rsplit(":", 1)[1]
        server = [binary, "-js", "-a", "127.0.0.1", "-p", nats_port, "-sd", str(store), "-l", str(nats_log(store))]
        out.append(Child("nats-server", server, output=f"its log: {nats_log(store)}"))
    ingest = _server_argv(argv, drop=CLIENT_ONLY)  # it has no flags for web clients' settings
    # One member id for every start of the ingest: started again, it reclaims its own leases at once.
    member = ["--member", f"{socket.gethostname()}-{os.getpid()}-ingest"]
    out.append(
        Child("ingest", [*me, "ingest", *ingest, *nats_flags, *member, "--port", "0", "--exit-with-parent"], env)
    )
    for n in range(workers):
        edge = [*me, "edge", *shared, *nats_flags, "--port", str(port), "--reuse-port", "--exit-with-parent"]
        out.append(Child(f"edge {n + 1}", edge, env))
    return out


def run(loaded: Loaded, argv: list[str]) -> int:
    settings, workers = loaded.settings, loaded.workers.count
    assert workers is not None  # (from 1 on: the loader checked it)
    logging_setup.setup_for(settings)
    require_nats()
    store: Path | None = None
    if loaded.nats.servers:
        nats_urls = loaded.nats.servers
    elif shutil.which("nats-server") is None and not Path("/usr/sbin/nats-server").exists():
        logger.error("--workers needs nats-server on PATH (Debian: apt-get install nats-server), or --nats URL")
        return 1
    else:
        store = Path(loaded.workers.state_dir) / "nats"
        try:
            store.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            named = loaded.given.get("state_dir", "--state-dir")  # a flag, a variable or the file's key
            raise ConfigError(f"{named} {str(store.parent)!r}: {exc.strerror or exc}") from None
        nats_urls = (f"nats://127.0.0.1:{_free_port()}",)
    try:
        # The port is the supervisor's before any child starts: a taken one is the single process's
        # one line, at once. Bound (SO_REUSEPORT, not listening) for as long as the supervisor runs,
        # so no other program takes it while edges restart; the edges listen beside it.
        reserved = listen(settings, reuse_port=True)  # --port 0: the port the kernel gives
    except StartupError as exc:
        logger.error("%s", exc)
        return 1
    with reserved:
        port = int(reserved.getsockname()[1])
        nats = replace(loaded.nats, servers=nats_urls)
        return _run_children(workers, argv, settings, nats=nats, store=store, port=port)


def _run_children(
    workers: int,
    argv: list[str],
    settings: Settings,
    *,
    nats: NatsOptions,
    store: Path | None,
    port: int,
) -> int:
    procs = children(workers, argv, nats, store, port)
    stopping: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for child in procs:
        child.start()
        if child.name == "nats-server":
            time.sleep(0.5)  # it listens within milliseconds; the roles retry anyway
    if store is not None:
        logger.info("nats-server log: %s", nats_log(store))
    announce = f"serving on http://{settings.host}:{port}/ with {workers} edge processes"
    code = _supervise(procs, stopping, Announcement(settings.host, port, announce))
    _stop_all([c for c in procs if c.name != "nats-server"], [c for c in procs if c.name == "nats-server"])
    return code


@dataclass
class Announcement:
    """The ready line, said once an edge accepts connections on the port (nothing is announced as
    started before the port works)."""

    host: str
    port: int
    line: str
    said: bool = False

    def check(self) -> None:
        if self.said:
            return
        with contextlib.suppress(OSError), socket.create_connection((self.host.strip("[]"), self.port), timeout=0.2):
            self.said = True
            logger.info("%s", self.line)


def _supervise(procs: list[Child], stopping: list[int], announcement: Announcement) -> int:
    """Start again what exits, until a signal (0) or a child that keeps failing at start (1)."""
    while not stopping:
        announcement.check()
        now = time.monotonic()
        for child in procs:
            if child.due is not None:
                if now >= child.due:
                    child.start()
                continue
            assert child.proc is not None
            code = child.proc.poll()
            if code is None or stopping:
                continue
            pause = child.exited(now)
            if pause is None:
                logger.error(
                    "%s failed to start %d times in a row (exit code %d; %s): giving up",
                    child.name,
                    child.failed_starts,
                    code,
                    child.output,
                )
                return 1
            logger.warning("%s exited (code %d): starting it again in %g s", child.name, code, pause)
            child.due = now + pause
        time.sleep(0.2)
    return 0


def _stop_all(roles: list[Child], servers: list[Child]) -> None:
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
                logger.warning("%s did not stop in %g s: killed", child.name, STOP_SECONDS)
                child.proc.kill()
                child.proc.wait()
    logger.info("stopped (pid %d)", os.getpid())
