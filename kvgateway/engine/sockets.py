"""ZeroMQ sockets from asyncio: waiting on one (its descriptor registered once for its life), and
receiving whole messages at less than pyzmq's ``recv_multipart`` costs.

A ZeroMQ socket's descriptor (``ZMQ_FD``) is its command mailbox: it becomes readable when the
socket's state may have changed, and ZeroMQ empties it whenever the socket processes its
commands (on ``ZMQ_EVENTS`` and on every receive). So it says nothing by itself: after a wake-up
the socket's own ``ZMQ_EVENTS`` tells whether a message is there.

The descriptor used to be added to the event loop and removed again around every wait: two
``epoll_ctl`` calls, a future and a handle per wake-up. With 2,000 streams of engines that are
down, every stream's monitor wakes at each reconnection attempt, and that churn was a good part
of the gateway's idle CPU. Here the descriptor stays registered; a wake-up with nobody waiting
costs one callback, and the task that owns the socket always asks ZeroMQ soon after, which empties
the mailbox (the descriptor is level-triggered in the loop: it cannot spin while unread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq

EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)
FD = int(zmq.FD)
# Plain ints: ``zmq.POLLIN`` is an enum.Flag, and ``int & Flag`` goes through enum's slow path.


def has_message(sock: zmq.Socket[bytes]) -> bool:
    """Whether a message is queued on ``sock`` now (processes its pending commands)."""
    return bool(int(sock.getsockopt(EVENTS)) & POLLIN)


class Readiness:
    """Waits until one ZeroMQ socket has a message; :meth:`close` before closing the socket."""

    __slots__ = ("_fd", "_loop", "_sock", "_waiter")

    def __init__(self, sock: zmq.Socket[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self._sock = sock
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None
        self._fd: int | None = int(sock.getsockopt(FD))
        loop.add_reader(self._fd, self.wake)

    def wake(self) -> None:
        """Let the waiting task look at the socket (also when a wake-up was taken by another
        caller of :func:`has_message`, which empties the descriptor's mailbox)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, within: float | None = None) -> bool:
        """Until a message is queued; False when ``within`` seconds pass first."""
        sock = self._sock
        if has_message(sock):
            return True
        loop = self._loop
        deadline = None if within is None else loop.time() + within
        while True:
            if deadline is None:
                await self.signalled()
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(self.signalled(), remaining)
                except TimeoutError:
                    return False
            if has_message(sock):
                return True

    async def signalled(self) -> None:
        """Until the descriptor signals, without asking ZeroMQ first: for a caller whose last
        receive found the socket empty. A receive that finds nothing has processed the socket's
        commands, as :func:`has_message` does, so the mailbox is empty and the descriptor stays
        quiet until something new comes; asking again would cost a ``ZMQ_EVENTS`` call before and
        after each wait. The caller receives after it: a wake-up may bring no message (a command
        that was not one), and its receive then finds none and waits again."""
        waiter = self._loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            self._fd = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.cancel()


def receiver(sock: zmq.Socket[bytes]) -> Callable[[], list[bytes] | None]:
    """A function that receives one whole message from ``sock`` without blocking, None when none
    is queued: the pure-Python receive (kvgateway.engine._receive_py, the reference). The ingest's
    reader takes its compiled twin where it was built (kvgateway.ingest.reader)."""
    from kvgateway.engine import _receive_py  # the receive's own module (engine/_receive_c.pyx mirrors it)

    return _receive_py.receiver(sock)


def monitor_value(frames: list[bytes]) -> int:
    """The 32-bit value of a monitor message whose event :func:`monitor_event` read (for
    ``CONNECT_RETRIED``: the milliseconds until the retry)."""
    return int.from_bytes(frames[0][2:6], "little")


def monitor_event(frames: list[bytes]) -> int | None:
    """The event number of a monitor message: its first frame is a 16-bit event and a 32-bit
    value, little-endian (``zmq_socket_monitor``); what else it carries (the address) is unused."""
    if len(frames) != 2 or len(frames[0]) != 6:
        return None
    return int.from_bytes(frames[0][:2], "little")
