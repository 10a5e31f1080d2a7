"""A hub without sockets, as the gateway wires it over an in-memory log, and what its tests do with it:
subscribe as a route does, publish what an outlet appends, drain a client's queue, read a metric."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import msgspec
from starlette.datastructures import QueryParams

from kvgateway.config import StreamConfig
from kvgateway.engine import wire
from kvgateway.log.ordered import MemoryLog
from kvgateway.log.records import NoticeRecord, batch_record
from kvgateway.log.ring import Ring
from kvgateway.log.status import StreamStatus
from kvgateway.protocol import messages
from kvgateway.protocol.messages import OutMessage
from kvgateway.runtime.metrics import Metrics
from kvgateway.serve.hub import Hub
from kvgateway.serve.query import ClientRequest, parse_query
from kvgateway.serve.sessions import Pump
from kvgateway.serve.subscription import Subscription

T = TypeVar("T")
STREAMS = [("a", 0), ("a", 1), ("b", 0)]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def snapshot(offset: int) -> dict[str, Any]:
    gpu = {"tier": "GPU", "blocks": offset, "tokens": 0, "capacity_blocks": None}
    tiers = {"GPU": {"mediums": ["GPU"], "blocks": offset, "tokens": 0, "capacity_blocks": None}}
    return {
        "offset": offset,
        "streams": [{"source": "a", "dp_rank": 0, "mediums": {"GPU": gpu}, "tiers": tiers}],
        "totals": {"GPU": gpu},
        "tiers": tiers,
    }


TRT_SEQ = 1_789_095_808_837_884_700

"""A TensorRT-LLM seq (its publisher starts at time_ns): far beyond 2^53."""


def statuses() -> list[dict[str, Any]]:
    """The real status of each stream (the schema lists every field of it)."""
    out = []
    for source, dp_rank in STREAMS:
        status = StreamStatus(StreamConfig(source, dp_rank, "tcp://127.0.0.1:5557", None, "", False, {}), True)
        status.last_seq = None if dp_rank == 1 else TRT_SEQ + dp_rank
        out.append(status.to_json(0.0, stale=dp_rank == 1, stale_reason="unrecovered"))
    return out


_METRICS: dict[Hub, Metrics] = {}
_SNAPSHOTS: dict[Hub, Callable[[int], dict[str, Any]]] = {}
_PUMPS: dict[Subscription, Pump] = {}


def make_hub(
    *,
    ring_messages: int = 10_000,
    ring_bytes: int = 64 * 2**20,
    snapshot: Callable[[int], dict[str, Any]] = snapshot,
    **kwargs: Any,
) -> Hub:
    """A hub following its own in-memory log, as the gateway wires them."""
    metrics = Metrics()
    hub_metrics = metrics.hub()
    log = MemoryLog(ring_messages, ring_bytes)
    hub_metrics.watch_ring(log.held)
    hub = Hub(log, metrics=hub_metrics, sources=STREAMS, **kwargs)
    log.follow(hub.follow)
    _METRICS[hub] = metrics
    _SNAPSHOTS[hub] = snapshot
    return hub


def ring(hub: Hub) -> Ring:
    assert isinstance(hub.log, MemoryLog)
    return hub.log.ring


def publish_batch(hub: Hub, source: str, dp_rank: int, seq: int, batch: wire.Batch) -> int:
    """What a stream's outlet appends for a delivered batch; its offset."""
    return hub.log.append(batch_record((source, dp_rank), seq, batch, received=batch.ts, replayed=False))


def publish_notice(hub: Hub, kind: str, source: str, dp_rank: int, **fields: Any) -> int:
    return hub.log.append(NoticeRecord((source, dp_rank), kind, fields))


def sample(hub: Hub, name: str, **labels: str) -> float:
    value = _METRICS[hub].registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def clients(hub: Hub) -> float:
    """The hub's clients, as kvgateway_clients counts them (every transport)."""
    return sample(hub, "kvgateway_clients", transport="ws") + sample(hub, "kvgateway_clients", transport="sse")


def subscribe(hub: Hub, query: str = "", transport: Any = "ws", last_event_id: str | None = None) -> Subscription:
    return subscribe_request(
        hub, parse_query(QueryParams(query), sources=hub.source_names, last_event_id=last_event_id), transport
    )


def subscribe_request(hub: Hub, request: ClientRequest, transport: Any) -> Subscription:
    """As the gateway subscribes a client: resume point, hello for it, subscription."""
    point = hub.resume_point(request, transport)
    hello = messages.encode_hello(
        epoch=hub.epoch,
        offset=point.offset,
        recovered=point.recovered,
        sources=statuses(),
        occupancy=None if point.recovered else _SNAPSHOTS[hub](point.offset),
    )
    return hub.subscribe(request, transport, hello, point)


async def next_chunk(sub: Subscription, **kwargs: Any) -> list[OutMessage] | None:
    """The web layer's wait for a chunk; the chunk counts as written at once (a client that reads)."""
    pump = _PUMPS.get(sub)
    if pump is None:
        pump = _PUMPS[sub] = Pump(sub)
    chunk = await pump.next_chunk(**kwargs)
    sub.written()
    return chunk


def stuck_writing(sub: Subscription) -> None:
    """As if its writer took a chunk and is stuck writing it to a client that does not read."""
    sub._in_flight = True


def drain(sub: Subscription) -> list[OutMessage]:
    """Every message queued now, through next_chunk (never blocks)."""

    async def collect() -> list[OutMessage]:
        out: list[OutMessage] = []
        while sub.queued_bytes:
            chunk = await next_chunk(sub)
            assert chunk is not None
            out.extend(chunk)
        return out

    return run(collect())


def decode(message: OutMessage) -> dict[str, Any]:
    value = msgspec.json.decode(message.data)
    assert isinstance(value, dict)
    return value


def offsets(items: list[OutMessage]) -> list[int]:
    return [decode(m)["offset"] for m in items if m.type != "hello"]
