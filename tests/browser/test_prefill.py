"""The dashboard's "Where prefill goes": the demo, in the system Chromium, shows every origin as a
visible share within two minutes (not a sliver beside 99% `new`), the chart in more than one
colour, a legend that takes an origin out of the bars, and a routing-miss share per stream that
points at the randomly routed pair."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.browser.test_dashboard import tid
from tests.support import ARTIFACTS
from tests.support.demo import Demo

ORIGINS = ("hit", "offloaded", "refetch", "elsewhere", "new")
MIN_SHARE = 0.02
"""Every origin's least share of the fleet's stored tokens in the legend (the demo gives each
5-20% within a minute or two, docs/operations.md's "Where the prefill goes")."""
MAX_NEW = 0.75
SCREENSHOT_BARS = 9
"""Bars of 10 s in the chart before the screenshot is taken."""

SHARES = """origins => {
  const tokens = origins.map(o => Number(document.querySelector(`[data-testid="prefill-${o}"]`)?.dataset.tokens || 0));
  const all = tokens.reduce((a, b) => a + b, 0);
  return Object.fromEntries(origins.map((o, i) => [o, all ? tokens[i] / all : 0]));
}"""

MISS_BY_STREAM = """() => Object.fromEntries([...document.querySelectorAll('[data-testid="fleet-rows"] tr[data-key]')]
  .map(tr => [tr.dataset.key.replace('\\u0000', '/'), tr.querySelector('[data-testid="cell-miss"]').dataset.value]))"""


def chart_colours(page: Any) -> set[str]:
    """The origins that have a segment in the chart's bars."""
    found: list[str] = page.evaluate(
        """() => [...document.querySelectorAll('[data-testid="prefill-chart"] .seg')]
             .map(s => [...s.classList].find(c => c.startsWith('o-')).slice(2))"""
    )
    return set(found)


def test_the_demo_splits_its_prefill_visibly_within_two_minutes(
    start_demo: Callable[..., Demo], new_page: Callable[..., Any]
) -> None:
    demo = start_demo(seed=3, rate=20)
    page = new_page(width=1440, height=900, device_scale_factor=1)
    page.goto(demo.url)
    # the history's points carry the tokens stored per origin: each a visible share, within 2 minutes
    page.wait_for_function(
        f"""origins => {{
             const shares = ({SHARES})(origins);
             return origins.every(o => shares[o] >= {MIN_SHARE}) && shares.new <= {MAX_NEW};
           }}""",
        arg=list(ORIGINS),
        timeout=120_000,
    )
    shares = page.evaluate(SHARES, list(ORIGINS))
    assert all(shares[o] >= MIN_SHARE for o in ORIGINS) and shares["new"] <= MAX_NEW, shares
    assert page.locator(tid("prefill")).is_visible()
    assert chart_colours(page) == set(ORIGINS), chart_colours(page)
    elsewhere = page.locator(f"{tid('prefill-elsewhere')} .v").text_content() or ""
    assert "%" in elsewhere and "<" not in elsewhere, elsewhere  # a share, not "<0.1%"
    assert "over the last" in (page.locator(tid("prefill-span")).text_content() or "")
    # the README's screenshot once the chart holds a minute and a half (vllm-c's first quiet spell)
    page.wait_for_function(
        """bars => document.querySelectorAll('[data-testid="prefill-chart"] .prefill-bar').length >= bars""",
        arg=SCREENSHOT_BARS,
        timeout=120_000,
    )
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-prefill-1440x900.png"))

    # the legend leaves `new` out of the bars (and its numbers as they were), then puts it back
    before = {o: page.locator(tid(f"prefill-{o}")).get_attribute("data-tokens") for o in ORIGINS}
    page.locator(tid("prefill-new")).click()
    assert page.locator(tid("prefill-new")).get_attribute("aria-pressed") == "false"
    assert chart_colours(page) == set(ORIGINS) - {"new"}
    assert "without new" in (page.locator(tid("prefill-span")).text_content() or "")
    after = {o: page.locator(tid(f"prefill-{o}")).get_attribute("data-tokens") for o in ORIGINS}
    assert all(int(after[o] or 0) >= int(before[o] or 0) for o in ORIGINS), (before, after)
    page.locator(tid("prefill-new")).click()
    assert "new" in chart_colours(page)

    # the table view: a routing-miss share per stream, from the same points: the routed pair misses
    page.locator(tid("view-table")).click()
    # (the map once all four rows have a value: the table builds its rows after the click)
    rows = page.wait_for_function(
        f"""() => {{
             const miss = ({MISS_BY_STREAM})();
             const values = Object.values(miss);
             return values.length === 4 && values.every(v => v !== '') && miss;
           }}""",
        timeout=30_000,
    ).json_value()
    miss = {stream: float(value) for stream, value in rows.items()}
    assert set(miss) == {"vllm-a/0", "vllm-a/1", "sglang-b/0", "vllm-c/0"}, miss
    assert miss["vllm-a/0"] > 0.05 and miss["vllm-a/1"] > 0.05, miss
    assert miss["sglang-b/0"] == miss["vllm-c/0"] == 0, miss
