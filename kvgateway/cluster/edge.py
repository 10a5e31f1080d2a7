"""``kvgateway edge``: follows the JetStream stream and serves the whole web protocol.

The serving half (:class:`~kvgateway.serve.serving.Serving`) follows the single process's ring
log (:class:`~kvgateway.log.ordered.MemoryLog`), given the stream to read its older part back from
(:class:`~kvgateway.cluster.read_back.StreamReadBack`) and appended to from the stream, so a
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
from nats.js import JetStreamContext
from nats.js import api as js_api
from starlette.applications import Starlette

from kvgateway.cluster import nats_link, records
from kvgateway.cluster.checkpoints import CheckpointStore
from kvgateway.cluster.heartbeat import INGEST_SILENCE_SECONDS
from kvgateway.cluster.order import OrderGuard
from kvgateway.cluster.read_back import StreamReadBack
from kvgateway.config.cluster import NatsOptions
from kvgateway.config.settings import Settings
from kvgateway.log.ordered import OffsetGap
from kvgateway.protocol import messages
from kvgateway.runtime.metrics import Metrics
from kvgateway.runtime.startup import StartupError
from kvgateway.runtime.tasks import cancel_and_wait
from kvgateway.serve.app import create_app
from kvgateway.serve.serving import Serving
from kvgateway.state import checkpoint
from kvgateway.state.checkpoint import CheckpointError

logger = logging.getLogger("kvgateway.cluster.edge")

EPOCH_CHECK_SECONDS = 2.0
"""How often the edge checks that the stream is still the one it follows."""

LEASE_INTERVALS = 3
"""The checkpoint writer's lease lasts this many checkpoint intervals: another edge takes over
writing when the writer has not renewed it for that long."""


class EdgeRole:
    """An edge (a :class:`~kvgateway.serve.role.Role`): the serving half, fed by the stream instead
    of engines."""

    def __init__(self, settings: Settings, options: NatsOptions) -> None:
        self.settings = settings
        self.options = options
        self.metrics = Metrics()
        self._order = OrderGuard()
        self._read_back = StreamReadBack(options, self._order)
        self.serving = Serving(settings, self.metrics, read_back=self._read_back, silence=INGEST_SILENCE_SECONDS)
        self.log = self.serving.log
        self.caught_up_to = 0  # the stream's last sequence when this edge started: ready past it
        self.fatal: str | None = None
        self.startup_error: StartupError | None = None
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
        self.log.start_at(state.epoch, max(state.first_seq, 1))  # an empty stream says 0
        self.caught_up_to = state.last_seq
        await self._start_from_checkpoint(state.first_seq)
        first = self.log.last_offset + 1
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
        assert self._js is not None
        load = None
        if self.options.checkpoint_seconds > 0:
            store = CheckpointStore(
                self._js, self.options, self.owner, LEASE_INTERVALS * self.options.checkpoint_seconds
            )
            try:
                await store.open()
            except Exception as exc:  # the edge serves without: a checkpoint is an optimisation
                logger.warning("checkpoints unavailable (%s): starting from the stream's first record", exc)
            else:
                self._checkpoints = store
                load = self._load_checkpoint
        self._read_back.open(self._js, load)
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
                if not self.whole or not await store.hold_lease() or self.log.last_offset == written:
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

    async def close_clients(self) -> None:
        await self.serving.close_clients()

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
            if state is None or state.epoch != self.log.epoch:
                self._die(f"stream {self.options.stream} was recreated (new epoch)")
                return

    # --- following ------------------------------------------------------------------------

    async def _on_message(self, msg: Msg) -> None:
        try:
            seq = msg.metadata.sequence.stream
            if seq > self.log.last_offset + 1 and not self.log.fed:
                self._expired_at_start(seq)
            if seq > self.log.last_offset:  # (a repeat after a consumer reset is ignored)
                self.log.append_at(seq, self._order.admit(seq, records.decode(msg.data)))
        except (OffsetGap, records.RecordError, messages.NoticeError) as exc:
            self._die(str(exc))

    def _expired_at_start(self, seq: int) -> None:
        """The stream's retention removed the records this edge was to start from between its look
        at the stream and its first delivery (a busy stream expires its oldest records all the
        time): what they did is unknown, as for a stream that no longer holds its beginning."""
        logger.warning(
            "the stream expired seqs %d..%d before this edge read them: every engine's index is stale "
            "(history_truncated) until it clears its cache or restarts",
            self.log.last_offset + 1,
            seq - 1,
        )
        self.whole = False
        self.serving.index.history_missing("history_truncated")
        self.log.start_at(self.log.epoch, seq)

    # --- views ----------------------------------------------------------------------------

    def refresh_gauges(self) -> None:
        self.serving.refresh_gauges()
        self.metrics.jetstream_applied_offset.set(self.log.last_offset)

    def health(self) -> dict[str, Any]:
        return self.serving.health()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """As one process's (every stream up, as the status board shows it), once the edge has
        applied the stream as it stood at start and while NATS is up."""
        behind = self.log.last_offset < self.caught_up_to
        connected = self._nc is not None and self._nc.is_connected
        if behind or not connected:
            reason = "catching up with the stream" if behind else "NATS disconnected"
            down = [{"source": None, "dp_rank": None, "reason": reason}]
            return False, {"streams": len(self.serving.board.streams), "not_ready": down}
        return self.serving.readiness()

    def started_line(self, url: str) -> str:
        return f"edge serving on {url}"


def edge_app(edge: EdgeRole) -> Starlette:
    """The web app of an edge: the single process's."""
    return create_app(edge, edge.serving)
