"""The sources bucket on a real nats-server: an announcement that finds no stream answering on the
bucket's subject (two ingest processes starting together, the second's put before the server
answers) waits for it instead of failing the ingest's start."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError
from nats.js.kv import KeyValue

from kvgateway.cluster.sources import put_when_answered
from tests.support.nats import NatsServer


async def unanswered(js: JetStreamContext) -> KeyValue:
    """A sources bucket whose stream is gone: nothing answers on its subjects."""
    kv = await js.create_key_value(bucket="kvg_sources", history=1)
    await js.delete_stream("KV_kvg_sources")
    return kv


def test_a_put_waits_for_the_buckets_stream_to_answer(nats_server: NatsServer) -> None:
    async def scenario() -> bytes:
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            kv = await unanswered(js)
            with pytest.raises(NoStreamResponseError):
                await kv.put("alpha", b"x")

            async def recreate() -> None:
                await asyncio.sleep(0.5)
                await js.create_key_value(bucket="kvg_sources", history=1)

            back = asyncio.create_task(recreate())
            await put_when_answered(kv, "alpha", b'{"name":"alpha"}')
            await back
            return (await kv.get("alpha")).value or b""
        finally:
            await nc.close()

    assert asyncio.run(scenario()) == b'{"name":"alpha"}'


def test_a_put_that_is_never_answered_fails_in_the_end(nats_server: NatsServer) -> None:
    async def scenario() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            kv = await unanswered(nc.jetstream())
            await put_when_answered(kv, "alpha", b"x", within=0.3)
        finally:
            await nc.close()

    with pytest.raises(NoStreamResponseError):
        asyncio.run(scenario())
