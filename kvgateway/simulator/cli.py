"""``kvgateway simulate``: :func:`add_arguments` and :func:`run`, N engines for ``--dp-size N``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import signal
import sys
from collections.abc import Callable
from typing import Final

import zmq
import zmq.asyncio

from kvgateway.simulator.engine import (
    EVENT_FORMS,
    MAX_SEQ,
    PUB_HWM,
    REPLAY_LAYOUTS,
    Faults,
    SimulatedEngine,
    build_engines,
)
from kvgateway.simulator.workload import _OFFLOAD_CHUNK_BLOCKS, HASH_KINDS

_ENDPOINT_RE: Final = re.compile(r"^(tcp://.+:(\d+|\*)|ipc://.+|inproc://.+)$")


def _endpoint_arg(value: str) -> str:
    if not _ENDPOINT_RE.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a ZeroMQ endpoint (tcp://HOST:PORT, tcp://*:PORT, ipc://PATH or inproc://NAME)"
        )
    port = value.rpartition(":")[2]
    if value.startswith("tcp://") and port.isdigit() and int(port) > 65535:
        raise argparse.ArgumentTypeError(f"port {port} is above 65535")
    return value


def _int_arg(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if number < minimum or (maximum is not None and number > maximum):
            bound = f"at least {minimum}" if maximum is None else f"between {minimum} and {maximum}"
            raise argparse.ArgumentTypeError(f"{value} must be {bound}")
        return number

    return parse


def _seconds_arg(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number >= 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number >= 0")
    return number


def _linger_arg(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if number == -1:
        return number
    if not number >= 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be >= 0, or -1 for forever")
    return number


def _range_arg(value: str) -> tuple[int, int]:
    low_text, sep, high_text = value.partition("-")
    try:
        low = int(low_text)
        high = int(high_text) if sep else low
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a range like 10-20 (or a single seq)") from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"{value!r} must be A-B with 0 <= A <= B")
    return low, high


def _events_arg(value: str) -> tuple[int, int]:
    low, high = _range_arg(value)
    if low < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: at least 1 event per batch")
    return low, high


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``kvgateway simulate`` options."""
    parser.description = (
        "Run vLLM-compatible KV-event publishers (one per DP rank) with a realistic workload, "
        "a replay endpoint and optional fault injection."
    )
    out = parser.add_argument_group("endpoints")
    out.add_argument(
        "--endpoint",
        type=_endpoint_arg,
        default="tcp://*:5557",
        help="PUB endpoint; binds on '*', '::', ipc:// and inproc://, otherwise connects, like vLLM "
        "(default: %(default)s; rank r uses port + r)",
    )
    out.add_argument(
        "--replay-endpoint",
        type=_endpoint_arg,
        default=None,
        help="ROUTER replay endpoint, always bound (default: none; rank r uses port + r)",
    )
    out.add_argument("--topic", default="kv-events", help="topic frame of every message (default: %(default)s)")
    out.add_argument("--dp-size", type=_int_arg(1, 1024), default=1, help="data-parallel ranks (default: 1)")

    pub = parser.add_argument_group("publishing")
    pub.add_argument("--rate", type=_seconds_arg, default=100.0, help="batches/s per rank, 0 = flat out (default: 100)")
    pub.add_argument("--batches", type=_int_arg(0), default=None, help="stop after N batches per rank (default: never)")
    pub.add_argument("--format", choices=EVENT_FORMS, default="map", help="event encoding (default: map, vLLM >= 0.24)")
    pub.add_argument(
        "--hash", choices=HASH_KINDS, default="int", help="block hash type (default: int, unsigned 64-bit)"
    )
    pub.add_argument(
        "--replay-layout",
        choices=REPLAY_LAYOUTS,
        default="topic",
        help="replay replies with a topic frame (vLLM >= 0.26) or without (older vLLM, SGLang) (default: topic)",
    )
    pub.add_argument(
        "--buffer-steps", type=_int_arg(0), default=10_000, help="batches kept for replay (default: 10000)"
    )
    parser.add_argument(
        "--hwm",
        type=_int_arg(0),
        default=PUB_HWM,
        help="PUB send high-water mark: beyond it batches are dropped silently, as vLLM's are (default: 100000)",
    )
    pub.add_argument(
        "--linger",
        type=_linger_arg,
        default=2.0,
        help="after the last batch keep answering replays this many seconds, -1 = forever (default: 2)",
    )

    work = parser.add_argument_group("workload")
    work.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    work.add_argument("--block-size", type=_int_arg(1, 4096), default=16, help="tokens per block (default: 16)")
    work.add_argument("--gpu-blocks", type=_int_arg(1), default=2048, help="GPU cache size in blocks (default: 2048)")
    work.add_argument("--cpu-offload", action="store_true", help="also copy blocks to a CPU pool (medium CPU)")
    work.add_argument("--cpu-blocks", type=_int_arg(1), default=8192, help="CPU pool size in blocks (default: 8192)")
    work.add_argument(
        "--clear-every", type=_int_arg(0), default=0, help="AllBlocksCleared every N batches (default: 0, never)"
    )
    work.add_argument(
        "--events-per-batch", type=_events_arg, default=(2, 6), help="minimum events per batch, N or A-B (default: 2-6)"
    )

    faults = parser.add_argument_group("fault injection (applied to every rank)")
    faults.add_argument(
        "--skip",
        type=_range_arg,
        action="append",
        default=[],
        metavar="A-B",
        help="do not send seqs A..B live (still replayable); repeatable",
    )
    faults.add_argument(
        "--restart-at",
        type=_int_arg(0),
        action="append",
        default=[],
        metavar="N",
        help="after seq N, restart at seq 0 with an empty replay buffer; repeatable",
    )
    faults.add_argument(
        "--garbage-at", type=_int_arg(0), action="append", default=[], metavar="N", help="undecodable payload for seq N"
    )
    faults.add_argument("--replay-delay", type=_seconds_arg, default=0.0, metavar="S", help="answer replays S s late")
    faults.add_argument("--replay-dead", action="store_true", help="bind the replay ROUTER but never answer")
    faults.add_argument(
        "--start-seq", type=_int_arg(0, MAX_SEQ), default=0, metavar="N", help="first seq (TensorRT-LLM style)"
    )


def _engines_from_args(args: argparse.Namespace, context: zmq.asyncio.Context) -> list[SimulatedEngine]:
    from kvgateway.cli import UsageError

    if args.replay_endpoint is None and (args.replay_dead or args.replay_delay > 0):
        raise UsageError("--replay-dead and --replay-delay need --replay-endpoint")
    if args.cpu_offload and args.cpu_blocks < _OFFLOAD_CHUNK_BLOCKS:
        raise UsageError(f"--cpu-blocks must be at least {_OFFLOAD_CHUNK_BLOCKS} with --cpu-offload")
    try:
        faults = Faults(
            skip=tuple(args.skip),
            restart_at=tuple(args.restart_at),
            garbage_at=tuple(args.garbage_at),
            replay_delay=args.replay_delay,
            replay_dead=args.replay_dead,
            start_seq=args.start_seq,
        )
        engines = build_engines(
            args.dp_size,
            args.endpoint,
            replay_endpoint=args.replay_endpoint,
            topic=args.topic,
            rate=args.rate,
            batches=args.batches,
            form=args.format,
            replay_layout=args.replay_layout,
            buffer_steps=args.buffer_steps,
            hwm=args.hwm,
            seed=args.seed,
            faults=faults,
            workload_options={
                "hash_kind": args.hash,
                "block_size": args.block_size,
                "gpu_capacity_blocks": args.gpu_blocks,
                "cpu_offload": args.cpu_offload,
                "cpu_capacity_blocks": args.cpu_blocks,
                "clear_every": args.clear_every,
                "events_per_batch": args.events_per_batch,
            },
            context=context,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    # vLLM does not notice overlapping port ranges (5557/5558 with 2 ranks); we refuse them.
    seen: dict[str, str] = {}
    for engine in engines:
        for role, ep in (("publish", engine.endpoint), ("replay", engine.replay_endpoint)):
            if ep is None or (role == "publish" and not engine.pub_binds) or ep.endswith((":*", ":0")):
                continue
            what = f"rank {engine.dp_rank}'s {role} endpoint"
            if ep in seen:
                raise UsageError(f"{what} {ep} collides with {seen[ep]}")
            seen[ep] = what
    return engines


async def _simulate(args: argparse.Namespace) -> int:
    context = zmq.asyncio.Context()
    engines: list[SimulatedEngine] = []
    loop = asyncio.get_running_loop()
    stopped = False

    def on_signal() -> None:
        nonlocal stopped
        stopped = True
        for engine in engines:
            engine.stop()

    try:
        engines = _engines_from_args(args, context)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        for engine in engines:
            try:
                await engine.start()
            except zmq.ZMQError as exc:
                replay = "" if engine.replay_endpoint is None else f" / {engine.replay_endpoint}"
                sys.stderr.write(
                    f"kvgateway simulate: error: rank {engine.dp_rank} cannot open {engine.endpoint}{replay}: {exc}\n"
                )
                return 1
        for engine in engines:
            how = "on" if engine.pub_binds else "to"
            suffix = "" if engine.pub_binds else " (connect)"
            print(
                f"simulate: rank {engine.dp_rank} publishing {how} {engine.bound_endpoint}{suffix}"
                f" replay {engine.replay_bound_endpoint or 'none'}",
                flush=True,
            )
        await asyncio.gather(*(engine.run() for engine in engines))
        if not stopped and args.linger != 0:
            seconds = None if args.linger < 0 else args.linger
            await asyncio.gather(*(engine.serve_replays(seconds) for engine in engines))
        for engine in engines:
            print(
                f"simulate: rank {engine.dp_rank} stopped after {engine.batches_done} batches"
                f" (next seq {engine.next_seq})",
                flush=True,
            )
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        for engine in engines:
            await engine.close()
        context.term()


def run(args: argparse.Namespace) -> int:
    """``kvgateway simulate``: returns the exit code (0 after SIGINT/SIGTERM too)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="kvgateway simulate: %(levelname)s: %(message)s")
    with contextlib.suppress(BrokenPipeError):  # stdout closed by the reader: nothing left to tell
        return asyncio.run(_simulate(args))
    return 0
