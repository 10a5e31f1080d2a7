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
from kvgateway.engine.sequencer import Action, CancelReplay, RequestReplay, Sequencer
from kvgateway.engine.sockets import FD, Readiness, has_message, monitor_event
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

# The monitor's events as plain ints: ``zmq.EVENT_*`` are enum.Flag members, whose ``&`` and
# ``|`` go through enum's slow path (this runs at every reconnection attempt of every stream).
HANDSHAKE_SUCCEEDED = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)
DISCONNECTED = int(zmq.EVENT_DISCONNECTED)
CONNECT_RETRIED = int(zmq.EVENT_CONNECT_RETRIED)
BIND_FAILED = int(zmq.EVENT_BIND_FAILED)
HANDSHAKE_FAILED = (
    int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    | int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
    | int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
)

MONITOR_EVENTS = HANDSHAKE_SUCCEEDED | DISCONNECTED | CONNECT_RETRIED | BIND_FAILED | HANDSHAKE_FAILED
"""What a stream's monitor carries while the stream's reason may change with the next retry."""

QUIET_EVENTS = MONITOR_EVENTS & ~CONNECT_RETRIED
"""...and once a down stream's reason is known (refused, the retries backed off to their longest):
every event but the retries, which then say nothing new (with 2,000 absent engines, 1,000 a
second, each a wake of the event loop). See StreamReader._switch_monitor."""

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
        self._monitor: zmq.Socket[bytes] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._replays: dict[int, asyncio.Task[None]] = {}
        self._peers = 0
        self._handshake_failure: str | None = None  # why the last connection never became a peer
        self._readiness: Readiness | None = None  # the SUB socket's (see _begin_drain)
        self._monitor_fd: int | None = None
        self._monitor_receive: Callable[[], list[bytes] | None] = lambda: None
        # Set while the old connection's batches are read after a disconnect: connection events
        # queued after the disconnect wait until they are all read (see _begin_drain).
        self._drained: asyncio.Event | None = None
        self._monitor_events = MONITOR_EVENTS  # what the monitor carries now...
        self._rearm: int | None = None  # ...and what it should carry, when that changed (_switch_monitor)
        self._monitor_backlog: list[list[bytes]] = []  # a replaced monitor's last events: read first
        self._monitor_serial = 0  # numbers each monitor's inproc address
        self._rearm_later: asyncio.TimerHandle | None = None  # a switch waiting for its turn (or a socket)
        self._turn_taken = False

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
        address = self._monitor_address()
        self._monitor = _connected_pair(self._context, address)
        try:
            sub.monitor(address, MONITOR_EVENTS)
        except zmq.ZMQError:
            self._monitor.close(linger=0)
            self._monitor = None
            raise
        if self.config.bind:
            sub.bind(self.config.endpoint)
        else:
            sub.connect(self.config.endpoint)
        self._sub = sub
        loop = asyncio.get_running_loop()
        self._readiness = Readiness(sub, loop)
        self._spawn(self._read_loop(sub, self._readiness))
        # The monitor is read straight from the loop's callback, not by a task waiting on it: an
        # absent engine's monitor wakes at every reconnection attempt (1,000 a second with 2,000
        # streams), and a task's future and step per wake were half the gateway's idle CPU.
        self._monitor_receive = receiver(self._monitor)
        self._monitor_fd = int(self._monitor.getsockopt(FD))
        loop.add_reader(self._monitor_fd, self._poll_monitor)
        # The descriptor signals only once ZeroMQ found the socket empty: until a first look, events
        # already queued would wait for ever.
        loop.call_soon(self._poll_monitor)

    async def stop(self) -> None:
        if self._quiet is not None:
            self._quiet.cancel()
        if self._rearm_later is not None:
            self._rearm_later.cancel()
        if self._monitor_fd is not None:  # before the socket closes: its descriptor leaves the loop first
            asyncio.get_running_loop().remove_reader(self._monitor_fd)
            self._monitor_fd = None
        await cancel_and_wait(*self._tasks, *self._replays.values())
        if self._sub is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sub.disable_monitor()
            self._sub.close(linger=0)
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None  # a look already scheduled (start's) finds nothing to read

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
                    self._on_live(frames)
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
        """One live message (its receipt is counted by the caller)."""
        if self._peers == 0 and self._drained is None:
            # A batch while no connection is known: the ZeroMQ thread finished a new connection's
            # handshake and queued its first batches after this burst's look at the monitor (a
            # loaded machine stalls the loop between the two). The handshake event is queued
            # before them: hear of the connection first, or a restarted engine's first batches
            # are taken for the old one's (a batch before ``up``, a restart before it).
            self._poll_monitor()
        received = self._clock()
        self._live_count += 1
        try:
            seq, payload = wire.split_message(frames)
        except wire.DecodeError as exc:
            self._outlet.decode_error(None, str(exc))
            return
        batch = self._decode(seq, payload)
        self._apply(self.sequencer.on_live(seq, batch, payload), received)

    def _decode(self, seq: int, payload: bytes) -> wire.Batch | None:
        try:
            return wire.decode_batch(payload)
        except wire.DecodeError as exc:
            # Counted and skipped; the seq still counts as received, so it is no gap.
            self._outlet.decode_error(seq, str(exc))
            return None

    def _apply(self, actions: list[Action], received: float) -> None:
        """The outlet takes every action; the reader acts on those that are I/O (replays)."""
        self._outlet.apply(actions, received, self.sequencer.held)
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
        """Feed replayed batches to the sequencer; None when the end marker came, else the failure."""
        loop = asyncio.get_running_loop()
        receive = receiver(dealer)
        hard_deadline = loop.time() + self._replay_timeout * MAX_REPLAY_SECONDS_FACTOR
        first = True
        while True:
            idle = min(self._replay_timeout, hard_deadline - loop.time())
            if idle <= 0 or not await readiness.wait(idle):
                logger.warning("stream %s[%d]: replay from token %d timed out", *self.key, token)
                return "timeout"
            deadline = loop.time() + TURN_SECONDS
            for _ in range(BUDGET):
                if loop.time() >= deadline:
                    break
                frames = receive()
                if frames is None:
                    break
                received = self._clock()
                parsed = wire.parse_replay_reply(frames)
                if parsed is None:
                    logger.warning("stream %s[%d]: malformed replay reply of %d frames", *self.key, len(frames))
                    self._outlet.decode_error(None, "malformed replay reply")
                    return "failed"
                seq, payload = parsed
                if seq == wire.END_SEQ:
                    self._apply(self.sequencer.on_replay_end(token), received)
                    return None
                if not (first and seq == self.sequencer.check_seq):
                    self._outlet.received()  # the anchor a reply begins with is no batch received anew
                first = False
                batch = self._decode(seq, payload)
                self._apply(self.sequencer.on_replay_item(token, seq, batch, payload), received)
                if self.sequencer.replay_token != token:
                    return None  # the sequencer gave this replay up (restart, overflow)
            await asyncio.sleep(0)

    # --- connection monitor -----------------------------------------------------------------

    def _poll_monitor(self) -> None:
        """Handle every connection event queued now (cheap when there is none), up to a disconnect
        whose batches are still being read (the events after it wait for them: _end_drain); then
        re-arm the monitor when the events it should carry changed."""
        monitor = self._monitor
        if monitor is None:
            return
        receive = self._monitor_receive
        backlog = self._monitor_backlog
        # Received until there is none: a receive that finds nothing has processed the socket's
        # commands, as has_message does, so the descriptor's mailbox is empty when this returns
        # (the loop's callback is level-triggered). The compiled receive's None costs 0.7 us
        # against has_message's 1.7, twice per event.
        while self._drained is None:
            frames = backlog.pop(0) if backlog else receive()
            if frames is None:
                if self._rearm is None or not self._switch_monitor():
                    return
                receive = self._monitor_receive  # the new monitor's, after what the old one held
                continue
            event = monitor_event(frames)
            if event is not None:
                self._on_monitor_event(event, frames)

    def _on_monitor_event(self, event: int, frames: list[bytes]) -> None:
        if event == CONNECT_RETRIED:  # first: an absent engine's monitor says nothing else
            if self._peers == 0:
                self._retried(int.from_bytes(frames[0][2:6], "little"))
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
        self._outlet.connection(False, "connection refused, retrying", "retrying")
        if interval_ms >= RECONNECT_IVL_MAX_MS:
            # Refused for 3 s, ZeroMQ's retries backed off to their longest: they say nothing new
            # until something else happens (not at the first refusal: 2,000 streams started
            # together would re-arm their monitors while the gateway starts, delaying it).
            self._want(QUIET_EVENTS)

    def _want(self, events: int) -> None:
        """Have the monitor carry ``events`` (re-armed when the events queued now are handled)."""
        self._rearm = None if events == self._monitor_events or self.config.bind else events

    def _switch_monitor(self) -> bool:
        """Re-arm the monitor to carry the events wanted (``_rearm``), losing none of those it
        sends: True when it did. ``zmq_socket_monitor`` stops the old monitor and starts the new
        one under the lock that every event is sent under, so each event goes to the old PAIR or
        to the new one; the new PAIR is connected before libzmq binds its end (an inproc
        connection waits for its bind), so libzmq's first send to it never waits for a reader (its
        sends block); and what the old PAIR holds is read into the backlog before it closes, to be
        handled before anything of the new one. A switch to quiet is paced (QUIETING): each
        leaves two sockets for libzmq's reaper thread to free, and 2,000 streams going quiet at
        once would outrun it."""
        events, sub, old = self._rearm, self._sub, self._monitor
        if events is None or sub is None or old is None or self._monitor_fd is None:  # or stopping
            return False
        if events == QUIET_EVENTS and not self._quiet_turn():
            return False
        address = self._monitor_address()
        try:
            pair = _connected_pair(self._context, address)
        except zmq.ZMQError:  # no socket left now: the old monitor still carries everything
            if self._rearm_later is None:  # a quiet monitor may not wake again: look again soon
                self._rearm_later = asyncio.get_running_loop().call_later(0.01, self._rearm_due, False)
            return False
        try:
            sub.monitor(address, events)
            armed = True
        except zmq.ZMQError:
            armed = False  # libzmq stopped the old one, then found no socket for the new one
        self._replace_pair(old, pair)
        if not armed:
            _arm_again(sub, address, events, self.key)
        self._monitor_events = events
        self._rearm = None
        self._turn_taken = False
        return True

    def _quiet_turn(self) -> bool:
        """Whether this stream's turn to switch to quiet has come (they are paced across the
        process: QUIETING); if not, it is taken, and the switch made then."""
        if self._turn_taken:
            self._turn_taken = False
            return True
        if self._rearm_later is None:
            loop = asyncio.get_running_loop()
            self._rearm_later = loop.call_later(QUIETING.wait(loop.time()), self._rearm_due, True)
        return False

    def _rearm_due(self, turn: bool) -> None:
        self._rearm_later = None
        self._turn_taken = turn
        self._poll_monitor()

    def _monitor_address(self) -> str:
        self._monitor_serial += 1
        return f"inproc://kvgateway.monitor.{id(self):x}.{self._monitor_serial}"

    def _replace_pair(self, old: zmq.Socket[bytes], pair: zmq.Socket[bytes]) -> None:
        """Read what the old PAIR holds into the backlog, close it, and read the new one from now on."""
        receive = self._monitor_receive
        while (frames := receive()) is not None:
            self._monitor_backlog.append(frames)
        loop = asyncio.get_running_loop()
        if self._monitor_fd is not None:
            loop.remove_reader(self._monitor_fd)
        old.close(linger=0)
        self._monitor = pair
        self._monitor_receive = receiver(pair)
        self._monitor_fd = int(pair.getsockopt(FD))
        loop.add_reader(self._monitor_fd, self._poll_monitor)
        # Its descriptor signals only once ZeroMQ found it empty, and the backlog none: a first look.
        loop.call_soon(self._poll_monitor)

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
            self._outlet.connection(False, "connection refused, retrying", "retrying")


class Pacer:
    """Turns, one every ``interval`` seconds: :meth:`wait` says how long until the caller's."""

    __slots__ = ("_interval", "_next")

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._next = 0.0

    def wait(self, now: float) -> float:
        turn = max(now, self._next)
        self._next = turn + self._interval
        return turn - now


QUIETING = Pacer(0.001)
"""The monitors switched to quiet, across the process, one a millisecond: 2,000 streams started
together go quiet within 2 s, and few switches at a time wait for libzmq's reaper thread (each
leaves it two sockets to free)."""

ARM_AGAIN_TRIES = 200
"""How often (a millisecond apart) a monitor that libzmq stopped is made again, before giving up."""


def _connected_pair(context: zmq.Context[zmq.Socket[bytes]], address: str) -> zmq.Socket[bytes]:
    """A PAIR connected to ``address``, where a monitor will bind (ZMQError: no socket left)."""
    pair = context.socket(zmq.PAIR)
    try:
        pair.setsockopt(zmq.LINGER, 0)
        pair.connect(address)
    except zmq.ZMQError:
        pair.close(linger=0)
        raise
    return pair


def _arm_again(sub: zmq.Socket[bytes], address: str, events: int, key: wire.Stream) -> None:
    """libzmq stopped ``sub``'s old monitor, then had no socket for the new one (the sockets closed
    before wait for its reaper thread): make it again as soon as one is free. The events meanwhile
    are lost; a fuller budget of sockets (kvgateway/ingest/streams.py) and the pacing of switches
    make this all but unreachable, and it is logged."""
    logger.warning("stream %s[%d]: its connection monitor was stopped with no socket left: re-made", *key)
    for _ in range(ARM_AGAIN_TRIES):
        time.sleep(0.001)  # the reaper's turn
        with contextlib.suppress(zmq.ZMQError):
            sub.monitor(address, events)
            return
    logger.error("stream %s[%d]: its connection monitor could not be re-made: its status stays as it is", *key)


def not_zeromq_reason(endpoint: str) -> str:
    """The down reason of a stream whose endpoint accepts TCP but fails ZeroMQ's handshake."""
    return f"{endpoint} answers but does not speak ZeroMQ: is it the engine's HTTP port?"
