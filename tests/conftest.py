"""The fixtures every test directory shares; the helpers themselves are in :mod:`tests.support`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.support import Procs, Start
from tests.support.builds import DockerBuild, build_once

# Hypothesis's per-example deadline and its too-slow health check are wall-clock bounds: on a
# loaded machine (CI shares its cores) a 200 ms example is ordinary. The properties are what
# the tests assert; their speed is measured in bench/.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


@pytest.fixture
def procs() -> Iterator[Start]:
    """Start CLI subprocesses; every one is stopped at the end of the test."""
    started = Procs()
    yield started
    started.stop_all()


@pytest.fixture(scope="session")
def docker_build(tmp_path_factory: pytest.TempPathFactory) -> DockerBuild:
    """The image's build stage, run once for the whole run and shared by every worker: its context
    and its wheelhouse (tests/integration/test_artifact.py, tests/ops/test_deploy_files.py)."""
    return build_once(tmp_path_factory)
