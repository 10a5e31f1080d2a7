"""``kvgateway edge``: follows the JetStream stream and serves the whole web protocol.

The index and the hub follow an :class:`~kvgateway.cluster.edge_log.EdgeLog` exactly as they
follow the single process's log, so a snapshot at an offset is the same on every edge, and a
message id names the same message on every edge: a client resumes on any of them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js import api as js_api

from kvgateway.cluster import nats_link, records
from kvgateway.cluster.edge_log import EdgeLog, OffsetGap
from kvgateway.cluster.options import NatsOptions
from kvgateway.cluster.order import OrderGuard
from kvgateway.config import Settings
from kvgateway.gateway import Gateway, StartupError
from kvgateway.log import messages
from kvgateway.log.ordered import BatchRecord, NoticeRecord, make_entry
from kvgateway.log.ring import Entry
from kvgateway.serve.query import ClientRequest
from kvgateway.serve.subscription import Subscription, Transport

log = logging.getLogger("kvgateway.cluster.edge")

AHEAD_WAIT_SECONDS = 5.0
"""A client whose id is ahead of this edge (it read a faster edge) waits this long for it."""

EPOCH_CHECK_SECONDS = 2.0
"""How often the edge checks that the stream is still the one it follows."""

FETCH_BATCH = 512
"""A resume range up to this long is read with direct gets, a longer one with an ordered consumer."""
FETCH_IDLE_SECONDS = 5.0

MAX_STREAM_RESUME = 200_000
"""A resume further back than this many messages before the ring is not recovered: the backlog is
held in memory for the client (exempt from its queue bound, as a ring backlog is)."""


class EdgeGateway(Gateway):
    """The single process's web side, fed by the stream instead of engines."""

    def __init__(self, settings: Settings, options: NatsOptions, **kwargs: Any) -> None:
        # A log is made before the gateway, and the gateway's metrics after: the ring's gauges are
        # wired once both exist.
        edge_log = EdgeLog(settings.ring_messages, settings.ring_bytes)
        super().__init__(settings, log=edge_log, **kwargs)  # the index, routers and hub follow it
        edge_log.report_to(self.metrics.hub().retained)
        self.options = options
        self.log.follow(self._follow_status)
        self.edge_log = edge_log
        self.caught_up_to = 0  # the stream's last sequence when this edge started: ready past it
        self.fatal: str | None = None
        self._order = OrderGuard()
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._watch: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._follow()
        except Exception as exc:
            self.startup_error = StartupError(f"cannot follow stream {self.options.stream}: {exc}")
            raise self.startup_error from None

    async def _follow(self) -> None:
        self._nc = await nats_link.connect(self.options)
        self._js = self._nc.jetstream()
        state = await nats_link.wait_stream(self._js, self.options, 30)
        first = max(state.first_seq, 1)  # an empty stream says 0
        self.edge_log.start_at(state.epoch, first)
        self.caught_up_to = state.last_seq
        await self._js.subscribe(
            f"{self.options.subject_prefix}.>",
            stream=self.options.stream,
            cb=self._on_message,
            ordered_consumer=True,
            idle_heartbeat=1.0,
            deliver_policy=js_api.DeliverPolicy.BY_START_SEQUENCE,
            config=js_api.ConsumerConfig(opt_start_seq=first),
        )
        self._watch = asyncio.ensure_future(self._watch_epoch())
        self._begin_background()  # the fleet gauges and pause timing, as in one process
        log.info("edge following %s from seq %d (epoch %s)", self.options.stream, first, state.epoch)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        await super().stop()
        if self._nc is not None:
            await nats_link.close(self._nc)

    def _die(self, reason: str) -> None:
        """The stream this edge followed is gone or broken: exit, a fresh edge starts over."""
        if self.fatal is None:
            self.fatal = reason
            log.error("edge stops: %s", reason)
            os.kill(os.getpid(), signal.SIGTERM)

    async def _watch_epoch(self) -> None:
        assert self._js is not None
        while True:
            await asyncio.sleep(EPOCH_CHECK_SECONDS)
            try:
                state = await nats_link.stream_state(self._js, self.options)
            except Exception:
                continue  # NATS unreachable: a pause, not a new stream
            if state is None or state.epoch != self.log.epoch:
                self._die(f"stream {self.options.stream} was recreated (new epoch)")
                return

    # --- following ------------------------------------------------------------------------

    async def _on_message(self, msg: Msg) -> None:
        try:
            seq = msg.metadata.sequence.stream
            if seq > self.log.last_offset:  # (a repeat after a consumer reset is ignored)
                self.edge_log.append_at(seq, self._order.admit(seq, records.decode(msg.data)))
        except (OffsetGap, records.RecordError, messages.NoticeError) as exc:
            self._die(str(exc))

    def _follow_status(self, entry: Entry) -> None:
        """What the single process's sink knows about a stream, as far as the log tells it."""
        record = entry.record
        outlet = self.outlets.get(entry.stream)
        if outlet is None:
            return
        status = outlet.status
        if type(record) is BatchRecord:
            status.last_seq = record.seq
            status.counters["batches"] += 1
            if record.replayed:
                status.counters["replayed"] += 1
        elif type(record) is NoticeRecord:
            if record.kind in ("up", "down"):
                status.connected = record.kind == "up"
                if not status.connected:
                    status.down_reason = str(record.fields.get("reason"))
            elif record.kind == "restart":
                status.counters["restarts"] += 1
            elif record.kind == "unrecovered_gap":
                status.counters["unrecovered"] += int(record.fields["count"])
                reason = str(record.fields["reason"])
                status.losses[reason] = status.losses.get(reason, 0) + int(record.fields["count"])

    # --- views ----------------------------------------------------------------------------

    def refresh_gauges(self) -> None:
        super().refresh_gauges()
        self.metrics.jetstream_applied_offset.set(self.log.last_offset)

    def readiness(self) -> tuple[bool, list[dict[str, Any]]]:
        """Ready once the edge has applied the stream as it stood at start (and NATS is up)."""
        behind = self.log.last_offset < self.caught_up_to
        connected = self._nc is not None and self._nc.is_connected
        if behind or not connected:
            reason = "catching up with the stream" if behind else "NATS disconnected"
            return False, [{"source": None, "dp_rank": None, "reason": reason}]
        return True, []

    async def subscribe_async(self, request: ClientRequest, transport: Transport) -> Subscription:
        """:meth:`subscribe`, after what it needs is here: an id ahead of this edge waits for the
        edge to reach it; an id older than the ring has its range fetched from JetStream."""
        parsed = None if request.last_event_id is None else messages.parse_message_id(request.last_event_id)
        if parsed is None or parsed[0] != self.log.epoch:
            return self.subscribe(request, transport)
        offset = parsed[1]
        if offset > self.log.last_offset:
            await self.edge_log.reached(offset, AHEAD_WAIT_SECONDS)
            return self.subscribe(request, transport)
        if self.edge_log.ring.first_offset - 1 - offset > MAX_STREAM_RESUME:
            return self.subscribe(request, transport)  # too far back to hold for one client
        lent: list[Entry] = []
        while offset + len(lent) < self.edge_log.ring.first_offset - 1:
            more = await self._fetch(offset + len(lent) + 1, self.edge_log.ring.first_offset - 1)
            if not more:
                return self.subscribe(request, transport)  # expired from the stream: not recovered
            lent.extend(more)
        # No await from here: nothing is appended between the check above and the subscribe.
        with self.edge_log.extended(lent):
            return self.subscribe(request, transport)

    async def _fetch(self, first: int, last: int) -> list[Entry]:
        """Entries ``first..last`` (or fewer) read back from JetStream; an empty list when
        ``first`` is no longer in the stream. A short range by direct gets, 512 in flight; a long
        one by an ordered consumer from ``first``."""
        if last - first >= FETCH_BATCH:
            return await self._fetch_consumed(first, last)
        assert self._js is not None
        seqs = range(first, last + 1)
        replies = await asyncio.gather(
            *(self._js.get_msg(self.options.stream, seq, direct=True) for seq in seqs), return_exceptions=True
        )
        out: list[Entry] = []
        for seq, raw in zip(seqs, replies, strict=True):
            if isinstance(raw, BaseException) or raw.data is None or raw.seq != seq:
                break  # expired (or deleted): what came before it is still of use
            out.append(self._entry_at(seq, raw.data))
        return out

    async def _fetch_consumed(self, first: int, last: int) -> list[Entry]:
        assert self._js is not None
        sub = await self._js.subscribe(
            f"{self.options.subject_prefix}.>",
            stream=self.options.stream,
            ordered_consumer=True,
            deliver_policy=js_api.DeliverPolicy.BY_START_SEQUENCE,
            config=js_api.ConsumerConfig(opt_start_seq=first),
        )
        out: list[Entry] = []
        try:
            while first + len(out) <= last:
                msg = await sub.next_msg(timeout=FETCH_IDLE_SECONDS)
                seq = msg.metadata.sequence.stream
                if seq != first + len(out):
                    break  # the start has expired meanwhile: only what is contiguous counts
                out.append(self._entry_at(seq, msg.data))
        except NatsTimeoutError:
            pass
        finally:
            await sub.unsubscribe()
        return out

    def _entry_at(self, seq: int, data: bytes) -> Entry:
        """The entry this edge applied at ``seq``, rendered again from the stream."""
        return make_entry(self.log.epoch, seq, self._order.at(seq, records.decode(data)))
