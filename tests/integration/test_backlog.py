"""A publisher that goes away with tens of thousands of batches still queued in the gateway's
socket: they are read in turns, so the gateway answers its probes throughout, and every one is
delivered once and in order, before anything of a new connection (issue 29)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx

from tests.support.fake_engine import FakeEngine, payload
from tests.support.gateway import BIG_QUEUE, occupancy_counts, occupancy_stream, source_status, start_gateway
from tests.support.metrics import scrape, total
from tests.support.ports import free_ports
from tests.support.processes import Start
from tests.support.sources import source_spec
from tests.support.waits import wait_until

BATCHES = 60_000
SLOW_SECONDS = 3.0
"""The bound for one probe: a liveness probe's timeout, past which an orchestrator restarts the
gateway. A quiet machine answers in a few milliseconds, one with a busy process on each core and
more (load 15) took up to 1.6 s, and the unbounded drain this test was written for made the first
/healthz wait 5.5 s even on a quiet machine. Not a benchmark: bench/backlog.py measures the p99."""


@dataclass
class Probes:
    """/healthz and /metrics asked in turn from a thread until the backlog is read: how long each
    took (a scrape with its parsing, a few milliseconds for one stream), and the received count
    each scrape showed."""

    base: str
    durations: list[tuple[str, float]] = field(default_factory=list)
    received: list[float] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.done.is_set():
            began = time.monotonic()
            response = httpx.get(f"{self.base}/healthz", timeout=120, trust_env=False)
            self.durations.append(("/healthz", time.monotonic() - began))
            assert response.status_code == 200, response.status_code
            began = time.monotonic()
            seen = total(scrape(self.base, timeout=120), "kvgateway_batches_received_total", source="a")
            self.durations.append(("/metrics", time.monotonic() - began))
            self.received.append(seen)
            if seen >= BATCHES:
                self.done.set()


def test_a_backlog_left_by_a_vanished_publisher_never_starves_the_probes(procs: Start) -> None:
    http, pub, replay = free_ports(3)
    gw = start_gateway(procs, http, [source_spec("a", pub)], client_queue_bytes=BIG_QUEUE)
    engine = FakeEngine(pub, replay, sndhwm=0)  # no high-water mark: every batch is queued, none dropped
    bodies = [payload(seq) for seq in range(BATCHES)]
    engine.wait_subscribed()
    # The gateway is stopped while the batches are published: otherwise it reads them as they come
    # (on a loaded machine the publishing is the slow part) and little is left for the probes to
    # wait behind (CI once saw 51,442 read before the first probe).
    with gw.proc.held():
        for seq, body in enumerate(bodies):
            engine.publish(seq, body)
    probes = Probes(gw.base)
    prober = threading.Thread(target=probes.run, daemon=True)
    prober.start()
    engine.close(linger=60_000)  # every batch on its way, then the publisher is gone
    prober.join(180)
    probes.done.set()
    assert not prober.is_alive(), "the backlog was not read within 180 s"
    slow = [(path, round(took, 2)) for path, took in probes.durations if took > SLOW_SECONDS]
    assert slow == [], f"{len(slow)} of {len(probes.durations)} probes took over {SLOW_SECONDS} s: {slow[:10]}"
    # The probes ran while the backlog was read (not only once it was).
    assert sum(seen < BATCHES for seen in probes.received) >= 3, probes.received[:10]
    # Every batch once, in order: the last seq, no gap or duplicate, and the index applied each.
    wait_until(lambda: source_status(gw.base, "a")["state"] == "down", timeout=30, what="the disconnect")
    status = source_status(gw.base, "a")
    counters = status["counters"]
    assert status["last_seq"] == BATCHES - 1
    assert (counters["batches"], counters["gaps"], counters["duplicates"], counters["restarts"]) == (BATCHES, 0, 0, 0)
    assert (counters["unrecovered"], counters["decode_errors"]) == (0, 0)
    counts = occupancy_counts(occupancy_stream(gw.base, "a"))
    assert (counts["GPU"]["stores"], counts["GPU"]["removes"]) == (BATCHES, BATCHES), counts
