"""The ingest half's appender in a cluster (a :class:`~kvgateway.log.ordered.Appender`): records go
to JetStream, which assigns their offsets; nothing is read back here (the edges read the stream).

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
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Final

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from kvgateway.cluster import records
from kvgateway.config.cluster import NatsOptions
from kvgateway.engine.wire import Stream
from kvgateway.log.records import BatchRecord, NoticeRecord, Record
from kvgateway.runtime.metrics import Metrics
from kvgateway.runtime.tasks import cancel_and_wait

logger = logging.getLogger("kvgateway.cluster.ingest")

RETRY_SECONDS = 0.5
MAX_IN_FLIGHT = 4096
"""Publishes sent and not yet acknowledged (pipelining: one at a time manages only hundreds a second)."""
ACK_SECONDS = 5.0
LINGER_SECONDS: Final = NatsOptions().linger_seconds
"""A publish waits at most this long for company (``--nats-linger``, 3 ms by default): the latency
it adds, against a write for each (a write costs the ingest, nats-server and the edge about 300 us
of CPU in all). At 1,000 batches/s on nats-server 2.15 (docs/scaling.md, "Latency and the linger"),
3 ms cost 12-27% more cluster CPU per batch than 5 ms for a p99 of 4.5-5.0 ms against 6.9-7.3;
none, about 70% more than 3 ms for 1.2-1.6 ms. From about 10,000 batches/s a write is full
(:data:`LINGER_BATCH`) at any of them. It waits only where company can come (:meth:`Publisher._lingers`):
not for a record after a quiet spell, nor for a backlog or burst already queued; and no longer once
:data:`LINGER_BATCH` are queued."""
LINGER_BATCH = 32


@dataclass(slots=True)
class PublishStats:
    published: int = 0  # stored by the server
    duplicates: int = 0  # dropped by the server: already stored under the same id
    retries: int = 0


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
    stream: Stream = ("", 0)
    generation: int = 0
    seq: int | None = None  # a batch's seq (None: a notice)
    probe: bool = False  # sent again only to learn whether the stream holds it (see _recover)


PROBE_HEADERS: Final = {"Nats-Expected-Last-Subject-Sequence": "0"}
"""On a resend: the server answers a stored id as a duplicate before it checks this expectation,
which fails on any subject with messages: a probe is never stored out of order."""
WRONG_LAST_SEQUENCE: Final = b"10071"


class Publisher:
    """Each record encoded once and published to the stream ``stream_name``; JetStream assigns its
    offset. ``on_failure`` runs before publishes are sent again (e.g. to
    re-create a lost stream); ``on_lost`` is told the batches the stream will never hold in order."""

    def __init__(
        self,
        nc: Client,
        js: JetStreamContext,
        prefix: str,
        stream_name: str,
        *,
        metrics: Metrics,
        on_failure: Callable[[], Awaitable[None]] | None = None,
        on_lost: Callable[[dict[Stream, list[int]]], None] | None = None,
        linger: float = LINGER_SECONDS,
    ) -> None:
        self.metrics = metrics
        self.linger = linger  # seconds; 0: what is queued leaves when the pump next runs, unwaited
        self._nc = nc
        self._js = js
        self._prefix = prefix
        self._stream_name = stream_name
        self._positions: dict[Stream, _Position] = {}
        self._queue: deque[_Outgoing] = deque()
        self._wake = asyncio.Event()
        self._appended_at = float("-inf")  # time.monotonic() of the last append
        self._alone = False  # the oldest queued record came after a quiet spell (see _lingers)
        self._gathered = 1  # records the last linger gathered
        self._full: asyncio.Future[None] | None = None  # a linger's, resolved at LINGER_BATCH queued
        self.stats = PublishStats()
        self._task: asyncio.Task[None] | None = None
        self._in_flight: dict[int, _Outgoing] = {}
        self._next_id = 0
        self._reply_prefix = ""
        self._failed: str | None = None
        self._lost: dict[Stream, list[int]] = {}
        self._reconnects = 0
        self.on_failure = on_failure
        self.on_lost = on_lost

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
            position.after_seq = last.seq if isinstance(last, records.WireBatch) else last.after_seq
        known = {f"{s}[{r}]": (p.generation, p.after_seq) for (s, r), p in self._positions.items()}
        logger.info("ingest continues (generation, last seq) from the stream: %s", known)

    def last_seqs(self) -> dict[Stream, int]:
        """Each stream's last batch seq in the stream (of its current generation), where known."""
        return {stream: p.after_seq for stream, p in self._positions.items() if p.after_seq >= 0}

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._pump())

    async def stop(self, drain_within: float = 3.0) -> None:
        if self._task is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_within
        while self.pending and loop.time() < deadline:  # noqa: ASYNC110 - polls two queues, one not ours
            await asyncio.sleep(0.02)
        await cancel_and_wait(self._task)
        self._task = None

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._in_flight)

    def append(self, record: Record) -> None:
        position = self._positions.get(record.stream)
        if position is None:
            position = self._positions[record.stream] = _Position()
        if type(record) is NoticeRecord and record.kind == "restart":
            position.generation += 1  # the engine's seqs start again: new ids
            position.after_seq = -1
        ident = records.msg_id(record, position.generation, position.after_seq)
        if type(record) is BatchRecord:
            position.after_seq = record.seq
        payload = records.encode_record(record, position.generation, position.after_seq)
        subject = records.subject(self._prefix, record.stream)
        seq = record.seq if type(record) is BatchRecord else None
        queue = self._queue
        now = time.monotonic()
        if not queue:
            self._alone = now - self._appended_at >= self.linger
        self._appended_at = now
        queue.append(_Outgoing(subject, payload, {"Nats-Msg-Id": ident}, record.stream, position.generation, seq))
        full = self._full
        if full is not None and len(queue) >= LINGER_BATCH and not full.done():
            full.set_result(None)
        self._wake.set()

    async def _pump(self) -> None:
        """Send in order with at most :data:`MAX_IN_FLIGHT` unacknowledged; after a failure (an
        error reply, or no reply within :data:`ACK_SECONDS`) send again, in order, everything
        from the oldest unacknowledged on (what the server did store comes back as a duplicate)."""
        nc = self._nc
        inbox = nc.new_inbox()
        self._reply_prefix = inbox + "."
        await nc.subscribe(inbox + ".*", cb=self._on_ack)
        queue = self._queue
        while True:
            if self._lost and self.on_lost is not None:
                self.on_lost(self.take_lost())
            reconnects = int(nc.stats["reconnects"])
            if reconnects != self._reconnects:
                self._reconnects = reconnects
                if self._in_flight and not self._failed:
                    self._failed = "reconnected"
            if self._failed:
                await self._recover()
                continue
            if not nc.is_connected:  # nothing into a dead connection's buffer: it may lose it
                await asyncio.sleep(0.05)
                continue
            if not queue or len(self._in_flight) >= MAX_IN_FLIGHT:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), ACK_SECONDS)
                except TimeoutError:
                    if self._in_flight:
                        self._failed = "no acknowledgement"
                continue
            if self._lingers():
                # Let a few more records come: their publishes then leave in one write (a write per
                # publish cost more CPU than everything else the ingest does).
                await self._linger()
            # What is queued now leaves in one write: nats-py buffers the publishes (none of them
            # yields below its 2 MB buffer) and its flusher writes them together in its next turn.
            if queue and not self._failed:  # an acknowledgement may have failed during the linger
                self.metrics.jetstream_writes.inc()
            while queue and len(self._in_flight) < MAX_IN_FLIGHT and not self._failed:
                item = queue.popleft()
                self._next_id += 1
                self._in_flight[self._next_id] = item
                try:
                    await nc.publish(
                        item.subject, item.payload, reply=f"{self._reply_prefix}{self._next_id}", headers=item.headers
                    )
                except Exception as exc:  # the connection is closed or its buffer is full
                    self._failed = str(exc) or type(exc).__name__

    def _lingers(self) -> bool:
        """Whether the queue waits for company before it is sent. Never with no linger; not when its
        oldest record came the linger's time or more after the one before it (at that pace a linger
        gathers nothing: it would add its whole wait to every record for no fewer writes), nor when the queue already
        holds :data:`LINGER_BATCH`, or as many as the last linger gathered and at least two (a burst,
        or a backlog the pump finds when it comes late, as after a stall: company came already)."""
        queued = len(self._queue)
        if self._alone or queued >= LINGER_BATCH or self.linger <= 0:
            return False
        return queued < max(2, self._gathered)

    async def _linger(self) -> None:
        """Wait the linger's time, or until :data:`LINGER_BATCH` records are queued."""
        loop = asyncio.get_running_loop()
        full = self._full = loop.create_future()
        timer = loop.call_later(self.linger, _release, full)
        try:
            await full
        finally:
            timer.cancel()
            self._full = None
        self._gathered = len(self._queue)

    async def _on_ack(self, msg: Msg) -> None:
        ident = int(msg.subject[len(self._reply_prefix) :])
        item = self._in_flight.pop(ident, None)
        if item is None:
            return  # sent again since: the fresh copy has its own id
        data = msg.data
        stats = self.stats
        if item.probe and WRONG_LAST_SEQUENCE in data and item.seq is not None:
            # Not stored, and a later batch of its stream is: lost for good (storing it now would
            # put it out of order). The gateway reports it as any loss.
            self._lost.setdefault(item.stream, []).append(item.seq)
            self._wake.set()
            return
        if not data or b'"error"' in data:
            self._in_flight[ident] = item  # kept for the resend, in its place (by id)
            if not self._failed:
                self._failed = data.decode(errors="replace")[:200] if data else f"no stream ({msg.headers})"
            return
        if b'"duplicate"' in data:  # the server adds it only when true
            stats.duplicates += 1
            self.metrics.jetstream_duplicates.inc()
        else:
            stats.published += 1
            self.metrics.jetstream_published.inc()
        self._wake.set()

    async def _recover(self) -> None:
        """Everything unacknowledged goes back in front of the queue, in its order. A batch older
        than what the stream already holds of its stream (a later publish got through while this
        one was lost with a broken connection) is sent as a probe: stored already, or lost."""
        logger.warning("publish failed (%s): sending %d again", self._failed, len(self._in_flight))
        await asyncio.sleep(RETRY_SECONDS)
        if self.on_failure is not None:
            with contextlib.suppress(Exception):
                await self.on_failure()
        again = [self._in_flight[key] for key in sorted(self._in_flight)]
        self._in_flight.clear()
        held: dict[str, tuple[int, int]] = {}
        for subject in {item.subject for item in again if item.seq is not None}:
            with contextlib.suppress(Exception):
                raw = await self._js.get_last_msg(self._stream_name, subject)
                last = records.decode(raw.data or b"")
                held[subject] = (last.generation, last.seq if isinstance(last, records.WireBatch) else last.after_seq)
        resend = [_probe(item) if _behind(item, held.get(item.subject)) else item for item in again]
        self._queue.extendleft(reversed(resend))
        self.stats.retries += len(resend)
        self.metrics.jetstream_retries.inc(len(resend))
        self._failed = None

    def take_lost(self) -> dict[Stream, list[int]]:
        """Batches found lost by probes since the last call, by stream."""
        lost, self._lost = self._lost, {}
        return lost


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _behind(item: _Outgoing, held: tuple[int, int] | None) -> bool:
    """Whether the stream holds a later batch of ``item``'s engine generation than ``item``."""
    return item.seq is not None and held is not None and held[0] == item.generation and item.seq < held[1]


def _probe(item: _Outgoing) -> _Outgoing:
    return replace(item, headers={**item.headers, **PROBE_HEADERS}, probe=True)
