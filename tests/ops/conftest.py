"""Fixtures of the deployment and operations tests (helpers: tests/support/deploy.py and catalogue.py)."""

from __future__ import annotations

import shutil

import pytest

from tests.support.catalogue import Catalogue, build_catalogue
from tests.support.deploy import PROMTOOL_MISSING


@pytest.fixture(scope="session")
def promtool() -> str:
    """The promtool binary; the test is skipped when it is not installed."""
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(PROMTOOL_MISSING)
    return path


@pytest.fixture(scope="session")
def catalogue() -> Catalogue:
    return build_catalogue()
