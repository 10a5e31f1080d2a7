"""The simulator over real ZeroMQ sockets: the CLI as a subprocess, and SimulatedEngine in-process."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
import zmq
import zmq.asyncio

from kvgateway import cli, wire
from kvgateway.simulator import Faults, SimulatedEngine, add_arguments, build_engines

from ._sim_helpers import (
    Layout,
    SimulatorProcess,
    connectable,
    free_port_block,
    parse_replay_reply,
    replay_async,
    replay_sync,
)

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")
_names = itertools.count()


def arun(coro: Coroutine[Any, Any, T], timeout: float = 20.0) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


# --- the real CLI ---------------------------------------------------------------------------


def _collect_live(
    context: zmq.Context[zmq.Socket[bytes]], endpoints: list[str], last_seq: int, timeout: float = 20.0
) -> list[list[tuple[list[bytes], wire.Message]]]:
    """Every message from each PUB endpoint until each has sent ``last_seq``."""
    subs = []
    for endpoint in endpoints:
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
        sub.connect(endpoint)
        subs.append(sub)
    got: list[list[tuple[list[bytes], wire.Message]]] = [[] for _ in endpoints]
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
                got[index].append((frames, wire.decode_message(frames)))
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
        pub_base, replay_base = free_port_block(2), free_port_block(2)
        endpoint, replay_endpoint = f"tcp://*:{pub_base}", f"tcp://*:{replay_base}"
    else:
        endpoint = replay_endpoint = "tcp://127.0.0.1:*"  # every rank on its own ephemeral loopback port
    sim = SimulatorProcess(
        [
            *f"--dp-size 2 --rate 100 --batches {batches} --replay-layout {layout} --format {form}".split(),
            *f"--hash {hash_kind} --buffer-steps 1000 --cpu-offload --linger -1 --seed 5".split(),
            *["--endpoint", endpoint, "--replay-endpoint", replay_endpoint],
        ]
    )
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        ready = sim.wait_ready(2)
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

        assert sim.stop(stop_signal) == 0
        out = [line for line in iter(sim.lines.get, None)]
        assert any(f"rank 1 stopped after {batches} batches" in line for line in out)
    finally:
        context.destroy(linger=0)
        sim.kill()


def test_cli_bad_argument_exits_2_with_one_line() -> None:
    sim = SimulatorProcess(["--rate", "-1"])
    try:
        assert sim.proc.wait(30) == 2
        assert sim.proc.stderr is not None
        err = sim.proc.stderr.read()
        assert err.count("\n") == 1 and "--rate" in err, err
    finally:
        sim.kill()


def test_cli_bind_failure_is_one_line() -> None:
    port = free_port_block(1)
    with zmq.Context() as context, context.socket(zmq.PUB) as holder:
        holder.bind(f"tcp://*:{port}")
        sim = SimulatorProcess(["--endpoint", f"tcp://*:{port}", "--batches", "1"])
        try:
            assert sim.proc.wait(30) == 1
            assert sim.proc.stderr is not None
            err = sim.proc.stderr.read()
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
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(engine.bound_endpoint)
    await asyncio.sleep(0.05)  # let the subscription reach the PUB socket
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
    assert engine.replay_endpoint is not None
    server = asyncio.ensure_future(engine.serve_replays(10.0))
    try:
        return await replay_async(context, engine.replay_endpoint, start, layout)
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
                        wire.decode_message(frames)
                else:
                    wire.decode_message(frames)
            replayed = dict(await replay_after_run(context, engine, 0))
            with pytest.raises(wire.DecodeError):
                wire.decode_batch(replayed[2])

    arun(scenario())


def test_buffer_steps_bound_the_replay() -> None:
    async def scenario() -> None:
        async with engine_and_sub(rate=0, batches=20, buffer_steps=5) as (context, engine, sub):
            await live_until(sub, engine)
            assert engine.buffered_seqs == [15, 16, 17, 18, 19]
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
                await asyncio.sleep(0.1)
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
            message = wire.decode_message(await sub.recv_multipart())
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
            await asyncio.sleep(0.1)
            engine.stop()
            stopped = time.monotonic()
            await runner
            assert time.monotonic() - stopped < 0.5
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
        first = [wire.encode_batch(e.workload.next_batch(0.0, e.dp_rank)) for e in engines]
        assert len(set(first)) == 3, "each rank has its own requests"
    finally:
        for engine in engines:
            arun(engine.close())
