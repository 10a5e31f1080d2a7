"""The fixtures every test directory shares, and how ``pytest -n --dist loadfile`` hands out the
tests; the helpers themselves are in :mod:`tests.support`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

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


ONE_WORKER_FOLDERS = ("tests/integration/web/",)
"""Folders whose files share package-scoped fixtures (the web suite's gateways): one xdist worker
runs all of a folder's files, one after the other, so that each fixture starts once."""


class FileScheduling(LoadScopeScheduling):
    """``--dist loadfile``, with each of :data:`ONE_WORKER_FOLDERS` handed out as one file: xdist
    hands a worker a scope at a time, and a package-scoped fixture is started by every worker
    that runs a test of its package. (``--dist loadgroup`` would keep a marked folder together
    but hand every other test out on its own, starting a file's module fixtures on both workers.)"""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


def scope_of(nodeid: str) -> str:
    """What :class:`FileScheduling` hands out together with the test ``nodeid``: its file, or its folder."""
    path = nodeid.split("::", 1)[0]
    return next((folder for folder in ONE_WORKER_FOLDERS if path.startswith(folder)), path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadScopeScheduling | None:
    """:class:`FileScheduling` for ``--dist loadfile`` (as ``make test`` runs); xdist's own otherwise."""
    if config.getvalue("dist") == "loadfile":
        return FileScheduling(config, log)
    return None
