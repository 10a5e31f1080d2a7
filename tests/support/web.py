"""The web suite's clients, checks and gateways (tests/integration/web, and again on an edge in
tests/cluster/test_cluster_web.py).

Clients: WebSocket clients from the ``websockets`` library and SSE clients over httpx, each keeping every
message in arrival order (:class:`Clients`, :class:`Conn`), and the Node.js example client
``tests/integration/js/kvgateway-client.mjs`` run by ``node`` (:func:`run_node`). Every message a
client receives is collected for the JSON Schema check (:func:`schema_check`), run at the end of each
test by the autouse fixture, so validation never slows a client down while it matters. The filters
and the occupancy a client builds are the suite's own implementations of docs/protocol.md.

The gateways: ``live`` and ``guarded`` (:func:`start_live`, :func:`start_guarded`), shared by every
test of tests/integration/web (its conftest starts each once for the folder) and of
tests/cluster/test_cluster_web.py (once for the module, the fixtures here), and ``gap_gateway``, one
per test. Each is started through the fixture ``serve``: one process in the folder, an edge of a
two-edge cluster in the cluster's test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any, TypeAlias, TypeVar
from urllib.parse import parse_qsl

import httpx
import pytest
from jsonschema import Draft202012Validator, validators
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.support import (
    BIG_QUEUE,
    REPO,
    GatewayProcess,
    Proc,
    Procs,
    free_ports,
    sim_flags,
    source_spec,
    start_sim,
    until,
    wait_until,
)
from tests.support import Start as Starter
from tests.support.node import node_command

T = TypeVar("T")


NODE_SCRIPT = REPO / "tests" / "integration" / "js" / "kvgateway-client.mjs"


SCHEMA_FILE = REPO / "kvgateway" / "protocol" / "schema.json"


PROTOCOL_DOC = REPO / "docs" / "protocol.md"


TOKEN = "tk-5Qx9-web-tests-7Rv2"


ALLOWED_ORIGIN = "http://dashboard.example"


UNKNOWN_EPOCH = "ffffffffffffffff"


U53 = 2**53


WITHIN = 120.0
"""How long the web suite waits for what it awaits (a message, an offset, a notice, a stream up):
ten times and more what a quiet machine takes, so that a loaded one (load 15-30, where the test's
own clients fall behind too) does not fail on it; only a failing test waits this long."""


BODY_WITHIN = 3 * WITHIN
"""A test's whole body on its event loop (:func:`tests.support.arun`), a few waits in a row."""


TEST_WITHIN = 2 * BODY_WITHIN
"""pytest-timeout's bound for a web test with its gateways' start and its schema check: a hang guard."""


_INTEGER = {"type": "integer"}


_items = Draft202012Validator.VALIDATORS["items"]


def _fast_item_checks(schema: dict[str, Any]) -> dict[str, Callable[[Any], bool]]:
    """For an ``items`` schema (as JSON text) that many long arrays use: a plain test that
    passes exactly the items the schema passes (integers: token_ids; a ``$defs`` string with a
    pattern and nothing else: block_hashes). An item it does not pass is validated as usual."""
    checks: dict[str, Callable[[Any], bool]] = {json.dumps(_INTEGER): lambda item: type(item) is int}
    for name, definition in schema.get("$defs", {}).items():
        if set(definition) - {"description"} == {"type", "pattern"} and definition["type"] == "string":
            search = re.compile(definition["pattern"]).search
            checks[json.dumps({"$ref": f"#/$defs/{name}"})] = lambda item, s=search: (
                type(item) is str and s(item) is not None
            )
    return checks


def _validator_class(schema: dict[str, Any]) -> Any:
    """Draft 2020-12 with ``items`` taking :func:`_fast_item_checks`' path; the same verdicts."""
    fast = _fast_item_checks(schema)
    by_id: dict[int, tuple[Any, Callable[[Any], bool] | None]] = {}  # the schema's objects live as long

    def items(validator: Any, items: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if id(items) not in by_id:
            by_id[id(items)] = (items, fast.get(json.dumps(items)) if isinstance(items, dict) else None)
        check = by_id[id(items)][1]
        if check is None or not validator.is_type(instance, "array"):
            yield from _items(validator, items, instance, schema)
            return
        for index, item in enumerate(instance):
            if not check(item):
                yield from validator.descend(item, items, path=index)

    return validators.extend(Draft202012Validator, {"items": items})


class SchemaCheck:
    """Validates each distinct message once. A batch is checked as its envelope (with no events)
    against the whole schema plus each distinct event against ``$defs/event``: the schema puts
    no constraint across array items, so this is the same verdict as the whole message, with
    the events shared by many messages and clients checked once, and an envelope shared by a
    batch's filtered variants (the same fields, fewer events) checked once too."""

    def __init__(self, schema: dict[str, Any]) -> None:
        Draft202012Validator.check_schema(schema)
        validator = _validator_class(schema)
        self.message = validator(schema)
        self.event = validator({k: v for k, v in schema.items() if k != "oneOf"} | {"$ref": "#/$defs/event"})
        self.seen_keys: set[int] = set()
        self.seen_envelopes: set[str] = set()
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
                envelope = {**message, "events": []}
                self._once(self.seen_envelopes, self.message, envelope, line)
                for event in message["events"]:
                    self._once(self.seen_events, self.event, event)
            else:
                self._raise_first(self.message, message, line)
            checked += 1
        return checked

    def _once(self, seen: set[str], validator: Any, instance: Any, text: str | None = None) -> None:
        key = json.dumps(instance, sort_keys=True)
        if key not in seen:
            seen.add(key)
            self._raise_first(validator, instance, text or key)

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


@pytest.fixture(scope="module")
def module_procs() -> Iterator[Starter]:
    """Like conftest's ``procs``, for the gateways the module's tests share."""
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

    wait_until(ready, timeout=WITHIN, what=f"streams {streams} up and delivering")


LIVE_RESTART_AT = 50


Serve: TypeAlias = Callable[..., GatewayProcess]

"""How the module starts a gateway: ``serve(start, port, sources, *flags, token=..., ...)``."""


def start_live(start: Starter, serve: Serve) -> GatewayProcess:
    """Two sources: ``llama`` (2 DP ranks, GPU + CPU offload, a restart, clears) and ``qwen``
    (1 rank, GPU only), behind a gateway whose ring keeps everything its tests see, so a
    client that resumes from ``<epoch>:0`` gets the whole history from offset 1. Its clients are
    never cut as slow consumers (slow clients are test_slow_clients' own gateways): on a loaded
    machine the test's clients, sixteen in one process, fall behind the live stream for a while.
    Its engines are slow (26 batches/s in all): what its tests need is counted in batches (the
    restarts at seq 50, clears, evictions), and test_fanout's clients each read and check the whole
    history, which grows with the time a loaded machine takes to get there."""
    http_port, llama_pub, llama_replay, qwen_pub, qwen_replay = free_ports(5, spacing=2)
    gateway = serve(
        start,
        http_port,
        [source_spec("llama", llama_pub, llama_replay, 2), source_spec("qwen", qwen_pub, qwen_replay)],
        "--ring-messages",
        "1000000",
        "--ring-bytes",
        str(2**30),
        client_queue_bytes=BIG_QUEUE,
    )
    start_simulator(
        start,
        llama_pub,
        llama_replay,
        "--dp-size=2",
        "--cpu-offload",
        "--rate=10",
        f"--restart-at={LIVE_RESTART_AT}",
        "--clear-every=37",
        "--gpu-blocks=256",
        "--cpu-blocks=512",
        "--seed=3",
        ranks=2,
    )
    start_simulator(start, qwen_pub, qwen_replay, "--rate=6", "--gpu-blocks=256", "--seed=4")
    wait_streams(gateway, [("llama", 0), ("llama", 1), ("qwen", 0)])
    return gateway


def start_guarded(start: Starter, serve: Serve) -> GatewayProcess:
    """A gateway with a token, an Origin allow-list, room for 2 clients and a 20-message ring."""
    http_port, pub, replay = free_ports(3)
    gateway = serve(
        start,
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
    start_simulator(start, pub, replay, "--rate=20", "--seed=5")
    wait_streams(gateway, [("llama", 0)])
    wait_until(lambda: gateway.offset() > 45, timeout=WITHIN, what="more than twice the ring")
    return gateway


@pytest.fixture(scope="module")
def live(module_procs: Starter, serve: Serve) -> GatewayProcess:
    """:func:`start_live` once for the module (the web folder's conftest: once for the folder)."""
    return start_live(module_procs, serve)


@pytest.fixture(scope="module")
def guarded(module_procs: Starter, serve: Serve) -> GatewayProcess:
    """:func:`start_guarded` once for the module (the web folder's conftest: once for the folder)."""
    return start_guarded(module_procs, serve)


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

    async def wait_messages(self, count: int, within: float = WITHIN) -> None:
        await until(lambda: len(self.messages) >= count or self._failed(), within, f"{self.label}: {count} messages")
        self._check_alive(len(self.messages) >= count)

    async def wait_offset(self, offset: int, within: float = WITHIN) -> None:
        """Until a message with an offset >= ``offset`` arrived."""
        await until(
            lambda: (self.messages and self.last_offset >= offset) or self._failed(),
            within,
            f"{self.label}: offset {offset}",
        )
        self._check_alive(self.last_offset >= offset)

    async def wait_ended(self, within: float = WITHIN) -> None:
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


GAP = (20, 22)

"""The seqs the engine of the gap test drops before its buffer (TensorRT-LLM's queue overflow):
neither live nor replay brings them, however late the gateway connects."""


def gap_source(pub: int, replay: int) -> tuple[str, list[str]]:
    """The gap test's source, and its engine's endpoints."""
    return source_spec("gap", pub, replay), sim_flags(pub, replay)


@pytest.fixture
def gap_gateway(procs: Starter, serve: Serve) -> tuple[GatewayProcess, list[str]]:
    """A gateway serving one source, ``gap``, and the flags of its engine, not started yet. Its
    clients are never cut as slow consumers: the test's reference client reads everything, and
    on a loaded machine it falls behind a 50 batches/s engine for a while."""
    http_port, pub, replay = free_ports(3)
    spec, engine = gap_source(pub, replay)
    return serve(procs, http_port, [spec], client_queue_bytes=BIG_QUEUE), engine


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
