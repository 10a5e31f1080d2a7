"""The engines' configuration, shared through a JetStream KV bucket: each ingest process writes the
sources it reads; an edge started without ``--source`` lists them (its /v1/sources, its filters)."""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import msgspec
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NoKeysError, NoStreamResponseError, NotFoundError
from nats.js.kv import KeyValue

from kvgateway.cluster.records import subject_token
from kvgateway.config.cluster import NatsOptions
from kvgateway.config.settings import SourceConfig

logger = logging.getLogger("kvgateway.cluster")


PUT_WAIT_SECONDS: Final = 10.0
"""How long an announcement waits for the bucket's stream to answer: two ingest processes starting
together both find no bucket and both create it, and a put of the second can come before the
server answers on the bucket's subjects (no responders)."""


def bucket_name(options: NatsOptions) -> str:
    return f"{options.stream}_sources"


async def put_when_answered(kv: KeyValue, key: str, value: bytes, within: float = PUT_WAIT_SECONDS) -> None:
    """``kv.put``, again every 0.1 s while no stream answers on the bucket's subject, for ``within``
    seconds at most (then the error is raised)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    while True:
        try:
            await kv.put(key, value)
            return
        except (NoRespondersError, NoStreamResponseError):
            if loop.time() >= until:
                raise
            await asyncio.sleep(0.1)


async def publish_sources(js: JetStreamContext, options: NatsOptions, sources: tuple[SourceConfig, ...]) -> None:
    try:
        kv = await js.key_value(bucket_name(options))
    except BucketNotFoundError:
        kv = await js.create_key_value(bucket=bucket_name(options), history=1, replicas=options.replicas)
    for source in sources:
        await put_when_answered(kv, subject_token(source.name), msgspec.json.encode(source))


async def read_sources(js: JetStreamContext, options: NatsOptions) -> tuple[SourceConfig, ...]:
    """Every source an ingest process has announced (none when no bucket exists yet)."""
    try:
        kv = await js.key_value(bucket_name(options))
        keys = await kv.keys()
    except (BucketNotFoundError, NoKeysError, NotFoundError):
        return ()
    found = []
    for key in sorted(keys):
        entry = await kv.get(key)
        try:
            found.append(msgspec.json.decode(entry.value or b"", type=SourceConfig))
        except msgspec.DecodeError as exc:
            logger.warning("sources bucket: entry %s skipped: %s", key, exc)
    return tuple(found)
