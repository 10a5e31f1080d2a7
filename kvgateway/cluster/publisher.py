"""The ingest side of the log: records go to JetStream, which assigns their offsets.

Publishes are pipelined (a bounded number in flight: a loop of synchronous JetStream publishes
manages only hundreds a second) and retried in order when they fail (a nats-server restart):
each carries a ``Nats-Msg-Id`` (:func:`kvgateway.cluster.records.msg_id`), so a retry of a
publish the server did store, or the same batch from another ingest process, is dropped by the
server as a duplicate instead of stored twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from kvgateway import wire
from kvgateway.cluster import records
from kvgateway.log import BatchRecord, MemoryLog, NoticeRecord, Record, Stream
from kvgateway.occupancy import OccupancyIndex

log = logging.getLogger("kvgateway.cluster.ingest")

RETRY_SECONDS = 0.5


@dataclass(slots=True)
class PublishStats:
    published: int = 0  # stored by the server
    duplicates: int = 0  # dropped by the server: already stored under the same id
    retries: int = 0
    last_seq: int = 0  # the stream sequence of the last publish acknowledged


@dataclass(slots=True)
class _Position:
    """Where a stream stands in the log: its engine generation and last batch seq published."""

    generation: int = 0
    after_seq: int = -1


@dataclass(frozen=True, slots=True)
class _Outgoing:
    subject: str
    payload: bytes
    headers: dict[str, str] = field(hash=False)


class PublishingLog(MemoryLog):
    """What the ingest gateway appends to: each record is encoded once and published.

    It keeps no ring (nothing is read back here); the index is told only what decides the
    gateway's own notices (stale marks, resets), not every block."""

    def __init__(self, js: JetStreamContext, prefix: str, stream_name: str, index: OccupancyIndex) -> None:
        super().__init__(0, 0)
        self._js = js
        self._prefix = prefix
        self._stream_name = stream_name
        self._index = index
        self._positions: dict[Stream, _Position] = {}
        self._queue: deque[_Outgoing] = deque()
        self._wake = asyncio.Event()
        self._count = 0
        self.stats = PublishStats()
        self._task: asyncio.Task[None] | None = None
        self.on_published: Callable[[PublishStats], None] | None = None
        self.on_failure: Callable[[], Awaitable[None]] | None = None  # e.g. re-create a lost stream

    async def load_positions(self, streams: list[Stream]) -> None:
        """Continue each stream's generation from its last record in the log, so the same batch
        from this process and from the one before it (or beside it) has the same id."""
        for stream in streams:
            try:
                raw = await self._js.get_last_msg(self._stream_name, records.subject(self._prefix, stream))
            except NotFoundError:
                continue
            if raw.data is None:
                continue
            try:
                last = records.decode(raw.data)
            except records.RecordError:
                continue
            position = self._positions.setdefault(stream, _Position())
            position.generation = last.generation
            if type(last) is records.WireBatch:
                position.after_seq = last.seq
        known = {f"{s}[{r}]": (p.generation, p.after_seq) for (s, r), p in self._positions.items()}
        log.info("ingest continues (generation, last seq) from the stream: %s", known)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._pump())

    async def stop(self, drain_within: float = 3.0) -> None:
        if self._task is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_within
        while self.pending and loop.time() < deadline:  # noqa: ASYNC110 - polls two queues, one not ours
            await asyncio.sleep(0.02)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    @property
    def pending(self) -> int:
        return len(self._queue) + self._js.publish_async_pending()

    def append(self, record: Record) -> int:
        position = self._positions.get(record.stream)
        if position is None:
            position = self._positions[record.stream] = _Position()
        if type(record) is NoticeRecord:
            if record.kind == "restart":
                position.generation += 1  # the engine's seqs start again: new ids
            self._track_notice(record)
        ident = records.msg_id(record, position.generation, position.after_seq)
        if type(record) is BatchRecord:
            position.after_seq = record.seq
            self._track_batch(record.stream, record.batch)
        payload = records.encode_record(record, position.generation)
        self._queue.append(_Outgoing(records.subject(self._prefix, record.stream), payload, {"Nats-Msg-Id": ident}))
        self._wake.set()
        self._count += 1
        return self._count

    # The gateway's own notices depend on the index's stale flag: keep it as the edges will.
    def _track_notice(self, record: NoticeRecord) -> None:
        if record.kind == "restart":
            self._index.stream(*record.stream).reset()
        elif record.kind == "stale":
            self._index.stream(*record.stream).mark_stale(record.fields["reason"])

    def _track_batch(self, stream: Stream, batch: wire.Batch) -> None:
        index = self._index.stream(*stream)
        if index.stale and any(type(event) is wire.AllBlocksCleared for event in batch.events):
            index.stale = False
            index.stale_reason = None

    async def _pump(self) -> None:
        queue = self._queue
        while True:
            if not queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            sent: list[tuple[_Outgoing, asyncio.Future[js_api.PubAck]]] = []
            try:
                while queue and len(sent) < 4096:
                    item = queue[0]
                    future = await self._js.publish_async(item.subject, item.payload, headers=item.headers)
                    queue.popleft()
                    sent.append((item, future))
            except Exception as exc:  # the connection is down: retry what was not sent
                log.warning("publish failed: %s; retrying", str(exc) or type(exc).__name__)
            failed = await self._settle(sent)
            if failed:
                # In their order, before anything later: duplicates among them are dropped by id.
                queue.extendleft(reversed(failed))
                self.stats.retries += len(failed)
                await asyncio.sleep(RETRY_SECONDS)
                if self.on_failure is not None:
                    with contextlib.suppress(Exception):
                        await self.on_failure()

    async def _settle(self, sent: list[tuple[_Outgoing, asyncio.Future[js_api.PubAck]]]) -> list[_Outgoing]:
        """Wait for the acknowledgements; what must be sent again (from the first failure on)."""
        failed_at: int | None = None
        stats = self.stats
        for i, (_, future) in enumerate(sent):
            try:
                ack = await asyncio.wait_for(future, 10.0)
            except Exception as exc:
                if failed_at is None:
                    failed_at = i
                    log.warning("publish not acknowledged: %s", str(exc) or type(exc).__name__)
                continue
            if failed_at is not None:
                continue
            if ack.duplicate:
                stats.duplicates += 1
            else:
                stats.published += 1
            stats.last_seq = max(stats.last_seq, ack.seq)
        if self.on_published is not None:
            self.on_published(stats)
        return [] if failed_at is None else [item for item, _ in sent[failed_at:]]
