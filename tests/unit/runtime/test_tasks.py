"""kvgateway.runtime.tasks: cancel_and_wait returns only once every task's ``finally`` has run."""

from __future__ import annotations

import asyncio

from kvgateway.runtime.tasks import cancel_and_wait


def test_every_task_is_cancelled_and_has_finished_when_it_returns() -> None:
    finished: list[str] = []

    async def worker(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # a cleanup that itself awaits
            finished.append(name)

    async def body() -> None:
        one, two = asyncio.create_task(worker("one")), asyncio.create_task(worker("two"))
        done = asyncio.create_task(asyncio.sleep(0))
        await done
        await asyncio.sleep(0)  # both are waiting
        await cancel_and_wait(one, None, two, done)
        assert sorted(finished) == ["one", "two"]
        assert one.cancelled() and two.cancelled() and not done.cancelled()

    asyncio.run(body())


def test_nothing_to_stop_is_fine() -> None:
    asyncio.run(cancel_and_wait())
    asyncio.run(cancel_and_wait(None))
