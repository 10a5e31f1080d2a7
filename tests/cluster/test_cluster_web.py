"""The web protocol's whole suite (tests/integration/web) against the cluster: every test there
that serves clients runs again here, with the gateway it starts replaced by the same engines
behind ``kvgateway ingest`` and a real nats-server, served by the second of two ``kvgateway edge``
processes (started after the first).

Offsets +1 with no duplicate, exact per-engine seqs, every filter, resume by WebSocket and SSE,
tokens, origins, client limits, slow clients and stalls, each route's parameters and 400s, rounded
rates, the schema: an edge must pass them as the single process does."""

from __future__ import annotations

import importlib
import inspect
import itertools
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.integration import web
from tests.support import GatewayProcess, free_ports
from tests.support import Start as Starter
from tests.support.nats import NatsServer
from tests.support.web import (  # noqa: F401 - pytest collects the fixtures imported
    TEST_WITHIN,
    WITHIN,
    Serve,
    _every_message_follows_the_schema,
    gap_gateway,
    guarded,
    live,
    module_procs,
)

pytestmark = pytest.mark.timeout(TEST_WITHIN)

SERVES = ("live", "guarded", "gap_gateway", "serve")
"""A test of the web suite that takes one of these serves clients: it runs here too."""


def web_tests() -> dict[str, Callable[..., Any]]:
    """Every test function of the web suite's modules, by name (the names are unique across them)."""
    tests: dict[str, Callable[..., Any]] = {}
    for info in pkgutil.iter_modules(web.__path__):
        if info.name.startswith("test_"):
            module = importlib.import_module(f"{web.__name__}.{info.name}")
            found = {name: test for name, test in vars(module).items() if name.startswith("test_")}
            assert not found.keys() & tests.keys(), f"{info.name}: a test name taken twice"
            tests |= found
    return tests


def serving_tests() -> dict[str, Callable[..., Any]]:
    return {name: test for name, test in web_tests().items() if set(inspect.signature(test).parameters) & set(SERVES)}


globals().update(serving_tests())


@pytest.fixture(scope="module")
def nats_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def serve(nats_module: NatsServer) -> Serve:
    """The web suite's gateway as a cluster: one ingest for its sources and two edges with its flags on a
    stream of its own (one nats-server for the module); the test talks to the second edge."""
    streams = itertools.count()

    def start(
        start: Starter,
        port: int,
        sources: list[str],
        *flags: str,
        token: str | None = None,
        client_queue_bytes: int | None = None,
        timeout: float = WITHIN,
    ) -> GatewayProcess:
        n = next(streams)
        nats = ["--nats", nats_module.url, "--nats-stream", f"WEB{n}", "--nats-subject-prefix", f"web{n}"]
        specs = [arg for spec in sources for arg in ("--source", spec)]
        ingest = start("ingest", *specs, *nats, "--port", "0")
        ingest.wait_for("ingest publishing to", timeout=timeout)
        edge_flags: list[Any] = [*specs, *nats, "--host", "127.0.0.1", *flags]
        if client_queue_bytes is not None:
            edge_flags += ["--client-queue-bytes", str(client_queue_bytes)]
        env = {"KVGATEWAY_TOKEN": token} if token else None
        (first_port,) = free_ports(1)
        for edge_port in (first_port, port):
            proc = start("edge", *edge_flags, "--port", str(edge_port), env=env)
            proc.wait_for("edge serving on", timeout=timeout)
        return GatewayProcess(proc, port, token)

    return start


@pytest.fixture(scope="module")
def recovery_window() -> str:
    return "stream"


def test_the_cluster_runs_every_test_of_the_single_process_that_serves_clients() -> None:
    here = {name for name in globals() if name.startswith("test_")}
    serving = set(serving_tests())
    assert len(serving) >= 18 and serving <= here, sorted(serving - here)
