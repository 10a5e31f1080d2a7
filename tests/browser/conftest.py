"""Fixtures for the dashboard tests: a real `kvgateway demo` process and the system Chromium."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support import free_port
from tests.support.demo import CHROMIUM, CHROMIUM_ARGS, Demo


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Module scope: Playwright's sync API keeps an event loop running in this thread while it
    # lives, and the rest of the suite calls asyncio.run().
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: the dashboard tests drive the system Chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def start_demo() -> Iterator[Callable[..., Demo]]:
    """Start demos (killed at teardown). `start_demo(port=..., token=..., extra=(...))`."""
    demos: list[Demo] = []

    def start(port: int | None = None, **kw: Any) -> Demo:
        demo = Demo(port or free_port(), **kw).start()
        demos.append(demo)
        return demo

    yield start
    for demo in demos:
        demo.stop()


@pytest.fixture(scope="module")
def shared_demo() -> Iterator[Demo]:
    """One demo for the read-only tests: four streams, sglang-b restarting every 60 batches (a
    restart storm), vllm-c publishing for 8 s then quiet for 20 s (silent from 10 s on)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: the dashboard tests drive the system Chromium")
    demo = Demo(free_port(), seed=11, rate=20, extra=("--restart-every", "60", "--silence", "8", "20")).start()
    yield demo
    demo.stop()


class PageErrors(list[str]):
    """Uncaught exceptions and CSP violations in the page (failed requests are expected noise)."""


@pytest.fixture
def new_page(browser: Any) -> Iterator[Callable[..., Any]]:
    contexts: list[Any] = []
    errors = PageErrors()

    def make(width: int = 1280, height: int = 900, **context_kw: Any) -> Any:
        ctx = browser.new_context(viewport={"width": width, "height": height}, **context_kw)
        contexts.append(ctx)
        page = ctx.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        # The gateway sends a strict Content-Security-Policy: the page must live within it.
        page.on(
            "console",
            lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None,
        )
        page.set_default_timeout(180_000)  # a wait, not a bound: at load 15-30 a page took over 60 s
        return page

    yield make
    for ctx in contexts:
        with contextlib.suppress(Exception):
            for page in ctx.pages:
                page.unroute_all(behavior="ignoreErrors")
            ctx.close()
    assert not errors, f"uncaught exceptions in the dashboard: {errors}"
