"""The command line's help and its one-line errors (the installed artifact: test_artifact.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO


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
