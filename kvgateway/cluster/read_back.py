"""What an edge's ring log reads back from JetStream (a :class:`~kvgateway.log.ordered.ReadBack`):
a range older than the ring for a resuming client, the latest checkpoint, and the wait of a client
whose id is ahead of this edge. The log it is given to (:class:`~kvgateway.log.ordered.MemoryLog`)
is the single process's; only where its older part lives differs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js import api as js_api

from kvgateway.cluster import records
from kvgateway.cluster.order import OrderGuard
from kvgateway.config.cluster import NatsOptions
from kvgateway.log.records import Record

AHEAD_WAIT_SECONDS = 5.0
"""A client whose id is ahead of this edge (it read a faster edge) waits this long for it."""

FETCH_BATCH = 512
"""A resume range up to this long is read with direct gets, a longer one with an ordered consumer."""
FETCH_IDLE_SECONDS = 5.0

Load = Callable[[], Awaitable[tuple[str, int, bytes] | None]]
"""The latest checkpoint in the stream's store: (epoch, offset, bytes), or None."""


class StreamReadBack:
    """The edge's JetStream stream as its log's older part (usable once :meth:`open`)."""

    def __init__(self, options: NatsOptions, order: OrderGuard) -> None:
        self._options = options
        self._order = order  # the same records as the edge applied them
        self._js: JetStreamContext | None = None
        self._load: Load | None = None
        self._last = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def open(self, js: JetStreamContext, load: Load | None) -> None:
        """Once connected: the stream to read from, and its checkpoints (None: checkpoints off)."""
        self._js = js
        self._load = load

    async def checkpoint(self) -> tuple[str, int, bytes] | None:
        return None if self._load is None else await self._load()

    def appended(self, offset: int) -> None:
        self._last = offset
        if self._waiters:
            ready = [w for w in self._waiters if w[0] <= offset]
            self._waiters = [w for w in self._waiters if w[0] > offset]
            for _, future in ready:
                if not future.done():
                    future.set_result(None)

    async def reached(self, offset: int) -> bool:
        if offset <= self._last:
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((offset, future))
        try:
            await asyncio.wait_for(future, AHEAD_WAIT_SECONDS)
        except TimeoutError:
            return False
        return True

    async def records(self, first: int, last: int) -> list[tuple[int, Record]]:
        """Records ``first..last`` (or fewer); none when ``first`` is no longer in the stream. A
        short range by direct gets, 512 in flight; a long one by an ordered consumer from ``first``."""
        if self._js is None:
            return []
        if last - first >= FETCH_BATCH:
            return await self._consumed(self._js, first, last)
        seqs = range(first, last + 1)
        replies = await asyncio.gather(
            *(self._js.get_msg(self._options.stream, seq, direct=True) for seq in seqs), return_exceptions=True
        )
        out: list[tuple[int, Record]] = []
        for seq, raw in zip(seqs, replies, strict=True):
            if isinstance(raw, BaseException) or raw.data is None or raw.seq != seq:
                break  # expired (or deleted): what came before it is still of use
            out.append(self._record_at(seq, raw.data))
        return out

    async def _consumed(self, js: JetStreamContext, first: int, last: int) -> list[tuple[int, Record]]:
        sub = await js.subscribe(
            f"{self._options.subject_prefix}.>",
            stream=self._options.stream,
            ordered_consumer=True,
            deliver_policy=js_api.DeliverPolicy.BY_START_SEQUENCE,
            config=js_api.ConsumerConfig(opt_start_seq=first),
        )
        out: list[tuple[int, Record]] = []
        try:
            while first + len(out) <= last:
                msg = await sub.next_msg(timeout=FETCH_IDLE_SECONDS)
                seq = msg.metadata.sequence.stream
                if seq != first + len(out):
                    break  # the start has expired meanwhile: only what is contiguous counts
                out.append(self._record_at(seq, msg.data))
        except NatsTimeoutError:
            pass
        finally:
            await sub.unsubscribe()
        return out

    def _record_at(self, seq: int, data: bytes) -> tuple[int, Record]:
        """The record this edge applied at ``seq``, read again from the stream."""
        return seq, self._order.at(seq, records.decode(data))
