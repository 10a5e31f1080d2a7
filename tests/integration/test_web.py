"""The web side end to end (issue 4): fan-out with filters, resume, slow clients, auth and limits.

Everything is real: ``kvgateway serve`` subprocesses on free loopback ports fed by ``kvgateway
simulate`` subprocesses, WebSocket clients from the ``websockets`` library, SSE clients over httpx
(or a raw socket), and the Node.js example client ``js/kvgateway-client.mjs`` run by ``node``.
Every message any client receives here is validated against the JSON Schema (at the end of each
test, so validation never slows a client down while it matters).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import signal
import socket
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, TypeAlias, TypeVar
from urllib.parse import parse_qsl

import httpx
import pytest
from jsonschema import Draft202012Validator, validators
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support import (
    REPO,
    GatewayProcess,
    Proc,
    Procs,
    arun,
    free_ports,
    metric_values,
    sim_flags,
    source_spec,
    start_gateway,
    start_sim,
    until,
    wait_until,
)
from tests.support import Start as Starter
from tests.support.node import node_command

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")

NODE_SCRIPT = Path(__file__).parent / "js" / "kvgateway-client.mjs"
SCHEMA_FILE = REPO / "kvgateway" / "protocol" / "schema.json"
PROTOCOL_DOC = REPO / "docs" / "protocol.md"

TOKEN = "tk-5Qx9-web-tests-7Rv2"
ALLOWED_ORIGIN = "http://dashboard.example"
UNKNOWN_EPOCH = "ffffffffffffffff"
U53 = 2**53


# --- the schema: every message received in this module is checked against it ----------------

_INTEGER = {"type": "integer"}
_items = Draft202012Validator.VALIDATORS["items"]


def _items_fast(validator: Any, items: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """``items`` with a fast path for arrays of integers (token_ids); the same verdicts."""
    if items == _INTEGER and validator.is_type(instance, "array"):
        for index, item in enumerate(instance):
            if not validator.is_type(item, "integer"):
                yield from validator.descend(item, items, path=index)
        return
    yield from _items(validator, items, instance, schema)


_Validator = validators.extend(Draft202012Validator, {"items": _items_fast})


class SchemaCheck:
    """Validates each distinct message once. A batch is checked as its envelope (with no events)
    against the whole schema plus each distinct event against ``$defs/event``: the schema puts
    no constraint across array items, so this is the same verdict as the whole message, with
    the events shared by many messages and clients checked once."""

    def __init__(self, schema: dict[str, Any]) -> None:
        Draft202012Validator.check_schema(schema)
        self.message = _Validator(schema)
        self.event = _Validator({k: v for k, v in schema.items() if k != "oneOf"} | {"$ref": "#/$defs/event"})
        self.seen_keys: set[int] = set()
        self.seen_events: set[str] = set()
        self.pending: list[str] = []

    def collect(self, line: str) -> None:
        key = hash(line)  # the same message reaches many clients: keep one copy to check
        if key not in self.seen_keys:
            self.seen_keys.add(key)
            self.pending.append(line)

    def flush(self) -> int:
        """Validate what was collected since the last flush; raises on the first invalid one."""
        checked = 0
        lines, self.pending = self.pending, []
        for line in lines:
            message = json.loads(line)
            if message.get("type") == "batch" and isinstance(message.get("events"), list):
                self._raise_first(self.message, {**message, "events": []}, line)
                for event in message["events"]:
                    key = json.dumps(event, sort_keys=True)
                    if key not in self.seen_events:
                        self.seen_events.add(key)
                        self._raise_first(self.event, event, key)
            else:
                self._raise_first(self.message, message, line)
            checked += 1
        return checked

    @staticmethod
    def _raise_first(validator: Any, instance: Any, text: str) -> None:
        error = next(iter(validator.iter_errors(instance)), None)
        if error is not None:
            raise AssertionError(f"message does not follow the schema: {error.message[:500]}\n{text[:2000]}")


@cache
def schema_check() -> SchemaCheck:
    return SchemaCheck(json.loads(SCHEMA_FILE.read_bytes()))


@pytest.fixture(autouse=True)
def _every_message_follows_the_schema() -> Iterator[None]:
    check = schema_check()
    check.pending.clear()
    yield
    check.flush()


def test_the_schema_check_rejects_what_the_schema_forbids() -> None:
    """The check every test relies on is not vacuous (and its shortcuts keep the verdicts)."""
    event = {
        "type": "BlockStored",
        "block_hashes": ["15760518052499183552"],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "tier": "GPU",
        "lora_name": None,
        "group_idx": 0,
    }
    batch = {
        "type": "batch",
        "id": "00000000000000ab:7",
        "offset": 7,
        "source": "s",
        "dp_rank": 0,
        "seq": "3",
        "ts": 1.5,
    }
    bad_events = [
        {**event, "block_hashes": [15760518052499183552]},  # a hash as a number
        {**event, "token_ids": [1, "2"]},
        {**event, "token_ids": [1, True]},
        {k: v for k, v in event.items() if k != "medium"},
        {"type": "BlockRemoved", "block_hashes": ["AB"], "medium": "GPU", "tier": "GPU"},  # hex is lowercase
        {"type": "BlockRemoved", "block_hashes": ["ab"], "medium": "GPU"},  # no tier
        {**event, "tier": "SSD"},  # not a tier
    ]
    bad_messages = [
        {**batch, "events": [], "extra": 1},  # envelopes are closed
        {**batch, "events": [], "id": "ab-7"},
        {**batch, "events": [], "seq": 3},  # an engine seq is a decimal string
        {**batch, "events": [], "seq": "1.5e18"},
        {"type": "notice", "kind": "slow_consumer", "reason": "x", "offset": 3},
        {"type": "hello", "epoch": "ab", "offset": 1, "recovered": True, "sources": [], "occupancy": {}},
    ]
    fresh = SchemaCheck(json.loads(SCHEMA_FILE.read_bytes()))
    fresh.collect(json.dumps({**batch, "events": [event, {"type": "AllBlocksCleared"}, {"type": "Other", "x": [1]}]}))
    assert fresh.flush() == 1
    for index, bad in enumerate(bad_events):
        fresh.collect(json.dumps({**batch, "offset": 100 + index, "events": [event, bad]}))
        with pytest.raises(AssertionError, match="does not follow the schema"):
            fresh.flush()
    for bad in bad_messages:
        fresh.collect(json.dumps(bad))
        with pytest.raises(AssertionError, match="does not follow the schema"):
            fresh.flush()


# --- processes --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def module_procs() -> Iterator[Starter]:
    """Like conftest's ``procs``, for the gateways this module's tests share."""
    started = Procs()
    yield started
    started.stop_all()


def start_simulator(start: Starter, pub: int, replay: int, *extra: str, ranks: int = 1) -> Proc:
    return start_sim(start, *sim_flags(pub, replay), *extra, ranks=ranks)


def wait_streams(gateway: GatewayProcess, streams: list[tuple[str, int]]) -> None:
    """Until every stream is connected and has delivered a batch."""

    def ready() -> bool:
        by_key = {(s["source"], s["dp_rank"]): s for s in gateway.sources()["sources"]}
        return all(by_key[key]["connected"] and by_key[key]["last_seq"] is not None for key in streams)

    wait_until(ready, timeout=30, what=f"streams {streams} up and delivering")


LIVE_RESTART_AT = 50


Serve: TypeAlias = Callable[..., GatewayProcess]
"""How the module starts a gateway: ``serve(start, port, sources, *flags, token=..., ...)``."""


@pytest.fixture(scope="module")
def serve() -> Serve:
    """One process here; tests/cluster/test_cluster_web.py runs every test of this module that
    serves clients again with an edge of a two-edge cluster instead."""
    return start_gateway


@pytest.fixture(scope="module")
def recovery_window() -> str:
    """How far back a client resumes: the ring here; the stream's retention on an edge."""
    return "ring"


@pytest.fixture(scope="module")
def live(module_procs: Starter, serve: Serve) -> GatewayProcess:
    """Two sources: ``llama`` (2 DP ranks, GPU + CPU offload, a restart, clears) and ``qwen``
    (1 rank, GPU only), behind a gateway whose ring keeps everything this module sees, so a
    client that resumes from ``<epoch>:0`` gets the whole history from offset 1."""
    http_port, llama_pub, llama_replay, qwen_pub, qwen_replay = free_ports(5, spacing=2)
    gateway = serve(
        module_procs,
        http_port,
        [source_spec("llama", llama_pub, llama_replay, 2), source_spec("qwen", qwen_pub, qwen_replay)],
        "--ring-messages",
        "1000000",
        "--ring-bytes",
        str(2**30),
    )
    start_simulator(
        module_procs,
        llama_pub,
        llama_replay,
        "--dp-size=2",
        "--cpu-offload",
        "--rate=25",
        f"--restart-at={LIVE_RESTART_AT}",
        "--clear-every=37",
        "--gpu-blocks=256",
        "--cpu-blocks=512",
        "--seed=3",
        ranks=2,
    )
    start_simulator(module_procs, qwen_pub, qwen_replay, "--rate=15", "--gpu-blocks=256", "--seed=4")
    wait_streams(gateway, [("llama", 0), ("llama", 1), ("qwen", 0)])
    return gateway


@pytest.fixture(scope="module")
def guarded(module_procs: Starter, serve: Serve) -> GatewayProcess:
    """A gateway with a token, an Origin allow-list, room for 2 clients and a 20-message ring."""
    http_port, pub, replay = free_ports(3)
    gateway = serve(
        module_procs,
        http_port,
        [source_spec("llama", pub, replay)],
        "--allowed-origin",
        ALLOWED_ORIGIN,
        "--max-clients",
        "2",
        "--ring-messages",
        "20",
        "--log-level",
        "debug",  # per-connection access lines (checked for redaction) are written at debug only
        token=TOKEN,
    )
    start_simulator(module_procs, pub, replay, "--rate=20", "--seed=5")
    wait_streams(gateway, [("llama", 0)])
    wait_until(lambda: gateway.offset() > 45, timeout=30, what="more than twice the ring")
    return gateway


# --- clients ----------------------------------------------------------------------------------


_OFFSET = re.compile(r'"offset":(\d+)')


def line_offset(line: str) -> int | None:
    """The offset of a batch or stream notice from its text (its first "offset" key)."""
    if line.startswith('{"type":"hello"'):
        return None
    match = _OFFSET.search(line, 0, 300)
    return int(match.group(1)) if match else None


@dataclass
class SseEvent:
    id: str | None
    event: str | None
    data: str
    data_lines: int


class SseParser:
    """The text/event-stream format, line by line (https://html.spec.whatwg.org/#event-stream-interpretation)."""

    def __init__(self) -> None:
        self.retry: int | None = None
        self.comments = 0
        self._fields: dict[str, str] = {}
        self._data: list[str] = []

    def feed(self, line: str) -> SseEvent | None:
        if line == "":
            fields, data = self._fields, self._data
            self._fields, self._data = {}, []
            if "retry" in fields:
                self.retry = int(fields["retry"])
            if not data:
                return None
            return SseEvent(fields.get("id"), fields.get("event"), "\n".join(data), len(data))
        if line.startswith(":"):
            self.comments += 1
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        else:
            self._fields[name] = value
        return None


@dataclass
class Conn:
    """One client connection: every message in arrival order (the hello first)."""

    transport: str
    label: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    digests: list[tuple[int | None, int]] = field(default_factory=list)
    sse_events: list[SseEvent] = field(default_factory=list)
    ended: bool = False
    close_code: int | None = None
    close_reason: str | None = None
    error: BaseException | None = None
    parse: bool = True
    sse_parser: SseParser | None = None
    close: Callable[[], Coroutine[Any, Any, None]] | None = None
    schema: bool = True
    """False for a client that asked for deprecated fields, which the schema does not list."""

    def add(self, line: str, sse: SseEvent | None = None) -> None:
        """One message. ``parse=False`` keeps only the hello parsed, and for every message its
        offset and a digest of its text: enough to compare what many clients received."""
        if self.schema:
            schema_check().collect(line)
        self.digests.append((line_offset(line), hash(line)))
        if sse is not None:
            self.sse_events.append(sse)
        if self.parse or not self.messages:
            self.messages.append(json.loads(line))

    def digest_offsets(self) -> list[int]:
        return [offset for offset, _ in self.digests[1:] if offset is not None]

    def digest_by_offset(self) -> dict[int, int]:
        return {offset: digest for offset, digest in self.digests[1:] if offset is not None}

    @property
    def hello(self) -> dict[str, Any]:
        assert self.messages, f"{self.label}: no hello"
        assert self.messages[0]["type"] == "hello", self.messages[0]
        return self.messages[0]

    @property
    def after_hello(self) -> list[dict[str, Any]]:
        return self.messages[1:]

    def offsets(self) -> list[int]:
        return [m["offset"] for m in self.after_hello if "offset" in m]

    @property
    def last_offset(self) -> int:
        offsets = self.offsets()
        return offsets[-1] if offsets else self.hello["offset"]

    @property
    def last_id(self) -> str:
        with_id = [m["id"] for m in self.after_hello if "id" in m]
        return with_id[-1] if with_id else f"{self.hello['epoch']}:{self.hello['offset']}"

    def by_offset(self) -> dict[int, dict[str, Any]]:
        return {m["offset"]: m for m in self.after_hello if "offset" in m}

    async def wait_messages(self, count: int, within: float = 20.0) -> None:
        await until(lambda: len(self.messages) >= count or self._failed(), within, f"{self.label}: {count} messages")
        self._check_alive(len(self.messages) >= count)

    async def wait_offset(self, offset: int, within: float = 20.0) -> None:
        """Until a message with an offset >= ``offset`` arrived."""
        await until(
            lambda: (self.messages and self.last_offset >= offset) or self._failed(),
            within,
            f"{self.label}: offset {offset}",
        )
        self._check_alive(self.last_offset >= offset)

    async def wait_ended(self, within: float = 20.0) -> None:
        await until(lambda: self.ended, within, f"{self.label}: end of the connection")

    def _failed(self) -> bool:
        return self.ended

    def _check_alive(self, reached: bool) -> None:
        if not reached:
            raise AssertionError(f"{self.label} ended early ({self.close_code} {self.close_reason}): {self.error!r}")


class Clients:
    """Opens WebSocket and SSE clients for one test and closes them all at the end."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self.gateway = gateway
        self._closers: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Clients:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for closer in reversed(self._closers):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(closer(), 10)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(coro))

    async def ws(
        self,
        query: str = "",
        *,
        token: bool = True,
        origin: str | None = None,
        label: str = "",
        wait_hello: bool = True,
        parse: bool = True,
        schema: bool = True,
        **kwargs: Any,
    ) -> tuple[Conn, ClientConnection]:
        headers = self.gateway.headers() if token else {}
        url = self.gateway.ws_url + (f"?{query}" if query else "")
        ws = await connect(
            url,
            additional_headers=headers,
            origin=origin,  # type: ignore[arg-type]
            proxy=None,
            max_size=None,
            open_timeout=15,
            **kwargs,
        )
        self._closers.append(ws.close)
        conn = Conn("ws", label or f"ws?{query}", parse=parse, close=ws.close, schema=schema)
        self._spawn(self._pump_ws(conn, ws))
        if wait_hello:
            await conn.wait_messages(1)
        return conn, ws

    @staticmethod
    async def _pump_ws(conn: Conn, ws: ClientConnection) -> None:
        try:
            async for frame in ws:
                assert isinstance(frame, str), "the gateway sends text frames"
                for line in frame.split("\n"):
                    conn.add(line)
        except ConnectionClosed:
            pass
        except Exception as exc:
            conn.error = exc
        finally:
            conn.close_code, conn.close_reason = ws.close_code, ws.close_reason
            conn.ended = True

    async def sse(
        self,
        query: str = "",
        *,
        headers: dict[str, str] | None = None,
        token: bool = True,
        label: str = "",
        wait_hello: bool = True,
        schema: bool = True,
    ) -> Conn:
        all_headers = {**(self.gateway.headers() if token else {}), **(headers or {})}
        http = httpx.AsyncClient(timeout=httpx.Timeout(15, read=None), trust_env=False)
        self._closers.append(http.aclose)
        url = f"{self.gateway.base}/v1/events" + (f"?{query}" if query else "")
        response = await http.send(http.build_request("GET", url, headers=all_headers), stream=True)
        self._closers.append(response.aclose)
        if response.status_code != 200:
            body = (await response.aread()).decode()
            raise AssertionError(f"SSE {url}: HTTP {response.status_code} {body}")
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        assert "content-encoding" not in response.headers

        async def close() -> None:
            await response.aclose()
            await http.aclose()

        conn = Conn("sse", label or f"sse?{query}", sse_parser=SseParser(), close=close, schema=schema)
        self._spawn(self._pump_sse(conn, response))
        if wait_hello:
            await conn.wait_messages(1)
        return conn

    @staticmethod
    async def _pump_sse(conn: Conn, response: httpx.Response) -> None:
        parser = conn.sse_parser
        assert parser is not None
        try:
            async for line in response.aiter_lines():
                event = parser.feed(line)
                if event is not None:
                    conn.add(event.data, event)
        except httpx.HTTPError:
            pass
        except Exception as exc:
            conn.error = exc
        finally:
            conn.ended = True


def check_status_notices(statuses: list[dict[str, Any]], history: list[dict[str, Any]]) -> None:
    """Each ``status`` notice is its stream's /v1/sources entry as the messages before it say: the
    connection as the last up/down notice left it, the restarts counted, the last batch's seq."""
    assert {(m["source"], m["dp_rank"]) for m in statuses} == {
        (m["source"], m["dp_rank"]) for m in history if m["type"] == "batch"
    }, "every stream that delivered a batch came up, and said so in a status notice"
    for notice in statuses:
        stream = (notice["source"], notice["dp_rank"])
        status = notice["status"]
        before = [m for m in history if m["offset"] < notice["offset"] and (m["source"], m["dp_rank"]) == stream]
        assert (status["source"], status["dp_rank"]) == stream
        links = [m["kind"] for m in before if m["type"] == "notice" and m["kind"] in ("up", "down")]
        assert status["connected"] == (links[-1:] == ["up"]), notice
        restarts = sum(1 for m in before if m["type"] == "notice" and m["kind"] == "restart")
        assert status["counters"]["restarts"] == restarts, notice
        seqs = [m["seq"] for m in before if m["type"] == "batch"]
        if seqs and status["counters"]["decode_errors"] == 0:
            assert status["last_seq"] == seqs[-1], notice


def check_sse_framing(conn: Conn, retry: int | None = 2000) -> None:
    """Each SSE event: ``event:`` the message type, ``id:`` the message id (the hello's too), one data line."""
    assert conn.sse_parser is not None
    assert conn.sse_parser.retry == retry
    assert len(conn.sse_events) == len(conn.messages)
    for sse, message in zip(conn.sse_events, conn.messages, strict=True):
        assert sse.event == message["type"]
        assert sse.data_lines == 1
        if message["type"] == "hello":
            assert sse.id == f"{message['epoch']}:{message['offset']}"
        else:
            assert sse.id == message.get("id")


def assert_contiguous(conn: Conn, first: int, last: int | None = None) -> None:
    """The connection saw every offset from ``first`` on (an unfiltered client misses none)."""
    offsets = conn.offsets()
    end = offsets[-1] if last is None else last
    assert offsets[: end - first + 1] == list(range(first, end + 1)), f"{conn.label}: gap or duplicate"


# --- filters, as docs/protocol.md defines them (the test's own implementation) ----------------


TIER_PREFIXES = {
    "GPU": ("GPU", "CUDA", "HBM", "DEVICE"),
    "CPU": ("CPU", "HOST", "DRAM", "PINNED"),
    "DISK": ("DISK", "STORAGE", "SSD", "NVME", "FILE", "HDD"),
}


def tier_of(medium: str | None) -> str:
    """The tier table of docs/protocol.md (block events carry it as ``tier``; unknown events do not)."""
    name = (medium or "GPU").upper()
    return next((tier for tier, prefixes in TIER_PREFIXES.items() if name.startswith(prefixes)), "EXTERNAL")


@dataclass(frozen=True)
class Filter:
    query: str
    sources: frozenset[str] | None
    ranks: frozenset[int] | None
    types: frozenset[str] | None
    mediums: frozenset[str] | None

    @classmethod
    def parse(cls, query: str) -> Filter:
        values: dict[str, set[str]] = {}
        for name, value in parse_qsl(query):
            values.setdefault(name, set()).add(value)

        def get(name: str) -> frozenset[str] | None:
            return frozenset(values[name]) if name in values else None

        ranks = get("dp_rank")
        mediums = get("medium")
        return cls(
            query,
            get("source"),
            None if ranks is None else frozenset(int(r) for r in ranks),
            get("type"),
            None if mediums is None else frozenset(m.upper() for m in mediums),
        )

    def event_passes(self, event: dict[str, Any]) -> bool:
        if self.types is not None and event["type"] not in self.types:
            return False
        if self.mediums is None or event["type"] == "AllBlocksCleared":
            return True  # AllBlocksCleared clears every medium
        medium = event.get("medium")
        # a medium name matches that medium, a tier name (GPU, CPU, DISK, EXTERNAL) the whole tier
        if event["type"] in ("BlockStored", "BlockRemoved"):
            return (medium or "GPU").upper() in self.mediums or event["tier"] in self.mediums
        if not isinstance(medium, str):
            return False
        return (medium or "GPU").upper() in self.mediums or tier_of(medium) in self.mediums

    def apply(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """What a client with this filter receives for ``message`` (None: nothing)."""
        if self.sources is not None and message["source"] not in self.sources:
            return None
        if self.ranks is not None and message["dp_rank"] not in self.ranks:
            return None
        if message["type"] != "batch" or (self.types is None and self.mediums is None):
            return message  # stream notices follow the stream filters only
        events = [event for event in message["events"] if self.event_passes(event)]
        return {**message, "events": events} if events else None


def expected_messages(reference: list[dict[str, Any]], flt: Filter) -> list[dict[str, Any]]:
    return [m for m in (flt.apply(message) for message in reference) if m is not None]


# --- the occupancy a client builds from the messages (docs/protocol.md, "Writing a client") ---


def occupancy_from_history(messages: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Exact figures per stream from every message since offset 1: reference-counted blocks per
    (medium, group), cumulative stores / removes / unknown removes, the last block size."""
    streams: dict[tuple[str, int], dict[str, Any]] = {}
    for message in messages:
        stream = streams.setdefault((message["source"], message["dp_rank"]), {"mediums": {}, "unknown_removes": 0})
        mediums: dict[str, dict[str, Any]] = stream["mediums"]
        if message["type"] == "notice":
            if message["kind"] == "restart":
                for medium in mediums.values():
                    medium["refs"] = {}
            continue
        for event in message["events"]:
            if event["type"] == "AllBlocksCleared":
                for medium in mediums.values():
                    medium["refs"] = {}
                continue
            if event["type"] not in ("BlockStored", "BlockRemoved"):
                continue
            name = (event.get("medium") or "GPU").upper()
            medium = mediums.setdefault(name, {"refs": {}, "stores": 0, "removes": 0, "block_size": 0})
            group = event.get("group_idx")
            group = group if type(group) is int else 0
            refs: dict[tuple[int, str], int] = medium["refs"]
            hashes = event["block_hashes"]
            if event["type"] == "BlockStored":
                for block in hashes:
                    refs[(group, block)] = refs.get((group, block), 0) + 1
                medium["stores"] += len(hashes)
                if event["block_size"] > 0:
                    medium["block_size"] = event["block_size"]
            else:
                for block in hashes:
                    held = refs.get((group, block), 0)
                    if held == 0:
                        stream["unknown_removes"] += 1
                    elif held == 1:
                        del refs[(group, block)]
                    else:
                        refs[(group, block)] = held - 1
                medium["removes"] += len(hashes)
    return {
        key: {
            "unknown_removes": stream["unknown_removes"],
            "mediums": {
                name: {
                    "blocks": len(m["refs"]),
                    "tokens": len(m["refs"]) * m["block_size"],
                    "block_size": m["block_size"],
                    "stores": m["stores"],
                    "removes": m["removes"],
                }
                for name, m in sorted(stream["mediums"].items())
                if m["stores"]  # a medium only ever removed from is not listed
            },
        }
        for key, stream in streams.items()
    }


def exact_occupancy(snapshot: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """The rate-free figures of an occupancy snapshot, shaped like :func:`occupancy_from_history`."""
    keys = ("blocks", "tokens", "block_size", "stores", "removes")
    out = {}
    for entry in snapshot["streams"]:
        assert entry["stale"] is False
        assert all(stats["capacity_blocks"] is None for stats in entry["mediums"].values())
        out[(entry["source"], entry["dp_rank"])] = {
            "unknown_removes": entry["unknown_removes"],
            "mediums": {name: {k: stats[k] for k in keys} for name, stats in entry["mediums"].items()},
        }
    return out


LIVE_STREAMS = [("llama", 0), ("llama", 1), ("qwen", 0)]


def check_fresh_hello(conn: Conn, gateway_epoch: str, not_before: int) -> None:
    hello = conn.hello
    assert hello["epoch"] == gateway_epoch
    assert hello["recovered"] is False
    assert hello["offset"] >= not_before
    assert hello["occupancy"]["offset"] == hello["offset"]


# --- fan-out with filters ---------------------------------------------------------------------

FILTERS = {
    # query: the stream notices (3 up, 2 restarts in all; status notices aside) it lets through
    "source=qwen": 1,
    "dp_rank=1": 2,
    "type=BlockStored": 5,
    "medium=cpu": 5,
    "source=llama&dp_rank=0&type=BlockStored&type=BlockRemoved&medium=GPU": 2,
    "type=BlockRemoved&type=AllBlocksCleared&medium=gpu&source=llama": 4,
    "dp_rank=0&dp_rank=1&source=llama&source=qwen": 5,
}


def test_every_batch_reaches_every_matching_client_in_order(live: GatewayProcess) -> None:
    """14 clients resume from offset 0 (the whole history) and stay for live messages: each
    filtered client receives exactly what the test's own filter makes of the unfiltered stream."""

    async def body() -> None:
        epoch = live.epoch()
        start = f"last_event_id={epoch}:0"
        async with Clients(live) as clients:
            reference, _ = await clients.ws(start, label="reference")
            plain_sse = await clients.sse(start, label="unfiltered sse")
            filtered: list[tuple[Filter, Conn]] = []
            for query in FILTERS:
                flt = Filter.parse(query)
                assert flt.query == query
                conn, _ = await clients.ws(f"{query}&{start}")
                filtered.append((flt, conn))
                filtered.append((flt, await clients.sse(f"{start}&{query}")))
            # Fresh clients: their snapshot must be the state the history up to their offset builds.
            offset_before = await live.offset_async()
            fresh_ws, _ = await clients.ws(label="fresh ws")
            fresh_sse = await clients.sse(label="fresh sse")

            # Both llama ranks restart once (seq LIVE_RESTART_AT then 0): wait for that, then some more.
            def restarts() -> int:
                return sum(1 for m in reference.after_hello if m["type"] == "notice" and m["kind"] == "restart")

            await until(lambda: restarts() == 2, 30, "both llama restarts")
            end = reference.last_offset + 60
            await reference.wait_offset(end + 1, 30)
            for _, conn in [(None, plain_sse), *filtered]:
                await conn.wait_offset(end + 1, 30)  # a later message arrived: everything up to end is in

        history = [m for m in reference.after_hello if m["offset"] <= end]
        reference_by_offset = {m["offset"]: m for m in history}
        for conn in (reference, plain_sse, *(conn for _, conn in filtered)):
            hello = conn.hello
            assert (hello["epoch"], hello["offset"], hello["recovered"], hello["occupancy"]) == (epoch, 0, True, None)
        assert [m["offset"] for m in history] == list(range(1, end + 1))
        assert [m for m in plain_sse.after_hello if m["offset"] <= end] == history
        check_sse_framing(plain_sse)

        # The history has the notices the test relies on: 3 up, 2 restarts, and the statuses.
        statuses = [m for m in history if m["type"] == "notice" and m["kind"] == "status"]
        check_status_notices(statuses, history)
        notices = [
            (m["kind"], m["source"], m["dp_rank"]) for m in history if m["type"] == "notice" and m["kind"] != "status"
        ]
        assert Counter(notices) == Counter(
            [
                ("up", "llama", 0),
                ("up", "llama", 1),
                ("up", "qwen", 0),
                ("restart", "llama", 0),
                ("restart", "llama", 1),
            ]
        )
        for m in history:
            if m["type"] == "notice" and m["kind"] == "restart":
                assert (m["seq"], m["previous"], m["reason"]) == ("0", str(LIVE_RESTART_AT), "seq_reset")
        kinds = Counter((e["type"], e.get("medium")) for m in history if m["type"] == "batch" for e in m["events"])
        for needed in [
            ("BlockStored", "GPU"),
            ("BlockStored", "CPU"),
            ("BlockRemoved", "GPU"),
            ("AllBlocksCleared", None),
        ]:
            assert kinds[needed] > 0, f"the workload has no {needed}: {kinds}"

        dropped_whole = 0
        for flt, conn in filtered:
            got = [m for m in conn.after_hello if m["offset"] <= end]
            want = expected_messages(history, flt)
            assert got == want, f"{conn.label}: {len(got)} messages, expected {len(want)}"
            assert all(m["type"] != "batch" or m["events"] for m in got), "a batch with no events was sent"
            if conn.transport == "sse":
                check_sse_framing(conn)
            stream_notices = [m for m in got if m["type"] == "notice" and m["kind"] != "status"]
            assert len(stream_notices) == FILTERS[flt.query], conn.label
            if flt.query.startswith("dp_rank=0&dp_rank=1"):
                assert got == history  # the values of one parameter are alternatives
                continue
            if flt.types is None and flt.mediums is None:
                assert len(got) < len(history), f"{conn.label}: the filter left everything"
            else:
                stream_filter = Filter(flt.query, flt.sources, flt.ranks, None, None)
                in_streams = [m for m in history if m["type"] == "batch" and stream_filter.apply(m) is not None]
                dropped_whole += sum(1 for m in in_streams if flt.apply(m) is None)
                cut_down = [
                    m for m in got if m["type"] == "batch" and m["events"] != reference_by_offset[m["offset"]]["events"]
                ]
                assert cut_down, f"{conn.label}: no batch lost an event to the filter"
        assert dropped_whole > 0, "no batch was left out for having no matching event"

        # The fresh clients' snapshots are exactly the state after the messages up to their offset.
        for fresh in (fresh_ws, fresh_sse):
            check_fresh_hello(fresh, epoch, offset_before)
            offset = fresh.hello["offset"]
            assert offset <= end
            model = occupancy_from_history([m for m in history if m["offset"] <= offset])
            snapshot = fresh.hello["occupancy"]
            assert exact_occupancy(snapshot) == {key: model[key] for key in LIVE_STREAMS}
            totals = {
                name: {"blocks": t["blocks"], "tokens": t["tokens"], "streams": t["streams"]}
                for name, t in snapshot["totals"].items()
            }
            expected_totals: dict[str, dict[str, int]] = {}
            for key in LIVE_STREAMS:
                for name, stats in model[key]["mediums"].items():
                    total = expected_totals.setdefault(name, {"blocks": 0, "tokens": 0, "streams": 0})
                    total["blocks"] += stats["blocks"]
                    total["tokens"] += stats["tokens"]
                    total["streams"] += 1
            assert totals == expected_totals
            assert [(s["source"], s["dp_rank"], s["state"]) for s in fresh.hello["sources"]] == [
                ("llama", 0, "up"),
                ("llama", 1, "up"),
                ("qwen", 0, "up"),
            ]
            assert fresh.offsets()[0] == offset + 1  # live from right after the snapshot
            assert_contiguous(fresh, offset + 1)
        check_sse_framing(fresh_sse)

    arun(body())


# --- resume ------------------------------------------------------------------------------------


async def gateway_passes(gateway: GatewayProcess, offset: int, within: float = 20.0) -> int:
    """Until the gateway's latest offset is at least ``offset``; that offset."""

    async def passed() -> tuple[int] | None:
        current = await gateway.offset_async()
        return (current,) if current >= offset else None  # a tuple: truthy at offset 0 too

    (current,) = await until(passed, within, f"the gateway at offset {offset}", interval=0.05)
    return int(current)


async def resumes(gateway: GatewayProcess) -> dict[tuple[str, str], float]:
    values = await asyncio.to_thread(
        lambda: {
            (transport, recovered): gateway.metric("kvgateway_resumes_total", transport=transport, recovered=recovered)
            for transport in ("ws", "sse")
            for recovered in ("true", "false")
        }
    )
    return values


def check_recovered_hello(conn: Conn, epoch: str, offset: int) -> None:
    hello = conn.hello
    assert (hello["epoch"], hello["offset"], hello["recovered"], hello["occupancy"]) == (epoch, offset, True, None)
    assert [(s["source"], s["dp_rank"]) for s in hello["sources"]] == [(s, r) for s, r in LIVE_STREAMS]


def test_websocket_resume_inside_the_ring_replays_exactly_the_missed_messages(live: GatewayProcess) -> None:
    async def body() -> None:
        epoch = live.epoch()
        before = await resumes(live)
        flt = Filter.parse("dp_rank=1&type=BlockStored&type=AllBlocksCleared")
        async with Clients(live) as clients:
            reference, _ = await clients.ws(label="reference")
            first, _ = await clients.ws(label="first")
            first_filtered, _ = await clients.ws(flt.query, label="first filtered")
            await first.wait_messages(6)
            await first_filtered.wait_messages(4)
            for conn in (first, first_filtered):
                assert conn.close is not None
                await conn.close()
                await conn.wait_ended()
            # the gap: messages published while these clients were away
            await gateway_passes(live, max(first.last_offset, first_filtered.last_offset) + 25)
            resumed, _ = await clients.ws(f"last_event_id={first.last_id}", label="resumed")
            resumed_filtered, _ = await clients.ws(f"{flt.query}&last_event_id={first_filtered.last_id}")
            live_from = await live.offset_async()
            await resumed.wait_offset(live_from + 10)
            await resumed_filtered.wait_offset(live_from + 1, 30)
            await reference.wait_offset(max(resumed.last_offset, resumed_filtered.last_offset))

        by_offset = reference.by_offset()
        check_fresh_hello(first, epoch, reference.hello["offset"])
        assert_contiguous(first, first.hello["offset"] + 1)
        check_recovered_hello(resumed, epoch, first.last_offset)
        # no gap and no duplicate across the reconnection: first and resumed make one contiguous run
        assert first.offsets() + resumed.offsets() == list(range(first.hello["offset"] + 1, resumed.last_offset + 1))
        assert resumed.after_hello == [by_offset[o] for o in resumed.offsets()]
        assert first.after_hello == [by_offset[o] for o in first.offsets()]
        assert resumed.last_offset > live_from  # replayed, then live

        check_recovered_hello(resumed_filtered, epoch, first_filtered.last_offset)
        window = [by_offset[o] for o in range(first_filtered.hello["offset"] + 1, resumed_filtered.last_offset + 1)]
        assert first_filtered.after_hello + resumed_filtered.after_hello == expected_messages(window, flt)
        assert resumed_filtered.last_offset > live_from

        after = await resumes(live)
        assert after[("ws", "true")] - before[("ws", "true")] == 2
        assert after[("ws", "false")] == before[("ws", "false")]

    arun(body())


def test_sse_resume_with_last_event_id_header_or_query_and_the_header_wins(live: GatewayProcess) -> None:
    async def body() -> None:
        epoch = live.epoch()
        before = await resumes(live)
        async with Clients(live) as clients:
            reference, _ = await clients.ws(label="reference")
            runs: list[Conn] = [await clients.sse(label="first")]
            await runs[0].wait_messages(5)
            hops: list[tuple[str, Callable[[Conn], str]]] = [
                ("header", lambda previous: ""),
                ("query", lambda previous: f"last_event_id={previous.last_id}"),
                ("both", lambda previous: f"last_event_id={runs[0].last_id}"),  # an older id: the header wins
            ]
            for name, query_for in hops:
                previous = runs[-1]
                assert previous.close is not None
                await previous.close()
                await previous.wait_ended()
                await gateway_passes(live, previous.last_offset + 15)
                headers = {} if name == "query" else {"Last-Event-ID": previous.last_id}
                conn = await clients.sse(query_for(previous), headers=headers, label=f"resumed ({name})")
                await conn.wait_messages(5)
                runs.append(conn)
            live_from = await live.offset_async()
            await runs[-1].wait_offset(live_from + 5)
            empty = await clients.sse("last_event_id=", label="empty id")
            await empty.wait_messages(2)
            await reference.wait_offset(runs[-1].last_offset)

        by_offset = reference.by_offset()
        check_fresh_hello(runs[0], epoch, reference.hello["offset"])
        for previous, conn in itertools.pairwise(runs):
            check_recovered_hello(conn, epoch, previous.last_offset)
        chain = [o for conn in runs for o in conn.offsets()]
        assert chain == list(range(runs[0].hello["offset"] + 1, runs[-1].last_offset + 1))
        for conn in runs:
            assert conn.after_hello == [by_offset[o] for o in conn.offsets()]
            check_sse_framing(conn)
        assert runs[-1].last_offset > live_from
        # an empty last_event_id is no resume at all
        check_fresh_hello(empty, epoch, runs[-1].hello["offset"])
        assert empty.offsets()[0] == empty.hello["offset"] + 1
        check_sse_framing(empty)

        after = await resumes(live)
        assert after[("sse", "true")] - before[("sse", "true")] == 3
        assert after[("sse", "false")] == before[("sse", "false")]

    arun(body())


GAP = (20, 22)
"""The seqs the engine of the gap test drops before its buffer (TensorRT-LLM's queue overflow):
neither live nor replay brings them, however late the gateway connects."""


def gap_source(pub: int, replay: int) -> tuple[str, list[str]]:
    """The gap test's source, and its engine's endpoints."""
    return source_spec("gap", pub, replay), sim_flags(pub, replay)


@pytest.fixture
def gap_gateway(procs: Starter, serve: Serve) -> tuple[GatewayProcess, list[str]]:
    """A gateway serving one source, ``gap``, and the flags of its engine, not started yet."""
    http_port, pub, replay = free_ports(3)
    spec, engine = gap_source(pub, replay)
    return serve(procs, http_port, [spec]), engine


def test_the_gap_notice_has_no_last_unless_the_client_asks_with_compat_gap_last_live_and_on_resume(
    procs: Starter, gap_gateway: tuple[GatewayProcess, list[str]]
) -> None:
    """``unrecovered_gap``'s integer ``last`` (``until``'s deprecated name) would give the name two
    types beside ``state``'s boolean: it goes only to a client that asks (``compat=gap_last``), on
    both transports, live and replayed from the ring; everything else is what every client gets."""
    gateway, engine = gap_gateway
    first, until_ = GAP

    def gap_of(conn: Conn) -> dict[str, Any] | None:
        return next((m for m in conn.after_hello if m.get("kind") == "unrecovered_gap"), None)

    async def body() -> tuple[list[Conn], list[Conn], Conn]:
        async with Clients(gateway) as clients:
            plain_ws, _ = await clients.ws(label="plain ws")
            plain_sse = await clients.sse(label="plain sse")
            compat_ws, _ = await clients.ws("compat=gap_last", label="compat ws", schema=False)
            compat_sse = await clients.sse("compat=gap_last", label="compat sse", schema=False)
            live_conns = [plain_ws, plain_sse, compat_ws, compat_sse]
            # the engine starts once every client is there: each sees the gap live
            await asyncio.to_thread(start_sim, procs, *engine, "--rate=50", f"--drop-queue={first}-{until_}")
            for conn in live_conns:
                await until(lambda conn=conn: gap_of(conn), 30, f"{conn.label}: the gap notice")
            notice = gap_of(plain_ws)
            assert notice is not None
            since = f"{gateway.epoch()}:0"  # the whole history is in the ring
            asked = f"compat=gap_last&last_event_id={since}"
            resumed = [
                (await clients.ws(f"last_event_id={since}", label="plain ws resumed"))[0],
                (await clients.ws(asked, label="compat ws resumed", schema=False))[0],
                await clients.sse(
                    "compat=gap_last", headers={"Last-Event-ID": since}, label="compat sse resumed", schema=False
                ),
            ]
            # the reference: a plain client at least as far as every other one
            for conn in [*live_conns, *resumed]:
                await conn.wait_offset(notice["offset"])
            await plain_ws.wait_offset(max(conn.last_offset for conn in [*live_conns, *resumed]))
            return live_conns, resumed, plain_ws

    live_conns, resumed, reference = arun(body())
    # What a plain client gets at each offset: live from its hello on, and from the ring before it
    # (a status notice may come before the first client: the engine is not up yet).
    by_offset = {**resumed[0].by_offset(), **reference.by_offset()}
    assert all(by_offset[offset] == m for offset, m in resumed[0].by_offset().items()), "plain clients agree"
    notice = gap_of(reference)
    assert notice is not None
    assert (notice["first"], notice["until"], notice["count"], notice["reason"]) == (
        str(first),
        str(until_),
        3,
        "not_sent",
    )
    assert "last" not in notice
    for conn in [*live_conns, *resumed]:
        gap = gap_of(conn)
        assert gap == ({**notice, "last": str(until_)} if "compat" in conn.label else notice), conn.label
        # every other message is the one a plain client gets (batches untouched)
        others = [m for m in conn.after_hello if m is not gap]
        assert others == [by_offset[m["offset"]] for m in others], conn.label
        if conn.transport == "sse":
            check_sse_framing(conn)  # the variant keeps its id: line
    assert [conn.hello["recovered"] for conn in resumed] == [True, True, True]


TRT_START = 1_789_095_808_837_884_700
"""A TensorRT-LLM engine's first seq (its publisher starts at time_ns): far beyond 2^53, where
doubles are 256 apart."""


def test_trtllm_seqs_are_exact_after_json_parse_in_node_and_numbers_only_with_compat_int_seqs(
    procs: Starter, serve: Serve
) -> None:
    """Node's JSON.parse of a real gateway's stream, with TensorRT-LLM's time_ns seqs and a lost
    range: every seq digit for digit, and ``count == until - first + 1`` exact with BigInt (and
    false with Number(), which is why seqs are strings). A client that asks for compat=int_seqs
    gets the same seqs as JSON numbers (exact in Python's json, rounded in JavaScript's)."""
    node_command()
    first, until_ = TRT_START + 20, TRT_START + 22
    http_port, pub, replay = free_ports(3)
    spec, engine = gap_source(pub, replay)
    gateway = serve(procs, http_port, [spec])
    batches = 30

    async def body() -> tuple[dict[str, Any], Conn, Conn]:
        async with Clients(gateway) as clients:
            strings, _ = await clients.ws(label="strings")
            numbers, _ = await clients.ws("compat=int_seqs", label="int seqs", schema=False)
            node = asyncio.ensure_future(run_node(gateway.base, str(batches), "sse"))
            await gateway.wait_clients(3)  # node too: it sees the engine's first batch live
            flags = ("--engine=trtllm", f"--start-seq={TRT_START}", "--rate=50", f"--drop-queue={first}-{until_}")
            await asyncio.to_thread(start_sim, procs, *engine, *flags)
            code, out, err = await node
            assert code == 0, err
            summary: dict[str, Any] = json.loads(out)["sse"]
            last = max(b["offset"] for b in summary["batches"])
            await strings.wait_offset(last)
            await numbers.wait_offset(last)
            return summary, strings, numbers

    summary, strings, numbers = arun(body())
    want = [str(TRT_START + i) for i in range(batches + 3) if not first <= TRT_START + i <= until_][:batches]
    assert [b["seq"] for b in summary["batches"]] == want  # JSON.parse kept every digit
    assert summary["gaps"] == [
        {"first": str(first), "until": str(until_), "count": 3, "exact": True, "as_numbers": False}
    ]
    by_offset, as_numbers = strings.by_offset(), numbers.by_offset()
    for got in summary["batches"]:
        assert by_offset[got["offset"]]["seq"] == got["seq"]
        assert as_numbers[got["offset"]]["seq"] == int(got["seq"])  # a number, exact to Python
    kinds = set()
    for offset in sorted(by_offset.keys() & as_numbers.keys()):
        message = by_offset[offset]
        kinds.add(message.get("kind"))
        if message["type"] == "notice" and message["kind"] in ("unrecovered_gap", "stale", "restart"):
            seqs = {name: value for name, value in message.items() if name in ("seq", "first", "until", "previous")}
            assert all(isinstance(value, str) for value in seqs.values() if value is not None), message
            other = as_numbers[offset]
            assert {name: other[name] for name in seqs} == {
                name: -1 if value is None else int(value) for name, value in seqs.items()
            }, other
        elif message["type"] == "notice" and message["kind"] == "status" and message["status"]["last_seq"] is not None:
            assert as_numbers[offset]["status"]["last_seq"] == int(message["status"]["last_seq"])
        else:
            assert as_numbers[offset] == message or message["type"] == "batch"
    assert {"unrecovered_gap", "status"} <= kinds


def test_resume_is_refused_for_another_epoch_an_id_outside_the_ring_or_a_malformed_id(
    guarded: GatewayProcess, recovery_window: str
) -> None:
    """All or nothing: recovered false, a fresh snapshot and no replay (the ring holds 20 messages;
    on an edge the stream is the window, and an id older than the ring is read back from it)."""

    async def body() -> None:
        epoch = guarded.epoch()
        before = await resumes(guarded)
        now = await guarded.offset_async()
        older = [f"{epoch}:{now - 30}"] if recovery_window == "ring" else []  # fell out of the ring
        bad_ids = [
            f"{UNKNOWN_EPOCH}:{now}",  # another epoch (a restarted gateway, another replica)
            *older,
            f"{epoch}:{now + 1000}",  # beyond the latest offset
            "not-an-id",
            f"{epoch}:",
            f"{epoch}:-3",
            f"{epoch}:1:2",
        ]
        assert epoch != UNKNOWN_EPOCH
        conns: list[Conn] = []
        async with Clients(guarded) as clients:
            for index, bad in enumerate(bad_ids):
                offset_before = await guarded.offset_async()
                conn, _ = await clients.ws(f"last_event_id={bad}", label=f"ws {bad}")
                via_header = index % 2 == 0
                sse = await clients.sse(
                    "" if via_header else f"last_event_id={bad}",
                    headers={"Last-Event-ID": bad} if via_header else None,
                    label=f"sse {bad}",
                )
                for c in (conn, sse):
                    await c.wait_messages(2)
                    check_fresh_hello(c, epoch, offset_before)
                    assert c.offsets()[0] == c.hello["offset"] + 1, f"{c.label}: something was replayed"
                    assert c.close is not None
                    await c.close()
                    conns.append(c)
                await guarded.wait_clients(0)
        for c in conns:
            if c.transport == "sse":
                check_sse_framing(c)
        after = await resumes(guarded)
        assert after[("ws", "false")] - before[("ws", "false")] == len(bad_ids)
        assert after[("sse", "false")] - before[("sse", "false")] == len(bad_ids)
        assert after[("ws", "true")] == before[("ws", "true")]
        assert after[("sse", "true")] == before[("sse", "true")]
        if recovery_window == "stream":  # an edge reads what fell out of its ring back from the stream
            async with Clients(guarded) as clients:
                conn, _ = await clients.ws(f"last_event_id={epoch}:{now - 30}", label="older than the ring")
                await conn.wait_offset(now, 30)
                assert conn.hello["recovered"] is True and conn.offsets()[:30] == list(range(now - 29, now + 1))

    arun(body())


# --- slow clients -------------------------------------------------------------------------------

SLOW_QUEUE_BYTES = 65536


def stingy_socket(port: int) -> socket.socket:
    """A connected socket with small kernel buffers (small receive buffer, small segments), so a
    client that never reads backs the gateway up after ~0.5 MB rather than several MB."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


async def read_http_response(sock: socket.socket, within: float) -> tuple[int, dict[str, str], bytes]:
    """Read one chunked HTTP/1.1 response to its last chunk: status, headers, decoded body."""
    loop = asyncio.get_running_loop()
    raw = bytearray()
    async with asyncio.timeout(within):
        while not raw.endswith(b"\r\n0\r\n\r\n"):
            data = await loop.sock_recv(sock, 1 << 16)
            if not data:
                break
            raw += data
    head, _, body = bytes(raw).partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
    assert headers.get("transfer-encoding") == "chunked", headers
    decoded = bytearray()
    position = 0
    while True:
        end = body.index(b"\r\n", position)
        size = int(body[position:end], 16)
        if size == 0:
            break
        decoded += body[end + 2 : end + 2 + size]
        position = end + 2 + size + 2
    return int(status_line.split()[1]), headers, bytes(decoded)


def sse_conn_from_text(text: str, label: str) -> Conn:
    conn = Conn("sse", label, sse_parser=SseParser())
    assert conn.sse_parser is not None
    for line in text.split("\n"):
        event = conn.sse_parser.feed(line)
        if event is not None:
            conn.add(event.data, event)
    conn.ended = True
    return conn


@pytest.mark.slow
def test_slow_clients_are_cut_off_while_50_others_keep_receiving_every_batch(procs: Starter, serve: Serve) -> None:
    """A WebSocket client and an SSE client that never read are cut (1013 "slow consumer"; the
    slow_consumer notice, then the end of the response) and resume from the ring; 50 WebSocket
    clients that read get every batch, in order, all along."""
    http_port, pub, replay = free_ports(3)
    gateway = serve(
        procs, http_port, [source_spec("llama", pub, replay)], "--client-queue-bytes", str(SLOW_QUEUE_BYTES)
    )
    start_simulator(procs, pub, replay, "--rate=20", "--events-per-batch=8-12", "--seed=6")
    wait_streams(gateway, [("llama", 0)])
    slow_labels = {"transport": "ws", "reason": "slow_consumer"}

    async def body() -> None:
        async with Clients(gateway) as clients:
            readers = [(await clients.ws(label=f"reader {i}", parse=False))[0] for i in range(50)]
            slow_ws = await connect(
                gateway.ws_url, sock=stingy_socket(http_port), max_queue=1, proxy=None, open_timeout=15
            )
            clients._closers.append(slow_ws.close)
            slow_sse_sock = stingy_socket(http_port)
            request = f"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{http_port}\r\nAccept: text/event-stream\r\n\r\n"
            await asyncio.get_running_loop().sock_sendall(slow_sse_sock, request.encode())
            try:
                # Neither slow client reads anything until the gateway has cut both.
                await gateway.wait_metric_reaches("kvgateway_client_disconnects_total", 1, 60, **slow_labels)
                await gateway.wait_metric_reaches(
                    "kvgateway_client_disconnects_total", 1, 60, transport="sse", reason="slow_consumer"
                )
                cut_at = await gateway.offset_async()
                cut_readers = [reader.label for reader in readers if reader.ended]
                assert not cut_readers, f"clients that kept reading were cut off too: {cut_readers}"
                slow = Conn("ws", "slow ws")
                clients._spawn(Clients._pump_ws(slow, slow_ws))
                await slow.wait_ended(30)
                status, headers, sse_body = await read_http_response(slow_sse_sock, 30)
            finally:
                slow_sse_sock.close()
            slow_sse = sse_conn_from_text(sse_body.decode(), "slow sse")

            resumed_ws, _ = await clients.ws(f"last_event_id={slow.last_id}", label="resumed ws", parse=False)
            resumed_sse = await clients.sse(headers={"Last-Event-ID": slow_sse.last_id}, label="resumed sse")
            target = await gateway.offset_async() + 5
            for conn in (resumed_ws, resumed_sse, *readers):
                await conn.wait_offset(target, 30) if conn.parse else await wait_digest_offset(conn, target)
            assert not any(reader.ended for reader in readers), "a reading client was cut off"

        # What the gateway counted: one cut per transport, both resumes recovered.
        assert await gateway.metric_async("kvgateway_client_disconnects_total", **slow_labels) == 1
        assert (
            await gateway.metric_async("kvgateway_client_disconnects_total", transport="sse", reason="slow_consumer")
            == 1
        )
        assert await gateway.metric_async("kvgateway_resumes_total", transport="ws", recovered="true") == 1
        assert await gateway.metric_async("kvgateway_resumes_total", transport="sse", recovered="true") == 1

        # The 50 readers: every offset from their hello on, each message the same text for all.
        reference = readers[0].digest_by_offset()
        for reader in readers:
            first = reader.hello["offset"] + 1
            offsets = reader.digest_offsets()
            assert offsets == list(range(first, first + len(offsets))), f"{reader.label}: gap or duplicate"
            assert offsets[-1] >= target > cut_at
            assert all(reference.get(o, digest) == digest for o, digest in reader.digests[1:] if o is not None)
        union: dict[int, int] = {}
        for reader in readers:
            union.update(reader.digest_by_offset())

        # The slow WebSocket client: what was in flight, in order, then 1013 "slow consumer".
        assert (slow.close_code, slow.close_reason) == (1013, "slow consumer")
        assert slow.hello["recovered"] is False
        assert_contiguous(slow, slow.hello["offset"] + 1)
        assert all(union[o] == digest for o, digest in slow.digests[1:] if o is not None)
        # ... and it resumes from its last id: the gap from the ring, then live.
        assert (resumed_ws.hello["recovered"], resumed_ws.hello["offset"]) == (True, slow.last_offset)
        offsets = resumed_ws.digest_offsets()
        assert offsets == list(range(slow.last_offset + 1, slow.last_offset + 1 + len(offsets)))
        assert all(union[o] == digest for o, digest in resumed_ws.digests[1:] if o is not None)

        # The slow SSE client: what was in flight, the slow_consumer notice (no id), the end.
        assert status == 200
        assert headers["content-type"] == "text/event-stream; charset=utf-8"
        check_sse_framing(slow_sse)
        assert slow_sse.messages[-1] == {
            "type": "notice",
            "kind": "slow_consumer",
            "reason": f"more than {SLOW_QUEUE_BYTES} bytes queued for this client",
        }
        assert slow_sse.sse_events[-1].id is None
        assert_contiguous(slow_sse, slow_sse.hello["offset"] + 1)
        assert slow_sse.last_offset < cut_at + 1
        assert all(union[o] == digest for o, digest in slow_sse.digests[1:] if o is not None)
        assert (resumed_sse.hello["recovered"], resumed_sse.hello["offset"]) == (True, slow_sse.last_offset)
        assert_contiguous(resumed_sse, slow_sse.last_offset + 1)
        assert all(union[o] == digest for o, digest in resumed_sse.digests[1:] if o is not None)
        check_sse_framing(resumed_sse)

    arun(body(), 100)


async def wait_digest_offset(conn: Conn, offset: int, within: float = 30.0) -> None:
    def reached() -> bool:
        offsets = conn.digest_offsets()
        return conn.ended or bool(offsets and offsets[-1] >= offset)

    await until(reached, within, f"{conn.label}: offset {offset}")
    if conn.ended:
        raise AssertionError(f"{conn.label} was cut off: {conn.close_code} {conn.close_reason}")


@pytest.mark.slow
def test_clients_that_keep_reading_survive_a_stall_of_the_gateway(procs: Starter, serve: Serve) -> None:
    """A reading client is not a slow consumer just because the gateway itself was descheduled.

    The gateway is paused for a second (SIGSTOP: what a loaded machine, a GC pause or a VM
    steal does) while the engine keeps publishing; when it runs again every client socket is
    idle and writable, and each client drains whatever is queued for it at once. None may be cut.
    """
    http_port, pub, replay = free_ports(3)
    gateway = serve(
        procs, http_port, [source_spec("llama", pub, replay)], "--client-queue-bytes", str(SLOW_QUEUE_BYTES)
    )
    start_simulator(procs, pub, replay, "--rate=40", "--events-per-batch=8-12", "--seed=7")
    wait_streams(gateway, [("llama", 0)])

    async def body() -> None:
        async with Clients(gateway) as clients:
            readers = [(await clients.ws(label=f"ws reader {i}"))[0] for i in range(3)]
            readers.append(await clients.sse(label="sse reader"))
            for reader in readers:
                await reader.wait_messages(5)
            os.kill(gateway.proc.popen.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(1.0)  # the stall itself, not a wait for something
            finally:
                os.kill(gateway.proc.popen.pid, signal.SIGCONT)
            target = await gateway.offset_async() + 20
            for reader in readers:
                await until(lambda r=reader: r.ended or r.last_offset >= target, 30, f"{reader.label} at {target}")
            cut = {
                r.label: (r.close_code, r.close_reason) if r.transport == "ws" else r.messages[-1]
                for r in readers
                if r.ended
            }
            disconnects = await gateway.metric_async("kvgateway_client_disconnects_total", reason="slow_consumer")
            assert (cut, disconnects) == ({}, 0), "clients that kept reading were cut off as slow consumers"
            for reader in readers:
                assert_contiguous(reader, reader.hello["offset"] + 1)

    arun(body())


def gateway_holds(gateway_port: int, client_port: int) -> bool:
    """Whether the gateway still holds an established connection from ``client_port`` (Linux /proc)."""
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path) as table:
            next(table)
            for row in table:
                local, remote, state = row.split()[1:4]
                if (
                    int(local.rsplit(":", 1)[1], 16) == gateway_port
                    and int(remote.rsplit(":", 1)[1], 16) == client_port
                ):
                    return state == "01"  # TCP_ESTABLISHED
    return False


CUT_CLIENT_RELEASE_SECONDS = 20.0
"""How long a cut client that never reads again may keep its connection (Mercure: a 5 s dispatch
timeout, Centrifugo: a 1 s write timeout; docs/protocol.md: such a client "is disconnected")."""


@pytest.mark.slow
def test_a_cut_client_that_never_reads_again_is_disconnected(procs: Starter, serve: Serve) -> None:
    """A client that stops reading for good is not only dropped from the hub: its connection is
    closed, so it stops holding a socket, a task and the gateway's send buffer (it no longer counts
    against --max-clients, so nothing else would bound how many such connections pile up)."""
    if not Path("/proc/net/tcp").exists():
        pytest.skip("reads the gateway's sockets from Linux /proc/net/tcp")
    http_port, pub, replay = free_ports(3)
    gateway = serve(
        procs, http_port, [source_spec("llama", pub, replay)], "--client-queue-bytes", str(SLOW_QUEUE_BYTES)
    )
    start_simulator(procs, pub, replay, "--rate=20", "--events-per-batch=8-12", "--seed=8")
    wait_streams(gateway, [("llama", 0)])

    async def body() -> None:
        loop = asyncio.get_running_loop()
        host = f"127.0.0.1:{http_port}"
        ws_sock, sse_sock = stingy_socket(http_port), stingy_socket(http_port)
        try:
            key = base64.b64encode(os.urandom(16)).decode()
            upgrade = (
                f"GET /v1/ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            await loop.sock_sendall(ws_sock, upgrade.encode())
            await loop.sock_sendall(sse_sock, f"GET /v1/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            for transport in ("ws", "sse"):
                await gateway.wait_metric_reaches(
                    "kvgateway_client_disconnects_total", 1, 60, transport=transport, reason="slow_consumer"
                )
            assert await gateway.metric_async("kvgateway_clients") == 0
            ports = {"ws": ws_sock.getsockname()[1], "sse": sse_sock.getsockname()[1]}
            await until(
                lambda: not [t for t, port in ports.items() if gateway_holds(http_port, port)],
                CUT_CLIENT_RELEASE_SECONDS,
                "the gateway to let go of the connections of clients that never read again",
                interval=0.2,
            )
        finally:
            ws_sock.close()
            sse_sock.close()

    arun(body())


# --- token, origin, limits, bad requests --------------------------------------------------------


async def refused_ws(gateway: GatewayProcess, query: str = "", **kwargs: Any) -> Any:
    """The HTTP response that refused a WebSocket handshake."""
    url = gateway.ws_url + (f"?{query}" if query else "")
    with pytest.raises(InvalidStatus) as refused:
        ws = await connect(url, proxy=None, open_timeout=15, **kwargs)
        await ws.close()
    return refused.value.response


def rejections(gateway: GatewayProcess) -> Counter[tuple[str, str]]:
    """kvgateway_client_rejections_total by (transport, reason)."""
    samples = metric_values(gateway.base, "kvgateway_client_rejections_total")
    return Counter({(dict(labels)["transport"], dict(labels)["reason"]): int(v) for labels, v in samples.items()})


def test_a_token_is_required_on_every_v1_endpoint_and_never_logged(guarded: GatewayProcess) -> None:
    unauthorized = {"error": "missing or invalid token"}
    before = rejections(guarded)
    wrong = [
        ({}, ""),  # no token at all
        ({"Authorization": "Bearer not-the-token"}, ""),
        ({}, "token=not-the-token"),
    ]

    async def body() -> None:
        for headers, query in wrong:
            response = await refused_ws(guarded, query, additional_headers=headers)
            assert response.status_code == 401
            assert json.loads(response.body) == unauthorized
            assert response.headers["WWW-Authenticate"] == 'Bearer realm="kvgateway"'
        async with httpx.AsyncClient(base_url=guarded.base, timeout=10, trust_env=False) as http:
            for headers, query in wrong:
                for path in ("/v1/events", "/v1/sources", "/v1/occupancy", "/v1/schema"):
                    response = await http.get(path + (f"?{query}" if query else ""), headers=headers)
                    assert (response.status_code, response.json()) == (401, unauthorized), path
                    assert response.headers["www-authenticate"] == 'Bearer realm="kvgateway"'
            for path in ("/healthz", "/metrics"):  # open: probes and Prometheus carry no token
                assert (await http.get(path)).status_code == 200
            for headers, query in [({"Authorization": f"Bearer {TOKEN}"}, ""), ({}, f"token={TOKEN}")]:
                suffix = f"?{query}" if query else ""
                sources = await http.get("/v1/sources" + suffix, headers=headers)
                assert (sources.status_code, sources.json()["epoch"]) == (200, guarded.epoch())
                occupancy = await http.get("/v1/occupancy" + suffix, headers=headers)
                assert occupancy.status_code == 200
                assert [(s["source"], s["dp_rank"]) for s in occupancy.json()["streams"]] == [("llama", 0)]
                schema = await http.get("/v1/schema" + suffix, headers=headers)
                assert (schema.status_code, schema.content) == (200, SCHEMA_FILE.read_bytes())
        async with Clients(guarded) as clients:
            by_header, _ = await clients.ws()
            by_query, _ = await clients.ws(f"token={TOKEN}", token=False)
            for conn in (by_header, by_query):
                check_fresh_hello(conn, guarded.epoch(), 0)
                await conn.wait_messages(2)
                assert conn.close is not None
                await conn.close()
            await guarded.wait_clients(0)
            sse_by_header = await clients.sse()
            sse_by_query = await clients.sse(f"token={TOKEN}", token=False)
            for conn in (sse_by_header, sse_by_query):
                check_fresh_hello(conn, guarded.epoch(), 0)
                await conn.wait_messages(2)
                check_sse_framing(conn)
                assert conn.close is not None
                await conn.close()
            await guarded.wait_clients(0)

    arun(body())
    after = rejections(guarded)
    assert after[("ws", "unauthorized")] - before[("ws", "unauthorized")] == 3
    assert after[("sse", "unauthorized")] - before[("sse", "unauthorized")] == 3
    assert after[("http", "unauthorized")] - before[("http", "unauthorized")] == 9
    log = guarded.proc.output()
    assert TOKEN not in log
    assert "token=[redacted]" in log  # the WebSocket access line was written, without the token


def test_origin_allow_list(guarded: GatewayProcess, live: GatewayProcess) -> None:
    """WebSocket Origin: the allow-list and the gateway's own origin (its dashboard); no Origin
    (not a browser) is fine; anything else is 403 before the upgrade, before the token is looked at."""
    forbidden = {"error": "origin not allowed"}
    before = {gateway.port: rejections(gateway) for gateway in (guarded, live)}

    async def body() -> None:
        cases = [
            (guarded, ALLOWED_ORIGIN, True),
            (guarded, None, True),
            (guarded, guarded.origin, True),  # the allow-list adds to the gateway's own origin
            (guarded, "http://evil.example", False),
            (live, live.origin, True),
            (live, None, True),
            (live, "http://evil.example", False),
            (live, f"http://127.0.0.1:{live.port + 1}", False),
            (live, "null", False),
        ]
        for gateway, origin, allowed in cases:
            async with Clients(gateway) as clients:
                if allowed:
                    conn, _ = await clients.ws(origin=origin)
                    check_fresh_hello(conn, gateway.epoch(), 0)
                else:
                    headers = gateway.headers()
                    response = await refused_ws(gateway, origin=origin, additional_headers=headers)
                    assert (response.status_code, json.loads(response.body)) == (403, forbidden), origin
            await gateway.wait_clients(0)
        # the origin is checked first: a foreign page is refused even without a token
        response = await refused_ws(guarded, origin="http://evil.example")
        assert response.status_code == 403

    arun(body())
    after = {gateway.port: rejections(gateway) for gateway in (guarded, live)}
    assert after[guarded.port][("ws", "forbidden_origin")] - before[guarded.port][("ws", "forbidden_origin")] == 2
    assert after[live.port][("ws", "forbidden_origin")] - before[live.port][("ws", "forbidden_origin")] == 3
    assert after[guarded.port][("ws", "unauthorized")] == before[guarded.port][("ws", "unauthorized")]


def test_max_clients(guarded: GatewayProcess) -> None:
    """--max-clients 2: a third SSE client gets 503, a third WebSocket is closed with 1013."""
    before = rejections(guarded)

    async def body() -> None:
        await guarded.wait_clients(0)
        async with Clients(guarded) as clients:
            first_sse = await clients.sse()
            first_ws, _ = await clients.ws()
            async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
                response = await http.get(f"{guarded.base}/v1/events", headers=guarded.headers())
            assert (response.status_code, response.json()) == (503, {"error": "too many clients"})
            assert response.headers["retry-after"] == "5"
            third, _ = await clients.ws(wait_hello=False)
            await third.wait_ended()
            assert (third.close_code, third.close_reason, third.messages) == (1013, "too many clients", [])
            # a place frees up: the next client gets in
            assert first_ws.close is not None
            await first_ws.close()
            await guarded.wait_clients(1)
            again, _ = await clients.ws()
            check_fresh_hello(again, guarded.epoch(), first_ws.last_offset)
            await first_sse.wait_messages(2)
            check_sse_framing(first_sse)
        await guarded.wait_clients(0)

    arun(body())
    after = rejections(guarded)
    assert after[("sse", "too_many_clients")] - before[("sse", "too_many_clients")] == 1
    assert after[("ws", "too_many_clients")] - before[("ws", "too_many_clients")] == 1


_ACCEPTED = "(accepted: source, dp_rank, type, medium, last_event_id, snapshot, compat, digest, token)"
BAD_QUERIES = [
    ("sources=llama", f"unknown query parameter 'sources' {_ACCEPTED}"),
    ("Source=llama", f"unknown query parameter 'Source' {_ACCEPTED}"),
    ("dp_rank=-1", "dp_rank: expected a non-negative integer, got '-1'"),
    ("dp_rank=0&dp_rank=one", "dp_rank: expected a non-negative integer, got 'one'"),
    ("source=llama&source=mistral", "source: unknown source 'mistral'"),
    ("dp_rank=0&dp_rank=99", "dp_rank: no configured stream has rank 99 (ranks: 0-1)"),
    ("source=qwen&dp_rank=1", "dp_rank: no configured stream of source 'qwen' has rank 1 (ranks: 0)"),
    ("medium=", "medium: expected a medium name (letters, digits, _.:-), got ''"),
    ("type=Block%20Stored", "type: expected an event type name (letters, digits, _.:-), got 'Block Stored'"),
    ("last_event_id=a:1&last_event_id=a:2", "last_event_id: given more than once"),
    ("compat=gap_until", "compat: expected gap_last or int_seqs, got 'gap_until'"),
]


def test_invalid_query_parameters_are_a_400_before_any_stream(live: GatewayProcess) -> None:
    before = rejections(live)

    async def body() -> None:
        async with httpx.AsyncClient(base_url=live.base, timeout=10, trust_env=False) as http:
            for query, error in BAD_QUERIES:
                response = await http.get(f"/v1/events?{query}")
                assert (response.status_code, response.json()) == (400, {"error": error}), query
                assert response.headers["content-type"] == "application/json"
                ws_response = await refused_ws(live, query)
                assert (ws_response.status_code, json.loads(ws_response.body)) == (400, {"error": error}), query

    arun(body())
    after = rejections(live)
    assert after[("sse", "bad_request")] - before[("sse", "bad_request")] == len(BAD_QUERIES)
    assert after[("ws", "bad_request")] - before[("ws", "bad_request")] == len(BAD_QUERIES)


ROUTES_ACCEPT = {
    "/v1/events": "source, dp_rank, type, medium, last_event_id, snapshot, compat, digest, token",
    "/v1/sources": "source, dp_rank, compat, token",
    "/v1/occupancy": "source, dp_rank, token",
    "/v1/analytics": "source, dp_rank, token",
    "/v1/history": "source, dp_rank, medium, since, step, token",
    "/v1/blocks": "source, dp_rank, format, token",
    "/v1/lookup": "source, dp_rank, token",
    "/v1/schema": "token",
}
"""What each route's 400 lists as accepted: exactly what that route takes (docs/protocol.md)."""


async def _ask(http: httpx.AsyncClient, route: str, query: str) -> httpx.Response:
    if route == "/v1/lookup":
        return await http.post(f"{route}?{query}", json={"block_hashes": ["1"]})
    return await http.get(f"{route}?{query}")


def test_every_route_refuses_a_parameter_it_does_not_take_and_lists_what_it_takes(live: GatewayProcess) -> None:
    before = rejections(live)
    refused = 0

    async def body() -> None:
        nonlocal refused
        async with httpx.AsyncClient(base_url=live.base, timeout=10, trust_env=False) as http:
            for route, accepted in ROUTES_ACCEPT.items():
                response = await _ask(http, route, "sources=llama")
                expected = {"error": f"unknown query parameter 'sources' (accepted: {accepted})"}
                assert (response.status_code, response.json()) == (400, expected), route
                refused += 1
                # a name of the stream that this route does not take is unknown here too
                for name in ("type", "medium", "last_event_id", "snapshot", "compat", "since", "format"):
                    if name in accepted.split(", "):
                        continue
                    response = await _ask(http, route, f"{name}=x")
                    expected = {"error": f"unknown query parameter '{name}' (accepted: {accepted})"}
                    assert (response.status_code, response.json()) == (400, expected), (route, name)
                    refused += 1
                # a bad value of a parameter the route does take names it
                if "dp_rank" in accepted:
                    response = await _ask(http, route, "dp_rank=-1")
                    assert response.json() == {"error": "dp_rank: expected a non-negative integer, got '-1'"}, route
                    refused += 1

    arun(body())
    after = rejections(live)
    counted = sum(after[(t, "bad_request")] - before[(t, "bad_request")] for t in ("http", "sse"))
    assert counted == refused


def test_sources_gives_last_seq_as_a_string_and_as_a_number_only_with_compat_int_seqs(live: GatewayProcess) -> None:
    live.wait_last_seq("qwen", 1)
    plain, numbers = live.get("/v1/sources").json(), live.get("/v1/sources?compat=int_seqs").json()
    assert {type(s["last_seq"]) for s in plain["sources"]} == {str}
    assert all(s["last_seq"].isdigit() for s in plain["sources"])
    assert {type(s["last_seq"]) for s in numbers["sources"]} == {int}
    assert _keys(numbers["sources"]) == _keys(plain["sources"])
    refused = live.get("/v1/sources?compat=ints")
    assert (refused.status_code, refused.json()) == (
        400,
        {"error": "compat: expected gap_last or int_seqs, got 'ints'"},
    )


def test_a_filter_that_names_what_is_not_configured_is_a_400_on_every_route(live: GatewayProcess) -> None:
    """One rule for source and dp_rank (docs/protocol.md): each value must name what the
    configuration has, on the REST routes as on the streams (issue 33, item 8: ``dp_rank=99``
    was a 200 with no streams, ``source=nope`` a 400)."""
    refusals = {
        "source=nope": "source: unknown source 'nope'",
        "dp_rank=99": "dp_rank: no configured stream has rank 99 (ranks: 0-1)",
        "source=qwen&dp_rank=1": "dp_rank: no configured stream of source 'qwen' has rank 1 (ranks: 0)",
    }

    async def body() -> None:
        async with httpx.AsyncClient(base_url=live.base, timeout=10, trust_env=False) as http:
            for route, accepted in ROUTES_ACCEPT.items():
                if "dp_rank" not in accepted:
                    continue
                for query, error in refusals.items():
                    response = await _ask(http, route, query)
                    assert (response.status_code, response.json()) == (400, {"error": error}), (route, query)
            for query, error in refusals.items():
                ws_response = await refused_ws(live, query)
                assert (ws_response.status_code, json.loads(ws_response.body)) == (400, {"error": error}), query

    arun(body())


def _keys(entries: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(entry["source"], entry["dp_rank"]) for entry in entries]


def test_every_per_stream_route_applies_the_streams_source_and_dp_rank(live: GatewayProcess) -> None:
    every = [("llama", 0), ("llama", 1), ("qwen", 0)]
    selections = {
        "": every,
        "source=qwen": [("qwen", 0)],
        "source=llama&dp_rank=1": [("llama", 1)],
        "dp_rank=0": [("llama", 0), ("qwen", 0)],
        "source=llama&source=qwen&dp_rank=1": [("llama", 1)],
    }

    async def body() -> None:
        async with httpx.AsyncClient(base_url=live.base, timeout=10, trust_env=False) as http:
            for query, expected in selections.items():
                sources = (await http.get(f"/v1/sources?{query}")).json()["sources"]
                assert sorted(_keys(sources)) == expected, query
                occupancy = (await http.get(f"/v1/occupancy?{query}")).json()
                assert _keys(occupancy["streams"]) == expected, query
                # the sums are over the streams listed
                blocks = sum(s["tiers"]["GPU"]["blocks"] for s in occupancy["streams"] if "GPU" in s["tiers"])
                assert occupancy["tiers"].get("GPU", {"blocks": 0})["blocks"] == blocks, query
                assert occupancy["tiers"].get("GPU", {"streams": 0})["streams"] == len(expected), query
                analytics = (await http.get(f"/v1/analytics?{query}")).json()
                assert _keys(analytics["streams"]) == expected, query
                assert analytics["prefixes"]["engines"] == len(expected), query  # every one is up
                history = (await http.get(f"/v1/history?{query}")).json()
                assert _keys(history["streams"]) == expected, query
                blocks_doc = (await http.get(f"/v1/blocks?{query}")).json()
                assert _keys(blocks_doc["streams"]) == expected, query
                lookup = (await http.post(f"/v1/lookup?{query}", json={"block_hashes": ["1"]})).json()
                assert sorted(_keys(lookup["streams"])) == expected, query

    arun(body())


_RATE = re.compile(rb'"(stores|removes)_per_s":(-?[0-9.e+-]+)')


def test_rates_are_rounded_to_thousandths_in_the_occupancy_snapshot(live: GatewayProcess) -> None:
    # the rates are sums of per-second counts over a window: as floats they print as 1185.1999999999998
    raw = httpx.get(f"{live.base}/v1/occupancy", timeout=10, trust_env=False).content
    rates = [float(m.group(2)) for m in _RATE.finditer(raw)]
    assert len(rates) >= 20 and any(r > 0 for r in rates)
    too_long = [m.group(0) for m in _RATE.finditer(raw) if len(m.group(2).partition(b".")[2]) > 3]
    assert not too_long, too_long[:5]


def test_an_inbound_websocket_message_above_64_kib_closes_with_1009(live: GatewayProcess) -> None:
    async def body() -> None:
        async with Clients(live) as clients:
            conn, ws = await clients.ws()
            await conn.wait_messages(2)
            await ws.send("x" * 65536)  # at the limit: read and ignored
            await asyncio.wait_for(await ws.ping(), 10)  # the gateway read past it and is still there
            received = len(conn.messages)
            await conn.wait_messages(received + 2)
            assert not conn.ended
            await ws.send("x" * 65537)
            await conn.wait_ended()
            assert conn.close_code == 1009
            assert_contiguous(conn, conn.hello["offset"] + 1)

    arun(body())


# --- the schema ----------------------------------------------------------------------------------


def test_the_schema_endpoint_serves_the_packaged_json_schema(live: GatewayProcess) -> None:
    response = httpx.get(f"{live.base}/v1/schema", timeout=10, trust_env=False)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/schema+json"
    assert response.content == SCHEMA_FILE.read_bytes()
    schema = response.json()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    assert {"hello", "batch", "notice", "BlockStored", "BlockRemoved", "AllBlocksCleared"} <= set(schema["$defs"])


# --- the Node.js client ---------------------------------------------------------------------------


async def run_node(*args: str, token: str | None = None) -> tuple[int, str, str]:
    env = {name: value for name, value in os.environ.items() if name != "KVGATEWAY_TOKEN"}
    if token is not None:
        env["KVGATEWAY_TOKEN"] = token
    proc = await asyncio.create_subprocess_exec(
        *node_command(),
        str(NODE_SCRIPT),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def test_the_node_client_gets_u64_hashes_digit_for_digit(live: GatewayProcess) -> None:
    node_command()
    batches = 12

    async def body() -> tuple[dict[str, Any], Conn]:
        async with Clients(live) as clients:
            python, _ = await clients.ws(label="python")
            code, out, err = await run_node(live.base, str(batches), "both")
            assert code == 0, err
            summary = json.loads(out)
            await python.wait_offset(max(b["offset"] for s in summary.values() for b in s["batches"]))
            return summary, python

    summary, python = arun(body())
    by_offset = python.by_offset()
    assert set(summary) == {"ws", "sse"}
    for transport, result in summary.items():
        hello = result["hello"]
        assert hello["epoch"] == python.hello["epoch"]
        assert hello["recovered"] is False
        assert hello["occupancy_offset"] == hello["offset"] >= python.hello["offset"]
        assert len(result["batches"]) == batches
        offsets = [b["offset"] for b in result["batches"]]
        assert offsets == sorted(offsets) and offsets[0] > hello["offset"]
        hashes = []
        for got in result["batches"]:
            want = by_offset[got["offset"]]
            assert got == {
                "id": want["id"],
                "offset": want["offset"],
                "source": want["source"],
                "dp_rank": want["dp_rank"],
                "seq": want["seq"],
                "block_hashes": [event.get("block_hashes") for event in want["events"]],
            }, transport
            hashes += [h for event in got["block_hashes"] if event is not None for h in event]
        assert hashes and all(isinstance(h, str) and h.isdigit() for h in hashes)
        above = [h for h in hashes if int(h) > U53]
        assert above, "no hash above 2^53 in these batches"
        assert result["hash_types"] == ["string"]  # typeof after JSON.parse: strings, digit for digit
        assert result["above_2_53"] == len(above)
        assert result["lossy_as_number"] == sum(1 for h in hashes if int(float(int(h))) != int(h)) > 0
        window = range(hello["offset"] + 1, offsets[-1] + 1)
        assert result["notices"] == sum(1 for o in window if o in by_offset and by_offset[o]["type"] == "notice")


def test_the_node_client_sends_the_token_and_reports_refusals(guarded: GatewayProcess) -> None:
    node_command()

    async def body() -> None:
        await guarded.wait_clients(0)
        code, out, err = await run_node(guarded.base, "2", "both", token=TOKEN)
        assert code == 0, err
        summary = json.loads(out)
        assert {t: len(s["batches"]) for t, s in summary.items()} == {"ws": 2, "sse": 2}
        await guarded.wait_clients(0)
        code, out, err = await run_node(guarded.base, "2", "sse")
        assert (code, out) == (1, "")
        assert err.strip() == 'kvgateway-client: sse: HTTP 401 {"error":"missing or invalid token"}'
        code, out, err = await run_node(guarded.base, "2", "ws")
        assert (code, out) == (1, "")
        assert "kvgateway-client: websocket: connection failed or refused" in err
        await guarded.wait_clients(0)

    arun(body())


def test_the_protocol_doc_shows_the_node_client_as_it_is() -> None:
    doc = PROTOCOL_DOC.read_text()
    section = doc.split("### JavaScript (Node.js)", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    blocks = re.findall(r"```js\n(.*?)```", section, re.DOTALL)
    assert blocks == [NODE_SCRIPT.read_text()]
    assert "tests/integration/js/kvgateway-client.mjs" in section


def test_the_garbage_collectors_pauses_are_timed_from_the_start(live: GatewayProcess) -> None:
    """kvgateway_gc_pause_seconds: the full collection that freezes start-up's heap (when the server
    is up) is the first generation-2 sample; a fed gateway's young collections follow."""

    def counts() -> dict[str, float]:
        samples = metric_values(live.base, "kvgateway_gc_pause_seconds_count")
        return {dict(labels)["generation"]: value for labels, value in samples.items()}

    assert set(counts()) == {"0", "1", "2"}
    assert counts()["2"] >= 1
    wait_until(lambda: counts()["0"] > 0, timeout=20, what="a young collection while batches flow")
    total = sum(metric_values(live.base, "kvgateway_gc_pause_seconds_sum").values())
    assert 0 < total < 5  # seconds: the whole module's collections, not one pause of that size
