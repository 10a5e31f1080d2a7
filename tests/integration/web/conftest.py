"""The web suite's gateways, started once for the whole folder: ``live`` and ``guarded`` are
package-scoped, so every file here shares them (one start each, torn down after the folder's last
test), and tests/conftest.py's scheduler keeps the folder's files on one xdist worker. Its other
fixtures (``gap_gateway``, one per test, and the schema check after each test) are defined in
:mod:`tests.support.web`, where tests/cluster/test_cluster_web.py takes them too, with its own
``serve`` (an edge of a cluster) and module-scoped ``live`` and ``guarded``."""

import functools
from collections.abc import Iterator

import pytest

from tests.support import GatewayProcess, Procs, start_gateway
from tests.support import Start as Starter
from tests.support.web import (  # noqa: F401 - pytest collects the fixtures imported
    WITHIN,
    Serve,
    _every_message_follows_the_schema,
    gap_gateway,
    start_guarded,
    start_live,
)


@pytest.fixture(scope="package")
def folder_procs() -> Iterator[Starter]:
    """Like conftest's ``procs``, for the gateways the folder's tests share."""
    started = Procs()
    yield started
    started.stop_all()


@pytest.fixture(scope="package")
def serve() -> Serve:
    """One process here; tests/cluster/test_cluster_web.py runs every test of the folder that
    serves clients again with an edge of a two-edge cluster instead."""
    return functools.partial(start_gateway, timeout=WITHIN)


@pytest.fixture(scope="package")
def recovery_window() -> str:
    """How far back a client resumes: the ring here; the stream's retention on an edge."""
    return "ring"


@pytest.fixture(scope="package")
def live(folder_procs: Starter, serve: Serve) -> GatewayProcess:
    return start_live(folder_procs, serve)


@pytest.fixture(scope="package")
def guarded(folder_procs: Starter, serve: Serve) -> GatewayProcess:
    return start_guarded(folder_procs, serve)
