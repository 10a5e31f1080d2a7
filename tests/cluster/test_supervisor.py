"""``serve --workers``'s supervisor with real processes: the children it starts, the nats-server's
output, and a child that cannot start."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
from pathlib import Path

import pytest

from kvgateway.cluster.supervisor import MAX_FAILED_STARTS
from tests.cluster.test_cluster import ready, sim
from tests.support import Proc, Start, free_port, source_spec, wait_until
from tests.support.nats import NatsServer, nats_binary

pytestmark = pytest.mark.timeout(120)

AS_INSTALLED = (sys.executable, "-P", "-m", "kvgateway")
"""The parent as the installed ``kvgateway`` script runs: the working directory not on sys.path."""


def test_a_kvgateway_folder_in_the_working_directory_is_ignored(procs: Start, tmp_path: Path) -> None:
    """From a directory holding a ``kvgateway/`` folder (a clone's parent; an editable install's
    finder comes after it on the path) the roles still import the package the parent runs; the
    private nats-server's banner goes to its log, not the terminal."""
    nats_binary()
    bogus = tmp_path / "kvgateway"
    bogus.mkdir()
    (bogus / "__init__.py").write_text("raise ImportError('the bogus kvgateway folder was imported')\n")
    pub, rep, port = free_port(), free_port(), free_port()
    sim(procs, pub, rep, "--rate", "50", "--batches", "100000")
    parent = Proc(
        "serve", "--source", source_spec("sim", pub, rep), "--port", str(port), "--workers", "2",
        command=AS_INSTALLED, cwd=tmp_path,
    )  # fmt: skip
    try:
        parent.wait_for("with 2 edge processes", timeout=60)
        # Announced once the port works: an edge accepts a connection from then on.
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        wait_until(lambda: ready(port), timeout=40, what="an edge ready")
        assert parent.popen.poll() is None
        output = parent.output()
        assert "exited (code" not in output and "Traceback" not in output, output
        assert "Starting nats-server" not in output, output  # the banner ...
        log = tmp_path / "kvgateway-state" / "nats-server.log"
        assert "Starting nats-server" in log.read_text()  # ... is in the state directory
        assert f"nats-server log: {log.relative_to(tmp_path)}" in output
        assert parent.stop(20) == 0
    finally:
        parent.stop()


def test_a_taken_port_is_the_single_process_line_at_once_and_nothing_starts(
    procs: Start, nats_server: NatsServer
) -> None:
    """``serve --workers`` binds its port before any child starts: a taken one fails at once with
    the one line single-process ``serve`` gives, and nothing is started or announced before it."""
    with socket.socket() as taken:  # no SO_REUSEPORT: nobody else may bind it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        source = source_spec("sim", free_port(), free_port())
        single = procs("serve", "--source", source, "--port", str(port))
        assert single.popen.wait(60) == 1
        workers = procs("serve", "--source", source, "--port", str(port), "--workers", "2", "--nats", nats_server.url)
        code = workers.popen.wait(60)
    lines = workers.finished_output()
    assert code == 1, lines
    (expected,) = [line[line.index("cannot listen") :] for line in single.finished_output() if "cannot listen" in line]
    assert expected.startswith(f"cannot listen on 127.0.0.1:{port}: address already in use;"), expected
    assert expected.endswith("choose another with --port"), expected
    errors = [line for line in lines if "ERROR" in line]
    assert [line[line.index("cannot listen") :] for line in errors] == [expected], lines
    assert not any("started" in line or "serving on" in line for line in lines), lines


def test_workers_from_the_environment_and_nats_from_the_file(
    procs: Start, nats_server: NatsServer, tmp_path: Path
) -> None:
    """KVGATEWAY_WORKERS and the file's [cluster] nats: serve runs the roles, no flag needed."""
    pub, rep, port = free_port(), free_port(), free_port()
    sim(procs, pub, rep, "--rate", "50", "--batches", "100000")
    path = tmp_path / "kvgateway.toml"
    path.write_text(f'[cluster]\nnats = "{nats_server.url}"\n')
    parent = procs(
        "serve", "--source", source_spec("sim", pub, rep), "--port", str(port), "--config", str(path),
        env={"KVGATEWAY_WORKERS": "1"},
    )  # fmt: skip
    parent.wait_for("with 1 edge processes", timeout=30)
    wait_until(lambda: ready(port), timeout=40, what="the edge ready")
    assert "started nats-server" not in parent.output()  # the file's server, not a private one
    assert parent.stop(20) == 0


def test_a_private_nats_server_that_cannot_start_points_at_its_log(procs: Start, tmp_path: Path) -> None:
    """Its words are in its log (not the terminal): the one line says where."""
    nats_binary()
    state = tmp_path / "state"
    (state / "nats-server.log").mkdir(parents=True)  # a log it cannot open: it exits at once
    parent = procs(
        "serve", "--source", source_spec("sim", free_port(), free_port()), "--workers", "1", "--state-dir", str(state)
    )
    code = parent.popen.wait(90)
    lines = parent.finished_output()
    assert code == 1, lines
    (given_up,) = [line for line in lines if "giving up" in line]
    assert (
        f"nats-server failed to start 4 times in a row (exit code 1; its log: {state / 'nats-server.log'})" in given_up
    )
    restarts = [line for line in lines if "nats-server exited (code 1): starting it again" in line]
    assert len(restarts) == MAX_FAILED_STARTS - 1, lines
    assert [line.rsplit(" in ", 1)[1] for line in restarts] == ["1 s", "2 s", "4 s"]
    assert not any("serving on" in line for line in lines), lines  # the port never worked: not announced


def test_a_state_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    nats_binary()
    state = tmp_path / "state"
    state.write_text("not a directory\n")
    proc = Proc(
        "serve", "--source", source_spec("sim", free_port(), free_port()), "--workers", "1", "--state-dir", str(state)
    )
    lines = proc.finished_output(timeout=60)
    assert proc.popen.returncode == 2, lines
    assert len(lines) == 1 and f"--state-dir {str(state)!r}" in lines[0], lines


def test_the_only_ingest_killed_is_started_again_and_reclaims_its_leases_at_once(
    procs: Start, nats_server: NatsServer
) -> None:
    """The supervisor starts its ingest again under the same member id: the new process holds the
    streams at its first round, before its ready line, instead of waiting out the dead one's leases."""
    pub, rep, port = free_port(), free_port(), free_port()
    sim(procs, pub, rep, "--rate", "50", "--batches", "100000")
    parent = procs(
        "serve", "--source", source_spec("sim", pub, rep), "--port", str(port), "--workers", "1",
        "--nats", nats_server.url,
    )  # fmt: skip
    first = parent.wait_for(re.compile(r"started ingest \(pid (\d+)\)"), timeout=60)
    parent.wait_for("ingest publishing to", timeout=60)
    os.kill(int(first.group(1)), signal.SIGKILL)
    wait_until(lambda: "ingest exited (code -9)" in parent.output(), timeout=30, what="the kill seen")
    wait_until(lambda: parent.output().count("ingest publishing to") == 2, timeout=60, what="the ingest again")
    lines = parent.lines
    again = max(i for i, line in enumerate(lines) if "started ingest (pid" in line)
    said = [line for line in lines[again:] if "sim[0]: reclaimed (lease" in line or "ingest publishing to" in line]
    assert len(said) >= 2 and "reclaimed" in said[0], parent.output()
    assert parent.stop(20) == 0
