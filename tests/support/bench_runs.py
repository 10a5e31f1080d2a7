"""Running a stand-alone bench script in its smoke mode, for the bench smoke tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.processes import REPO


def run_bench(module: str, *args: str) -> Any:
    """``python -m MODULE ARGS`` from the repository: what it printed, as JSON (it must succeed)."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def smoke_result(module: str, tmp_path: Path) -> dict[str, Any]:
    """``python -m MODULE --smoke``: its result file, checked to equal what it printed."""
    printed = run_bench(module, "--smoke", "--results-dir", str(tmp_path))
    (path,) = tmp_path.glob("*-smoke.json")
    result: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    assert result == printed
    assert result["mode"] == "smoke"
    return result
