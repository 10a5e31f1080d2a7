"""Node.js for the tests: the command that runs it with a global ``WebSocket`` (Node 22 has one;
Node 20 and 21 need ``--experimental-websocket``), or a skip when there is none."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache

import pytest


@cache
def node_command() -> tuple[str, ...]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node (Node.js) is not installed: the example client cannot be run")
    probe = subprocess.run(
        [node, "-e", "process.stdout.write(typeof WebSocket)"], check=False, capture_output=True, text=True
    )
    if probe.stdout == "function":
        return (node,)
    flagged = subprocess.run(
        [node, "--experimental-websocket", "-e", "process.stdout.write(typeof WebSocket)"],
        check=False,
        capture_output=True,
        text=True,
    )
    if flagged.stdout != "function":
        pytest.skip(f"this node ({probe.stdout or probe.stderr}) has no WebSocket client, even with a flag")
    return (node, "--experimental-websocket")
