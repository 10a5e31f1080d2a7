"""The ``digest`` messages of the clients that asked for them (``digest=SECONDS``).

Every :data:`TICK_SECONDS` the ticker runs one synchronous step on the event loop, where the log
appends too: nothing is appended during the step, and an append runs every follower of the log in
one synchronous step of its own, so the index is exactly the state after the log's last offset.
Each client that is due gets, per stream its filter selects, ``{"type": "digest", "source",
"dp_rank", "offset", "digest", "block_count"}`` at that offset, queued behind every message it was
sent before (the hub's order).

A client's ``medium`` filter selects the mediums summed (as it selects the events: a medium name or
its tier). A ``type`` filter that drops block events is refused with ``digest`` (a 400, see
kvgateway/serve/query.py): such a client cannot keep the state the digest is of.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Final

from kvgateway.engine.wire import Stream
from kvgateway.protocol import messages
from kvgateway.runtime.tasks import cancel_and_wait
from kvgateway.serve.hub import Hub
from kvgateway.serve.subscription import Subscription
from kvgateway.state.digest import hex_digest
from kvgateway.state.occupancy import OccupancyIndex

TICK_SECONDS: Final = 0.5
"""How often due clients are looked for: a digest comes at most this late after its due time."""


class DigestTicker:
    """Sends the due ``digest`` messages of one hub's clients (use from the event loop's thread)."""

    def __init__(
        self, hub: Hub, index: OccupancyIndex, streams: Callable[[], Sequence[Stream]], clock: Callable[[], float]
    ) -> None:
        self.hub = hub
        self.index = index
        self.streams = streams
        """The streams a client may select (the configured ones and any seen since)."""
        self.clock = clock
        self._task: asyncio.Task[None] | None = None

    def tick(self) -> int:
        """Send what is due now; returns how many digest messages were queued."""
        now = self.clock()
        sent = 0
        for sub in self.hub.digest_clients:
            every = sub.digest_every
            if every is None or sub.digest_due > now:
                continue
            sub.digest_due = now + every
            sent += self.send(sub)
        return sent

    def send(self, sub: Subscription) -> int:
        """One digest per stream ``sub`` selects, at the log's last offset."""
        offset = self.hub.offset
        mediums = sub.filter.mediums
        sent = 0
        for source, dp_rank in sorted(self.streams()):
            if not sub.filter.matches_stream(source, dp_rank):
                continue
            value, blocks = self.index.stream(source, dp_rank).digest(mediums)
            message = messages.encode_digest(source, dp_rank, offset, hex_digest(value), blocks)
            if not self.hub.deliver(sub, message):
                break
            sent += 1
        return sent

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            self.tick()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
