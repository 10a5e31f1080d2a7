"""The sockets and file descriptors a gateway needs, and the limits raised to fit them at start.

Every stream holds three ZeroMQ sockets for its whole life: its SUB, the PAIR that libzmq's
monitor writes events into, and the PAIR this process reads them from. A monitor re-armed (a down
stream's, ingest/monitor.py) closes its two PAIRs for two new ones, and libzmq frees the old ones'
places a moment later: the budget keeps room for those (``REARM_SOCKETS``). Each ZeroMQ socket owns a
mailbox (one eventfd), and the SUB's TCP connection is one more descriptor while it is connected
or connecting: four descriptors a stream. A replay adds a DEALER (its mailbox and its connection)
for its duration, at most ``max_concurrent_replays`` at once. A web client is one descriptor.

ZeroMQ refuses a context's 1,024th socket by default (``ZMQ_MAX_SOCKETS`` 1023), which stopped a
gateway at 341 streams with "too many open files" although the OS would have allowed far more:
the context is now sized from this budget, and the OS soft limit on open files is raised toward
the hard limit so that the descriptors are there too.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

import zmq

from kvgateway.config.settings import Settings

logger = logging.getLogger("kvgateway")

SOCKETS_PER_STREAM = 3
"""The SUB, the monitor's PAIR inside libzmq, and the PAIR end read here."""

DESCRIPTORS_PER_STREAM = SOCKETS_PER_STREAM + 1
"""One mailbox eventfd per ZeroMQ socket, plus the SUB's TCP connection."""

DESCRIPTORS_PER_REPLAY = 2
"""A replay's DEALER: its mailbox and its TCP connection."""

BASE_SOCKETS = 16
"""Room for ZeroMQ sockets outside the streams (none today): a margin, not a need."""

REARM_SOCKETS = 64
"""Room for the PAIRs of monitors being re-armed, closed and not yet freed by libzmq's reaper
thread (the re-arms are paced, one a millisecond across the process: ingest/monitor.py)."""

BASE_DESCRIPTORS = 64
"""The interpreter, stdio, the HTTP listener, the event loop's own, ZeroMQ's I/O thread."""

ZMQ_DEFAULT_MAX_SOCKETS = 1023


@dataclass(frozen=True, slots=True)
class Budget:
    """What ``streams`` streams, ``replays`` concurrent replays and ``clients`` web clients need."""

    streams: int
    replays: int
    clients: int

    @property
    def sockets(self) -> int:
        """ZeroMQ sockets open at once, at most."""
        return BASE_SOCKETS + REARM_SOCKETS + SOCKETS_PER_STREAM * self.streams + self.replays

    @property
    def engine_descriptors(self) -> int:
        """Descriptors the engines' side needs: without them the gateway cannot start."""
        return BASE_DESCRIPTORS + DESCRIPTORS_PER_STREAM * self.streams + DESCRIPTORS_PER_REPLAY * self.replays

    @property
    def descriptors(self) -> int:
        """...and with every web client connected."""
        return self.engine_descriptors + self.clients

    @classmethod
    def of(cls, settings: Settings) -> Budget:
        return cls(len(settings.streams()), settings.max_concurrent_replays, settings.max_clients)


class BudgetError(Exception):
    """The OS's hard limit on open files is below what the configured streams need (one line)."""


def soft_limit_target(budget: Budget, soft: int, hard: int) -> int:
    """The soft limit to ask for: the hard one (a server's descriptors are its clients), unless
    that is unlimited, then what the budget needs; never below the current soft limit."""
    if hard == resource.RLIM_INFINITY:
        return max(soft, budget.descriptors) if soft != resource.RLIM_INFINITY else soft
    return max(soft, hard) if soft != resource.RLIM_INFINITY else soft


def raise_open_files(budget: Budget) -> int:
    """Raise the soft RLIMIT_NOFILE toward the hard limit; returns the limit now in force.

    Raises :class:`BudgetError` naming both numbers when even the hard limit cannot hold the
    streams' descriptors; warns when it cannot hold every web client too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = soft_limit_target(budget, soft, hard)
    if target != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # e.g. above fs.nr_open
            logger.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    limit = soft if soft != resource.RLIM_INFINITY else budget.descriptors
    if limit < budget.engine_descriptors:
        raise BudgetError(
            f"{budget.streams} streams need {budget.engine_descriptors} open files but the limit is {limit} "
            f"(hard limit {_show(hard)}): raise it (ulimit -n, systemd LimitNOFILE=) or configure fewer streams"
        )
    if limit < budget.descriptors:
        logger.warning(
            "the open-file limit %d leaves room for about %d web clients, not --max-clients %d",
            limit,
            limit - budget.engine_descriptors,
            budget.clients,
        )
    return limit


def _show(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)


def open_context(budget: Budget) -> zmq.Context[zmq.Socket[bytes]]:
    """A ZeroMQ context that admits the budget's sockets (never fewer than ZeroMQ's default)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ceiling = int(context.get(zmq.SOCKET_LIMIT))
    wanted = max(ZMQ_DEFAULT_MAX_SOCKETS, budget.sockets)
    if wanted > ceiling:
        context.destroy(linger=0)
        raise BudgetError(
            f"{budget.streams} streams need {wanted} ZeroMQ sockets but this libzmq allows {ceiling}: "
            "configure fewer streams per gateway"
        )
    context.set(zmq.MAX_SOCKETS, wanted)
    return context
