"""Ingest processes share the engine streams of one source list through leases
(:class:`~kvgateway.cluster.leases.Leases`, the bucket ``<stream>_leases``): each stream is read by
the one process that holds its lease, and each process holds about its fair share, so scaling the
ingest deployment up or down just moves streams.

Every :data:`ROUND_SECONDS` a process renews its presence (``member.<owner>``) and its streams'
leases (``stream.<source>.<rank>``), gives back what it holds beyond its fair share (the streams
divided by the live members, rounded up), and takes free or run-out streams up to it. A process
that dies stops renewing: its streams are free after :data:`LEASE_SECONDS` and taken at the next
round of another process, so a stream is unread for at most LEASE_SECONDS + ROUND_SECONDS. A
process started again under the same member id (``serve --workers`` restarting its ingest) holds
its leases already: it reclaims them at its first round, without waiting for them to run out.
The decision (:func:`plan`) is sans-I/O; :class:`Shards` does the bucket's I/O around it.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from kvgateway.cluster.leases import Leases
from kvgateway.cluster.records import subject_token
from kvgateway.config.settings import StreamConfig
from kvgateway.engine.wire import Stream

logger = logging.getLogger("kvgateway.cluster")

LEASE_SECONDS: Final = 10.0
"""A stream's lease, and a member's presence, run out this long after their last renewal."""

ROUND_SECONDS: Final = 2.5
"""How often a process renews what it holds and takes or gives back streams."""

MEMBER: Final = "member."
STREAM: Final = "stream."


def stream_key(stream: Stream) -> str:
    return f"{STREAM}{subject_token(stream[0])}.{stream[1]}"


def member_key(owner: str) -> str:
    return MEMBER + re.sub(r"[^A-Za-z0-9_-]", "_", owner)


@dataclass(frozen=True, slots=True)
class Plan:
    fair: int  # streams this process should hold
    keep: list[str]  # stream keys it holds and renews
    give_back: list[str]  # stream keys it holds beyond its share
    take: list[str]  # free stream keys to try, in order, until it holds its share


def plan(streams: Iterable[str], holders: Mapping[str, str], me: str) -> Plan:
    """What ``me`` does this round, given every running lease (key -> owner): keep what it holds up
    to its fair share, give back the rest (the last ones in key order), try free streams up to it."""
    wanted = sorted(streams)
    members = {owner for key, owner in holders.items() if key.startswith(MEMBER)} | {me}
    fair = math.ceil(len(wanted) / len(members)) if wanted else 0
    mine = [key for key in wanted if holders.get(key) == me]
    free = [key for key in wanted if key not in holders]
    keep, give_back = mine[:fair], mine[fair:]
    return Plan(fair, keep, give_back, free[: max(0, fair - len(keep))])


class Shards:
    """One ingest process's share of the streams, kept by rounds (call :meth:`round` regularly)."""

    def __init__(
        self,
        leases: Leases,
        streams: Iterable[StreamConfig],
        take: Callable[[StreamConfig], Awaitable[None]],
        drop: Callable[[Stream], Awaitable[None]],
    ) -> None:
        self._leases = leases
        self._by_key = {stream_key(s.key): s for s in streams}
        self._take = take
        self._drop = drop
        self.held: set[str] = set()

    async def round(self) -> None:
        leases = self._leases
        await leases.hold(member_key(leases.owner))
        holders = await leases.holders()
        step = plan(self._by_key, holders, leases.owner)
        for key in list(self.held):
            if key not in step.keep or not await leases.hold(key):
                await self._let_go(key, "given back" if key in step.give_back else "lost its lease")
        for key in step.give_back:
            await leases.release(key)
        for key in step.keep:
            if key not in self.held and await leases.hold(key):
                # Held by this member before this process started (its restart by ``serve
                # --workers``, which gives it the same member id): reclaimed at once.
                await self._took(key, "reclaimed")
        for key in step.take:
            if len(self.held) >= step.fair:
                break
            if await leases.hold(key):
                await self._took(key, "taken")

    async def _took(self, key: str, how: str) -> None:
        self.held.add(key)
        stream = self._by_key[key]
        logger.info("stream %s[%d]: %s (lease %s)", *stream.key, how, key)
        await self._take(stream)

    async def _let_go(self, key: str, why: str) -> None:
        self.held.discard(key)
        stream = self._by_key[key]
        logger.info("stream %s[%d]: no longer read here (%s)", *stream.key, why)
        await self._drop(stream.key)

    async def release_all(self) -> None:
        """At a clean stop: another process may take the streams at once."""
        for key in list(self.held):
            await self._leases.release(key)
        self.held.clear()
