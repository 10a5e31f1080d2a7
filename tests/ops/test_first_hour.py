"""What a new user reads and types in the first hour: the Makefile's demo and the docs' promises."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from kvgateway.config.errors import ConfigError
from kvgateway.config.sources import parse_source_flag
from tests.support import REPO


@pytest.mark.parametrize(("extra", "command"), [([], "kvgateway demo"), (["PORT=9099"], "kvgateway demo --port 9099")])
def test_make_demo_passes_port(extra: list[str], command: str) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # Run from `make test` too: a sub-make inherits MAKEFLAGS and MAKELEVEL and would print its
    # "Entering/Leaving directory" lines around the commands; this make is a user's, at top level.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"}}
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", ".venv/.installed", "demo", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=30, check=True, env=env,
    )  # fmt: skip
    assert result.stdout.strip().endswith(command), result.stdout


def test_operations_says_publisher_zmq_is_required() -> None:
    """docs/operations.md says what the config does: a kv_events_config without it is refused."""
    text = " ".join((REPO / "docs/operations.md").read_text().split())
    assert '`"publisher": "zmq"` is required in the JSON the gateway is given' in text
    with pytest.raises(ConfigError, match='"publisher": "zmq"'):
        parse_source_flag('name=a,host=h,kv_events_config={"enable_kv_cache_events": true}')
