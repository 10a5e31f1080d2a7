"""Fault injection with real processes and real signals: engines killed, flooded, silent or late,
replay sockets that answer garbage, and the gateway itself killed under 20 WebSocket clients.

Every test watches the gateway from outside only: WebSocket clients, /metrics, /v1/occupancy,
/readyz and its log. What the engine really did comes from the engine side: the simulator's
deterministic workload (:class:`WorkloadOracle`) or the fake engine's own record of what it sent.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import threading
import time
from typing import Any

import pytest
import zmq

from tests.support import (
    BIG_QUEUE,
    GatewayProcess,
    Start,
    arun,
    free_ports,
    sim_flags,
    source_spec,
    start_gateway,
    start_sim,
    until,
    wait_until,
)
from tests.support.clients import ResumingClient
from tests.support.fake_engine import END_SEQ, FakeEngine, good_replies, payload
from tests.support.oracles import WorkloadOracle, event_hashes

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # the waits below are bounds for a loaded machine


def batches_of(messages: list[dict[str, Any]], source: str = "e") -> list[dict[str, Any]]:
    return [m for m in messages if m["type"] == "batch" and m["source"] == source]


def kinds(messages: list[dict[str, Any]]) -> list[str]:
    """The stream notices' kinds (status notices aside: they restate the status, see test_status_board)."""
    return [m["kind"] for m in messages if m["type"] == "notice" and m["kind"] != "status"]


def story(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """("batch", seq) and ("notice", kind, fields): what a client saw, without ids and offsets
    (status notices aside)."""
    out: list[tuple[Any, ...]] = []
    envelope = ("type", "kind", "id", "offset", "source", "dp_rank")
    for m in messages:
        if m["type"] == "notice" and m["kind"] == "status":
            continue
        if m["type"] == "batch":
            out.append(("batch", m["seq"]))
        else:
            out.append(("notice", m["kind"], {k: v for k, v in m.items() if k not in envelope}))
    return out


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """Counters that changed (gauges excluded)."""
    gauges = {"source_up", "source_last_seq", "ingest_queue_depth"}
    return {k: after[k] - before.get(k, 0) for k in after if k not in gauges and after[k] != before.get(k, 0)}


def gpu_blocks(snapshot: dict[str, Any], source: str = "e") -> int:
    (entry,) = [s for s in snapshot["streams"] if s["source"] == source]
    gpu = entry["mediums"].get("GPU")
    return 0 if gpu is None else int(gpu["blocks"])


async def start_client(gateway: GatewayProcess, *, reconnect: bool = False, query: str = "") -> ResumingClient:
    return await ResumingClient(gateway.ws_url, query=query, headers=gateway.headers()).start(reconnect=reconnect)


async def stop_clients(*clients: ResumingClient) -> None:
    await asyncio.gather(*(client.stop() for client in clients))


# --- an engine killed with SIGKILL and started again on the same ports ------------------------


def test_engine_killed_and_restarted_on_the_same_ports(procs: Start) -> None:
    """SIGKILL mid-stream, a new process on the same ports: down, up, exactly one restart, the
    stream's index reset to what the new process announced, and every one of its batches (with
    the events the engine generated) delivered in order."""
    http, pub, rep = free_ports(3)
    new_batches = 120
    first = start_sim(procs, *sim_flags(pub, rep), "--rate", "200", "--seed", "1")
    gateway = start_gateway(procs, http, [source_spec("e", pub, rep)], client_queue_bytes=BIG_QUEUE)

    async def body() -> None:
        client = await start_client(gateway)
        # Far above what the new process reaches before the gateway sees it again.
        await until(lambda: len(batches_of(client.messages)) >= 400, 120, "400 batches of the first process")
        # The catch-up at connect (the engine published before the gateway started) is over first:
        # on a loaded machine it recovered 600 batches after the 400th, and it is not the restart's.
        await until(lambda: gateway.counters("e").get("replay_recovered", 0) >= 1, 120, "the catch-up at connect")
        before = gateway.counters("e")
        first.kill()
        await asyncio.to_thread(gateway.wait_up, "e", False)
        start_sim(
            procs, *sim_flags(pub, rep), "--rate", "100", "--seed", "2", "--batches", str(new_batches), "--linger", "-1"
        )
        down = len(client.messages)  # the down notice comes after this (wait_up saw it)

        def last_batch() -> bool:
            # The last batch, not the last message: a status notice may follow it.
            return any(m["seq"] == new_batches - 1 for m in batches_of(client.messages[down:]))

        await until(last_batch, 120, "the new process's last batch")
        await asyncio.to_thread(gateway.wait_last_seq, "e", new_batches - 1)
        after = gateway.counters("e")
        snapshot = gateway.get("/v1/occupancy").json()
        await stop_clients(client)

        messages = client.messages
        (cut,) = [i for i, m in enumerate(messages) if m["type"] == "notice" and m["kind"] == "down"]
        (up,) = [i for i, m in enumerate(messages) if m["type"] == "notice" and m["kind"] == "up"]
        # The first process's batches, every one before the new connection's up. A few may come
        # after the down: ZeroMQ can hand the reader the dead connection's last batches after its
        # disconnect event (seen at load 15-30); they still continue its seqs, in order.
        old = batches_of(messages[:up])
        old_seqs = [m["seq"] for m in old]
        assert old_seqs == list(range(old_seqs[0], old_seqs[-1] + 1)), "the first process arrived in order"
        tail = [m for m in messages[cut:] if not (m["type"] == "notice" and m["kind"] == "status")]
        assert kinds(tail) == ["down", "up", "restart"]
        tail = [m for m in messages[up:] if not (m["type"] == "notice" and m["kind"] == "status")]
        assert [m["type"] for m in tail[:2]] == ["notice"] * 2, "nothing from the new process before its restart"
        restart = tail[1]
        assert restart["previous"] == old_seqs[-1]
        # After the reconnection the gateway asks the engine for its last delivered batch: the new
        # process does not hold one that old, which gives the restart away at once.
        assert (restart["reason"], restart["seq"]) == ("identity", old_seqs[-1]), restart
        new = batches_of(tail)
        assert [m["seq"] for m in new] == list(range(new_batches)), "every batch of the new process, in order"
        oracle = WorkloadOracle(2)
        for m in new:
            assert event_hashes(m) == oracle.hashes_of(m["seq"]), f"seq {m['seq']} carries the engine's events"

        changed = delta(after, before)
        assert changed.pop("publisher_restarts") == 1
        assert changed.get("unrecovered_batches", 0) == 0
        assert changed.get("decode_errors", 0) == 0
        # The verification and the new process's catch-up both recovered; what the new process sent
        # before the gateway reconnected came back by that catch-up: none when the gateway was back
        # before its first batch, which a loaded machine can do (every batch arrived, in order, above).
        assert changed.get("replay_recovered", 0) >= 2
        assert changed.get("replay_failed", 0) == changed.get("replay_partial", 0) == 0
        assert changed.get("replayed_batches", 0) <= new_batches
        assert after["source_up"] == 1
        (entry,) = snapshot["streams"]
        assert entry["stale"] is False
        assert gpu_blocks(snapshot) == oracle.resident_after(new_batches), "the index holds the new process only"

    arun(body(), 280)


# --- the engine's PUB drops at its high-water mark ---------------------------------------------


def runs(seqs: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive seqs, as (first, last)."""
    out: list[tuple[int, int]] = []
    for seq in sorted(seqs):
        if out and out[-1][1] == seq - 1:
            out[-1] = (out[-1][0], seq)
        else:
            out.append((seq, seq))
    return out


GAP_LINE = re.compile(r"stream e\[0\]: gap, seq (\d+)\.\.(\d+) missing \((\d+) batches\)")


def test_hwm_drops_under_a_flood_are_replayed_and_counted_exactly(procs: Start) -> None:
    """The gateway is frozen (SIGSTOP) while an engine floods it through a PUB socket with a send
    high-water mark of 10: the socket drops what does not fit. The simulator has no HWM option, so
    a fake engine does it with an XPUB and ``XPUB_NODROP``: a send that would be dropped fails
    instead, so the engine knows exactly which seqs the wire lost (and keeps them for replay, as
    vLLM does). The replay answer waits until the gateway has read every live batch, so each
    dropped run is seen as a gap first: the counts are then exact, not just plausible."""
    http, pub, rep = free_ports(3)
    release = threading.Event()

    def delayed_replies(start: int, history: dict[int, bytes]) -> list[list[bytes]]:
        if start == 0:  # the catch-up at connect, before the flood: answered at once
            return good_replies(start, history)
        assert release.wait(60), "the test never released the replay"
        # The engine's buffer as it is now: the request may have come before the tail was published.
        return good_replies(start, dict(engine.history))

    engine = FakeEngine(pub, rep, sndhwm=10, replies=delayed_replies)
    engine.pub.setsockopt(zmq.XPUB_NODROP, 1)
    try:
        gateway = start_gateway(
            procs, http, [source_spec("e", pub, rep)], "--replay-timeout", "60", client_queue_bytes=BIG_QUEUE
        )
        engine.wait_subscribed()
        gateway.wait_up("e")
        # The catch-up at connect finds nothing: the batches below come after it.
        wait_until(lambda: engine.requests == [0], timeout=30, what="the catch-up at connect")

        async def body() -> None:
            client = await start_client(gateway)
            for seq in range(5):
                engine.publish(seq)
            await asyncio.to_thread(gateway.wait_last_seq, "e", 4)
            before = gateway.counters("e")

            flood = range(5, 3005)
            big = payload(5, tokens=4000)  # ~12 KiB: 36 MiB in all, more than the socket buffers hold
            dropped: list[int] = []
            os.kill(gateway.pid, signal.SIGSTOP)
            try:
                for seq in flood:
                    try:
                        engine.publish(seq, big)
                    except zmq.Again:
                        dropped.append(seq)  # XPUB_NODROP: what a PUB would have dropped silently
            finally:
                os.kill(gateway.pid, signal.SIGCONT)
            assert dropped, "the flood did not reach the high-water mark"
            tail = flood.stop
            engine.publish(tail, wait=30)  # queued behind the flood, so the last dropped run is seen too
            live = tail + 1 - 5 - len(dropped)  # live batches since the baseline

            def read_everything() -> bool:
                return gateway.counters("e")["batches_received"] - before["batches_received"] == live

            await asyncio.to_thread(wait_until, read_everything, 60, 0.1, "every live batch read by the gateway")
            # the catch-up at connect, then one replay from the batch before the first drop: rule 11
            # asks from the last delivered seq and checks its bytes before using the reply
            anchor = dropped[0] - 1
            assert engine.requests == [0, anchor], "the catch-up at connect, then one replay from the anchor"
            release.set()
            await until(lambda: client.messages and client.messages[-1].get("seq") == tail, 60, "the tail")
            await asyncio.to_thread(gateway.wait_last_seq, "e", tail)
            after = gateway.counters("e")
            await stop_clients(client)

            assert [m["seq"] for m in batches_of(client.messages)] == list(range(tail + 1))
            assert kinds(client.messages) == [], "no loss, no degraded stream"
            found = [GAP_LINE.search(line) for line in gateway.proc.lines]
            gaps = [tuple(int(g) for g in match.groups()) for match in found if match is not None]
            assert [(a, b) for a, b, _ in gaps] == runs(dropped), "each run the wire dropped is one gap"
            assert all(count == b - a + 1 for a, b, count in gaps)
            # The reply from the anchor, whole. (Once the recovery is over, the stream has been quiet
            # for a while: rule 10's tail probe may ask from the tail too, and get the tail alone.)
            replied = dict(engine.replied)
            assert replied[anchor] == tail + 1 - anchor
            assert engine.requests[2:] in ([], [tail]) and replied.get(tail, 1) == 1, engine.replied
            assert delta(after, before) == {
                "batches_received": live + replied[anchor] - 1,  # the anchor is checked, not received again
                "sequence_gaps": len(runs(dropped)),
                "missed_batches": len(dropped),
                "replay_recovered": 1,
                "replayed_batches": len(dropped),
            }

        arun(body(), 100)
    finally:
        engine.close()


# --- a replay socket that answers garbage -------------------------------------------------------

# (name, reply frames after the ROUTER identity for a request of seq g, the replay's outcome)
MALFORMED: list[tuple[str, Any, str]] = [
    ("one frame", lambda g, body: [[b"", b"garbage"]], "failed"),
    ("empty message", lambda g, body: [[b""]], "failed"),
    ("3-byte seq", lambda g, body: [[b"", b"kv", g.to_bytes(3, "big"), body]], "failed"),
    ("extra frame", lambda g, body: [[b"", b"kv", g.to_bytes(8, "big"), body, b"more"]], "failed"),
    ("no delimiter", lambda g, body: [[b"kv", g.to_bytes(8, "big"), body]], "failed"),
    ("no end marker", lambda g, body: [[b"", b"kv", g.to_bytes(8, "big"), body], [b"", b"oops"]], "recovered"),
    ("undecodable payload", lambda g, body: [[b"", b"kv", g.to_bytes(8, "big"), b"\xc1not msgpack"]], "skipped"),
]


def test_malformed_replay_replies_fail_the_replay_and_not_the_live_stream(procs: Start) -> None:
    """A fake engine publishes real batches and answers each replay with a different malformed
    reply. Each is counted (a failed replay, a decode error, the lost seq unrecovered and
    announced) and the live stream goes on in order; a reply whose frames are right but whose
    payload is not msgpack is a decode error of that seq only (skipped, like a live one)."""
    http, pub, rep = free_ports(3)
    current: list[Any] = []

    def replies(start: int, history: dict[int, bytes]) -> list[list[bytes]]:
        # The catch-up at connect, a request past the end, and any later attempt of the same recovery
        # (a reply that lost its end marker after bringing a batch is asked again from the cursor)
        # get good replies: only the request for the case's gap gets the malformed one. That request
        # asks from the batch before the gap (rule 11: the last delivered, whose bytes the gateway
        # checks first), so the reply begins with it, whole, and goes wrong at the gap.
        if not current or start != current[2] - 1:
            return good_replies(start, history)
        gap = current[2]
        if gap + 1 not in history:
            # Not the case's request but the quiet stream's tail probe (sequencer rule 10: the
            # previous case's tail is this case's anchor), which a loaded machine can bring after
            # the test armed the case and before it published the batch after the gap (a KeyError
            # here when it came before the gap's): the engine answers with what it had sent by
            # then, the tail alone, and made the gap's batch after that.
            return good_replies(start, {seq: body for seq, body in history.items() if seq < gap})
        frames: list[list[bytes]] = [good_replies(start, {start: history[start]})[0], *current[0](gap, history[gap])]
        if current[1] == "skipped":  # well formed, so an end marker follows
            frames.append([b"", b"", END_SEQ, b""])
        return frames

    engine = FakeEngine(pub, rep, replies=replies)
    try:
        gateway = start_gateway(procs, http, [source_spec("e", pub, rep)])
        engine.wait_subscribed()
        gateway.wait_up("e")

        async def body() -> None:
            client = await start_client(gateway)
            for seq in range(3):
                engine.publish(seq)
            await asyncio.to_thread(gateway.wait_last_seq, "e", 2)
            expected: list[tuple[Any, ...]] = [("batch", 0), ("batch", 1), ("batch", 2)]
            degraded = False
            for case, (name, reply, outcome) in enumerate(MALFORMED):
                gap = 3 + 3 * case
                current[:] = [reply, outcome, gap]
                before = gateway.counters("e")
                engine.publish(gap, live=False)
                engine.publish(gap + 1)
                engine.publish(gap + 2)
                await asyncio.to_thread(gateway.wait_last_seq, "e", gap + 2)
                if outcome == "recovered":
                    # A reply without its end marker may have lost its tail: the gateway asks again
                    # from after the last item, and the recovery ends with that answer.
                    await asyncio.to_thread(
                        gateway.wait_metric,
                        "kvgateway_replay_requests_total",
                        before.get("replay_recovered", 0) + 1,
                        30,
                        source="e",
                        outcome="recovered",
                    )
                changed = delta(gateway.counters("e"), before)
                want = {"batches_received": 2, "sequence_gaps": 1, "missed_batches": 1}
                if outcome == "failed":
                    # Nothing usable came back: the loss is no_answer, and the index is stale.
                    want |= {"replay_failed": 1, "decode_errors": 1, "unrecovered_batches": 1}
                    fields = {"first": gap, "until": gap, "count": 1, "reason": "no_answer"}
                    expected.append(("notice", "unrecovered_gap", fields))
                    if not degraded:
                        detail = "1 batches lost (no_answer)"
                        expected.append(("notice", "stale", {"reason": "unrecovered", "seq": gap, "detail": detail}))
                        lost = {"reason": "1 batches unrecovered (no_answer)", "reason_code": "no_answer"}
                        expected.append(("notice", "degraded", lost))
                        degraded = True
                elif outcome == "recovered":
                    # every missing batch came before the garbage: nothing was lost
                    want |= {"batches_received": 3, "replay_recovered": 1, "decode_errors": 1, "replayed_batches": 1}
                    expected.append(("batch", gap))
                else:
                    want |= {"batches_received": 3, "replay_recovered": 1, "decode_errors": 1}
                    detail = "the batch could not be decoded; see the log"
                    expected.append(("notice", "stale", {"reason": "undecodable", "seq": gap, "detail": detail}))
                if outcome == "recovered" and changed.get("batches_received") == want["batches_received"] + 1:
                    # The retry of a reply cut short may race the quiet stream's tail probe, whose
                    # answer (this fake engine's same cut shape) brings one batch again: received,
                    # and one of its two copies dropped, never delivered twice (the story below says
                    # so). Which copy is delivered is the race's: the live one held behind the gap,
                    # or the replayed one, then counted as replayed (seen under a busy process on
                    # each core).
                    changed["batches_received"] -= 1
                    changed.pop("duplicate_batches", None)
                    if changed.get("replayed_batches") == want["replayed_batches"] + 1:
                        changed["replayed_batches"] -= 1
                assert changed == want, name
                expected += [("batch", gap + 1), ("batch", gap + 2)]
            last = 3 + 3 * len(MALFORMED)
            for seq in range(last, last + 20):
                engine.publish(seq)
            expected += [("batch", seq) for seq in range(last, last + 20)]
            await until(lambda: len(story(client.messages)) >= len(expected), 30, "every message")
            await stop_clients(client)
            assert story(client.messages) == expected
            found = [re.search(r"malformed replay reply of (\d+) frames", line) for line in gateway.proc.lines]
            # one log line per bad reply, with its frame count as the gateway's DEALER saw it
            assert [int(m.group(1)) for m in found if m is not None] == [2, 1, 4, 5, 3, 2]
            assert gateway.get("/readyz").status_code == 200

        arun(body(), 100)
    finally:
        engine.close()


# --- an engine that starts after the gateway ---------------------------------------------------


def test_engine_that_starts_after_the_gateway(procs: Start) -> None:
    """The gateway starts first: the stream is down, /readyz is 503 and says why. The engine then
    starts: the stream comes up, and every batch from seq 0 arrives in order (what the gateway's
    subscription missed at first comes by the catch-up replay), with nothing counted lost."""
    http, pub, rep = free_ports(3)
    total = 150
    gateway = start_gateway(procs, http, [source_spec("e", pub, rep)])

    async def body() -> None:
        client = await start_client(gateway)
        (status,) = client.sessions[0].hello["sources"]
        assert (status["state"], status["connected"]) == ("down", False)
        ready = gateway.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["ready"] is False
        (why,) = ready.json()["not_ready"]
        assert why["source"] == "e" and why["reason"] in ("never connected", "connection refused, retrying")
        start_sim(
            procs, *sim_flags(pub, rep), "--rate", "100", "--seed", "4", "--batches", str(total), "--linger", "-1"
        )
        # The last batch, not the last message: a status notice may follow it. A quiet machine needs
        # about 3 s (the engine's start and 150 batches at 100/s).
        await until(lambda: any(m["seq"] == total - 1 for m in batches_of(client.messages)), 120, "the last batch")
        await asyncio.to_thread(gateway.wait_last_seq, "e", total - 1)
        counters = gateway.counters("e")
        snapshot = gateway.get("/v1/occupancy").json()
        await stop_clients(client)

        assert client.messages[0]["type"] == "notice" and client.messages[0]["kind"] == "up"
        assert kinds(client.messages) == ["up"]
        assert [m["seq"] for m in batches_of(client.messages)] == list(range(total))
        for name in ("sequence_gaps", "missed_batches", "unrecovered_batches", "publisher_restarts"):
            assert counters[name] == 0, name
        assert counters["duplicate_batches"] == 0
        assert counters["replay_recovered"] <= 1
        assert gateway.get("/readyz").status_code == 200
        assert gpu_blocks(snapshot) == WorkloadOracle(4).resident_after(total)

    arun(body(), 90)


# --- a replay socket that never answers at connect ---------------------------------------------


def test_a_dead_replay_socket_at_connect_is_no_answer_not_a_truncated_history(procs: Start) -> None:
    """Issue 32, item 6. The engine published seqs 0..31 before the gateway came and still holds
    them, but its ROUTER never replies: the catch-up gets no answer, so nothing says those seqs are
    gone. They are lost ``no_answer`` (unrecovered_gap, stale ``unrecovered``, degraded), never
    ``history_truncated`` with "seqs 0..31 no longer buffered"."""
    http, pub, rep = free_ports(3)
    engine = FakeEngine(pub, rep, replies=lambda start, history: [])  # reads each request, answers none
    try:
        for seq in range(32):
            engine.publish(seq, live=False)  # in the engine's buffer, never seen live by the gateway
        gateway = start_gateway(procs, http, [source_spec("e", pub, rep)], "--replay-timeout", "0.5")
        engine.wait_subscribed()
        gateway.wait_up("e")

        async def body() -> None:
            client = await start_client(gateway)
            for seq in range(32, 35):
                engine.publish(seq)
            await asyncio.to_thread(gateway.wait_last_seq, "e", 34)
            await until(lambda: len(batches_of(client.messages)) == 3, 30, "the three live batches")
            status = gateway.get("/v1/sources").json()["sources"][0]
            await stop_clients(client)

            said = [
                (kind, {k: str(v) for k, v in fields.items()})  # seqs as text: whatever their JSON type
                for what, kind, fields in (m for m in story(client.messages) if m[0] == "notice")
                if kind != "up"
            ]
            assert said == [
                ("unrecovered_gap", {"first": "0", "until": "31", "count": "32", "reason": "no_answer"}),
                ("stale", {"reason": "unrecovered", "seq": "0", "detail": "32 batches lost (no_answer)"}),
                ("degraded", {"reason": "32 batches unrecovered (no_answer)", "reason_code": "no_answer"}),
            ]
            assert [int(m["seq"]) for m in batches_of(client.messages)] == [32, 33, 34]
            assert (status["stale_reason"], status["counters"]["history_truncations"]) == ("unrecovered", 0)
            assert engine.requests and set(engine.requests) == {0}  # it was asked, from seq 0
            assert engine.replied == [(0, 0)] * len(engine.requests)  # and answered nothing

        arun(body(), 90)
    finally:
        engine.close()


# --- a long silence ---------------------------------------------------------------------------


def test_a_long_silence_is_neither_a_restart_nor_a_gap(procs: Start) -> None:
    """An idle engine publishes nothing: silence does not mean dead. The engine is frozen with
    SIGSTOP for 5 s; the stream stays up and ready, and when it resumes the seqs simply go on."""
    http, pub, rep = free_ports(3)
    sim = start_sim(procs, *sim_flags(pub, rep), "--rate", "100", "--seed", "5")
    gateway = start_gateway(procs, http, [source_spec("e", pub, rep)])

    async def body() -> None:
        client = await start_client(gateway)
        await until(lambda: len(batches_of(client.messages)) >= 50, 30, "50 batches")
        # The catch-up at connect (the engine published before the gateway started) is over first:
        # on a loaded machine its reply can come after the 50th batch, and it is not the silence's.
        await until(lambda: gateway.counters("e").get("replay_recovered", 0) >= 1, 60, "the catch-up at connect")
        before = gateway.counters("e")
        seen = len(client.messages)
        os.kill(sim.popen.pid, signal.SIGSTOP)
        try:
            # What was in flight when the engine froze arrives first: wait for a quiet second.
            quiet_at = -1
            while quiet_at != len(client.messages):
                quiet_at = len(client.messages)
                await asyncio.sleep(1.0)
            silent_from = time.monotonic()
            while time.monotonic() - silent_from < 5:
                await asyncio.sleep(0.25)
                assert gateway.get("/readyz").status_code == 200, "silence is not a failure"
            assert len(client.messages) == quiet_at, "the engine really was silent"
            (status,) = gateway.get("/v1/sources").json()["sources"]
            assert (status["state"], status["connected"]) == ("up", True)
        finally:
            os.kill(sim.popen.pid, signal.SIGCONT)
        await until(lambda: len(batches_of(client.messages[quiet_at:])) >= 50, 30, "50 batches after the silence")
        after = gateway.counters("e")
        await stop_clients(client)

        seqs = [m["seq"] for m in batches_of(client.messages)]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "no gap and no restart across the silence"
        assert kinds(client.messages[seen:]) == []
        changed = delta(after, before)
        assert changed.pop("batches_received") >= 50
        changed.pop("unknown_removes", None)  # the workload's own removes of never-stored hashes
        assert changed == {}, "no gap, no replay, no restart, no duplicate"

    arun(body(), 90)


# --- the gateway killed under 20 clients ---------------------------------------------------------


def test_gateway_killed_and_restarted_under_20_websocket_clients(procs: Start) -> None:
    """SIGKILL the gateway while 20 WebSocket clients read; start it again on the same port. Every
    client reconnects by itself with its last id and gets ``recovered: false`` (a new epoch: the
    old ring is gone) with a fresh snapshot in its hello, exactly the engine's cache at that point."""
    http, pub, rep = free_ports(3)
    start_sim(procs, *sim_flags(pub, rep), "--rate", "50", "--seed", "3")
    # Big client queues: the 20 clients read in this test's process, which a loaded machine
    # starves, and a hello with a snapshot and the catch-up behind it must not cut them.
    first = start_gateway(procs, http, [source_spec("e", pub, rep)], client_queue_bytes=BIG_QUEUE)
    old_epoch = first.epoch()
    oracle = WorkloadOracle(3)

    async def body() -> None:
        clients = [ResumingClient(first.ws_url) for _ in range(20)]
        for client in clients:
            await client.start(reconnect=True)
        await until(lambda: all(len(c.messages) >= 5 for c in clients), 120, "5 messages for every client")
        first.proc.kill()
        await until(lambda: all(c.sessions[0].close_code is not None for c in clients), 60, "every client cut")
        last_ids = [c.last_id for c in clients]
        again = [source_spec("e", pub, rep)]
        second = await asyncio.to_thread(start_gateway, procs, http, again, client_queue_bytes=BIG_QUEUE)

        def reconnected(c: ResumingClient) -> bool:
            return len(c.sessions) == 2 and any(m["type"] == "batch" for m in c.sessions[1].messages)

        try:
            await until(lambda: all(reconnected(c) for c in clients), 120, "every client back with a batch")
        except AssertionError as exc:  # what each client has: the next run under load says why
            seen = [(len(c.sessions), len(c.sessions[-1].messages), c.connect_failures) for c in clients]
            raise AssertionError(f"{exc}; (sessions, last session's messages, failed connects): {seen}") from None
        new_epoch = second.epoch()
        resumes = {
            recovered: second.metric("kvgateway_resumes_total", transport="ws", recovered=recovered)
            for recovered in ("true", "false")
        }
        connected = second.metric("kvgateway_clients", transport="ws")
        await stop_clients(*clients)

        assert new_epoch != old_epoch
        assert resumes == {"true": 0, "false": 20}, "each client asked to resume, none could be"
        assert connected == 20
        for client, last_id in zip(clients, last_ids, strict=True):
            before, after = client.sessions
            assert before.hello["epoch"] == old_epoch
            assert before.close_code == 1006, "the connection was lost, not closed"
            assert last_id is not None and last_id.startswith(old_epoch + ":")
            hello = after.hello
            assert (hello["epoch"], hello["recovered"]) == (new_epoch, False)
            occupancy = hello["occupancy"]
            assert occupancy is not None and occupancy["offset"] == hello["offset"]
            assert [(s["source"], s["dp_rank"]) for s in hello["sources"]] == [("e", 0)]
            batches = batches_of(after.messages)
            assert all(m["id"].startswith(new_epoch + ":") for m in after.messages)
            offsets = [m["offset"] for m in after.messages]
            assert offsets == list(range(hello["offset"] + 1, hello["offset"] + 1 + len(offsets)))
            seqs = [m["seq"] for m in batches]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            # The new gateway rebuilt its index from seq 0 (catch-up replay), in order: the
            # snapshot is the engine's cache after every batch before the first one that follows.
            assert gpu_blocks(occupancy) == oracle.resident_after(seqs[0]), f"snapshot at seq {seqs[0]}"

    arun(body(), 280)


# --- a client that drops and resumes inside the ring ---------------------------------------------


def type_filtered(messages: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """What a ``type=<kind>`` client gets (docs/protocol.md): batches cut to the matching events
    and left out when none is left; notices unchanged."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["type"] != "batch":
            out.append(m)
            continue
        events = [e for e in m["events"] if e["type"] == kind]
        if events:
            out.append({**m, "events": events})
    return out


def test_clients_that_lose_their_connection_resume_inside_the_ring_and_lose_nothing(procs: Start) -> None:
    """Four clients (two of them filtered) lose their TCP connection three times each, abruptly
    (no closing handshake), while the engine restarts and a gap is replayed. Each reconnects with
    its last id: recovered every time, and what all its connections got together is exactly what a
    client that never dropped got over the same span (through the same filter)."""
    http, pub, rep = free_ports(3)
    sim = start_sim(
        procs, *sim_flags(pub, rep), "--rate", "100", "--seed", "6", "--restart-at", "250", "--skip", "100-109"
    )
    queries = ["", "", "type=BlockStored", "type=BlockRemoved"]

    async def body() -> None:
        # The engine held until every client reads: on a loaded machine the gateway and the clients
        # started after its restart (2.5 s in), and the reference saw none.
        with sim.held():
            # Big client queues: the five clients read in this test's process, which a loaded
            # machine starves; a slow-consumer cut would be one more resume than the test's.
            flags = [source_spec("e", pub, rep)]
            gateway = await asyncio.to_thread(start_gateway, procs, http, flags, client_queue_bytes=BIG_QUEUE)
            epoch = gateway.epoch()
            reference = await ResumingClient(gateway.ws_url).start()
            droppers = [await ResumingClient(gateway.ws_url, query=q).start(reconnect=True) for q in queries]
        for round_ in range(1, 4):
            await until(lambda r=round_: all(c.connected_sessions() == r for c in droppers), 120, "reconnected")
            await asyncio.sleep(0.4)  # the clients read for a while
            for client in droppers:
                await client.drop()
            await asyncio.sleep(0.3)  # messages they miss while away
        await until(lambda: all(len(c.sessions) == 4 for c in droppers), 120, "every client reconnected 3 times")

        # Past the engine's restart (batch 250), whenever the machine lets it come.
        def restarted() -> bool:
            return any(m["type"] == "notice" and m["kind"] == "restart" for m in reference.messages)

        await until(restarted, 120, "the restart")
        end = gateway.offset() + 20
        everyone = [reference, *droppers]
        await until(lambda: all(c.messages and c.messages[-1]["offset"] >= end for c in everyone), 120, "the end")
        resumes = gateway.metric("kvgateway_resumes_total", transport="ws", recovered="true")
        await stop_clients(*everyone)

        assert resumes == 12
        assert any(m["type"] == "notice" and m["kind"] == "restart" for m in reference.messages)
        by_offset = {m["offset"]: m for m in reference.messages}
        for client, query in zip(droppers, queries, strict=True):
            for previous, session in itertools.pairwise(client.sessions):
                hello = session.hello
                resumed_from = previous.messages[-1]["offset"] if previous.messages else previous.hello["offset"]
                assert (hello["epoch"], hello["recovered"], hello["offset"]) == (epoch, True, resumed_from)
                assert hello["occupancy"] is None
                assert previous.close_code == 1006
            # The clients are stopped one after the other while messages still flow: compare up
            # to the last offset the reference saw.
            last_seen = reference.messages[-1]["offset"]
            got = [m for s in client.sessions for m in s.messages if m["offset"] <= last_seen]
            start, stop = client.sessions[0].hello["offset"], got[-1]["offset"]
            span = [by_offset[o] for o in range(start + 1, stop + 1)]
            want = type_filtered(span, query.partition("=")[2]) if query else span
            assert got == want, f"client {query!r} lost or repeated messages"

    arun(body(), 280)
