"""What the tests share, one of each, in modules named for what they hold:

- :mod:`~tests.support.waits`: the polling helper (:func:`wait_until`, :func:`until` on an event
  loop) and :func:`arun`;
- :mod:`~tests.support.processes`: the process handle :class:`Proc`, :data:`Start` and
  :class:`Procs` (what starts processes for a test and stops them);
- :mod:`~tests.support.sources`: the ``--source`` builder and the simulator's matching flags;
- :mod:`~tests.support.command_line`: a command's arguments parsed and loaded as the command does;
- :mod:`~tests.support.metrics`: the metrics scraper and its views;
- :mod:`~tests.support.gateway`: :func:`start_gateway` and its :class:`GatewayProcess` handle (and
  :func:`start_ingest_and_edge`, a cluster of one ingest and one edge);
- :mod:`~tests.support.simulator`, :mod:`~tests.support.replay`, :mod:`~tests.support.fake_engine`,
  :mod:`~tests.support.oracles`: engines, their replay sockets and their truth;
- :mod:`~tests.support.clients`: WebSocket clients; :mod:`~tests.support.seqs`: how they read a
  message's engine seqs (decimal strings on the wire, ints to the tests); :mod:`~tests.support.ports`:
  free ports;
- :mod:`~tests.support.events`: the engine events and batches unit tests build (one builder of
  each); :mod:`~tests.support.payloads`: engine payloads built by hand, every layout, and their
  hypothesis strategies; :mod:`~tests.support.fast_layouts`: what the fast decoders take, drawn
  for the events core's and the batch parser's differential tests;
- :mod:`~tests.support.cores`: :func:`compiled_twin`, the compiled module a differential test
  holds against its reference (or the test skipped);
- :mod:`~tests.support.hub`: a hub without sockets and what its unit tests do with it;
  :mod:`~tests.support.web`: the web suite's clients, schema check, filters and gateway fixtures;
- :mod:`~tests.support.builds`: the package built as users get it (the image's build context and
  its wheelhouse), once for the whole run;
- :mod:`~tests.support.nats`, :mod:`~tests.support.demo`, :mod:`~tests.support.deploy`,
  :mod:`~tests.support.catalogue`, :mod:`~tests.support.bench_runs`: what one directory's tests use.

The most used are re-exported here (``from tests.support import Proc, free_ports``)."""

from tests.support.gateway import (
    BIG_QUEUE,
    GatewayProcess,
    occupancy_counts,
    occupancy_stream,
    proc_status,
    source_status,
    start_gateway,
    start_half_fleet,
    start_ingest_and_edge,
)
from tests.support.metrics import STREAM_SERIES, metric, metric_values, scrape, stream_metrics
from tests.support.ports import established, free_port, free_ports
from tests.support.processes import ARTIFACTS, REPO, Proc, Procs, Start
from tests.support.simulator import (
    SIM_READY,
    WARMUP_BASE,
    sim_done,
    sim_endpoints,
    sim_ready,
    start_sim,
    start_sim_seen,
    warmup,
)
from tests.support.sources import connectable, sim_flags, source_spec
from tests.support.waits import arun, until, wait_until

__all__ = [
    "ARTIFACTS",
    "BIG_QUEUE",
    "REPO",
    "SIM_READY",
    "STREAM_SERIES",
    "WARMUP_BASE",
    "GatewayProcess",
    "Proc",
    "Procs",
    "Start",
    "arun",
    "connectable",
    "established",
    "free_port",
    "free_ports",
    "metric",
    "metric_values",
    "occupancy_counts",
    "occupancy_stream",
    "proc_status",
    "scrape",
    "sim_done",
    "sim_endpoints",
    "sim_flags",
    "sim_ready",
    "source_spec",
    "source_status",
    "start_gateway",
    "start_half_fleet",
    "start_ingest_and_edge",
    "start_sim",
    "start_sim_seen",
    "stream_metrics",
    "until",
    "wait_until",
    "warmup",
]
