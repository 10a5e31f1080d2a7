"""Stopping background tasks: the one cancel-then-await every component's ``stop`` needs."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any] | asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` (None skipped), then wait until each has finished: its ``finally`` blocks ran
    and nothing of it touches a socket or an index any more when the caller goes on to close them."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    for task in running:
        with contextlib.suppress(asyncio.CancelledError):
            await task
