"""A stream's connection monitor: the PAIR that libzmq's ``zmq_socket_monitor`` writes a SUB
socket's connection events into, read from the event loop's callback, and re-armed to carry fewer
events (or more again) without losing one.

An absent engine's monitor says ``CONNECT_RETRIED`` at every reconnection attempt: with 2,000
streams down, 1,000 wake-ups of the event loop a second, each saying what the stream's status
already says. Once the reader knows a down stream's reason, it asks for the monitor without the
retries (:data:`QUIET_EVENTS`), and for them again when the reason can change
(:data:`MONITOR_EVENTS`). What the events mean stays with the reader (kvgateway/ingest/reader.py);
this module only carries them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import zmq

from kvgateway.engine.sockets import FD
from kvgateway.engine.wire import Stream

logger = logging.getLogger("kvgateway.ingest")

Receiver = Callable[[zmq.Socket[bytes]], Callable[[], list[bytes] | None]]
"""How a socket's whole messages are received (the reader's choice: kvgateway.ingest.reader)."""

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
"""...and once a down stream's reason is known (refused for 3 s): every event but the retries,
which then say nothing new (with 2,000 absent engines, 1,000 a second, each a wake of the loop)."""


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
"""How often (a millisecond apart, by a timer) a monitor that libzmq stopped is made again, before
giving up."""


class ConnectionMonitor:
    """The monitor of one stream's SUB socket: :meth:`next` gives its events' messages in order,
    the reader's ``look`` is called when some may be there, :meth:`want` re-arms it."""

    def __init__(
        self, context: zmq.Context[zmq.Socket[bytes]], sub: zmq.Socket[bytes], key: Stream, receiver: Receiver
    ) -> None:
        self._context = context
        self._receiver = receiver
        self._sub = sub
        self._key = key
        self.events = MONITOR_EVENTS  # what the monitor carries now...
        self._rearm: int | None = None  # ...and what it should carry, when that changed (switch)
        self._backlog: list[list[bytes]] = []  # a replaced monitor's last events: read first
        self._serial = 0  # numbers each monitor's inproc address
        self._later: asyncio.TimerHandle | None = None  # a switch waiting for its turn (or a socket)
        self._arming: asyncio.TimerHandle | None = None  # a monitor libzmq stopped, made again soon
        self._turn_taken = False
        self._look: Callable[[], None] = lambda: None
        self.fd: int | None = None
        address = self._address()
        self._pair: zmq.Socket[bytes] | None = _connected_pair(context, address)
        try:
            sub.monitor(address, MONITOR_EVENTS)
        except zmq.ZMQError:
            self._pair.close(linger=0)
            self._pair = None
            raise
        self._receive: Callable[[], list[bytes] | None] = lambda: None

    def start(self, look: Callable[[], None]) -> None:
        """Call ``look`` from the event loop whenever events may have come (and once now)."""
        assert self._pair is not None
        self._look = look
        self._listen(self._pair)

    def stop(self) -> None:
        """No more looks: first of all when the stream stops (its descriptor leaves the loop
        before any socket closes); no re-arm after it."""
        for timer in (self._later, self._arming):
            if timer is not None:
                timer.cancel()
        self._later = self._arming = None
        if self.fd is not None:
            asyncio.get_running_loop().remove_reader(self.fd)
            self.fd = None

    def close(self) -> None:
        """After the SUB's monitor is disabled and the SUB closed: the PAIR closes (a look already
        scheduled finds nothing to read)."""
        self.stop()
        if self._pair is not None:
            self._pair.close(linger=0)
            self._pair = None

    def next(self) -> list[bytes] | None:
        """The next event's message (a replaced monitor's first), None when there is none now. A
        receive that finds nothing has processed the socket's commands, so the descriptor's
        mailbox is empty when it returns None (the loop's callback is level-triggered); a re-arm
        wanted is made then."""
        while True:
            if self._pair is None:
                return None
            if self._backlog:
                return self._backlog.pop(0)
            frames = self._receive()
            if frames is not None or self._rearm is None or not self._switch():
                return frames

    def want(self, events: int) -> None:
        """Have the monitor carry ``events`` (re-armed once the events queued now are read)."""
        self._rearm = None if events == self.events else events

    def _switch(self) -> bool:
        """Re-arm the monitor to carry the events wanted, losing none of those it sends: True when
        it did. ``zmq_socket_monitor`` stops the old monitor and starts the new one under the lock
        that every event is sent under, so each event goes to the old PAIR or to the new one; the
        new PAIR is connected before libzmq binds its end (an inproc connection waits for its
        bind), so libzmq's first send to it never waits for a reader (its sends block); and what
        the old PAIR holds is read into the backlog before it closes, to be read before anything
        of the new one. A switch to quiet is paced (QUIETING): each leaves two sockets for
        libzmq's reaper thread to free, and 2,000 streams going quiet at once would outrun it."""
        events, old = self._rearm, self._pair
        if events is None or old is None or self.fd is None:  # or stopping
            return False
        if events == QUIET_EVENTS and not self._quiet_turn():
            return False
        address = self._address()
        try:
            pair = _connected_pair(self._context, address)
        except zmq.ZMQError:  # no socket left now: the old monitor still carries everything
            if self._later is None:  # a quiet monitor may not wake again: look again soon
                self._later = asyncio.get_running_loop().call_later(0.01, self._due, False)
            return False
        if self._arming is not None:  # an earlier monitor still to be made: this one replaces it
            self._arming.cancel()
            self._arming = None
        try:
            self._sub.monitor(address, events)
            armed = True
        except zmq.ZMQError:
            armed = False  # libzmq stopped the old one, then found no socket for the new one
        self._replace(old, pair)
        if not armed:
            logger.warning("stream %s[%d]: its connection monitor was stopped with no socket left: re-made", *self._key)
            self._arm_later(address, events, ARM_AGAIN_TRIES)
        self.events = events
        self._rearm = None
        self._turn_taken = False
        return True

    def _quiet_turn(self) -> bool:
        """Whether this stream's turn to switch to quiet has come (they are paced across the
        process: QUIETING); if not, it is taken, and the switch made then."""
        if self._turn_taken:
            self._turn_taken = False
            return True
        if self._later is None:
            loop = asyncio.get_running_loop()
            self._later = loop.call_later(QUIETING.wait(loop.time()), self._due, True)
        return False

    def _due(self, turn: bool) -> None:
        self._later = None
        self._turn_taken = turn
        self._look()

    def _arm_later(self, address: str, events: int, tries: int) -> None:
        """Make the monitor at ``address`` again a millisecond from now, when libzmq's reaper thread
        may have freed a socket: libzmq stopped the old monitor, then had no socket for the new one
        (the sockets closed before wait for the reaper). A timer, not a sleep: the event loop (every
        other stream, the web side) runs meanwhile. The events between are lost; the budget's room
        for re-arms (kvgateway/runtime/fd_budget.py) and the pacing of switches make this all but
        unreachable, and it is logged."""
        self._arming = asyncio.get_running_loop().call_later(0.001, self._arm_again, address, events, tries)

    def _arm_again(self, address: str, events: int, tries: int) -> None:
        self._arming = None
        try:
            self._sub.monitor(address, events)
        except zmq.ZMQError:
            if tries > 1:
                self._arm_later(address, events, tries - 1)
            else:
                logger.error(
                    "stream %s[%d]: its connection monitor could not be re-made: its status stays as it is", *self._key
                )

    def _address(self) -> str:
        self._serial += 1
        return f"inproc://kvgateway.monitor.{id(self):x}.{self._serial}"

    def _replace(self, old: zmq.Socket[bytes], pair: zmq.Socket[bytes]) -> None:
        """Read what the old PAIR holds into the backlog, close it, and read the new one from now on."""
        while (frames := self._receive()) is not None:
            self._backlog.append(frames)
        if self.fd is not None:
            asyncio.get_running_loop().remove_reader(self.fd)
            self.fd = None
        old.close(linger=0)
        self._listen(pair)

    def _listen(self, pair: zmq.Socket[bytes]) -> None:
        self._pair = pair
        self._receive = self._receiver(pair)
        self.fd = int(pair.getsockopt(FD))
        loop = asyncio.get_running_loop()
        # Read straight from the loop's callback, not by a task waiting on it: an absent engine's
        # monitor woke at every reconnection attempt, and a task's future and step per wake were
        # half the gateway's idle CPU.
        loop.add_reader(self.fd, self._look)
        # Its descriptor signals only once ZeroMQ found it empty (and the backlog is read first):
        # until a first look, events already queued would wait for ever.
        loop.call_soon(self._look)


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
