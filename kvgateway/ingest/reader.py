"""The asyncio layer around the sequencer: one reader per stream, its replays and its monitor.

ZeroMQ sockets are plain (non-asyncio) sockets whose file descriptor is watched by the event
loop. The descriptor is edge-triggered, so a wake-up drains the socket, but at most a budget of
messages at a time: a flooding engine then takes turns with the others instead of starving them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final

import zmq

from kvgateway.config.settings import StreamConfig
from kvgateway.engine import wire
from kvgateway.engine.endpoints import is_ipv6
from kvgateway.engine.sequencer import Action, CancelReplay, Deliver, RequestReplay, Sequencer
from kvgateway.engine.sockets import Readiness, has_message, monitor_event, monitor_value
from kvgateway.ingest.monitor import (
    BIND_FAILED,
    CONNECT_RETRIED,
    DISCONNECTED,
    HANDSHAKE_FAILED,
    HANDSHAKE_SUCCEEDED,
    MONITOR_EVENTS,
    QUIET_EVENTS,
    ConnectionMonitor,
)
from kvgateway.ingest.outlet import StreamOutlet
from kvgateway.runtime.extensions import load
from kvgateway.runtime.tasks import cancel_and_wait

if TYPE_CHECKING:  # one API: the reference's
    from kvgateway.engine.sockets import receiver
else:
    # Every socket's receive (live, replay, monitor): the compiled one where it was built and
    # found pyzmq's libzmq (kvgateway/engine/_receive_c.pyx), else the pure-Python reference.
    _compiled_receive = load("kvgateway.engine._receive_c")
    if _compiled_receive is None:
        from kvgateway.engine.sockets import receiver
    else:
        receiver = _compiled_receive.receiver

logger = logging.getLogger("kvgateway.ingest")

BUDGET = 64
"""Messages one stream may process before the loop serves another stream."""

TURN_SECONDS = 0.005
"""...and the time it may take for them: huge batches must not turn 64 messages into a second."""

MAX_REPLAY_SECONDS_FACTOR = 20
"""A replay attempt may run this many replay timeouts in all, however steadily it trickles."""

HANDSHAKE_MS = 5000
"""A peer that accepts the TCP connection but sends no ZeroMQ greeting within this is no engine
(ZeroMQ's default is 30 s; a real publisher's I/O thread answers in milliseconds)."""

RECONNECT_IVL_MS = 100
"""ZeroMQ's first wait before it tries a connection again (the first retry of each new attempt)..."""

RECONNECT_IVL_MAX_MS = 2000
"""...doubled at each failure up to this: a restarted engine is found within 2 s at any age."""

NOT_ZEROMQ: Final = "not_zeromq"
"""The reason code of a stream whose endpoint answers TCP but fails ZeroMQ's handshake."""

QUIET_SECONDS = 2.0
"""Batches wait this long for a live stream that is behind a replay before the hole below them is
settled by another replay (the live stream cannot be relied on to bring it: it may be idle)."""


class StreamReader:
    """One (source, dp_rank) stream: its SUB socket, its sequencer and its replays."""

    def __init__(
        self,
        config: StreamConfig,
        context: zmq.Context[zmq.Socket[bytes]],
        outlet: StreamOutlet,
        *,
        replay_slots: asyncio.Semaphore,
        replay_timeout: float = 5.0,
        restart_window: int = 1024,
        hold_limit: int = 10_000,
        quiet_seconds: float = QUIET_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.key = config.key
        self.labels = (config.source, str(config.dp_rank))
        self._context = context
        self._outlet = outlet
        self._clock = clock
        self._replay_slots = replay_slots
        self._replay_timeout = replay_timeout
        self._quiet_seconds = quiet_seconds
        self._quiet: asyncio.TimerHandle | None = None
        self._live_count = 0  # live messages so far, to tell a quiet stream from a busy one
        self._quiet_seen = 0  # the live count at the last quiet check that found the stream quiet
        self.sequencer = Sequencer(
            has_replay=config.replay is not None, restart_window=restart_window, hold_limit=hold_limit
        )
        self._sub: zmq.Socket[bytes] | None = None
        self.monitor: ConnectionMonitor | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._replays: dict[int, asyncio.Task[None]] = {}
        self._peers = 0
        self._handshake_failure: str | None = None  # why the last connection never became a peer
        self._readiness: Readiness | None = None  # the SUB socket's (see _begin_drain)
        # Set while the old connection's batches are read after a disconnect: connection events
        # queued after the disconnect wait until they are all read (see _begin_drain).
        self._drained: asyncio.Event | None = None

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, self.config.topic.encode())
        sub.setsockopt(zmq.IPV6, is_ipv6(self.config.endpoint))  # ZeroMQ refuses IPv6 addresses without it
        # Reconnect quickly after an engine restart, but back off against a dead address.
        sub.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        sub.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        monitor = ConnectionMonitor(self._context, sub, self.key, receiver)
        if self.config.bind:
            sub.bind(self.config.endpoint)
        else:
            sub.connect(self.config.endpoint)
        self._sub = sub
        self._readiness = Readiness(sub, asyncio.get_running_loop())
        self._spawn(self._read_loop(sub, self._readiness))
        self.monitor = monitor
        monitor.start(self._poll_monitor)

    async def stop(self) -> None:
        if self._quiet is not None:
            self._quiet.cancel()
        if self.monitor is not None:  # before the sockets close: its descriptor leaves the loop first
            self.monitor.stop()
        await cancel_and_wait(*self._tasks, *self._replays.values())
        if self._sub is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sub.disable_monitor()
            self._sub.close(linger=0)
        if self.monitor is not None:
            self.monitor.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("stream %s[%d]: reader task failed: %r", *self.key, task.exception())

    # --- live -------------------------------------------------------------------------------

    async def _read_loop(self, sub: zmq.Socket[bytes], readiness: Readiness) -> None:
        try:
            await self._read_live(sub, readiness)
        finally:
            readiness.close()  # before the socket closes: its descriptor leaves the loop first

    async def _read_live(self, sub: zmq.Socket[bytes], readiness: Readiness) -> None:
        clock = asyncio.get_running_loop().time
        receive = receiver(sub)
        on_live = self._on_live  # bound once, not at each message
        # The descriptor signals only once ZeroMQ found the socket empty: the first wait asks it.
        await readiness.wait()
        while True:
            # Connection changes first: a batch of a new connection must not be read before the
            # sequencer has heard of that connection (see _on_monitor_event).
            self._poll_monitor()
            deadline = clock() + TURN_SECONDS
            count = 0
            frames: list[bytes] | None = None
            try:
                for _ in range(BUDGET):
                    frames = receive()
                    if frames is None:
                        break
                    count += 1
                    on_live(frames)
                    if clock() >= deadline:
                        break
            finally:
                if count:  # counted once a burst: the same figures, one metric update instead of 64
                    self._outlet.received(count)
                    self._outlet.settle()
            # The old connection's last batch is read: found by a read, or by a look when the turn
            # ended on its budget right after it (no read would come to find the queue empty).
            if self._drained is not None and (frames is None or not has_message(sub)):
                self._end_drain()
            if frames is None:
                # The turn's last receive found the socket empty (and emptied its mailbox): wait for
                # the descriptor, with no ZMQ_EVENTS call before and after and no extra turn of
                # the loop. At a rate the gateway keeps up with, that was per batch: 5 us of 60.
                await readiness.signalled()
            else:
                # The turn ended on its budget or its time: yield although more is waiting, so
                # other streams and the web side get their turn.
                await asyncio.sleep(0)

    def _on_live(self, frames: list[bytes]) -> None:
        """One live message (its receipt is counted by the caller): split, decoded, sequenced and
        applied in this one call (a call for each step was three more Python frames a batch)."""
        if self._peers == 0 and self._drained is None:
            # A batch while no connection is known: the ZeroMQ thread finished a new connection's
            # handshake and queued its first batches after this burst's look at the monitor (a
            # loaded machine stalls the loop between the two). The handshake event is queued
            # before them: hear of the connection first, or a restarted engine's first batches
            # are taken for the old one's (a batch before ``up``, a restart before it).
            self._poll_monitor()
        clock = self._clock  # read, then called: a method call of an attribute is not specialised
        received = clock()
        self._live_count += 1
        outlet = self._outlet
        try:
            seq, payload = wire.split_message(frames)
        except wire.DecodeError as exc:
            outlet.decode_error(None, str(exc))
            return
        try:
            batch: wire.Batch | None = wire.decode_batch(payload)
        except wire.DecodeError as exc:
            # Counted and skipped; the seq still counts as received, so it is no gap.
            outlet.decode_error(seq, str(exc))
            batch = None
        sequencer = self.sequencer
        actions = sequencer.on_live(seq, batch, payload)
        outlet.apply(actions, received, sequencer.held)  # what _apply does, the common case in line
        if len(actions) != 1 or type(actions[0]) is not Deliver or self._quiet is None:
            self._act(actions)

    def _apply(self, actions: list[Action], received: float) -> None:
        """The outlet takes every action; the reader acts on those that are I/O (replays)."""
        self._outlet.apply(actions, received, self.sequencer.held)
        self._act(actions)

    def _act(self, actions: list[Action]) -> None:
        """What the reader does about the actions (the outlet has taken them): the replays they
        start or cancel, and the quiet timer. Nothing for a lone delivery while the timer is armed:
        the live and replay loops skip the call then."""
        for action in actions:
            if type(action) is RequestReplay:
                self._start_replay(action.token, action.start)
            elif type(action) is CancelReplay:
                task = self._replays.pop(action.token, None)
                if task is not None:
                    task.cancel()
        if self._quiet is None and (self.sequencer.waiting_for_live or self._live_count != self._quiet_seen):
            # One timer per quiet period, not per message: it re-arms itself while batches flow.
            self._quiet = asyncio.get_running_loop().call_later(
                self._quiet_seconds, self._quiet_check, self._live_count
            )

    def _quiet_check(self, live_count: int) -> None:
        """The live stream was quiet for ``quiet_seconds``: let the sequencer settle holes below
        waiting batches, or probe the engine for a burst's dropped tail (sequencer rule 10)."""
        self._quiet = None
        if self._live_count != live_count:  # still flowing: look again later
            self._quiet = asyncio.get_running_loop().call_later(
                self._quiet_seconds, self._quiet_check, self._live_count
            )
            return
        self._quiet_seen = live_count
        self._apply(self.sequencer.on_quiet(), self._clock())

    # --- replay -----------------------------------------------------------------------------

    def _start_replay(self, token: int, start: int) -> None:
        task = asyncio.ensure_future(self._replay(token, start))
        self._replays[token] = task

        def done(finished: asyncio.Task[None], token: int = token) -> None:
            if self._replays.get(token) is finished:
                del self._replays[token]
            if not finished.cancelled() and finished.exception() is not None:
                logger.error("stream %s[%d]: replay task failed: %r", *self.key, finished.exception())

        task.add_done_callback(done)

    async def _replay(self, token: int, start: int) -> None:
        assert self.config.replay is not None
        async with self._replay_slots:
            dealer = self._context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RCVHWM, 0)
            dealer.setsockopt(zmq.IPV6, is_ipv6(self.config.replay))
            readiness = Readiness(dealer, asyncio.get_running_loop())
            try:
                dealer.connect(self.config.replay)
                # A fresh DEALER per request: late replies to an abandoned request can never mix in.
                dealer.send_multipart([b"", wire.seq_bytes(start)])
                outcome = await self._read_replay(dealer, readiness, token)
            finally:
                readiness.close()
                dealer.close(linger=0)
                self._outlet.settle()
        if outcome is not None:
            self._apply(self.sequencer.on_replay_failed(token, outcome), self._clock())

    async def _read_replay(self, dealer: zmq.Socket[bytes], readiness: Readiness, token: int) -> str | None:
        """Feed replayed batches to the sequencer; None when the end marker came, else the failure.
        Per item, what the live loop does per message, in this loop's body: no call for the decode
        or the hand-over, and what it calls read once."""
        now = asyncio.get_running_loop().time
        receive = receiver(dealer)
        clock, sequencer, outlet = self._clock, self.sequencer, self._outlet
        hard_deadline = now() + self._replay_timeout * MAX_REPLAY_SECONDS_FACTOR
        first = True
        while True:
            idle = min(self._replay_timeout, hard_deadline - now())
            if idle <= 0 or not await readiness.wait(idle):
                logger.warning("stream %s[%d]: replay from token %d timed out", *self.key, token)
                return "timeout"
            deadline = now() + TURN_SECONDS
            for _ in range(BUDGET):
                if now() >= deadline:
                    break
                frames = receive()
                if frames is None:
                    break
                received = clock()
                parsed = wire.parse_replay_reply(frames)
                if parsed is None:
                    logger.warning("stream %s[%d]: malformed replay reply of %d frames", *self.key, len(frames))
                    outlet.decode_error(None, "malformed replay reply")
                    return "failed"
                seq, payload = parsed
                if seq == wire.END_SEQ:
                    self._apply(sequencer.on_replay_end(token), received)
                    return None
                if not (first and seq == sequencer.check_seq):
                    outlet.received()  # the anchor a reply begins with is no batch received anew
                first = False
                try:
                    batch: wire.Batch | None = wire.decode_batch(payload)
                except wire.DecodeError as exc:
                    outlet.decode_error(seq, str(exc))  # counted and skipped, as a live one
                    batch = None
                actions = sequencer.on_replay_item(token, seq, batch, payload)
                outlet.apply(actions, received, sequencer.held)  # _apply, the common case in line
                if len(actions) != 1 or type(actions[0]) is not Deliver or self._quiet is None:
                    self._act(actions)
                if sequencer.replay_token != token:
                    return None  # the sequencer gave this replay up (restart, overflow)
            await asyncio.sleep(0)

    # --- connection monitor -----------------------------------------------------------------

    def _poll_monitor(self) -> None:
        """Handle every connection event queued now (cheap when there is none), up to a disconnect
        whose batches are still being read (the events after it wait for them: _end_drain). The
        monitor re-arms itself when it finds none and the events it should carry changed."""
        monitor = self.monitor
        if monitor is None:
            return
        while self._drained is None:
            frames = monitor.next()
            if frames is None:
                return
            event = monitor_event(frames)
            if event is not None:
                self._on_monitor_event(event, frames)

    def _on_monitor_event(self, event: int, frames: list[bytes]) -> None:
        if event == CONNECT_RETRIED:  # first: an absent engine's monitor says nothing else
            if self._peers == 0:
                self._retried(monitor_value(frames))
        elif event == HANDSHAKE_SUCCEEDED:
            self._handshake_failure = None
            self._peers += 1
            if self._peers == 1:
                self._outlet.connection(True, "connected", "connected")
                # Catch up, or check that the engine behind the socket is the one we were reading.
                self._apply(self.sequencer.on_connected(), self._clock())
        elif event & HANDSHAKE_FAILED:
            # TCP works but the peer speaks no ZeroMQ (an HTTP port, most likely): ZeroMQ itself
            # only retries, every few hundred ms, and never says why.
            self._handshake_failure = not_zeromq_reason(self.config.endpoint)
            if self._peers == 0:
                self._outlet.connection(False, self._handshake_failure, NOT_ZEROMQ)
            self._want(MONITOR_EVENTS)  # the retries tell when the port refuses again
        elif event == DISCONNECTED:
            if self._handshake_failure is not None and self._peers == 0:
                return  # the failed handshake's connection closing: it never was a peer
            self._peers = max(0, self._peers - 1)
            if self._peers == 0:
                self._begin_drain()
        elif event == BIND_FAILED:
            self._outlet.connection(False, "bind failed", "bind_failed")

    def _retried(self, interval_ms: int) -> None:
        """ZeroMQ tries again (in ``interval_ms``): say why the stream is down. After a failed
        handshake, the retry that ZeroMQ schedules at once as the connection closes (a new
        attempt's first, after RECONNECT_IVL) is no refusal: keep saying what failed. A later
        retry (each waits twice the one before) is; it is told by its interval, not by its place
        after the failure, because a quiet monitor did not carry it while being re-armed."""
        failure = self._handshake_failure
        if failure is not None:
            if interval_ms < 2 * RECONNECT_IVL_MS:
                self._outlet.connection(False, failure, NOT_ZEROMQ)
                return
            self._handshake_failure = None
        self._refused()
        if interval_ms >= RECONNECT_IVL_MAX_MS:
            # Refused for 3 s, ZeroMQ's retries backed off to their longest: they say nothing new
            # until something else happens (not at the first refusal: 2,000 streams started
            # together would re-arm their monitors while the gateway starts, delaying it).
            self._want(QUIET_EVENTS)

    def _want(self, events: int) -> None:
        """Have the monitor carry ``events`` (a bound SUB's keeps all: no retries to quiet)."""
        if self.monitor is not None and not self.config.bind:
            self.monitor.want(events)

    def _begin_drain(self) -> None:
        """The publisher went away. What it delivered is queued before this event: it is read as
        the old connection's (the sequencer hears of the disconnect after it), so a restarted
        engine's batches are never mistaken for it. It is read in the live loop's turns, not at
        once: 60,000 queued batches kept the event loop (and /healthz) busy for ten seconds.
        Connection events after this one wait meanwhile (a new connection's batches queue behind
        the old ones on the same pipe)."""
        sub = self._sub
        if sub is None or not has_message(sub):
            self._disconnected()
            return
        self._drained = asyncio.Event()
        if self._readiness is not None:
            self._readiness.wake()  # has_message took the socket's wake-up: the read loop must look

    def _end_drain(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None:
            drained.set()
        self._disconnected()
        self._poll_monitor()  # what came after the disconnect (a new connection) before its batches

    def _disconnected(self) -> None:
        self.sequencer.on_disconnected()
        self._outlet.connection(False, "disconnected", "disconnected")
        if not self.config.bind:
            # ZeroMQ schedules the reconnection as the connection closes and says so at once (its
            # CONNECT_RETRIED), which a quiet monitor does not carry: its word, said here (when the
            # monitor carries it too, it changes nothing).
            self._refused()

    def _refused(self) -> None:
        """ZeroMQ's word on a connecting stream it retries: refused (or not answered yet)."""
        self._outlet.connection(False, "connection refused, retrying", "retrying")


def not_zeromq_reason(endpoint: str) -> str:
    """The down reason of a stream whose endpoint accepts TCP but fails ZeroMQ's handshake."""
    return f"{endpoint} answers but does not speak ZeroMQ: is it the engine's HTTP port?"
