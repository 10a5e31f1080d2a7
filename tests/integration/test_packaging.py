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


def test_ingest_help_lists_only_what_ingest_uses() -> None:
    """The ingest serves no web client: no flags for their auth, limits and queries; the NATS
    flags show their defaults."""
    from kvgateway.config.options import CLIENT_ONLY, OPTION_BY_KEY

    result = _cli("ingest", "--help")
    assert result.returncode == 0, result.stderr
    for key in CLIENT_ONLY:
        assert OPTION_BY_KEY[key].flag_name + " " not in result.stdout, key
    for flag in ("--token", "--allowed-origin", "--max-clients", "--lookup-rate", "--max-snapshots"):
        assert flag + " " not in result.stdout, flag
    assert "--ring-bytes" in result.stdout and "--replay-timeout" in result.stdout
    assert "needs a token" not in result.stdout and "probes and metrics" in result.stdout  # --host
    text = " ".join(result.stdout.split())
    assert "--nats-subject-prefix PREFIX subjects PREFIX.SOURCE.RANK (default kvgateway)" in text
    assert "--nats-replicas N stream replicas, 1 to 5 (an odd number keeps a majority; default 1)" in text
    assert "--token" in _cli("edge", "--help").stdout  # the edge serves clients: it has them all
