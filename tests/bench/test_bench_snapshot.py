"""``python -m bench.snapshot --smoke`` serves a block snapshot to a client while live clients listen,
and reports every figure (never a speed: smoke sizes mean nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_snapshot_bench_smoke(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.snapshot", "--smoke", "--results-dir", str(tmp_path)],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("*-smoke.json")
    result = json.loads(path.read_text(encoding="utf-8"))
    assert result == json.loads(proc.stdout)
    snap = result["snapshot"]
    assert snap["blocks"] >= 8192 and snap["first_live_offset"] == snap["hello_offset"] + 1
    assert result["learned_blocks"] >= 8192
    for window in ("baseline", "during"):
        assert {"count", "p50_ms", "p99_ms", "max_ms"} <= set(result[window]), window
    assert result["p99_ratio_during_vs_baseline"] > 0
