"""`kvgateway demo --streams 64` as a user runs it: a real process on a loopback port for about a
minute, on whatever else the machine is doing. The fleet must stay light (issue 21): the API
answers within a second throughout (the page within two, see REQUEST_LIMIT_S), every stream's lag
stays under a second, memory is bounded, and SIGINT ends it within 2 s.

On 9b2743e (the machine at a load of 14 on 2 cores) it failed on every count: `/` took up to 17 s
and `/v1/sources` 2.1 s, lags reached 2.9 s and 64 % of the batches came more than 1 s late, RSS
was 680 MB at the start and 1,140 MB after 51 s; by hand, SIGINT took 244 s to end it.
"""

from __future__ import annotations

import signal
import subprocess
import time

import httpx
import pytest

from tests.support import Start, free_port, metric_values, proc_status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

RUN_SECONDS = 55.0
"""How long the fleet is watched (the test's wall time is about this plus start and stop)."""
WARM_SECONDS = 25.0
"""RSS is compared from this point on: by then the smallest caches are full and the gateway's
ring and structures have their working size."""
PATHS = ("/", "/v1/sources", "/v1/occupancy")
REQUEST_LIMIT_S = {"/": 2.0, "/v1/sources": 1.0, "/v1/occupancy": 1.0}
"""The API answers within 1 s. The page's own file gets 2 s: Starlette serves it in about six
hops to a worker thread and back, and on a machine running several times more threads than it has
cores each hop waits for the OS to run that thread (an idle gateway's `/` took up to 0.3 s there)."""
LAG_LIMIT_S = 1.0
LATE_SHARE = 0.01
"""Batches that may arrive more than 1 s after their making, of all (a loaded machine stalls a
process now and then); 9b2743e's lags were seconds for every stream."""
RSS_LIMIT_MB = 400
"""The whole process (64 simulated engines and the gateway): 9b2743e passed 1 GB within a minute."""
RSS_GROWTH_LIMIT_MB = 120
"""Growth after the warm-up: the larger caches still fill (a rank's up to 4,096 blocks, in the
engine, the index and the learner), the ring and the replay buffers too (they level off at about
350 MB after 3 minutes); 9b2743e grew 400 MB in 45 s."""
EXIT_LIMIT_S = 2.0


def rss_mb(pid: int) -> float:
    return proc_status(pid)["VmRSS"] / 1024


def lag_buckets(base: str) -> tuple[float, float]:
    """(batches delivered, batches delivered at most 1 s after their engine made them), fleet-wide."""
    samples = metric_values(base, "kvgateway_event_lag_seconds_bucket")
    total = sum(value for labels, value in samples.items() if dict(labels)["le"] == "+Inf")
    within = sum(value for labels, value in samples.items() if float(dict(labels)["le"]) == LAG_LIMIT_S)
    return total, within


def test_fleet_of_64_stays_light_and_stops_at_once(procs: Start) -> None:
    port = free_port()
    demo = procs("demo", "--host", "127.0.0.1", "--port", str(port), "--streams", "64")
    base = demo.wait_for(r"dashboard at (http://\S+)", timeout=30).group(1).rstrip("/")
    pid = demo.popen.pid
    started = time.monotonic()
    took: dict[str, list[float]] = {path: [] for path in PATHS}
    worst_lag = 0.0
    rss: list[tuple[float, float]] = []
    with httpx.Client(timeout=30) as client:
        while (elapsed := time.monotonic() - started) < RUN_SECONDS:
            for path in PATHS:
                t0 = time.monotonic()
                res = client.get(base + path)
                took[path].append(time.monotonic() - t0)
                assert res.status_code == 200, (path, res.text[:200])
                if path == "/v1/sources":
                    sources = res.json()["sources"]
                    assert len(sources) == 64
                    worst_lag = max([worst_lag, *(s["lag_seconds"] or 0.0 for s in sources)])
            rss.append((elapsed, rss_mb(pid)))
            time.sleep(1.0)  # a dashboard's pace, not a wait for a condition
        delivered, within = lag_buckets(base)
        sources = client.get(base + "/v1/sources").json()["sources"]

    # the fleet ran: every stream delivered, none is down
    assert all(s["state"] != "down" and s["counters"]["batches"] > 0 for s in sources), sources
    assert delivered > 64 * 20
    slowest = {path: sorted(round(t, 3) for t in times)[-3:] for path, times in took.items()}
    print(f"slowest {slowest}, worst lag {worst_lag:.3f} s, {delivered - within:.0f} of {delivered:.0f} late")
    print("rss MB:", [(round(t), round(m)) for t, m in rss])
    assert all(max(times) < REQUEST_LIMIT_S[path] for path, times in took.items()), slowest
    assert worst_lag < LAG_LIMIT_S, worst_lag
    assert delivered - within <= LATE_SHARE * delivered, (delivered - within, delivered)
    warm = [m for t, m in rss if t >= WARM_SECONDS]
    assert max(m for _, m in rss) < RSS_LIMIT_MB, rss
    assert max(warm) - warm[0] < RSS_GROWTH_LIMIT_MB, rss

    demo.popen.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    try:
        code = demo.popen.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the demo still ran 30 s after SIGINT")
    took = time.monotonic() - t0
    assert took < EXIT_LIMIT_S and code == 0, (took, code, demo.output()[-2000:])
