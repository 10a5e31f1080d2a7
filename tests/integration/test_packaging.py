"""The package as users get it: a non-editable wheel with the dashboard and schema inside."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support import REPO


def test_wheel_ships_dashboard_and_schema(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(REPO)],
        check=True,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = wheel_dir.glob("kvgateway-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "kvgateway/static/index.html" in names
    assert "kvgateway/protocol.schema.json" in names
    assert "kvgateway/py.typed" in names
    assert any(name.startswith("kvgateway/static/vendor/uplot/") and name.endswith(".js") for name in names)
    assert any(name.startswith("kvgateway/static/vendor/uplot/LICENSE") for name in names)
    assert not any(name.startswith("tests/") for name in names)
    # Every subpackage ships (a missing one breaks `kvgateway simulate` and `demo` only when installed).
    assert {"kvgateway/simulator/engine.py", "kvgateway/simulator/cli.py"} <= set(names)

    # Installed (not editable) into a plain directory, the package finds its files there.
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=240,
    )
    probe = (
        "import kvgateway.app as a, kvgateway.messages as m, kvgateway.simulator.cli, pathlib;"
        "d = a.static_dir(); print(d); assert (d / 'index.html').is_file(); assert m.schema_bytes().startswith(b'{')"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [sys.executable, "-c", probe], check=False, capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(target)


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvgateway", *argv], check=False, capture_output=True, text=True, timeout=60, cwd=REPO
    )


def test_cli_help_and_bad_arguments() -> None:
    for argv in (["--help"], ["serve", "--help"], ["simulate", "--help"], ["demo", "--help"]):
        result = _cli(*argv)
        assert result.returncode == 0, result.stderr
        assert "usage: kvgateway" in result.stdout
    for argv in (["serve", "--port", "notaport"], ["bogus"], ["demo", "--rate", "-1"]):
        result = _cli(*argv)
        assert result.returncode == 2, (argv, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvgateway"), (argv, result.stderr)
