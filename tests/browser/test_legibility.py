"""What the dashboard says to people (issue 21), in a real headless Chromium against real gateways:
time axes whose labels differ, a sentence rather than the browser's words when the gateway does
not answer, a tier named once, a down engine's reason said once without an empty chart, reason
codes as words (the code in a tooltip), and the prefix spread over the engines that are up."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser.conftest import CHROMIUM
from tests.browser.test_dashboard import card, open_dashboard, tid, wait_until
from tests.support import ARTIFACTS, GatewayProcess, Start, start_half_fleet
from tests.support.demo import Demo

pytestmark = pytest.mark.browser

# Every text uPlot draws into a canvas since it last cleared it: its axes are pixels, not DOM.
RECORD_CANVAS_TEXT = """(() => {
  const drawn = new WeakMap();
  window.canvasText = (canvas) => drawn.get(canvas) || [];
  const proto = CanvasRenderingContext2D.prototype;
  const fillText = proto.fillText;
  const clearRect = proto.clearRect;
  proto.fillText = function (text, ...rest) {
    const list = drawn.get(this.canvas) || [];
    list.push(String(text));
    drawn.set(this.canvas, list);
    return fillText.call(this, text, ...rest);
  };
  proto.clearRect = function (x, y, w, h) {
    if (x === 0 && y === 0 && w >= this.canvas.width && h >= this.canvas.height) drawn.set(this.canvas, []);
    return clearRect.call(this, x, y, w, h);
  };
})();"""
TIME_LABEL = re.compile(r"^\d\d:\d\d(:\d\d)?$")


def time_labels(page: Any, selector: str) -> list[str]:
    texts: list[str] = page.locator(f"{selector} {tid('chart')} canvas").first.evaluate("c => window.canvasText(c)")
    return [t for t in texts if TIME_LABEL.match(t)]


@pytest.mark.parametrize("width,height", [(1440, 900), (390, 844)])
def test_time_axis_labels_differ(shared_demo: Demo, new_page: Callable[..., Any], width: int, height: int) -> None:
    # a demo minutes old draws a 2-minute axis: ticks 20-30 s apart, which HH:MM alone repeats
    page = new_page(width=width, height=height)
    page.add_init_script(RECORD_CANVAS_TEXT)
    open_dashboard(page, shared_demo)
    for selector in (card("vllm-a", 0), card("sglang-b", 0)):
        labels = wait_until(page, lambda sel=selector: len(ls := time_labels(page, sel)) >= 2 and ls)
        assert len(set(labels)) == len(labels), labels


def test_a_gateway_that_does_not_answer_is_said_in_words(
    start_demo: Callable[..., Demo], new_page: Callable[..., Any]
) -> None:
    demo = start_demo(seed=8, rate=5)
    page = new_page()
    open_dashboard(page, demo)
    assert demo.proc is not None
    pid = demo.proc.popen.pid
    os.kill(pid, signal.SIGSTOP)  # alive but silent: every poll times out (the browser aborts it)
    try:
        updated = page.locator(tid("updated"))
        wait_until(page, lambda: "did not answer" in updated.inner_text(), timeout=20, what="a timed-out poll")
        text = updated.inner_text()
        assert "the gateway did not answer within 4 s; retrying" in text, text
        body = page.locator("body").inner_text()
        assert "aborted" not in body and "signal" not in body, text
        # the browser's own words stay available in the tooltip
        assert "aborted" in (updated.get_attribute("title") or "")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(page, lambda: "did not answer" not in page.locator(tid("updated")).inner_text(), timeout=20)
    demo.kill()  # now it is gone: refused connections
    updated = page.locator(tid("updated"))
    wait_until(page, lambda: "cannot be reached" in updated.inner_text(), timeout=20, what="a refused poll")
    assert "Failed to fetch" not in page.locator("body").inner_text()


def test_a_tier_whose_medium_has_its_name_says_it_once(shared_demo: Demo, new_page: Callable[..., Any]) -> None:
    page = new_page(width=1440, height=900)
    open_dashboard(page, shared_demo)
    gpu = page.locator(tid("total-GPU"))
    gpu.wait_for()
    head = gpu.locator(".tile-head").inner_text().split()
    assert head.count("GPU") == 1, head
    # CPU: sglang-b offloads to a medium named CPU; the demo's mediums are the tier's names
    cpu = page.locator(tid("total-CPU")).locator(".tile-head").inner_text().split()
    assert cpu.count("CPU") == 1, cpu
    # the prefix spread says over which engines it counts
    facts = page.locator(tid("fleet-facts"))
    wait_until(page, lambda: "prefix spread" in facts.inner_text(), timeout=30, what="the prefix spread")
    assert "of the 4 engines that are up" in facts.inner_text()
    # the table's restarts and the card's say which they count
    assert page.locator(".fleet-table th[data-sort='restarts']").inner_text() == "restarts (2 min)"
    title = page.locator(f"{card('vllm-a', 0)} dt", has_text="restarts").get_attribute("title") or ""
    assert "since the gateway started" in title


@pytest.fixture
def half_fleet(procs: Start) -> Iterator[GatewayProcess]:
    """One engine up, one (`gone`) down from the start: :func:`tests.support.start_half_fleet`."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: the dashboard tests drive the system Chromium")
    yield start_half_fleet(procs)


def test_a_down_engine_says_why_once_without_an_empty_chart(
    half_fleet: GatewayProcess, new_page: Callable[..., Any]
) -> None:
    page = new_page(width=1440, height=900)
    page.goto(half_fleet.base + "/")
    page.wait_for_selector(f'{tid("conn-state")}[data-value="live"]', timeout=20_000)
    down = page.locator(card("gone", 0))
    wait_until(page, lambda: down.locator(tid("state")).get_attribute("data-value") == "down", what="a down card")
    wait_until(page, lambda: down.locator(tid("health")).inner_text(), what="the reason shown")
    # read in one go: the gateway may find out more about why meanwhile and say it differently
    text, reason = page.evaluate(
        """(sel) => { const c = document.querySelector(sel);
                      return [c.innerText, c.querySelector('[data-testid="health"]').innerText]; }""",
        card("gone", 0),
    )
    api = next(s for s in half_fleet.sources()["sources"] if s["source"] == "gone")["reason"]
    assert api and reason and text.count(reason) == 1, text
    assert not down.locator(tid("headline")).is_visible()  # no big dash
    assert not down.locator(tid("chart")).is_visible()  # no chart of nothing
    assert not down.locator(".chart-head").is_visible()
    # the engine that is up keeps its chart
    up = page.locator(card("up", 0))
    wait_until(page, up.locator(f"{tid('chart')} canvas").first.is_visible, what="the live chart")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-down-1440x900.png"))
    # the prefix spread asks only the engine that is up: with one, there is no spread to show
    wait_until(page, lambda: page.evaluate("() => kvgatewayDashboard.state.analytics !== null"), timeout=20)
    page.wait_for_timeout(300)  # not a wait for something: a frame or two in which it would show
    assert "prefix spread" not in page.locator(tid("fleet-facts")).inner_text()


def test_reason_codes_read_as_words_with_the_code_in_a_tooltip(shared_demo: Demo, new_page: Callable[..., Any]) -> None:
    page = new_page()
    open_dashboard(page, shared_demo)
    said = page.evaluate(
        """async () => {
          const { streamHealth } = await import("./health.js");
          const { reasonText, kindText } = await import("./reasons.js");
          const stale = streamHealth({ serverState: "stale",
                                       src: { connected: true, stale_reason: "history_truncated" },
                                       occ: null, restarts: 0, ageS: 1, watchedS: 60 });
          const degraded = streamHealth({ serverState: "degraded",
                                          src: { connected: true, unrecovered_by_reason: { evicted: 3, no_replay: 0 } },
                                          occ: null, restarts: 0, ageS: 1, watchedS: 60 });
          return { stale, degraded, unknown: reasonText("stale", "brand_new_code"), kind: kindText("unrecovered_gap") };
        }"""
    )
    assert said["stale"]["reason"] == "index incomplete: the engine no longer held the start of its history"
    assert said["stale"]["code"] == "history_truncated"
    assert said["degraded"]["reason"] == "lost 3 batches (gone from the engine's replay buffer)"
    assert said["degraded"]["code"] == "evicted"
    assert said["unknown"] == "brand new code" and said["kind"] == "batches lost"
    # and the page shows no code to people: sglang-b restarts every 60 batches (reason seq_reset)
    notice = page.locator(f"{card('sglang-b', 0)} {tid('last-notice')}")
    wait_until(page, lambda: notice.get_attribute("data-value") == "restart", timeout=30, what="a restart notice")
    assert (notice.get_attribute("title") or "").startswith("gateway reason: ")
    shown = page.locator(tid("cards")).inner_text() + page.locator(tid("tail")).inner_text()
    for code in ("seq_reset", "history_truncated", "unrecovered_gap", "no_replay", "not_sent", "no_answer"):
        assert code not in shown, code
