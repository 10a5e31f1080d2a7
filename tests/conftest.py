"""The fixtures every test directory shares; the helpers themselves are in :mod:`tests.support`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support import Proc


@pytest.fixture
def procs() -> Iterator[Callable[..., Proc]]:
    """Start CLI subprocesses; every one is stopped at the end of the test."""
    started: list[Proc] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Proc:
        proc = Proc(*args, env=env)
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        proc.stop()
