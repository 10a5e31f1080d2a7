"""static/client.js, the JavaScript client the dashboard uses, run by Node (``node --test``).

- Its unit tests: the connection (tests/js/client.test.mjs, a fake WebSocket and fetch) and the
  state (tests/js/client-state.test.mjs), with digest vectors computed here by Python's
  own FNV-1a, so that the JavaScript digest is checked against an independent implementation.
- The README's snippet, on the client as the gateway serves it, over WebSocket and over SSE.
- The paused-offset conformance (tests/js/conformance.test.mjs) against a real gateway and
  tests/support/conformance.py's scripted engine: the client's blocks and stale flags equal
  ``GET /v1/blocks`` at every pause, TensorRT-LLM's ``time_ns`` seqs arrive exact, and, on a
  gateway that knows the ``digest`` parameter, its digests match the gateway's and a corrupted
  model is caught at the next one.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from tests.support import REPO, Start, wait_until
from tests.support.conformance import ConformanceScript, ControlServer, digest_supported
from tests.support.metrics import metric
from tests.support.node import node_command

JS_TESTS = REPO / "tests" / "js"
FNV_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    value = FNV_BASIS
    for byte in data:
        value = ((value ^ byte) * FNV_PRIME) & MASK
    return value


def digest(keys: list[tuple[str, int, str]]) -> str:
    """The state digest as docs/protocol.md defines it, written here from the definition."""
    total = sum(fnv1a64(f"{medium}\n{group}\n{block_hash}".encode()) for medium, group, block_hash in set(keys))
    return f"{total & MASK:016x}"


def vectors() -> list[dict[str, object]]:
    rng = random.Random(32)
    mediums = ["GPU", "CPU", "CPU_PINNED", "REMOTE_GPU", "Ünïcode"]
    cases: list[list[tuple[str, int, str]]] = [[], [("GPU", 0, "1")], [("GPU", 0, "18446744073709551615")]]
    for size in (2, 10, 500):
        cases.append(
            [(rng.choice(mediums), rng.choice([0, 1, 7]), str(rng.getrandbits(64) - (1 << 63))) for _ in range(size)]
        )
    cases.append([("DISK", 0, "00ff" * 8), ("DISK", 0, "00FF" * 8)])  # hex hashes: case matters
    return [{"keys": keys, "digest": digest(keys)} for keys in cases]


def run_node_test(script: Path, env: dict[str, str], timeout: float) -> str:
    result = subprocess.run(
        [*node_command(), "--test", str(script)],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=timeout,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "# fail 0" in result.stdout and "# skipped 0" in result.stdout, result.stdout[-3000:]
    return result.stdout


def test_the_javascript_connection_logic() -> None:
    out = run_node_test(JS_TESTS / "client.test.mjs", {}, 60)
    assert "# pass 7" in out


def test_the_javascript_state_and_digest(tmp_path: Path) -> None:
    cases = vectors()
    assert cases[0]["digest"] == "0000000000000000"
    assert cases[1]["digest"] != cases[2]["digest"]
    out = run_node_test(JS_TESTS / "client-state.test.mjs", {"KVGATEWAY_DIGEST_VECTORS": json.dumps(cases)}, 60)
    assert "# pass 11" in out


@pytest.mark.timeout(360)
@pytest.mark.parametrize("transport", ["ws", "sse"])
def test_the_javascript_client_follows_the_gateway_in_node(procs: Start, transport: str) -> None:
    script = ConformanceScript(procs)
    control = ControlServer(script)
    try:
        every = "1" if digest_supported(script.base) else ""
        env = {"KVGATEWAY_URL": script.base, "KVGATEWAY_CONTROL": control.url, "KVGATEWAY_DIGEST": every}
        env["KVGATEWAY_TRANSPORT"] = transport
        out = run_node_test(JS_TESTS / "conformance.test.mjs", env, 330)
        assert "# pass 1" in out
    finally:
        control.close()
        script.close()


def readme_snippet() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (snippet,) = [b for b in re.findall(r"```js\n(.*?)```", readme, re.S) if "connect(" in b]
    return snippet


@pytest.mark.timeout(120)
@pytest.mark.parametrize("websocket", [True, False], ids=["websocket", "sse"])
def test_the_readme_snippet_runs_on_the_served_client(procs: Start, tmp_path: Path, websocket: bool) -> None:
    """The README's three lines, as they are, with client.js and client-state.js fetched from the
    gateway (their stable URLs): with a WebSocket, and on a Node without one (Node 20 without the
    flag), over SSE. The block count it prints last is the gateway's."""
    script = ConformanceScript(procs)
    try:
        for name in ("client.js", "client-state.js"):
            response = httpx.get(f"{script.base}/{name}", timeout=10)
            assert response.status_code == 200 and "javascript" in response.headers["content-type"]
            (tmp_path / name).write_bytes(response.content)
        (tmp_path / "readme.mjs").write_text(readme_snippet().replace("http://127.0.0.1:8080", script.base))
        script.steps["history"]()
        # node_command() adds --experimental-websocket where Node needs it: without it, no WebSocket
        node = node_command() if websocket else node_command()[:1]
        lines: list[str] = []
        with subprocess.Popen([*node, "readme.mjs"], cwd=tmp_path, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
            reader.start()
            try:
                wait_until(lambda: metric(script.base, "kvgateway_clients") >= 1, timeout=20, what="node connected")
                script.steps["clear"]()  # batches, after the state
                doc = httpx.get(f"{script.base}/v1/blocks", params={"source": "a"}, timeout=10).json()
                expected = f"a 0 {len(doc['streams'][0]['blocks'])} blocks\n"
                wait_until(lambda: lines and lines[-1] == expected, timeout=20, what=expected)
            finally:
                proc.kill()
    finally:
        script.close()
