"""Many streams in one gateway: 2,000 of them start, are listed and stop; too few open files is one line.

ZeroMQ allows 1,023 sockets per context by default and each stream holds three, so a gateway
used to die at 341 streams with "too many open files". Real processes: ``python -m kvgateway
serve`` against closed loopback ports (engines not running), and one run under a lowered
RLIMIT_NOFILE.
"""

from __future__ import annotations

import resource
import subprocess
import sys

import httpx

from tests.support import BIG_QUEUE, REPO, Start, free_port, free_ports, source_spec, start_gateway


def _fleet(count: int, per_source: int = 1000) -> list[str]:
    """``--source`` specs for ``count`` streams on closed loopback ports (nothing listens there)."""
    specs = []
    for index, base in enumerate(free_ports((count + per_source - 1) // per_source, spacing=per_source)):
        size = min(per_source, count - index * per_source)
        specs.append(source_spec(f"fleet{index}", base, dp_size=size))
    return specs


def test_a_thousand_streams_start_are_listed_and_stop_cleanly(procs: Start) -> None:
    port = free_port()
    # A wait, not a bound (the start's time is bench/'s): a loaded machine starts 1,000 streams slowly.
    gateway = start_gateway(procs, port, _fleet(1000), timeout=180, client_queue_bytes=BIG_QUEUE)
    sources = httpx.get(f"{gateway.base}/v1/sources", timeout=30).json()["sources"]
    assert len(sources) == 1000
    assert {(s["source"], s["dp_rank"]) for s in sources} == {("fleet0", r) for r in range(1000)}
    assert gateway.proc.stop(timeout=20) == 0
    assert "Traceback" not in gateway.proc.output()
    assert "too many open files" not in gateway.proc.output()


def _lower_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))


def test_too_low_an_open_file_limit_is_one_line_naming_both_numbers() -> None:
    args = ["serve", "--port", str(free_port())]
    for spec in _fleet(100):
        args += ["--source", spec]
    result = subprocess.run(
        [sys.executable, "-m", "kvgateway", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
        preexec_fn=_lower_open_files,
    )
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 1, output
    (line,) = output.splitlines()
    # 64 + 4 per stream + 2 per concurrent replay (4 by default)
    assert "100 streams need 472 open files but the limit is 200 (hard limit 200)" in line, line
