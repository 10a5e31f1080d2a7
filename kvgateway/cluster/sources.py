"""The engines' configuration, shared through a JetStream KV bucket: each ingest process writes the
sources it reads; an edge started without ``--source`` lists them (its /v1/sources, its filters)."""

from __future__ import annotations

import logging

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NoKeysError, NotFoundError

from kvgateway.cluster.records import subject_token
from kvgateway.config.cluster import NatsOptions
from kvgateway.config.settings import SourceConfig

logger = logging.getLogger("kvgateway.cluster")


def bucket_name(options: NatsOptions) -> str:
    return f"{options.stream}_sources"


async def publish_sources(js: JetStreamContext, options: NatsOptions, sources: tuple[SourceConfig, ...]) -> None:
    try:
        kv = await js.key_value(bucket_name(options))
    except BucketNotFoundError:
        kv = await js.create_key_value(bucket=bucket_name(options), history=1, replicas=options.replicas)
    for source in sources:
        await kv.put(subject_token(source.name), msgspec.json.encode(source))


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
