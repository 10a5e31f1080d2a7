"""The fixtures every test directory shares; the helpers themselves are in :mod:`tests.support`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import Procs, Start


@pytest.fixture
def procs() -> Iterator[Start]:
    """Start CLI subprocesses; every one is stopped at the end of the test."""
    started = Procs()
    yield started
    started.stop_all()
