"""Starting the gateway as a new user does: taken ports, IPv6 engines, the bare command; and
stopping it.

Real processes only: ``python -m kvgateway`` subprocesses, a listening socket holding a port, a
ZeroMQ socket holding an engine port, and the simulator as an IPv6 engine.
"""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import zmq

from tests.support import (
    BIG_QUEUE,
    REPO,
    Proc,
    Start,
    free_port,
    free_ports,
    start_gateway,
    start_sim,
    stream_metrics,
    wait_until,
)
from tests.support.clients import WsCollector, closed_by_signal


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port some other program listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def _run(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None, python: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``kvgateway *args`` run as a process (``python``: the interpreter's own options first)."""
    return subprocess.run(
        [sys.executable, *python, "-m", "kvgateway", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


@pytest.mark.parametrize(
    ("flags", "env", "named"),
    [(["--nats", "nats://h:1"], {}, "--nats"), ([], {"KVGATEWAY_NATS": "nats://h:1"}, "KVGATEWAY_NATS")],
)
def test_serve_with_nats_but_no_workers_names_where_nats_was_given(
    flags: list[str], env: dict[str, str], named: str
) -> None:
    result = _run("serve", "--source", "name=a,endpoint=tcp://127.0.0.1:9", *flags, env=env)
    assert result.returncode == 2, result.stderr
    assert (
        result.stderr
        == f"kvgateway serve: error: {named} needs --workers (or run kvgateway ingest and kvgateway edge)\n"
    )


@pytest.mark.parametrize("command", ["demo", "serve"])
def test_a_taken_http_port_is_one_line_naming_the_port_and_the_flag(command: str, taken_port: int) -> None:
    extra = [] if command == "demo" else ["--source", "name=a,endpoint=tcp://127.0.0.1:9"]
    result = _run(command, "--port", str(taken_port), *extra)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output  # no traceback, nothing else
    assert f"cannot listen on 127.0.0.1:{taken_port}: address already in use" in lines[0]
    assert "--port" in lines[0]
    # Nothing claimed to have started.
    assert "started" not in output and "dashboard at" not in output and "serving on" not in output


@pytest.mark.parametrize("place", ["flag", "env"])
def test_a_state_dir_that_cannot_be_made_names_where_it_was_given(place: str) -> None:
    where = "/proc/kvgateway-state"  # no directory can be made there
    flags, env = (["--state-dir", where], {}) if place == "flag" else ([], {"KVGATEWAY_STATE_DIR": where})
    result = _run("serve", "--source", "name=a,endpoint=tcp://127.0.0.1:9", "--workers", "1", *flags, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    named = "--state-dir" if place == "flag" else "KVGATEWAY_STATE_DIR"
    assert result.stderr.startswith(f"kvgateway serve: error: {named} '{where}': "), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_demo_engines_that_cannot_start_are_one_line_and_exit_1(tmp_path: Path) -> None:
    """Their ipc:// sockets in a directory too deep for a socket path: the shell's one line."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    result = _run("demo", "--port", "0", env={"TMPDIR": str(deep)})
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    (error,) = result.stderr.strip().splitlines()
    assert "ERROR" in error and "demo engines: cannot start: " in error and str(deep) in error, error
    assert "dashboard at" not in output


def test_port_zero_start_up_lines_show_the_port_chosen(procs: Start) -> None:
    """--port 0: the start-up line and the demo's first line (before a line per stream) hold the
    real port, not 0."""
    gateway = procs("serve", "--port", "0", "--source", "name=a,endpoint=tcp://127.0.0.1:9")
    port = gateway.wait_for(r"serving on http://127\.0\.0\.1:(\d+)/", timeout=30).group(1)
    assert gateway.wait_for(r"gateway started: http 127\.0\.0\.1:(\d+),").group(1) == port
    demo = procs("demo", "--port", "0")
    demo.wait_for("press Ctrl-C to stop", timeout=30)
    first = demo.lines[0]
    url = demo.wait_for(r"^kvgateway demo: dashboard at (\S+)$").group(1)
    assert first == f"kvgateway demo: starting 4 streams; the dashboard will be at {url}", demo.output()
    assert not url.endswith(":0/")


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_a_signal_closes_web_clients_with_the_gateways_code_then_exits_0(command: str, procs: Start) -> None:
    """SIGTERM: the shell closes every client with the gateway's own close (1012 and its reason;
    uvicorn's would have none) before uvicorn stops. The edge's: tests/cluster/test_edge_cli.py."""
    if command == "serve":
        gateway = procs("serve", "--port", "0", "--source", "name=a,endpoint=tcp://127.0.0.1:9")
        url = gateway.wait_for(r"serving on (http://\S+)", timeout=30).group(1)
    else:
        gateway = procs("demo", "--port", "0")
        url = gateway.wait_for(r"dashboard at (http://\S+)", timeout=30).group(1)
    ws_url = url.replace("http://", "ws://", 1) + "v1/ws"
    assert closed_by_signal(gateway, ws_url) == (1012, "gateway shutting down", 0), gateway.output()
    assert "Traceback" not in gateway.output()


def test_a_taken_engine_port_names_the_source_address_and_reason() -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    holder = context.socket(zmq.PUB)
    try:
        port = holder.bind_to_random_port("tcp://127.0.0.1")
        endpoint = f"tcp://127.0.0.1:{port}"
        result = _run("serve", "--port", str(free_port()), "--source", f"name=late,endpoint={endpoint},bind=true")
    finally:
        holder.close(linger=0)
        context.term()
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    (line,) = output.strip().splitlines()
    assert f"source 'late' rank 0: cannot bind {endpoint}: address already in use" in line
    assert "Resource temporarily unavailable" not in line and "gateway started" not in output


def test_an_ipv6_engine_is_connected_to_and_replayed_from(procs: Start) -> None:
    """The engine listens on IPv6 (``[::]``, so on ``::1``); the gateway is given ``tcp://[::1]:P``:
    it must connect (not bind), receive every batch and fill a gap from the IPv6 replay socket."""
    http, pub, rep = free_ports(3)
    total = 150
    start_sim(
        procs,
        "--endpoint",
        f"tcp://[::]:{pub}",
        "--replay-endpoint",
        f"tcp://[::]:{rep}",
        "--rate",
        "100",
        "--batches",
        str(total),
        "--skip",
        "60-69",  # never sent live: only a replay over IPv6 can deliver them
        "--linger",
        "60",
    )
    gw = start_gateway(
        procs, http, [f"name=v6,endpoint=tcp://[::1]:{pub},replay=tcp://[::1]:{rep}"], client_queue_bytes=BIG_QUEUE
    )
    assert "v6[0]=tcp://[::1]" in gw.proc.output()  # connect: the summary would say "bind"
    assert "v6[0]=bind" not in gw.proc.output()

    def done() -> dict[str, object] | None:
        m = stream_metrics(gw.base, "v6")
        return m if m["last_seq"] == total - 1 and m["queue_depth"] == 0 and m["replay"] else None

    m = wait_until(done, timeout=60, what="every batch of the IPv6 engine")
    assert m["up"] == 1 and m["unrecovered"] == 0
    assert m["replay"].get("recovered", 0) >= 1 and set(m["replay"]) == {"recovered"}
    assert m["replayed"] >= 10  # at least the skipped 60-69


def test_the_bare_command_prints_the_help() -> None:
    result = _run()
    assert result.returncode == 0
    assert result.stdout.startswith("usage: kvgateway")
    for command in ("simulate", "serve", "demo"):
        assert command in result.stdout


def test_serve_help_has_description_examples_and_groups() -> None:
    result = _run("serve", "--help")
    assert result.returncode == 0
    text = result.stdout
    for title in ("engines:", "HTTP:", "security:", "limits:", "logging:", "examples:"):
        assert f"\n{title}" in text, title
    assert "kv_events_config=" in text and "KVGATEWAY_RING_BYTES" in text
    assert "a flag beats the\nenvironment" in text or "a flag beats the environment" in text.replace("\n", " ")


def _imported(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """The command run with ``-X importtime``: its result and every module it imported."""
    result = _run(*args, python=("-X", "importtime"))
    lines = [line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")]
    return result, set(lines)


def test_each_command_imports_the_modules_of_its_own_arguments_only() -> None:
    """``serve`` does not import the simulator, the demo or the cluster's commands to build its
    parser (a tenth of its start-up's imports); ``simulate`` still gets its own arguments, and a
    mistyped command still hears of every command."""
    others = {"kvgateway.simulator", "kvgateway.demo", "kvgateway.cluster.commands"}
    result, modules = _imported("serve", "--help")
    assert result.returncode == 0 and "--source" in result.stdout
    assert "kvgateway.cli" in modules and not modules & others
    result, modules = _imported("simulate", "--help")
    assert result.returncode == 0 and "--endpoint" in result.stdout and "kvgateway.simulator" in modules
    result = _run("serv")
    assert result.returncode == 2
    assert all(command in result.stderr for command in ("simulate", "serve", "ingest", "edge", "demo"))


IMPORT_LINE = re.compile(r"^import time: +\d+ \| +\d+ \| +(\S+)$")
"""A line of ``-X importtime`` (``PYTHONPROFILEIMPORTTIME``): the module imported."""

NOT_AT_START: frozenset[str] = frozenset(
    {
        "kvgateway.simulator",
        "kvgateway.demo",
        "kvgateway.cluster.commands",
        "kvgateway.cluster.supervisor",
        "kvgateway.serve.ws_protocol",  # at the first WebSocket upgrade (serve.server.WebSocketUpgrade)
        "websockets",
        "tomllib",  # with a configuration file only
        "difflib",  # for a mistyped name only
        "ctypes.util",  # the C library's malloc_trim, looked up at the first trim (runtime.memory)
        "importlib.readers",  # the JSON Schema's file, read at the first GET /v1/schema (serve.app)
    }
)
"""What a ``serve`` start-up without a file and without a client must not import (what a gateway
catching up from an engine's buffer spent before it could ask for the replay)."""


def _imports(proc: Proc) -> set[str]:
    return {match.group(1) for line in list(proc.lines) if (match := IMPORT_LINE.match(line))}


def test_serve_imports_the_websocket_protocol_and_the_file_parser_only_when_needed(procs: Start) -> None:
    """Started without a configuration file, the gateway serves (/healthz, the start-up line)
    without having imported what only a WebSocket client, a file or a typo needs; the first
    WebSocket client gets its hello through the protocol imported at its upgrade."""
    gateway = procs(
        "serve", "--port", "0", "--source", "name=a,endpoint=tcp://127.0.0.1:9", env={"PYTHONPROFILEIMPORTTIME": "1"}
    )
    url = gateway.wait_for(r"serving on (http://\S+)", timeout=60).group(1)
    started = _imports(gateway)
    assert "kvgateway.serve.server" in started and "uvicorn.protocols.http.httptools_impl" in started
    assert not started & NOT_AT_START, sorted(started & NOT_AT_START)
    with WsCollector(url.replace("http://", "ws://", 1) + "v1/ws") as client:
        assert client.hello["type"] == "hello"
    gateway.wait_for(r"^import time: .*\| +kvgateway\.serve\.ws_protocol$")
    schema = httpx.get(url + "v1/schema", timeout=30)  # read at its first request
    assert schema.status_code == 200 and "$defs" in schema.json()


GC_PROBE = """
import gc, os, signal, sys
from kvgateway import gateway
from kvgateway.cli import main

seen = []
collections = []
made = gateway.OneProcess.__init__
start = gateway.OneProcess.start

def init(self, *args, **kwargs):
    seen.append(("made", gc.isenabled(), gc.get_freeze_count()))
    made(self, *args, **kwargs)

async def started(self):
    seen.append(("start", gc.isenabled(), gc.get_freeze_count(), len(collections)))
    await start(self)
    os.kill(os.getpid(), signal.SIGTERM)

gateway.OneProcess.__init__ = init
gateway.OneProcess.start = started
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
code = main(sys.argv[1:])
print(repr((seen, code, gc.isenabled())))
"""


def test_serve_holds_the_collector_through_start_up_and_freezes_its_heap_before_the_streams_open() -> None:
    """The collector is off while start-up builds the role (its objects live as long as the
    process); the heap is frozen, and the collector on again, before the role starts the streams:
    the freeze's full collection no longer falls into a catch-up's first batches. The freeze is no
    collection at all (a walk of the whole start-up heap, a tenth of the start-up): from main to
    the role's start the collector runs never. main gives the collector back when it returns."""
    result = subprocess.run(
        [sys.executable, "-c", GC_PROBE, "serve", "--port", "0", "--source", "name=a,endpoint=tcp://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen, code, enabled_after = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    (made, held, frozen_before), (start, collecting, frozen, collections) = seen
    assert (made, held, frozen_before) == ("made", False, 0)
    assert start == "start" and collecting and frozen > 10_000  # the modules, classes and functions of start-up
    assert collections == 0
    assert code == 0 and enabled_after


def test_a_command_other_than_serve_runs_with_the_collector() -> None:
    probe = (
        "import gc, sys\n"
        "from kvgateway import cli, simulator\n"
        "simulator.run = lambda args: print(gc.isenabled()) or 0\n"
        "sys.exit(cli.main(['simulate']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO, check=False
    )
    assert (result.returncode, result.stdout) == (0, "True\n"), result.stderr
