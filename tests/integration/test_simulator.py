"""The simulator over real ZeroMQ sockets: the CLI as a subprocess, and SimulatedEngine in-process."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import msgspec
import pytest
import zmq
import zmq.asyncio

from kvgateway import cli
from kvgateway.engine import wire
from kvgateway.simulator import Faults, SimulatedEngine, Workload, add_arguments, build_engines, encode
from tests.support import (
    Proc,
    Start,
    arun,
    connectable,
    free_ports,
    sim_done,
    sim_endpoints,
    sim_flags,
    source_spec,
    start_gateway,
    start_sim,
    until,
    warmup,
)
from tests.support.replay import Layout, parse_replay_reply, replay_async, replay_sync
from tests.support.simulator import PubMessage, decode_pub

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")
_names = itertools.count()


# --- the real CLI ---------------------------------------------------------------------------


def _collect_live(
    context: zmq.Context[zmq.Socket[bytes]], endpoints: list[str], last_seq: int, timeout: float = 20.0
) -> list[list[tuple[list[bytes], PubMessage]]]:
    """Every message from each PUB endpoint until each has sent ``last_seq``."""
    subs = []
    for endpoint in endpoints:
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
        sub.connect(endpoint)
        subs.append(sub)
    got: list[list[tuple[list[bytes], PubMessage]]] = [[] for _ in endpoints]
    poller = zmq.Poller()
    for sub in subs:
        poller.register(sub, zmq.POLLIN)
    deadline = time.monotonic() + timeout
    try:
        while not all(msgs and msgs[-1][1].seq == last_seq for msgs in got):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"live batches incomplete: {[len(m) for m in got]}"
            for sock, _ in poller.poll(int(remaining * 1000)):
                index = subs.index(sock)
                frames = sock.recv_multipart()
                got[index].append((frames, decode_pub(frames)))
    finally:
        for sub in subs:
            sub.close(linger=0)
    return got


@pytest.mark.parametrize(
    ("layout", "form", "hash_kind", "stop_signal", "numeric_ports"),
    [
        ("topic", "map", "int", signal.SIGTERM, False),
        ("plain", "array", "bytes", signal.SIGINT, True),
    ],
)
def test_cli_two_ranks_live_and_replay(
    layout: Layout, form: str, hash_kind: str, stop_signal: int, numeric_ports: bool
) -> None:
    batches = 120
    if numeric_ports:
        # vLLM's rule: rank r publishes on port + r and replays on replay port + r.
        pub_base, replay_base = free_ports(1, spacing=2, host="")[0], free_ports(1, spacing=2, host="")[0]
        endpoint, replay_endpoint = f"tcp://*:{pub_base}", f"tcp://*:{replay_base}"
    else:
        endpoint = replay_endpoint = "tcp://127.0.0.1:*"  # every rank on its own ephemeral loopback port
    sim = Proc(
        "simulate",
        *[
            *f"--dp-size 2 --rate 100 --batches {batches} --replay-layout {layout} --format {form}".split(),
            *f"--hash {hash_kind} --buffer-steps 1000 --cpu-offload --linger -1 --seed 5".split(),
            *["--endpoint", endpoint, "--replay-endpoint", replay_endpoint],
        ],
        stderr_apart=True,
    )
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        ready = sim_endpoints(sim, 2)
        assert [rank for rank, _, _ in ready] == [0, 1]
        if numeric_ports:
            assert ready[0][1].endswith(f":{pub_base}") and ready[1][1].endswith(f":{pub_base + 1}")
            assert ready[0][2].endswith(f":{replay_base}") and ready[1][2].endswith(f":{replay_base + 1}")
        pubs = [connectable(pub) for _, pub, _ in ready]
        replays = [connectable(rep) for _, _, rep in ready]

        live = _collect_live(context, pubs, batches - 1)
        for rank, messages in enumerate(live):
            assert len(messages) > 20, "most live batches arrive"
            seqs = [m.seq for _, m in messages]
            assert seqs == list(range(seqs[0], batches)), "live seqs are contiguous (slow joiner may miss the first)"
            for _, message in messages:
                assert message.topic == b"kv-events"
                assert message.batch.dp_rank == rank
                for event in message.batch.events:
                    if isinstance(event, wire.BlockStored):
                        assert all(isinstance(h, bytes if hash_kind == "bytes" else int) for h in event.block_hashes)

        for rank, replay in enumerate(replays):
            start = 17 + rank
            items = replay_sync(context, replay, start, layout)
            assert [seq for seq, _ in items] == list(range(start, batches)), "exactly the buffered seqs from start"
            live_payloads = {m.seq: frames[2] for frames, m in live[rank]}
            for seq, payload in items:
                assert wire.decode_batch(payload).dp_rank == rank
                if seq in live_payloads:
                    assert payload == live_payloads[seq], "replay returns the same bytes as live"
            assert replay_sync(context, replay, batches + 100, layout) == [], "nothing newer: only the end marker"

        assert sim.stop(sig=stop_signal) == 0
        out = sim.finished_output()
        assert any(f"rank 1 stopped after {batches} batches" in line for line in out)
    finally:
        context.destroy(linger=0)
        sim.kill()


def test_cli_bad_argument_exits_2_with_one_line() -> None:
    sim = Proc("simulate", "--rate", "-1", stderr_apart=True)
    try:
        assert sim.popen.wait(30) == 2
        err = sim.errors()
        assert err.count("\n") == 1 and "--rate" in err, err
    finally:
        sim.kill()


def test_cli_bind_failure_is_one_line() -> None:
    port = free_ports(1, host="")[0]
    with zmq.Context() as context, context.socket(zmq.PUB) as holder:
        holder.bind(f"tcp://*:{port}")
        sim = Proc("simulate", "--endpoint", f"tcp://*:{port}", "--batches", "1", stderr_apart=True)
        try:
            assert sim.popen.wait(30) == 1
            err = sim.errors()
            assert err.count("\n") == 1 and "cannot open" in err, err
        finally:
            sim.kill()
            holder.close(linger=0)


@pytest.mark.parametrize(
    "argv",
    [
        ["--rate", "-1"],
        ["--rate", "nan"],
        ["--dp-size", "0"],
        ["--format", "xml"],
        ["--hash", "str"],
        ["--replay-layout", "json"],
        ["--skip", "5-2"],
        ["--skip", "x"],
        ["--restart-at", "-3"],
        ["--garbage-at", "a"],
        ["--linger", "-3"],
        ["--endpoint", "localhost:5557"],
        ["--endpoint", "tcp://*:70000"],
        ["--replay-endpoint", "udp://x:1"],
        ["--batches", "-1"],
        ["--buffer-steps", "-1"],
        ["--start-seq", "-1"],
        ["--start-seq", str(2**64 - 1)],
        ["--block-size", "0"],
        ["--gpu-blocks", "0"],
        ["--events-per-batch", "0"],
        ["--replay-delay", "-0.5"],
        ["--clear-every", "-2"],
        ["--engine", "tgi"],
        ["--replay-hwm", "-1"],
        ["--replay-drop", "5-3"],
        ["--replay-drop", "3-5x0"],
        ["--replay-drop", "3-5xa"],
        ["--replay-cut", "x2"],
        ["--replay-cut", "-1"],
        ["--restart-down", "-1"],
        ["--heartbeat", "nan"],
        ["--lose-tail", "-1"],
        ["--drop-queue", "9-2"],
        ["--conversations", "0"],
    ],
)
def test_bad_values_are_one_parser_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["simulate", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvgateway simulate: error:"), err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--replay-dead"], "--replay-endpoint"),
        (["--replay-delay", "1"], "--replay-endpoint"),
        (["--endpoint", "tcp://*:5557", "--replay-endpoint", "tcp://*:5558", "--dp-size", "2"], "collides"),
        (["--endpoint", "tcp://*:65535", "--dp-size", "2"], "65535"),
        (["--cpu-offload", "--cpu-blocks", "2"], "--cpu-blocks"),
        (["--replay-drop", "3-5"], "--replay-endpoint"),
        (["--replay-cut", "3", "--replay-pace"], "--replay-endpoint"),
        (["--restart-down", "1"], "--restart-at"),
        (["--sglang-metadata"], "--engine sglang"),
        (["--routed"], "--dp-size 2"),
    ],
)
def test_inconsistent_options_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_defaults_match_the_brief() -> None:
    parser = cli._Parser(prog="kvgateway simulate")
    add_arguments(parser)
    args = parser.parse_args([])
    assert (args.endpoint, args.replay_endpoint, args.topic, args.dp_size) == ("tcp://*:5557", None, "kv-events", 1)
    # Flavour-dependent options stay None here; the engine fills them in (vLLM's by default).
    assert (args.rate, args.batches, args.format, args.hash, args.replay_layout) == (100.0, None, None, None, None)
    assert (args.buffer_steps, args.linger, args.start_seq, args.skip, args.restart_at) == (10_000, 2.0, None, [], [])
    assert (args.engine, args.replay_hwm, args.replay_pace, args.heartbeat, args.restart_down) == (
        "vllm",
        1000,
        False,
        None,
        None,
    )
    assert (args.lose_tail, args.replay_drop, args.replay_cut, args.drop_queue) == (0, [], None, [])
    args = parser.parse_args(
        ["--skip", "3-5", "--skip", "9", "--restart-at", "4", "--restart-at", "4", "--linger", "-1"]
    )
    assert args.skip == [(3, 5), (9, 9)] and args.restart_at == [4, 4] and args.linger == -1


# --- SimulatedEngine in-process (inproc transport, one shared context) ----------------------


def inproc_sub(context: zmq.asyncio.Context, endpoint: str) -> zmq.asyncio.Socket:
    """A SUB to everything of an inproc PUB, subscribed before the PUB's first send, with no wait:
    an inproc connect writes the subscription into the new pipe and posts the pipe to the PUB,
    which attaches it, reading the subscription, when it next processes its commands, at the
    latest on its first send. (Over TCP the subscription travels on its own: see the restart test.)"""
    assert endpoint.startswith("inproc://"), endpoint
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


@asynccontextmanager
async def engine_and_sub(
    **kwargs: Any,
) -> AsyncIterator[tuple[zmq.asyncio.Context, SimulatedEngine, zmq.asyncio.Socket]]:
    """A started engine on inproc endpoints and a SUB socket already subscribed to it."""
    context = zmq.asyncio.Context()
    name = f"sim-test-{next(_names)}"
    kwargs.setdefault("replay_endpoint", f"inproc://{name}-replay")
    engine = SimulatedEngine(f"inproc://{name}", context=context, **kwargs)
    await engine.start()
    sub = inproc_sub(context, engine.bound_endpoint)
    try:
        yield context, engine, sub
    finally:
        sub.close(linger=0)
        await engine.close()
        context.term()


async def live_until(sub: zmq.asyncio.Socket, engine: SimulatedEngine, within: float = 5.0) -> list[list[bytes]]:
    """Run the engine to completion while reading every live message."""
    runner = asyncio.ensure_future(engine.run())
    got: list[list[bytes]] = []
    async with asyncio.timeout(within):
        while not runner.done() or await sub.poll(50):
            if await sub.poll(20):
                got.append(await sub.recv_multipart())
    await runner
    return got


async def replay_after_run(
    context: zmq.asyncio.Context, engine: SimulatedEngine, start: int, layout: Layout = "topic"
) -> list[tuple[int, bytes]]:
    """Ask a replay of a finished engine, serving replays meanwhile (the CLI's --linger)."""
    endpoint = engine.replay_bound_endpoint
    assert endpoint is not None
    server = asyncio.ensure_future(engine.serve_replays(10.0))
    try:
        return await replay_async(context, endpoint, start, layout)
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server


def seqs_of(messages: list[list[bytes]]) -> list[int]:
    return [wire.parse_seq(frames[1]) for frames in messages]


def test_skip_range_absent_live_but_replayable() -> None:
    async def scenario() -> None:
        async with engine_and_sub(rate=0, batches=12, faults=Faults(skip=((3, 5),))) as (context, engine, sub):
            live = await live_until(sub, engine)
            assert seqs_of(live) == [0, 1, 2, 6, 7, 8, 9, 10, 11]
            assert engine.published == seqs_of(live)
            replayed = await replay_after_run(context, engine, 0)
            assert [seq for seq, _ in replayed] == list(range(12))
            for _, payload in replayed:
                wire.decode_batch(payload)

    arun(scenario())


def test_restart_resets_seq_and_empties_buffer() -> None:
    async def scenario() -> None:
        async with engine_and_sub(rate=0, batches=10, faults=Faults(restart_at=(4,))) as (context, engine, sub):
            live = await live_until(sub, engine)
            assert seqs_of(live) == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
            assert engine.next_seq == 5
            assert live[0][2] != live[5][2], "the new process sends new batches"
            replayed = await replay_after_run(context, engine, 0)
            assert [seq for seq, _ in replayed] == [0, 1, 2, 3, 4]
            assert [payload for _, payload in replayed] == [frames[2] for frames in live[5:]]

    arun(scenario())


def test_restart_listed_twice_fires_twice() -> None:
    async def scenario() -> None:
        async with engine_and_sub(rate=0, batches=9, faults=Faults(restart_at=(2, 2))) as (_, engine, sub):
            assert seqs_of(await live_until(sub, engine)) == [0, 1, 2] * 3

    arun(scenario())


def test_garbage_payload_raises_decode_error_live_and_in_replay() -> None:
    async def scenario() -> None:
        async with engine_and_sub(rate=0, batches=5, faults=Faults(garbage_at=(2,))) as (context, engine, sub):
            live = await live_until(sub, engine)
            assert seqs_of(live) == [0, 1, 2, 3, 4]
            for frames in live:
                if wire.parse_seq(frames[1]) == 2:
                    with pytest.raises(wire.DecodeError):
                        decode_pub(frames)
                else:
                    decode_pub(frames)
            replayed = dict(await replay_after_run(context, engine, 0))
            with pytest.raises(wire.DecodeError):
                wire.decode_batch(replayed[2])

    arun(scenario())


def test_buffer_steps_bound_the_replay() -> None:
    async def scenario() -> None:
        async with engine_and_sub(rate=0, batches=20, buffer_steps=5) as (context, engine, sub):
            await live_until(sub, engine)
            replayed = await replay_after_run(context, engine, 3)
            assert [seq for seq, _ in replayed] == [15, 16, 17, 18, 19], "older history is gone, no error"

    arun(scenario())


@pytest.mark.parametrize(("layout", "form"), [("topic", "map"), ("plain", "array"), ("plain", "map")])
def test_replay_layouts_in_process(layout: Layout, form: str) -> None:
    async def scenario() -> None:
        async with engine_and_sub(rate=0, batches=10, replay_layout=layout, form=form, dp_rank=3) as (
            context,
            engine,
            sub,
        ):
            live = await live_until(sub, engine)
            replayed = await replay_after_run(context, engine, 3, layout)
            assert [seq for seq, _ in replayed] == list(range(3, 10))
            assert [payload for _, payload in replayed] == [frames[2] for frames in live[3:]]
            assert all(wire.decode_batch(payload).dp_rank == 3 for _, payload in replayed)

    arun(scenario())


def test_malformed_replay_requests_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kvgateway.simulator")

    async def scenario() -> None:
        async with engine_and_sub(rate=0, batches=3) as (context, engine, sub):
            await live_until(sub, engine)
            assert engine.replay_endpoint is not None
            server = asyncio.ensure_future(engine.serve_replays())
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(engine.replay_endpoint)
            try:
                await dealer.send_multipart([b"", b"abc"])  # seq not 8 bytes
                await dealer.send_multipart([b"", wire.seq_bytes(0), b"x"])  # extra frame
                await dealer.send_multipart([wire.seq_bytes(0)])  # no empty delimiter
                await dealer.send_multipart([b"x", wire.seq_bytes(0)])  # non-empty delimiter
                await dealer.send_multipart([b"", wire.seq_bytes(1)])  # the only valid one
                replies = []
                while True:
                    seq, _ = parse_replay_reply(await dealer.recv_multipart(), "topic")
                    replies.append(seq)
                    if seq == wire.END_SEQ:
                        break
                assert replies == [1, 2, wire.END_SEQ]
                assert not await dealer.poll(200), "malformed requests get no reply"
            finally:
                dealer.close(linger=0)
                engine.stop()
                await server

    arun(scenario())
    warnings = [r for r in caplog.records if "ignored a replay request" in r.getMessage()]
    assert len(warnings) == 4


def test_replay_delay_answers_late_while_live_goes_on() -> None:
    async def scenario() -> None:
        async with engine_and_sub(rate=100, faults=Faults(replay_delay=0.4)) as (context, engine, sub):
            runner = asyncio.ensure_future(engine.run())
            try:
                await until(lambda: engine.published, what="the run under way")
                assert engine.replay_endpoint is not None
                started = time.monotonic()
                reply = asyncio.ensure_future(replay_async(context, engine.replay_endpoint, 0, within=5))
                live_during = 0
                while not reply.done():
                    if await sub.poll(20):
                        await sub.recv_multipart()
                        live_during += 1
                items = await reply
                assert time.monotonic() - started >= 0.35
                assert items and items[0][0] == 0
                assert live_during >= 5, "publishing continues while the replay is pending"
            finally:
                engine.stop()
                await runner

    arun(scenario())


def test_replay_dead_never_answers() -> None:
    async def scenario() -> None:
        async with engine_and_sub(rate=200, faults=Faults(replay_dead=True)) as (context, engine, sub):
            runner = asyncio.ensure_future(engine.run())
            try:
                assert engine.replay_endpoint is not None
                with pytest.raises(TimeoutError):
                    await replay_async(context, engine.replay_endpoint, 0, within=0.5)
                assert await sub.poll(1000), "live publishing is unaffected"
            finally:
                engine.stop()
                await runner

    arun(scenario())


def test_start_seq_like_tensorrt_llm() -> None:
    first = 1_789_095_808_837_884_700

    async def scenario() -> None:
        async with engine_and_sub(rate=0, batches=3, faults=Faults(start_seq=first)) as (_, engine, sub):
            assert seqs_of(await live_until(sub, engine)) == [first, first + 1, first + 2]

    arun(scenario())


def test_pub_connects_when_endpoint_has_no_wildcard() -> None:
    async def scenario() -> None:
        context = zmq.asyncio.Context()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
        port = sub.bind_to_random_port("tcp://127.0.0.1")  # the consumer binds, vLLM-style
        engine = SimulatedEngine(f"tcp://127.0.0.1:{port}", rate=200, context=context)
        try:
            assert not engine.pub_binds
            runner = asyncio.ensure_future(engine.run())
            assert await sub.poll(5000)
            message = decode_pub(await sub.recv_multipart())
            assert message.topic == b"kv-events" and message.batch.dp_rank == 0
            engine.stop()
            await runner
        finally:
            sub.close(linger=0)
            await engine.close()
            context.term()

    arun(scenario())


def test_stop_ends_an_unbounded_run_promptly() -> None:
    async def scenario() -> None:
        async with engine_and_sub(rate=500) as (_, engine, _sub):
            runner = asyncio.ensure_future(engine.run())
            await until(lambda: engine.published, what="the run under way")
            engine.stop()
            stopped = time.monotonic()
            await runner
            assert time.monotonic() - stopped < 5.0  # ten times a quiet machine's bound: not never
            published = engine.published
            assert published and published == list(range(len(published)))

    arun(scenario())


def test_rate_paces_publishing() -> None:
    async def scenario() -> None:
        async with engine_and_sub(rate=40, batches=8) as (_, engine, sub):
            started = time.monotonic()
            live = await live_until(sub, engine)
            elapsed = time.monotonic() - started
            assert len(live) == 8
            assert 0.15 <= elapsed < 3.0, elapsed

    arun(scenario())


def test_build_engines_offsets_and_shares_system_prompts() -> None:
    engines = build_engines(3, "tcp://*:6000", replay_endpoint="inproc://replay", batches=1, seed=4)
    try:
        assert [e.endpoint for e in engines] == ["tcp://*:6000", "tcp://*:6001", "tcp://*:6002"]
        assert [e.replay_endpoint for e in engines] == ["inproc://replay", "inproc://replay_dp1", "inproc://replay_dp2"]
        assert [e.dp_rank for e in engines] == [0, 1, 2]
        first = [encode.encode_batch(e.workload.next_batch(0.0, e.dp_rank)) for e in engines]
        assert len(set(first)) == 3, "each rank has its own requests"
    finally:
        for engine in engines:
            arun(engine.close())


# --- replay as vLLM serves it: one unpaced loop through a ROUTER at SNDHWM 1000 ---------------


async def _read_reply(
    dealer: zmq.asyncio.Socket, layout: Layout = "topic", quiet: float = 0.3
) -> tuple[list[int], bool]:
    """The seqs of one reply and whether its end marker came; stops after ``quiet`` s of silence."""
    seqs: list[int] = []
    while await dealer.poll(int(quiet * 1000)):
        seq, _ = parse_replay_reply(await dealer.recv_multipart(), layout)
        if seq == wire.END_SEQ:
            return seqs, True
        seqs.append(seq)
    return seqs, False


@asynccontextmanager
async def finished_engine(
    batches: int, **kwargs: Any
) -> AsyncIterator[tuple[zmq.asyncio.Context, SimulatedEngine, zmq.asyncio.Socket]]:
    """An engine that has published ``batches`` (cheap ones) and now serves replays, and a DEALER."""
    kwargs.setdefault("workload", Workload(1, events_per_batch=1, gpu_capacity_blocks=64))
    rcvhwm = kwargs.pop("rcvhwm", 1000)
    async with engine_and_sub(rate=0, batches=batches, **kwargs) as (context, engine, _sub):
        await engine.run()
        assert engine.replay_endpoint is not None
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RCVHWM, rcvhwm)
        dealer.connect(engine.replay_endpoint)
        server = asyncio.ensure_future(engine.serve_replays())
        try:
            yield context, engine, dealer
        finally:
            dealer.close(linger=0)
            engine.stop()
            await server


def test_long_reply_through_the_default_hwm_loses_batches_the_engine_still_holds() -> None:
    """vLLM's own behaviour: the DEALER does not read while the engine sends 5,000 replies in one
    loop; the ROUTER keeps 1,000 (+ the DEALER's 10) and drops the rest and the end marker."""
    total = 5000

    async def scenario() -> None:
        async with finished_engine(total, rcvhwm=10) as (_, engine, dealer):
            await dealer.send_multipart([b"", wire.seq_bytes(0)])
            await asyncio.sleep(0.3)  # not reading while the engine answers
            first, ended = await _read_reply(dealer)
            assert not ended, "the end marker was dropped too"
            assert 1000 <= len(first) < total and first == list(range(len(first)))
            reply = engine.replies[-1]
            assert (reply.planned, reply.sent) == (total, len(first)), "it held every batch to reply from"
            assert reply.hwm_dropped == list(range(len(first), total)), "dropped by the ROUTER, not by a fault"
            # A consumer that asks again from the first missing seq gets the rest, reply by reply.
            got = list(first)
            for _ in range(10):
                await dealer.send_multipart([b"", wire.seq_bytes(got[-1] + 1)])
                await asyncio.sleep(0.1)  # the same slow DEALER: not reading while the engine answers
                more, ended = await _read_reply(dealer)
                assert more and more[0] == got[-1] + 1
                got += more
                if ended:
                    break
            assert got == list(range(total)) and ended

    arun(scenario())


@pytest.mark.parametrize(("replay_hwm", "pace"), [(1000, True), (0, False)])
def test_paced_or_unlimited_replay_never_drops(replay_hwm: int, pace: bool) -> None:
    total = 5000

    async def scenario() -> None:
        async with finished_engine(total, rcvhwm=10, replay_hwm=replay_hwm, replay_pace=pace) as (_, engine, dealer):
            await dealer.send_multipart([b"", wire.seq_bytes(0)])
            await asyncio.sleep(0.3)  # the same slow DEALER
            seqs, ended = await _read_reply(dealer, quiet=1.0)
            assert seqs == list(range(total)) and ended
            assert engine.replies[-1].hwm_dropped == []

    arun(scenario())


def test_replay_drop_leaves_exactly_those_holes_in_the_first_n_replies() -> None:
    faults = Faults(replay_drop=((3, 5, 1), (8, 8, 2)))

    async def scenario() -> None:
        async with finished_engine(12, faults=faults) as (_, engine, dealer):

            async def ask(start: int) -> list[int]:
                await dealer.send_multipart([b"", wire.seq_bytes(start)])
                seqs, ended = await _read_reply(dealer)
                assert ended, "a dropped item is a hole, not a cut: the end marker still comes"
                return seqs

            assert await ask(9) == [9, 10, 11], "a reply without those seqs does not use up the fault"
            assert await ask(0) == [0, 1, 2, 6, 7, 9, 10, 11]
            assert await ask(2) == [2, 3, 4, 5, 6, 7, 9, 10, 11], "3-5 only once, 8 twice"
            assert await ask(0) == list(range(12))
            assert engine.replies[1].fault_dropped == [3, 4, 5, 8] and engine.replies[1].hwm_dropped == []

    arun(scenario())


def test_replay_cut_stops_the_first_n_replies_without_end_marker() -> None:
    async def scenario() -> None:
        async with finished_engine(10, faults=Faults(replay_cut=(4, 2))) as (_, _engine, dealer):
            for start, expected in ((0, [0, 1, 2, 3]), (5, [5, 6, 7, 8])):
                await dealer.send_multipart([b"", wire.seq_bytes(start)])
                assert await _read_reply(dealer) == (expected, False)
            await dealer.send_multipart([b"", wire.seq_bytes(0)])
            assert await _read_reply(dealer) == (list(range(10)), True)

    arun(scenario())


# --- process lifecycle ------------------------------------------------------------------------


def test_real_restart_disconnects_subscribers_and_starts_a_new_process() -> None:
    async def scenario() -> None:
        context = zmq.asyncio.Context()
        engine = SimulatedEngine(
            "tcp://127.0.0.1:*",
            replay_endpoint="tcp://127.0.0.1:*",
            rate=50,
            batches=30,
            faults=Faults(restart_at=(9,), restart_down=0.4),
            context=context,
        )
        await engine.start()
        pub, replay = engine.bound_endpoint, engine.replay_bound_endpoint
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sub.connect(pub)
        # Over TCP a PUB does not tell when a subscription has reached it, and this engine's PUB
        # (vLLM's, not an XPUB) cannot: the one wait with nothing to await (the slow joiner).
        await asyncio.sleep(0.2)
        try:
            runner = asyncio.ensure_future(engine.run())
            live: list[list[bytes]] = []
            disconnected_after: int | None = None
            async with asyncio.timeout(10):
                while not runner.done() or await sub.poll(100):
                    if await monitor.poll(0) and disconnected_after is None:
                        await monitor.recv_multipart()
                        disconnected_after = len(live)
                    if await sub.poll(10):
                        live.append(await sub.recv_multipart())
            await runner
            assert disconnected_after is not None, "the SUB saw the PUB go away"
            seqs = seqs_of(live)
            # The monitor's event and the SUB's last queued batches race inside one loop turn: the
            # old process's tail may be read just after the event. The new process, though, can
            # only be read after it: it starts restart_down seconds later. Split at the restart.
            split = next((i for i in range(1, len(seqs)) if seqs[i] <= seqs[i - 1]), len(seqs))
            assert disconnected_after <= split, "the disconnect is seen before the new process is read"
            assert seqs[:split] == list(range(10)), "the old process, up to the restart"
            disconnected_after = split
            after = seqs[disconnected_after:]
            assert after and after == list(range(after[0], 20)) and after[0] < 10, "the new process counts from 0"
            assert engine.restarts == 1 and engine.bound_endpoint == pub and engine.replay_bound_endpoint == replay
            assert replay is not None
            replayed = await replay_after_run(context, engine, 0)
            assert [seq for seq, _ in replayed] == list(range(20)), "the new process replays only its own batches"
            old = {frames[2] for frames in live[:disconnected_after]}
            assert not old & {payload for _, payload in replayed}
            assert [payload for seq, payload in replayed if seq >= after[0]] == [
                f[2] for f in live[disconnected_after:]
            ]
        finally:
            sub.close(linger=0)
            monitor.close(linger=0)
            await engine.close()
            context.term()

    arun(scenario())


def test_lose_tail_consumes_seqs_that_are_never_sent() -> None:
    """Stopped, the engine loses its tail: seqs consumed and never sent (nor buffered; once stopped it
    answers no replay that could show them)."""

    async def scenario() -> None:
        async with engine_and_sub(rate=200, faults=Faults(lose_tail=3)) as (_, engine, sub):
            runner = asyncio.ensure_future(engine.run())
            await until(lambda: len(engine.published) >= 10, what="ten batches published")
            engine.stop()
            await runner
            live = seqs_of([await sub.recv_multipart() for _ in range(len(engine.published))])
            last = live[-1]
            assert live == list(range(last + 1))
            assert not await sub.poll(200), "nothing after the last published batch"
            assert engine.tail_lost == [last + 1, last + 2, last + 3]
            assert (engine.next_seq, engine.batches_done) == (last + 4, last + 4)

    arun(scenario())


def test_lose_tail_does_not_apply_when_the_batches_are_all_done() -> None:
    async def scenario() -> None:
        async with engine_and_sub(rate=0, batches=5, faults=Faults(lose_tail=3)) as (_, engine, sub):
            assert seqs_of(await live_until(sub, engine)) == [0, 1, 2, 3, 4]
            assert engine.tail_lost == [] and engine.next_seq == 5

    arun(scenario())


# --- engine flavours --------------------------------------------------------------------------


def _raw_events(payload: bytes) -> list[Any]:
    body = msgspec.msgpack.decode(payload)
    assert isinstance(body, list)
    return list(body[1])


def test_sglang_flavour() -> None:
    async def scenario() -> None:
        context = zmq.asyncio.Context()
        name = f"sim-test-{next(_names)}"
        (engine,) = build_engines(
            1,
            f"inproc://{name}",
            replay_endpoint=f"inproc://{name}-replay",
            rate=0,
            batches=120,
            engine="sglang",
            sglang_metadata=True,
            faults=Faults(restart_at=(79,)),
            workload_options={"cpu_offload": True, "gpu_capacity_blocks": 128},
            context=context,
        )
        assert (engine.form, engine.replay_layout, engine.workload.hash_kind) == ("array", "plain", "signed")
        await engine.start()
        sub = inproc_sub(context, engine.bound_endpoint)
        try:
            live = await live_until(sub, engine)
            assert seqs_of(live) == [*range(80), *range(40)]
            for first in (live[0], live[80]):  # after start and after the restart
                assert _raw_events(first[2]) == [["AllBlocksCleared"]]
            hashes: list[int] = []
            mediums: set[str] = set()
            placeholders = 0
            for frames in live:
                for event in _raw_events(frames[2]):
                    assert isinstance(event, list), "SGLang's positional form"
                    mediums.add(
                        event[6] if event[0] == "BlockStored" else event[2] if event[0] == "BlockRemoved" else ""
                    )
                    if event[0] == "BlockStored":
                        assert len(event) == 8 and isinstance(event[7], dict), "metadata map at index 7"
                        assert set(event[7]) == {"cache_salt"}
                        hashes += event[1]
                        placeholders += event[3] == [] and event[4] == 0
                    elif event[0] == "BlockRemoved":
                        assert len(event) == 3
            assert any(h < 0 for h in hashes) and all(isinstance(h, int) for h in hashes), "signed int hashes"
            assert {"GPU", "CPU_PINNED"} <= mediums <= {"GPU", "CPU_PINNED", "DISK", "EXTERNAL", ""}
            assert placeholders > 0
            replayed = await replay_after_run(context, engine, 38, "plain")
            assert [seq for seq, _ in replayed] == [38, 39]
        finally:
            sub.close(linger=0)
            await engine.close()
            context.term()

    arun(scenario())


def test_trtllm_flavour_seq_from_time_ns_and_heartbeats() -> None:
    async def scenario() -> None:
        before = time.time_ns()
        async with engine_and_sub(rate=0, batches=2, engine="trtllm", heartbeat=0.15) as (context, engine, sub):
            after = time.time_ns()
            assert engine.form == "map"
            live = await live_until(sub, engine)
            first = seqs_of(live)[0]
            assert before <= first <= after
            assert seqs_of(live) == [first, first + 1]
            await asyncio.sleep(0)  # no heartbeat while batches flow
            assert engine.heartbeat_seqs == []
            await engine.serve_replays(0.7)  # idle: heartbeats
            beats = [await sub.recv_multipart() for _ in range(len(engine.heartbeat_seqs))]
            assert 3 <= len(beats) <= 5
            assert seqs_of(beats) == list(range(first + 2, first + 2 + len(beats)))
            for frames in beats:
                assert decode_pub(frames).batch.events == []
            replayed = await replay_after_run(context, engine, first)
            assert [seq for seq, _ in replayed][: 2 + len(beats)] == list(range(first, first + 2 + len(beats)))

    arun(scenario())


def test_trtllm_drop_queue_leaves_an_unfillable_gap_then_a_clear_fence() -> None:
    base = 1_800_000_000_000_000_000
    faults = Faults(start_seq=base, drop_queue=((base + 3, base + 5),))

    async def scenario() -> None:
        async with engine_and_sub(rate=0, batches=10, engine="trtllm", faults=faults) as (context, engine, sub):
            live = await live_until(sub, engine)
            expected = [base + i for i in (0, 1, 2, 6, 7, 8, 9)]
            assert seqs_of(live) == expected
            assert engine.queue_dropped == [base + 3, base + 4, base + 5]
            fence = msgspec.msgpack.decode(live[3][2])[1]
            assert fence[0] == {"type": "AllBlocksCleared"} and len(fence) > 1, "a clear, then that batch's events"
            for frames in live[4:]:
                assert not any(isinstance(e, wire.AllBlocksCleared) for e in decode_pub(frames).batch.events)
            for start in (base, base + 3):
                replayed = [seq for seq, _ in await replay_after_run(context, engine, start)]
                assert replayed == [s for s in expected if s >= start], "no replay fills the gap"

    arun(scenario())


def test_flavours_only_change_defaults() -> None:
    engines = [
        *build_engines(1, "inproc://f1", engine="sglang", form="map", replay_layout="topic", hash_kind="int"),
        *build_engines(1, "inproc://f2", engine="trtllm", heartbeat=0),
        *build_engines(1, "inproc://f3", engine="trtllm"),
        *build_engines(1, "inproc://f4"),
    ]
    try:
        sglang, trt_quiet, trt, vllm = engines
        assert (sglang.form, sglang.replay_layout, sglang.workload.hash_kind, sglang.clear_on_start) == (
            "map",
            "topic",
            "int",
            True,
        )
        assert (trt_quiet.heartbeat, trt.heartbeat, vllm.heartbeat) == (0, 5.0, 0)
        assert trt.next_seq > 1_700_000_000 * 10**9 and vllm.next_seq == 0
        assert (vllm.form, vllm.replay_layout, vllm.workload.hash_kind, vllm.replay_hwm) == (
            "map",
            "topic",
            "int",
            1000,
        )
    finally:
        for engine in engines:
            arun(engine.close())


# --- the CLI with the new options -------------------------------------------------------------


def test_cli_sglang_replay_plain_and_wrong_shapes_get_no_answer() -> None:
    sim = Proc(
        "simulate",
        *[
            *["--engine", "sglang", "--sglang-metadata", "--rate", "0", "--batches", "30", "--linger", "-1"],
            *["--endpoint", "tcp://127.0.0.1:*", "--replay-endpoint", "tcp://127.0.0.1:*"],
            *["--replay-drop", "5-6", "--replay-cut", "20x1"],
        ],
        stderr_apart=True,
    )
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        ((_, _, replay),) = sim_endpoints(sim, 1)
        sim_done(sim)  # 30 batches flat out
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(connectable(replay))
        for wrong in ([wire.seq_bytes(0)], [b"", b"abc"], [b"", wire.seq_bytes(0), b""], [b"x", wire.seq_bytes(0)]):
            dealer.send_multipart(wrong)
        assert not dealer.poll(500), "a request of the wrong shape gets no answer at all"
        dealer.send_multipart([b"", wire.seq_bytes(0)])
        first: list[int] = []
        while dealer.poll(500):
            seq, payload = parse_replay_reply(dealer.recv_multipart(), "plain")
            assert seq != wire.END_SEQ, "the cut reply has no end marker"
            first.append(seq)
            if seq == 0:
                assert msgspec.msgpack.decode(payload)[1] == [["AllBlocksCleared"]]
        assert first == [0, 1, 2, 3, 4, *range(7, 22)], "5-6 dropped, then cut after 20 items"
        dealer.close(linger=0)
        assert [seq for seq, _ in replay_sync(context, connectable(replay), 0, "plain")] == list(range(30))
        assert sim.stop() == 0
    finally:
        context.destroy(linger=0)
        sim.kill()


def test_cli_lose_tail_and_real_restart() -> None:
    sim = Proc(
        "simulate",
        *[
            *["--rate", "100", "--restart-at", "49", "--restart-down", "0.2", "--lose-tail", "4"],
            *["--endpoint", "tcp://127.0.0.1:*", "--replay-endpoint", "tcp://127.0.0.1:*"],
        ],
        stderr_apart=True,
    )
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        ((_, pub, _),) = sim_endpoints(sim, 1)
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(connectable(pub))
        seqs: list[int] = []
        deadline = time.monotonic() + 10
        while not (49 in seqs and len(seqs) > seqs.index(49) + 10):
            assert time.monotonic() < deadline and sub.poll(2000), seqs
            seqs.append(wire.parse_seq(sub.recv_multipart()[1]))
        assert sim.stop() == 0
        while sub.poll(300):
            seqs.append(wire.parse_seq(sub.recv_multipart()[1]))
        restart = seqs.index(49) + 1
        assert seqs[restart] < 49, "the seq went back after the restart"
        assert seqs[restart:] == list(range(seqs[restart], seqs[-1] + 1))
        out = sim.finished_output()
        stopped = [line for line in out if "stopped after" in line]
        assert len(stopped) == 1 and stopped[0].endswith(f"(next seq {seqs[-1] + 1 + 4})"), (stopped, seqs[-5:])
        sub.close(linger=0)
    finally:
        context.destroy(linger=0)
        sim.kill()


def test_help_says_whose_behaviour_each_option_is(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--help"])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) < 80, "the help fits a terminal of 80 columns"
    assert not re.search(r"--[a-z]+-\n", out), "no flag broken at its hyphen"
    text = " ".join(out.split())
    for needle in ("vLLM's own behaviour", "SGLang", "TensorRT-LLM", "fault injection", "NOT vLLM's behaviour"):
        assert needle in text
    for flag in (
        "--engine",
        "--sglang-metadata",
        "--heartbeat",
        "--replay-hwm",
        "--replay-pace",
        "--replay-drop",
        "--replay-cut",
        "--restart-down",
        "--lose-tail",
        "--drop-queue",
        "--conversations",
        "--routed",
    ):
        assert flag in text
    # how to reproduce each origin of the gateway's prefill attribution, flags unbroken
    recipes = text[text.index("Where the prefill goes") :]
    for needle in (
        "hit --report-hits",
        "refetch more --conversations than --gpu-blocks",
        "offloaded the same with --cpu-offload",
        "elsewhere --dp-size 2 --routed",
        "new any workload",
    ):
        assert needle in recipes, recipes


RECIPE_BATCHES = 600


def test_each_origin_recipe_of_the_help_through_a_gateway(procs: Start) -> None:
    """The help's recipes, a simulator each, followed by one real gateway: each stream shows the
    origin its options are for (shares of its stored tokens since start, from /v1/analytics)."""
    http, routed, routed_replay, small, small_replay, full, full_replay = free_ports(7, spacing=2)
    gateway = start_gateway(
        procs,
        http,
        [
            source_spec("routed", routed, routed_replay, dp_size=2),
            source_spec("small", small, small_replay),
            source_spec("full", full, full_replay),
        ],
    )
    common = ["--rate", "100", "--batches", str(RECIPE_BATCHES), "--linger", "-1", *warmup(1.0)]
    # a seed each: engines of one seed share system prompts (elsewhere across them)
    start_sim(procs, *sim_flags(routed, routed_replay), "--dp-size", "2", "--routed", "--seed", "5", *common, ranks=2)
    small_flags = ["--gpu-blocks", "1024", "--conversations", "128", "--cpu-offload", "--cpu-blocks", "2048"]
    start_sim(procs, *sim_flags(small, small_replay), *small_flags, "--seed", "6", *common)
    start_sim(procs, *sim_flags(full, full_replay), "--report-hits", "--seed", "7", *common)
    for source, rank in (("routed", 0), ("routed", 1), ("small", 0), ("full", 0)):
        gateway.wait_metric("kvgateway_source_last_seq", RECIPE_BATCHES - 1, 45.0, source=source, dp_rank=str(rank))
    streams = {(s["source"], s["dp_rank"]): s["prefill"] for s in gateway.get("/v1/analytics").json()["streams"]}
    share = {key: prefill["since_start"]["shares"] for key, prefill in streams.items()}
    assert not any(prefill["stale"] or prefill["unattributed_tokens"] for prefill in streams.values()), streams
    assert share[("routed", 0)]["elsewhere"] > 0.1 and share[("routed", 1)]["elsewhere"] > 0.1, share
    assert share[("small", 0)]["refetch"] > 0.1 and share[("small", 0)]["offloaded"] > 0.1, share
    assert share[("full", 0)]["hit"] > 0.3, share
    assert share[("full", 0)]["elsewhere"] == share[("small", 0)]["elsewhere"] == 0, share


def test_new_options_parse() -> None:
    parser = cli._Parser(prog="kvgateway simulate")
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--replay-drop",
            "3-5x2",
            "--replay-drop",
            "7",
            "--replay-cut",
            "100x3",
            "--restart-at",
            "4",
            "--restart-down",
            "--drop-queue",
            "8-9",
            "--engine",
            "trtllm",
            "--heartbeat",
            "0.5",
            "--replay-hwm",
            "0",
            "--lose-tail",
            "2",
        ]
    )
    assert args.replay_drop == [(3, 5, 2), (7, 7, 1)] and args.replay_cut == (100, 3)
    assert (args.restart_down, args.drop_queue, args.engine, args.heartbeat) == (0.0, [(8, 9)], "trtllm", 0.5)
    assert (args.replay_hwm, args.lose_tail) == (0, 2)
    assert parser.parse_args(["--replay-cut", "7", "--restart-down", "1.5"]).replay_cut == (7, 1)
