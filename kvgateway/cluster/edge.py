"""``kvgateway edge``: follows the JetStream stream and serves the whole web protocol.

The serving half (:class:`~kvgateway.serve.serving.Serving`) follows an
:class:`~kvgateway.cluster.edge_log.EdgeLog` exactly as it follows the single process's log, so a
snapshot, a status and a message id at an offset are the same on every edge and in one process:
a client resumes on any of them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js import api as js_api

from kvgateway.cluster import nats_link, records
from kvgateway.cluster.checkpoints import CheckpointStore
from kvgateway.cluster.edge_log import EdgeLog, OffsetGap
from kvgateway.cluster.options import INGEST_SILENCE_SECONDS, NatsOptions
from kvgateway.cluster.order import OrderGuard
from kvgateway.config import Settings
from kvgateway.log import messages
from kvgateway.log.ordered import make_entry
from kvgateway.log.ring import Entry
from kvgateway.runtime.metrics import Metrics
from kvgateway.runtime.startup import StartupError
from kvgateway.runtime.tasks import cancel_and_wait
from kvgateway.serve.serving import Serving
from kvgateway.state import checkpoint
from kvgateway.state.checkpoint import CheckpointError

logger = logging.getLogger("kvgateway.cluster.edge")

EPOCH_CHECK_SECONDS = 2.0
"""How often the edge checks that the stream is still the one it follows."""

LEASE_INTERVALS = 3
"""The checkpoint writer's lease lasts this many checkpoint intervals: another edge takes over
writing when the writer has not renewed it for that long."""

FETCH_BATCH = 512
"""A resume range up to this long is read with direct gets, a longer one with an ordered consumer."""
FETCH_IDLE_SECONDS = 5.0


class EdgeService:
    """The serving half, fed by the stream instead of engines."""

    def __init__(self, settings: Settings, options: NatsOptions) -> None:
        self.settings = settings
        self.options = options
        self.metrics = Metrics()
        hub_metrics = self.metrics.hub()
        self.edge_log = EdgeLog(settings.ring_messages, settings.ring_bytes, retained=hub_metrics.retained)
        hub_metrics.retained(0, 0)
        self.edge_log.fetch = self._fetch
        self.serving = Serving(settings, self.edge_log, self.metrics, silence=INGEST_SILENCE_SECONDS)
        self.caught_up_to = 0  # the stream's last sequence when this edge started: ready past it
        self.fatal: str | None = None
        self.startup_error: StartupError | None = None
        self._order = OrderGuard()
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._watch: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._checkpoints: CheckpointStore | None = None
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.whole = True  # False: started without the stream's beginning (it writes no checkpoint)
        self._stopped = False

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
        self.edge_log.start_at(state.epoch, max(state.first_seq, 1))  # an empty stream says 0
        self.caught_up_to = state.last_seq
        await self._start_from_checkpoint(state.first_seq)
        first = self.edge_log.last_offset + 1
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
        self.serving.start()  # the fleet gauges and pause timing, as in one process
        if self._checkpoints is not None and self.whole:
            self._writer = asyncio.ensure_future(self._write_checkpoints(self._checkpoints))
        logger.info("edge following %s from seq %d (epoch %s)", self.options.stream, first, state.epoch)

    # --- checkpoints ------------------------------------------------------------------------

    async def _start_from_checkpoint(self, stream_first: int) -> None:
        """Load the stream's latest checkpoint when the stream holds everything after it; else,
        if the stream no longer holds its beginning, say so: every stream's index is stale
        (history_truncated) until its engine clears its cache or restarts."""
        if self.options.checkpoint_seconds > 0:
            assert self._js is not None
            store = CheckpointStore(
                self._js, self.options, self.owner, LEASE_INTERVALS * self.options.checkpoint_seconds
            )
            try:
                await store.open()
            except Exception as exc:  # the edge serves without: a checkpoint is an optimisation
                logger.warning("checkpoints unavailable (%s): starting from the stream's first record", exc)
            else:
                self._checkpoints = store
                self.edge_log.load = self._load_checkpoint
        try:
            loaded = await self.serving.load_checkpoint()
        except CheckpointError as exc:
            logger.warning("checkpoint skipped: %s", exc)
            loaded = None
        if loaded is not None:
            self._order.restore(loaded.extra.get("order", {}))
            self.metrics.checkpoint_loaded_offset.set(loaded.offset)
            logger.info("edge starts from the checkpoint at seq %d", loaded.offset)
        elif stream_first > 1:
            self.whole = False
            self.serving.index.history_missing("history_truncated")
            logger.warning(
                "the stream no longer holds seqs before %d and no checkpoint covers them: every engine's "
                "index is stale (history_truncated) until it clears its cache or restarts",
                stream_first,
            )

    async def _load_checkpoint(self) -> tuple[str, int, bytes] | None:
        assert self._checkpoints is not None
        found = await self._checkpoints.latest()
        return None if found is None else (found.pointer.epoch, found.pointer.offset, found.data)

    async def _write_checkpoints(self, store: CheckpointStore) -> None:
        """Every ``checkpoint_seconds``, while this edge holds the writer's lease and has applied
        something new: the index at its last offset."""
        every = self.options.checkpoint_seconds
        written = -1
        while True:
            await asyncio.sleep(every)
            try:
                if not self.whole or not await store.hold_lease() or self.edge_log.last_offset == written:
                    continue
                taken = self.serving.capture_checkpoint({"order": self._order.state()})
                data = checkpoint.encode(taken)
                await store.write(taken.epoch, taken.offset, data)
            except Exception as exc:  # NATS away, a full store: the next interval tries again
                logger.warning("checkpoint not written: %s", exc)
                continue
            written = taken.offset
            self.metrics.checkpoints_written.inc()
            self.metrics.checkpoint_bytes.set(len(data))

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await cancel_and_wait(self._watch, self._writer)
        await self.serving.stop()
        if self._nc is not None:
            await nats_link.close(self._nc)

    def close_clients(self) -> None:
        self.serving.hub.close()

    def _die(self, reason: str) -> None:
        """The stream this edge followed is gone or broken: exit, a fresh edge starts over."""
        if self.fatal is None:
            self.fatal = reason
            logger.error("edge stops: %s", reason)
            os.kill(os.getpid(), signal.SIGTERM)

    async def _watch_epoch(self) -> None:
        assert self._js is not None
        while True:
            await asyncio.sleep(EPOCH_CHECK_SECONDS)
            try:
                state = await nats_link.stream_state(self._js, self.options)
            except Exception:
                continue  # NATS unreachable: a pause, not a new stream
            if state is None or state.epoch != self.edge_log.epoch:
                self._die(f"stream {self.options.stream} was recreated (new epoch)")
                return

    # --- following ------------------------------------------------------------------------

    async def _on_message(self, msg: Msg) -> None:
        try:
            seq = msg.metadata.sequence.stream
            if seq > self.edge_log.last_offset + 1 and not self.edge_log.fed:
                self._expired_at_start(seq)
            if seq > self.edge_log.last_offset:  # (a repeat after a consumer reset is ignored)
                self.edge_log.append_at(seq, self._order.admit(seq, records.decode(msg.data)))
        except (OffsetGap, records.RecordError, messages.NoticeError) as exc:
            self._die(str(exc))

    def _expired_at_start(self, seq: int) -> None:
        """The stream's retention removed the records this edge was to start from between its look
        at the stream and its first delivery (a busy stream expires its oldest records all the
        time): what they did is unknown, as for a stream that no longer holds its beginning."""
        logger.warning(
            "the stream expired seqs %d..%d before this edge read them: every engine's index is stale "
            "(history_truncated) until it clears its cache or restarts",
            self.edge_log.last_offset + 1,
            seq - 1,
        )
        self.whole = False
        self.serving.index.history_missing("history_truncated")
        self.edge_log.start_at(self.edge_log.epoch, seq)

    # --- views ----------------------------------------------------------------------------

    def refresh_gauges(self) -> None:
        self.serving.refresh_gauges()
        self.metrics.jetstream_applied_offset.set(self.edge_log.last_offset)

    def readiness(self) -> tuple[bool, list[dict[str, Any]]]:
        """As one process's (every stream up, as the status board shows it), once the edge has
        applied the stream as it stood at start and while NATS is up."""
        behind = self.edge_log.last_offset < self.caught_up_to
        connected = self._nc is not None and self._nc.is_connected
        if behind or not connected:
            reason = "catching up with the stream" if behind else "NATS disconnected"
            return False, [{"source": None, "dp_rank": None, "reason": reason}]
        not_ready = self.serving.board.not_ready(self.serving.clock())
        return not not_ready, not_ready

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
        return make_entry(self.edge_log.epoch, seq, self._order.at(seq, records.decode(data)))
