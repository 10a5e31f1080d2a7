"""Resume, end to end: a WebSocket or SSE client that reconnects with the id of the last message it got
receives exactly what it missed; another epoch, an id outside the ring or a malformed one gets a fresh
hello; the compat variants (gap_last, int_seqs) live and on resume."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import (
    BIG_QUEUE,
    GatewayProcess,
    arun,
    free_ports,
    start_sim,
    until,
)
from tests.support import Start as Starter
from tests.support.node import node_command
from tests.support.web import (
    BODY_WITHIN,
    GAP,
    LIVE_STREAMS,
    TEST_WITHIN,
    UNKNOWN_EPOCH,
    WITHIN,
    Clients,
    Conn,
    Filter,
    Serve,
    assert_contiguous,
    check_fresh_hello,
    check_sse_framing,
    expected_messages,
    gap_source,
    run_node,
)

pytestmark = pytest.mark.timeout(TEST_WITHIN)


async def gateway_passes(gateway: GatewayProcess, offset: int, within: float = WITHIN) -> int:
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
            await resumed_filtered.wait_offset(live_from + 1)
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

    arun(body(), BODY_WITHIN)


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

    arun(body(), BODY_WITHIN)


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
                await until(lambda conn=conn: gap_of(conn), WITHIN, f"{conn.label}: the gap notice")
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

    live_conns, resumed, reference = arun(body(), BODY_WITHIN)
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
    gateway = serve(procs, http_port, [spec], client_queue_bytes=BIG_QUEUE)  # no client cut on a loaded machine
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

    summary, strings, numbers = arun(body(), BODY_WITHIN)
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
                await conn.wait_offset(now)
                assert conn.hello["recovered"] is True and conn.offsets()[:30] == list(range(now - 29, now + 1))

    arun(body(), BODY_WITHIN)
