"""The dashboard's "Where prefill goes": the demo, in the system Chromium, shows all five origins
within two minutes, and the fleet table a routing-miss share per stream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.browser.test_dashboard import tid
from tests.support import ARTIFACTS
from tests.support.demo import Demo

ORIGINS = ("hit", "offloaded", "refetch", "elsewhere", "new")


def test_the_demo_shows_every_origin_within_two_minutes(
    start_demo: Callable[..., Demo], new_page: Callable[..., Any]
) -> None:
    demo = start_demo(seed=3, rate=20)
    page = new_page(width=1440, height=900, device_scale_factor=1)
    page.goto(demo.url)
    # the history's points carry the tokens stored per origin: every origin above 0, within 2 minutes
    page.wait_for_function(
        """origins => origins.every(o => {
             const item = document.querySelector(`[data-testid="prefill-${o}"]`);
             return item && Number(item.dataset.tokens) > 0;
           })""",
        arg=list(ORIGINS),
        timeout=120_000,
    )
    assert page.locator(tid("prefill")).is_visible()
    assert page.locator(f"{tid('prefill-chart')} .seg").count() > 0
    shown = {o: int(page.locator(tid(f"prefill-{o}")).get_attribute("data-tokens") or 0) for o in ORIGINS}
    assert all(shown.values()), shown
    assert "%" in (page.locator(f"{tid('prefill-elsewhere')} .v").text_content() or "")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-prefill-1440x900.png"))
    # the table view: a routing-miss share per stream, from the same points
    page.locator(tid("view-table")).click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-testid="cell-miss"]')]
             .some(c => c.textContent.includes('%'))""",
        timeout=30_000,
    )
    assert page.locator(tid("cell-miss")).count() == 4
