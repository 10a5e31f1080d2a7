"""Index checkpoints in JetStream: the bytes in an object store, the pointer to the latest and the
writer's lease in a key-value bucket (both named after the stream, ``<stream>_checkpoints``).

One edge at a time writes (the lease: a key updated with compare-and-set on its revision, renewed
on every write, taken over when its holder let it lapse); every edge reads the latest at start.
A checkpoint names the stream's epoch and the offset it reflects: an edge uses it only for the
same stream (a recreated stream has a new epoch) and only while the stream still holds every
record after that offset.

The lease is a :class:`~kvgateway.cluster.leases.Leases` key, as the ingest processes' shard leases are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Final

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    NotFoundError,
    ObjectNotFoundError,
)
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from kvgateway.cluster.leases import Leases
from kvgateway.config.cluster import NatsOptions

logger = logging.getLogger("kvgateway.cluster.edge")

LATEST = "latest"
WRITER = "writer"

READ_ATTEMPTS: Final = 5
POINTER_POLL_SECONDS: Final = 1.0
READ_SECONDS: Final = 60.0
"""An object's read waits for its last chunk with no bound of its own (nats-py's ``ObjectStore.get``):
if the writer replaces the checkpoint and drops the old one's chunks while a slow reader is still
reading them, the last chunk never comes. So a read is abandoned once the pointer names another
object (the new checkpoint is read instead, at most :data:`READ_ATTEMPTS` times), or after
:data:`READ_SECONDS` (the edge then starts without a checkpoint, as when there is none)."""


class Pointer(msgspec.Struct, frozen=True):
    epoch: str
    offset: int
    object: str
    size: int
    at: float


@dataclass(frozen=True, slots=True)
class Found:
    pointer: Pointer
    data: bytes


def bucket_name(options: NatsOptions) -> str:
    return f"{options.stream}_checkpoints"


class CheckpointStore:
    """The checkpoints of one stream (use from the event loop's thread)."""

    def __init__(self, js: JetStreamContext, options: NatsOptions, owner: str, lease_seconds: float) -> None:
        self._js = js
        self._bucket = bucket_name(options)
        self._replicas = options.replicas
        self.owner = owner
        self.lease_seconds = lease_seconds
        self._kv: KeyValue | None = None
        self._objects: ObjectStore | None = None
        self._leases: Leases | None = None

    async def open(self) -> None:
        """The bucket and the object store, created by the first edge that needs them."""
        try:
            self._kv = await self._js.key_value(self._bucket)
        except BucketNotFoundError:
            self._kv = await self._js.create_key_value(bucket=self._bucket, history=1, replicas=self._replicas)
        self._leases = Leases(self._kv, self.owner, self.lease_seconds)
        try:
            self._objects = await self._js.object_store(self._bucket)
        except (BucketNotFoundError, NotFoundError):
            self._objects = await self._js.create_object_store(self._bucket)

    async def latest(self) -> Found | None:
        """The latest checkpoint written, or None (none yet, or none could be read: see
        :data:`READ_SECONDS`)."""
        for _ in range(READ_ATTEMPTS):
            pointer = await self._pointer()
            if pointer is None:
                return None
            try:
                data = await self._read_unless_replaced(pointer)
            except (NotFoundError, ObjectNotFoundError):
                continue  # dropped after the pointer was read: the pointer names its successor now
            except TimeoutError:
                logger.warning("checkpoint %s not read within %.0f s: starting without", pointer.object, READ_SECONDS)
                return None
            if data is not None and len(data) == pointer.size:
                return Found(pointer, data)
        return None

    async def _pointer(self) -> Pointer | None:
        assert self._kv is not None
        try:
            entry = await self._kv.get(LATEST)
            return msgspec.json.decode(entry.value or b"", type=Pointer)
        except KeyNotFoundError:
            return None
        except msgspec.DecodeError as exc:
            logger.warning("checkpoint pointer unreadable, starting without: %s", exc)
            return None

    async def _read_unless_replaced(self, pointer: Pointer) -> bytes | None:
        """The object's bytes; None once the pointer names another object before they all came."""
        assert self._objects is not None
        reading = asyncio.ensure_future(self._objects.get(pointer.object))
        try:
            async with asyncio.timeout(READ_SECONDS):
                while True:
                    done, _ = await asyncio.wait({reading}, timeout=POINTER_POLL_SECONDS)
                    if done:
                        return reading.result().data or b""
                    now = await self._pointer()
                    if now is None or now.object != pointer.object:
                        return None
        finally:
            reading.cancel()

    async def hold_lease(self, now: float | None = None) -> bool:
        """Take or renew the writer's lease; False while another edge holds it."""
        assert self._leases is not None
        return await self._leases.hold(WRITER, now)

    async def write(self, epoch: str, offset: int, data: bytes) -> Pointer:
        """Store ``data`` as the checkpoint at ``offset``, point to it, drop the one it replaces."""
        assert self._kv is not None and self._objects is not None
        name = f"{epoch}-{offset}"
        await self._objects.put(name, data)
        previous = None
        with contextlib.suppress(KeyNotFoundError, msgspec.DecodeError):
            previous = msgspec.json.decode((await self._kv.get(LATEST)).value or b"", type=Pointer)
        pointer = Pointer(epoch, offset, name, len(data), time.time())
        await self._kv.put(LATEST, msgspec.json.encode(pointer))
        if previous is not None and previous.object != name:
            with contextlib.suppress(NotFoundError, ObjectNotFoundError):
                await self._objects.delete(previous.object)
        return pointer
