"""The one polling helper of the tests: wait until a condition holds, within a bound, and fail
with what was awaited and the last value seen. :func:`wait_until` from plain code (a test's
thread), :func:`until` from an event loop; both poll through one :class:`Bound`.

A test never sleeps to let something happen: it names the condition and waits for it here."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

FLOOR_S = 120.0
"""No wait gives up sooner. A wait ends as soon as its condition holds, so the bound costs a
passing test nothing; it only says when to stop hoping. On a loaded machine (the suite's three
workers and a busy process on each core) a supervisor's edge took over 40 s to become ready where a
quiet machine needs 3: a bound written for a quiet machine is a test of the machine."""


class Bound:
    """A deadline and what is awaited: :meth:`reached` says whether a polled value is the
    awaited one, and raises once the deadline passed without it (never before :data:`FLOOR_S`)."""

    def __init__(self, within: float, what: object) -> None:
        within = max(within, FLOOR_S)
        self.within = within
        self.what = what
        self.deadline = time.monotonic() + within

    def reached(self, value: Any) -> bool:
        if value:
            return True
        if time.monotonic() > self.deadline:
            raise AssertionError(f"timed out after {self.within}s waiting for {self.what}; last value {value!r}")
        return False


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 20.0,
    interval: float = 0.1,
    what: str = "",
    *,
    pause: Callable[[float], object] = time.sleep,
) -> Any:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy (that value);
    AssertionError after ``timeout`` seconds. ``pause`` replaces :func:`time.sleep` where the
    waiting must let something else run (Playwright's ``page.wait_for_timeout``)."""
    bound = Bound(timeout, what or predicate)
    while not bound.reached(value := predicate()):
        pause(interval)
    return value


async def until(
    predicate: Callable[[], Any | Awaitable[Any]], within: float = 20.0, what: str = "", interval: float = 0.02
) -> Any:
    """:func:`wait_until` on an event loop: ``predicate`` may be sync or return an awaitable."""
    bound = Bound(within, what or predicate)
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if bound.reached(value):
            return value
        await asyncio.sleep(interval)


def arun(coro: Coroutine[Any, Any, T], timeout: float = 90.0) -> T:
    """``asyncio.run(coro)``, failing the test after ``timeout`` seconds instead of hanging it."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())
