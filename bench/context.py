"""The run's settings, handed to every scenario."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Mode


@dataclass(frozen=True)
class Context:
    mode: Mode
    runs: int
    """Repetitions of each measurement; figures are their median."""
    logs: Path
    """Where the processes of this run write their logs."""
    churn_seconds: float
    """Length of the memory scenario's churn run (the full run: 600)."""
    profile: bool = False
    """Record a py-spy profile of the gateway during the measurements that support it."""

    def pick(self, full: Any, quick: Any, smoke: Any) -> Any:
        return {"full": full, "quick": quick, "smoke": smoke}[self.mode]
