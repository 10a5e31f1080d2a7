"""The web protocol's own tests (tests/integration/test_web.py) against the cluster: the same
engines behind ``kvgateway ingest`` and a real nats-server, served by ``kvgateway edge``.

Offsets +1 with no duplicate, exact per-engine seqs, every filter, resume by WebSocket and SSE,
each route's parameters and 400s, rounded rates: the edge must pass them as the single process
does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_web import (  # noqa: F401 - pytest collects what is imported
    LIVE_RESTART_AT,
    Gateway,
    Starter,
    _every_message_follows_the_schema,
    free_ports,
    gap_source,
    module_procs,
    source_spec,
    start_simulator,
    test_every_batch_reaches_every_matching_client_in_order,
    test_every_per_stream_route_applies_the_streams_source_and_dp_rank,
    test_every_route_refuses_a_parameter_it_does_not_take_and_lists_what_it_takes,
    test_invalid_query_parameters_are_a_400_before_any_stream,
    test_rates_are_rounded_to_thousandths_in_the_occupancy_snapshot,
    test_sse_resume_with_last_event_id_header_or_query_and_the_header_wins,
    test_the_gap_notice_has_no_last_unless_the_client_asks_with_compat_gap_last_live_and_on_resume,
    test_websocket_resume_inside_the_ring_replays_exactly_the_missed_messages,
    wait_streams,
)
from tests.support.nats import NatsServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def nats_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def live(module_procs: Starter, nats_module: NatsServer) -> Gateway:  # noqa: F811 - the cluster's own
    """test_web's ``live`` gateway as a cluster: the same simulated engines, one ingest process,
    two edges; the tests talk to the second edge, started after the first."""
    ports = free_ports(6, spacing=2)
    http_a, http_b, llama_pub, llama_replay, qwen_pub, qwen_replay = ports
    sources = [source_spec("llama", llama_pub, llama_replay, 2), source_spec("qwen", qwen_pub, qwen_replay)]
    flags = [arg for spec in sources for arg in ("--source", spec)]
    nats = ["--nats", nats_module.url]
    ingest = module_procs("ingest", *flags, *nats, "--port", "0")
    ingest.wait_for("ingest publishing to", timeout=30)
    edges = []
    for port in (http_a, http_b):
        proc = module_procs(
            "edge", *flags, *nats, "--host", "127.0.0.1", "--port", str(port),
            "--ring-messages", "1000000", "--ring-bytes", str(2**30),
        )  # fmt: skip
        proc.wait_for("edge serving on", timeout=30)
        edges.append(Gateway(proc, port))
    start_simulator(
        module_procs, llama_pub, llama_replay, "--dp-size=2", "--cpu-offload", "--rate=25",
        f"--restart-at={LIVE_RESTART_AT}", "--clear-every=37", "--gpu-blocks=256", "--cpu-blocks=512",
        "--seed=3", ranks=2,
    )  # fmt: skip
    start_simulator(module_procs, qwen_pub, qwen_replay, "--rate=15", "--gpu-blocks=256", "--seed=4")
    for gateway in edges:
        wait_streams(gateway, [("llama", 0), ("llama", 1), ("qwen", 0)])
    return edges[1]


@pytest.fixture
def gap_gateway(procs: Starter, tmp_path: Path) -> Iterator[tuple[Gateway, list[str]]]:
    """test_web's ``gap_gateway`` as a cluster: one ingest and one edge on a nats-server of its own
    (the module's carries the ``live`` streams), and the flags of the engine, not started yet."""
    server = NatsServer(tmp_path)
    server.start()
    http_port, pub, replay = free_ports(3)
    spec, engine = gap_source(pub, replay)
    flags = ["--source", spec, "--nats", server.url]
    ingest = procs("ingest", *flags, "--port", "0")
    ingest.wait_for("ingest publishing to", timeout=30)
    edge = procs("edge", *flags, "--host", "127.0.0.1", "--port", str(http_port))
    edge.wait_for("edge serving on", timeout=30)
    yield Gateway(edge, http_port), engine
    for proc in (edge, ingest):  # before their nats-server (procs would stop them after it)
        proc.stop()
    server.stop()
