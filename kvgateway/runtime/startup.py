"""Start-up failures: one line and exit code 1, whichever command and part fails."""

from __future__ import annotations


class StartupError(Exception):
    """The process could not start (one line, exit code 1)."""
