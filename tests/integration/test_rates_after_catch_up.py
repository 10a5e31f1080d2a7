"""After a catch-up replay, /v1/occupancy's rates count live batches only, over the time covered.

A real engine (the simulator) has published 3,000 batches nobody received before the gateway
starts; the gateway replays them, then receives 500 more live. The rates must reflect the 500
live batches over the gateway's uptime, not 3,500 batches, and not anything divided by 60.
"""

from __future__ import annotations

import time

import httpx
import msgspec
import pytest

from tests.support import (
    BIG_QUEUE,
    Start,
    established,
    free_ports,
    source_spec,
    start_gateway,
    start_sim,
    stream_metrics,
    wait_until,
)
from tests.support.replay import fetch_history


def loopback(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


@pytest.mark.slow
def test_rates_count_live_batches_over_the_uptime(procs: Start) -> None:
    http, pub, rep = free_ports(3)
    rate, history, total = 1000, 3000, 3500
    sim = start_sim(
        procs,
        "--endpoint",
        f"tcp://*:{pub}",
        "--replay-endpoint",
        loopback(rep),
        "--rate",
        str(rate),
        "--batches",
        str(total),
        "--skip",
        f"0-{history - 1}",
        "--buffer-steps",
        "10000",
        "--replay-delay",
        "1.5",
        "--linger",
        "60",
    )
    time.sleep(0.5)  # the scenario: the engine publishes a while before the gateway starts (no count depends on it)
    # Batches from 3000 on must arrive live: the engine is held while the gateway starts, however
    # long that takes, and goes on once the gateway is connected, still seconds before its 3000.
    with sim.held():
        gw = start_gateway(procs, http, [source_spec("a", pub, rep)], client_queue_bytes=BIG_QUEUE)
        wait_until(lambda: established(pub), timeout=60, what="the gateway's connection to the engine")
    got = wait_until(
        lambda: (m := stream_metrics(gw.base, "a"))["last_seq"] == total - 1 and m["replay"] and m,
        timeout=90,
        what="every batch, the history by replay",
    )
    assert got["replayed"] == history  # 0..2999 came by replay, 3000..3499 live
    stores_by_seq = {}
    for seq, payload in fetch_history(loopback(rep)):
        events = msgspec.msgpack.decode(payload)[1]
        stores_by_seq[seq] = sum(len(e["block_hashes"]) for e in events if e["type"] == "BlockStored")
    live = sum(n for seq, n in stores_by_seq.items() if seq >= history)
    replayed = sum(n for seq, n in stores_by_seq.items() if seq < history)
    assert live > 0 and replayed > 4 * live

    # Live stores over the time covered (the uptime): the same figure now and a few seconds later
    # (nothing new arrives), where "the last 60 s divided by 60" would grow with the uptime.
    for pause in (0.0, 4.0):
        time.sleep(pause)
        gpu = httpx.get(f"{gw.base}/v1/occupancy", timeout=5).json()["streams"][0]["mediums"]["GPU"]
        uptime = httpx.get(f"{gw.base}/healthz", timeout=5).json()["uptime_seconds"]
        assert uptime < 55, "the whole run must fit in one rate window"
        assert gpu["stores"] == live + replayed  # the totals do count the history
        assert gpu["stores_per_s"] * uptime == pytest.approx(live, rel=0.05)
    assert stream_metrics(gw.base, "a")["unrecovered"] == 0
