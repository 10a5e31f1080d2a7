"""Fan-out with filters, end to end: every batch reaches every matching client, WebSocket and SSE, in
order, exactly as docs/protocol.md's filters select, with the occupancy a client builds from the
messages equal to the gateway's."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.support import GatewayProcess, arun, until
from tests.support.web import (
    BODY_WITHIN,
    LIVE_RESTART_AT,
    LIVE_STREAMS,
    TEST_WITHIN,
    WITHIN,
    Clients,
    Conn,
    Filter,
    assert_contiguous,
    check_fresh_hello,
    check_sse_framing,
    check_status_notices,
    exact_occupancy,
    expected_messages,
    occupancy_from_history,
)

pytestmark = pytest.mark.timeout(TEST_WITHIN)


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

            await until(lambda: restarts() == 2, WITHIN, "both llama restarts")
            end = reference.last_offset + 60
            await reference.wait_offset(end + 1)
            for _, conn in [(None, plain_sse), *filtered]:
                await conn.wait_offset(end + 1)  # a later message arrived: everything up to end is in

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

    arun(body(), BODY_WITHIN)
