"""Ingest processes share one source list through leases: the plan each makes (no I/O), and real
processes on a real nats-server sharing, then taking over, engine streams."""

from __future__ import annotations

import pytest

from kvgateway.cluster.shards import LEASE_SECONDS, ROUND_SECONDS
from tests.support import GatewayProcess, Proc, Start, free_ports, start_sim, wait_until
from tests.support.nats import NatsServer


@pytest.mark.timeout(150)
def test_two_ingests_share_the_streams_and_one_takes_over_when_the_other_is_killed(
    procs: Start, nats_server: NatsServer
) -> None:
    http, pub, replay = free_ports(3, spacing=2)
    ranks = 4
    source = f"name=pool,endpoint=tcp://127.0.0.1:{pub},replay=tcp://127.0.0.1:{replay},dp_size={ranks}"
    start_sim(
        procs, "--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{replay}", f"--dp-size={ranks}",
        "--rate=20", ranks=ranks,
    )  # fmt: skip
    nats = ["--nats", nats_server.url]
    first = procs("ingest", "--source", source, *nats, "--port", "0")
    first.wait_for("ingest publishing to", timeout=30)
    second = procs("ingest", "--source", source, *nats, "--port", "0")
    second.wait_for("ingest publishing to", timeout=30)
    edge_proc = procs("edge", *nats, "--host", "127.0.0.1", "--port", str(http))
    edge_proc.wait_for("edge serving on", timeout=30)
    edge = GatewayProcess(edge_proc, http)

    def taken(proc: Proc) -> int:
        return sum(1 for line in proc.lines if "taken (lease" in line)

    wait_until(lambda: taken(first) + taken(second) >= ranks + 2, timeout=40, what="the streams shared")
    wait_until(lambda: taken(second) >= 2, timeout=40, what="the second process holding its half")

    def up() -> int:
        return sum(1 for s in edge.sources()["sources"] if s["state"] == "up")

    def read() -> bool:  # up, and a batch read: a stream is up from its connection, before its first batch
        sources = edge.sources()["sources"]
        return len(sources) == ranks and all(s["state"] == "up" and s["last_seq"] is not None for s in sources)

    wait_until(read, timeout=30, what="every stream up on the edge, a batch of each read")
    offsets = [s["last_seq"] for s in edge.sources()["sources"]]
    first.kill()
    # Within a lease and a round, the survivor reads every stream: each goes on past where it was.
    bound = LEASE_SECONDS + 2 * ROUND_SECONDS + 10
    # (A stream the survivor took over shows its status from the survivor's first report on: no
    # last seq until its first batch.)
    wait_until(
        lambda: (
            [(s["last_seq"] or -1) > seq for s, seq in zip(edge.sources()["sources"], offsets, strict=True)]
            == [True] * ranks
            and up() == ranks
        ),
        timeout=bound,
        what="every stream read again by the survivor",
    )


@pytest.mark.timeout(150)
def test_an_ingest_started_again_under_its_member_id_reclaims_its_leases_before_they_run_out(
    procs: Start, nats_server: NatsServer
) -> None:
    """``serve --workers`` starts its only ingest again under the same member id: SIGKILLed, the
    new process holds the streams at its first round (before its ready line), long before the dead
    one's leases (made ten minutes long here) could have run out."""
    pub, replay = free_ports(2, spacing=2)
    source = f"name=solo,endpoint=tcp://127.0.0.1:{pub},replay=tcp://127.0.0.1:{replay}"
    start_sim(procs, "--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{replay}", "--rate=20")
    argv = ["ingest", "--source", source, "--nats", nats_server.url, "--port", "0"]
    member = ["--member", "host-1-ingest", "--lease-seconds", "600"]
    first = procs(*argv, *member)
    first.wait_for("ingest publishing to", timeout=30)
    assert any("solo[0]: taken (lease" in line for line in first.lines), first.output()
    first.kill()
    second = procs(*argv, *member)
    second.wait_for("ingest publishing to", timeout=30)
    said = [line for line in second.lines if "solo[0]: reclaimed (lease" in line or "ingest publishing to" in line]
    assert len(said) == 2 and "reclaimed" in said[0], second.output()
    # Another member (a new id) cannot take them: they are held for the ten minutes.
    other = procs(*argv, "--lease-seconds", "600")
    other.wait_for("ingest publishing to", timeout=30)
    assert not any("solo[0]:" in line for line in other.lines), other.output()
