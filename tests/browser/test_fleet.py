"""The dashboard an SRE keeps open (issue 16), in a real headless Chromium against real demos:
history on first paint, health at a glance (a restart storm, a silent engine, the tab's title),
and a 64-stream fleet in the table view. Screenshots at 1440x900 and 390x844 for both setups go
to test-artifacts/ (docs/img/ holds copies for the README)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser.conftest import CHROMIUM
from tests.browser.test_dashboard import (
    OccupancyRecorder,
    card,
    get_json,
    open_dashboard,
    tid,
    wait_page_matches_occupancy,
    wait_until,
)
from tests.support import ARTIFACTS, free_port
from tests.support import wait_until as support_wait_until
from tests.support.demo import Demo

pytestmark = pytest.mark.browser

SIZES = [(1440, 900), (390, 844)]
HISTORY_LENGTHS = "() => Object.fromEntries([...kvgatewayDashboard.state.history].map(([k, h]) => [k, h.t.length]))"


@pytest.fixture(scope="module")
def fleet_demo() -> Iterator[Demo]:
    """64 streams (8 sources of 8 ranks) at 2 batches/s each; pool-00/0 restarts every 10 batches."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: the dashboard tests drive the system Chromium")
    demo = Demo(free_port(), seed=3, rate=2, extra=("--streams", "64", "--restart-every", "10")).start()
    yield demo
    demo.stop()


def overflow(page: Any) -> int:
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


def screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name))


def test_charts_full_on_first_paint(shared_demo: Demo, new_page: Callable[..., Any]) -> None:
    # the gateway samples every 5 s from its start: wait until it holds a few points per stream
    support_wait_until(
        lambda: min(len(s["points"]) for s in get_json(shared_demo, "v1/history")["streams"]) >= 3,
        timeout=30,
        interval=0.5,
        what="the gateway's history to grow",
    )
    page = new_page()
    open_dashboard(page, shared_demo)
    # right after the hello, before the page could have sampled anything itself
    lengths = wait_until(page, lambda: (n := page.evaluate(HISTORY_LENGTHS)) and len(n) == 4 and n, timeout=5)
    streams = get_json(shared_demo, "v1/history")["streams"]
    api = {f"{s['source']}\u0000{s['dp_rank']}": len(s["points"]) for s in streams}
    for key, n in lengths.items():
        assert n >= 3 and abs(n - api[key]) <= 1, (key, n, api[key])
    # every card's chart draws those points (uPlot's data: time, occupancy, stored/s, removed/s)
    drawn = page.locator(f"{card('vllm-a', 0)} {tid('chart')} canvas")
    assert drawn.count() >= 1
    assert page.evaluate("() => [...kvgatewayDashboard.state.history.values()].every(h => h.occ.some(v => v !== null))")


def test_restart_storm_and_silent_engine_show(shared_demo: Demo, new_page: Callable[..., Any]) -> None:
    page = new_page()
    open_dashboard(page, shared_demo)
    storm = page.locator(f"{card('sglang-b', 0)} {tid('state')}")
    wait_until(page, lambda: storm.get_attribute("data-value") == "restarting", timeout=30, what="a restart storm")
    reason = page.locator(f"{card('sglang-b', 0)} {tid('health')}").inner_text()
    assert "restarts in 2 min" in reason
    # the count shown is the gateway's: its restart counter minus the history's two minutes ago
    shown = int(reason.split()[0])
    gateway = next(s for s in get_json(shared_demo, "v1/sources")["sources"] if s["source"] == "sglang-b")
    assert 3 <= shown <= gateway["counters"]["restarts"]

    # vllm-c publishes 8 s, then says nothing for 20 s: silent (connected, no batch for > 10 s)
    quiet = page.locator(f"{card('vllm-c', 0)} {tid('state')}")
    wait_until(page, lambda: quiet.get_attribute("data-value") == "silent", timeout=40, what="a silent engine")
    assert "no batch for" in page.locator(f"{card('vllm-c', 0)} {tid('health')}").inner_text()
    age = float(page.locator(f"{card('vllm-c', 0)} {tid('batch-age')}").get_attribute("data-value") or 0)
    assert age >= 10  # shown to a tenth of a second: 10.04 s reads 10.0
    # the gateway agrees: connected, and its history's batch age grows
    status = next(s for s in get_json(shared_demo, "v1/sources")["sources"] if s["source"] == "vllm-c")
    assert status["connected"] and status["state"] == "up"
    # lag is only shown while batches arrive
    assert page.locator(f"{card('vllm-c', 0)} {tid('lag')}").get_attribute("data-value") == ""

    # the title and the icon name the trouble, in a background tab too
    other = page.context.new_page()
    other.goto("about:blank")
    other.bring_to_front()
    hidden = page.evaluate("document.hidden")
    wait_until(page, lambda: "silent" in page.title() or "restarting" in page.title(), timeout=10, what="the title")
    assert page.locator(tid("favicon")).get_attribute("data-value") in {"warn", "bad"}
    if hidden:  # the tab is in the background: it runs no animation frames, the 1 s tick updates the title
        assert "kvgateway" in page.title()
    counts = {k: int(page.locator(tid(f"streams-{k}")).get_attribute("data-value") or 0) for k in ("restarting", "up")}
    assert counts["restarting"] == 1 and counts["up"] >= 1


@pytest.mark.parametrize("width,height", SIZES)
def test_demo_screenshots(shared_demo: Demo, new_page: Callable[..., Any], width: int, height: int) -> None:
    page = new_page(width=width, height=height, device_scale_factor=1)
    recorder = OccupancyRecorder()
    open_dashboard(page, shared_demo, recorder)
    wait_page_matches_occupancy(page, recorder)
    assert page.locator('[data-testid^="card-"]').count() == 4  # up to 6 streams: cards, no table
    assert page.locator(tid("fleet-table-wrap")).is_hidden()
    assert overflow(page) <= 0, f"horizontal overflow at {width}px"
    # no holes: the cards' rows are full (the last card spans what its row leaves)
    rights = page.locator('[data-testid^="card-"]').evaluate_all(
        "els => els.map(e => Math.round(e.getBoundingClientRect().right))"
    )
    assert max(rights) <= width and rights[-1] == max(rights)
    screenshot(page, f"dashboard-demo-{width}x{height}.png")


@pytest.mark.timeout(600)  # two page loads of a 64-stream demo: at load 15-30 over 300 s
def test_fleet_of_64_streams(fleet_demo: Demo, new_page: Callable[..., Any]) -> None:
    page = new_page(width=1440, height=900, device_scale_factor=1)
    recorder = OccupancyRecorder()
    open_dashboard(page, fleet_demo, recorder)
    rows = page.locator(f"{tid('fleet-rows')} tr[data-key]")
    wait_until(page, lambda: rows.count() == 64, what="64 rows")
    assert page.locator('[data-testid^="card-"]').count() == 0  # cards on demand only
    assert page.locator(f"{tid('fleet-rows')} .group-row").count() == 8  # grouped by source
    # the table's fill equals /v1/occupancy at the offset the page shows
    # rows and totals are drawn from one snapshot in one frame: read both in one go
    read = """() => ({
        offset: document.querySelector('[data-testid="totals"]').dataset.offset,
        fills: Object.fromEntries([...document.querySelectorAll('[data-testid="fleet-rows"] tr[data-key]')]
          .map(r => [r.dataset.testid, r.querySelector('[data-testid="cell-fill"]').dataset.value])),
      })"""
    seen = wait_until(page, lambda: (d := page.evaluate(read)) and int(d["offset"] or 0) in recorder.bodies and d)
    shown, body = seen["fills"], recorder.bodies[int(seen["offset"])]
    for s in body["streams"]:
        gpu = s["mediums"]["GPU"]
        value = shown[f"row-{s['source']}-{s['dp_rank']}"]
        assert abs(float(value) - gpu["blocks"] / gpu["capacity_blocks"]) < 2e-6, (s["source"], s["dp_rank"], value)

    # sort by fill, descending: the values follow
    page.click(".fleet-table th[data-sort='fill']")
    page.click(".fleet-table th[data-sort='fill']")
    page.uncheck(tid("group-by-source"))
    script = "els => els.map(e => Number(e.querySelector('[data-testid=cell-fill]').dataset.value))"
    fills = wait_until(
        page,
        lambda: (f := rows.evaluate_all(script)) and len(f) == 64 and f == sorted(f, reverse=True) and f,
        what="64 rows sorted by fill, descending",
    )
    assert len(fills) == 64 and fills == sorted(fills, reverse=True)
    page.check(tid("group-by-source"))

    # the restart storm shows in its row; a click opens that stream's card with a full chart
    storm = page.locator(f"{tid('row-pool-00-0')} {tid('cell-state')}")
    wait_until(page, lambda: storm.get_attribute("data-value") == "restarting", timeout=30, what="the storm's row")
    page.click(tid("row-pool-00-0"))
    page.locator(card("pool-00", 0)).wait_for(state="visible")
    assert page.locator(f"{card('pool-00', 0)} {tid('chart')} canvas").count() >= 1
    # The title counts the streams restarting now: the storm's restart is a state of a few seconds,
    # every 5 s, and the card's opening above may outlast one (at load 8 it did), so await the next.
    wait_until(page, lambda: "restarting" in page.title(), timeout=30, what="'restarting' in the tab's title")
    page.click(tid("row-pool-00-0"))  # and closes it again
    page.locator(card("pool-00", 0)).wait_for(state="detached")
    screenshot(page, "dashboard-64-1440x900.png")

    phone = new_page(width=390, height=844, device_scale_factor=1)
    open_dashboard(phone, fleet_demo)
    wait_until(phone, lambda: phone.locator(f"{tid('fleet-rows')} tr[data-key]").count() == 64, what="64 rows")
    assert overflow(phone) <= 0, "horizontal overflow at 390px"
    screenshot(phone, "dashboard-64-390x844.png")
