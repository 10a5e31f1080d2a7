"""``kvgateway simulate``: :func:`add_arguments` and :func:`run`, N engines for ``--dp-size N``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import textwrap
from collections.abc import Callable
from typing import Final

import zmq
import zmq.asyncio

from kvgateway.engine.endpoints import endpoint_problem
from kvgateway.engine.wire import Stream
from kvgateway.simulator.engine import (
    ENGINE_FLAVOURS,
    EVENT_FORMS,
    MAX_SEQ,
    PUB_HWM,
    REPLAY_HWM,
    REPLAY_LAYOUTS,
    Faults,
    SimulatedEngine,
    build_engines,
)
from kvgateway.simulator.workload import (
    _OFFLOAD_CHUNK_BLOCKS,
    DEFAULT_CONVERSATIONS,
    HASH_KINDS,
    ROUTED_REQUESTS_PER_BATCH,
)

_HELP_WIDTH: Final = 79

ORIGIN_RECIPES: Final = (
    ("hit", "--report-hits: the engine re-announces the prefix it reused, as vLLM's full report mode does"),
    (
        "refetch",
        "more --conversations than --gpu-blocks holds, e.g. --gpu-blocks 1024 --conversations 128: a "
        "conversation comes back after its history was evicted (within the gateway's 60 s refetch window)",
    ),
    ("offloaded", "the same with --cpu-offload: what the CPU tier kept is loaded back, the rest is refetch"),
    (
        "elsewhere",
        "--dp-size 2 --routed: the ranks take one request sequence at random, so a conversation's next "
        "turn often lands on the rank that did not compute its history (without --routed the ranks share "
        "only system prompts, which a roomy cache stores once)",
    ),
    ("new", "any workload: new conversations, new turns and one-shot requests"),
)
"""The epilog's recipe per origin of the gateway's prefill attribution."""


def _fill(text: str, first: str = "", rest: str = "") -> str:
    """``text`` in lines that fit the help's width once argparse indents them (an argument group's
    description by 2), never broken at a flag's hyphen."""
    return textwrap.fill(
        text, width=_HELP_WIDTH - 2, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    )


class UsageError(Exception):
    """Arguments that do not go together: printed as one line, exit code 2."""


def _endpoint_arg(value: str) -> str:
    problem = endpoint_problem(value, wildcard_port=True)
    if problem is not None:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a ZeroMQ endpoint (tcp://HOST:PORT, tcp://*:PORT, ipc://PATH or inproc://NAME): "
            + problem
        )
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


def _times(value: str) -> Stream:
    """``TEXT[xN]`` -> (TEXT, N), N = 1 when absent."""
    text, sep, times_text = value.partition("x")
    if not sep:
        return value, 1
    if not times_text.isdigit() or int(times_text) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: the count after 'x' must be a positive integer")
    return text, int(times_text)


def _replay_drop_arg(value: str) -> tuple[int, int, int]:
    text, times = _times(value)
    low, high = _range_arg(text)
    return low, high, times


def _replay_cut_arg(value: str) -> tuple[int, int]:
    text, times = _times(value)
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not K or KxN (K items, N replies)")
    return int(text), times


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``kvgateway simulate`` options."""
    parser.description = (
        "Run KV-event publishers (one per DP rank) that behave like vLLM's ZmqEventPublisher by default "
        "(--engine sglang / trtllm: like SGLang or TensorRT-LLM), with a realistic workload, a replay "
        "endpoint and deterministic fault injection. Each option's help says whose behaviour it is: "
        "vLLM's own, SGLang's, TensorRT-LLM's, or fault injection (no engine does it on purpose)."
    )
    # Laid out here (RawDescription): argparse's own filling breaks "--cpu-offload" at its hyphen.
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = _fill(parser.description)
    parser.epilog = "\n".join(
        [
            "Where the prefill goes (docs/operations.md): how to reproduce each origin:",
            *(_fill(text, f"  {origin:<11}", " " * 13) for origin, text in ORIGIN_RECIPES),
            "kvgateway demo runs all five at once.",
        ]
    )
    out = parser.add_argument_group("endpoints (vLLM's own conventions)")
    out.add_argument(
        "--endpoint",
        type=_endpoint_arg,
        default="tcp://*:5557",
        help="PUB endpoint; binds on a wildcard host or port ('*', '0.0.0.0', '[::]'), ipc:// and "
        "inproc://, otherwise connects, like vLLM (which also binds any address containing '::') "
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

    flavour = parser.add_argument_group(
        "engine flavour",
        _fill(
            "--engine only changes defaults; an explicit --format, --hash, --replay-layout, --heartbeat or "
            "--start-seq wins. vllm: map events, unsigned int hashes, replies with a topic frame, seq from 0. "
            "sglang: array events, signed hashes, the first batch of every process is AllBlocksCleared, "
            "replies without a topic frame, offload tier medium CPU_PINNED (unknown removes also DISK and "
            "EXTERNAL). trtllm: map events, seq from time.time_ns() at process start, a heartbeat every 5 s.",
        ),
    )
    flavour.add_argument(
        "--engine", choices=ENGINE_FLAVOURS, default="vllm", help="whose publisher to imitate (default: vllm)"
    )
    flavour.add_argument(
        "--sglang-metadata",
        action="store_true",
        help="SGLang (a variant): every BlockStored carries a metadata map {'cache_salt': ...}; in the "
        "array form it is the element at index 7, where vLLM has lora_name (needs --engine sglang)",
    )
    flavour.add_argument(
        "--heartbeat",
        type=_seconds_arg,
        default=None,
        metavar="S",
        help="TensorRT-LLM: after S s without a batch publish an empty-events batch (it consumes a seq "
        "and is buffered), 0 = never (default: 5 with --engine trtllm, otherwise 0)",
    )

    pub = parser.add_argument_group("publishing")
    pub.add_argument("--rate", type=_seconds_arg, default=100.0, help="batches/s per rank, 0 = flat out (default: 100)")
    pub.add_argument("--batches", type=_int_arg(0), default=None, help="stop after N batches per rank (default: never)")
    pub.add_argument(
        "--format",
        choices=EVENT_FORMS,
        default=None,
        help="event encoding (default: map, as vLLM >= 0.24 and TensorRT-LLM; array with --engine sglang)",
    )
    pub.add_argument(
        "--hash",
        choices=HASH_KINDS,
        default=None,
        help="block hash type (default: int, unsigned 64-bit as vLLM; signed with --engine sglang)",
    )
    pub.add_argument(
        "--buffer-steps",
        type=_int_arg(0),
        default=10_000,
        help="batches kept for replay, vLLM's buffer_steps (default: 10000)",
    )
    pub.add_argument(
        "--hwm",
        type=_int_arg(0),
        default=PUB_HWM,
        help="PUB send high-water mark: beyond it batches are dropped silently, vLLM's own behaviour "
        "(default: 100000, vLLM's)",
    )
    pub.add_argument(
        "--linger",
        type=_linger_arg,
        default=2.0,
        help="after the last batch keep answering replays this many seconds, -1 = forever (default: 2)",
    )

    replay = parser.add_argument_group(
        "replay (vLLM's own behaviour unless marked)",
        _fill(
            "Like vLLM, the publishing loop answers one waiting request per batch in one tight loop of "
            "non-blocking sends over the buffer, with no pacing and no yielding, so live publishing waits "
            "meanwhile; the ROUTER drops what exceeds its send HWM, so a long reply to a consumer that does "
            "not drain fast enough has holes and may lack its end marker, while the engine still holds those "
            "batches. A request of any other shape than [identity, b'', seq8] gets no answer at all.",
        ),
    )
    replay.add_argument(
        "--replay-layout",
        choices=REPLAY_LAYOUTS,
        default=None,
        help="replies with a topic frame (vLLM >= 0.26) or without (older vLLM, SGLang) "
        "(default: topic; plain with --engine sglang)",
    )
    replay.add_argument(
        "--replay-hwm",
        type=_int_arg(0),
        default=REPLAY_HWM,
        metavar="N",
        help="the ROUTER's send HWM per peer, vLLM's own behaviour: libzmq's default 1000; 0 = unlimited",
    )
    replay.add_argument(
        "--replay-pace",
        action="store_true",
        help="the polite mode, NOT vLLM's behaviour: wait until the ROUTER can take each reply "
        "(yielding to the other ranks) and never drop",
    )

    work = parser.add_argument_group("workload")
    work.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    work.add_argument("--block-size", type=_int_arg(1, 4096), default=16, help="tokens per block (default: 16)")
    work.add_argument("--gpu-blocks", type=_int_arg(1), default=2048, help="GPU cache size in blocks (default: 2048)")
    work.add_argument(
        "--cpu-offload",
        action="store_true",
        help="also copy blocks to a CPU pool (medium CPU, CPU_PINNED with --engine sglang), some as "
        "placeholders without tokens",
    )
    work.add_argument("--cpu-blocks", type=_int_arg(1), default=8192, help="CPU pool size in blocks (default: 8192)")
    work.add_argument(
        "--clear-every", type=_int_arg(0), default=0, help="AllBlocksCleared every N batches (default: 0, never)"
    )
    work.add_argument(
        "--events-per-batch", type=_events_arg, default=(2, 6), help="minimum events per batch, N or A-B (default: 2-6)"
    )
    work.add_argument(
        "--conversations",
        type=_int_arg(1),
        default=DEFAULT_CONVERSATIONS,
        metavar="N",
        help="conversations in flight: each comes back with its next turn on top of its history, some "
        f"evicted by then when their histories outgrow --gpu-blocks (default: {DEFAULT_CONVERSATIONS})",
    )
    work.add_argument(
        "--routed",
        action="store_true",
        help="the ranks (--dp-size 2 or more) take one request sequence, each request sent to a rank at "
        "random, as a router that ignores prefixes does; each serves about "
        f"{ROUTED_REQUESTS_PER_BATCH:g} requests a batch, whatever --events-per-batch says "
        "(default: each rank has its own requests)",
    )
    work.add_argument(
        "--report-hits",
        action="store_true",
        help="vLLM's kv_cache_report_mode=full: a request's reused prefix blocks are announced again "
        "(the gateway attributes them 'hit')",
    )

    faults = parser.add_argument_group(
        "fault injection (applied to every rank)",
        _fill(
            "Deterministic versions of what real publishers do by accident or under load, so a test does "
            "not depend on the machine's load. Each says which engine it imitates. Seqs are absolute: with "
            "--engine trtllm (seq from time.time_ns()) give --start-seq to know them.",
        ),
    )
    faults.add_argument(
        "--skip",
        type=_range_arg,
        action="append",
        default=[],
        metavar="A-B",
        help="fault injection: do not send seqs A..B live (still replayable), like a PUB at its HWM; repeatable",
    )
    faults.add_argument(
        "--restart-at",
        type=_int_arg(0),
        action="append",
        default=[],
        metavar="N",
        help="after seq N the engine becomes a new process (vLLM's and SGLang's seq restarts at 0, "
        "TensorRT-LLM's at a new time_ns), with an empty replay buffer and cache; without --restart-down "
        "this happens in place and subscribers see no disconnect; repeatable",
    )
    faults.add_argument(
        "--restart-down",
        type=_seconds_arg,
        nargs="?",
        const=0.0,
        default=None,
        metavar="S",
        help="with --restart-at, a real restart as a process does it: close PUB and ROUTER, stay down S "
        "seconds (default 0 when given without S), then bind/connect again",
    )
    faults.add_argument(
        "--lose-tail",
        type=_int_arg(0),
        default=0,
        metavar="N",
        help="vLLM's own shutdown(): on SIGTERM/SIGINT, N more batches were queued: their seqs are "
        "consumed but they are never sent nor buffered (default: 0)",
    )
    faults.add_argument(
        "--drop-queue",
        type=_range_arg,
        action="append",
        default=[],
        metavar="A-B",
        help="TensorRT-LLM's queue overflow: seqs A..B are consumed but never sent nor buffered (no replay "
        "fills the gap), then the next batch starts with AllBlocksCleared and the cache restarts empty; repeatable",
    )
    faults.add_argument(
        "--garbage-at",
        type=_int_arg(0),
        action="append",
        default=[],
        metavar="N",
        help="fault injection: undecodable payload for seq N",
    )
    faults.add_argument(
        "--replay-drop",
        type=_replay_drop_arg,
        action="append",
        default=[],
        metavar="A-B[xN]",
        help="vLLM's ROUTER HWM drop, made deterministic: leave seqs A..B out of the first N replies that "
        "contain any of them (default N: 1); repeatable",
    )
    faults.add_argument(
        "--replay-cut",
        type=_replay_cut_arg,
        default=None,
        metavar="K[xN]",
        help="SGLang's cut reply: the first N replies (default 1) stop after K items and send no end marker",
    )
    faults.add_argument(
        "--replay-delay", type=_seconds_arg, default=0.0, metavar="S", help="fault injection: answer replays S s late"
    )
    faults.add_argument(
        "--replay-dead", action="store_true", help="fault injection: bind the replay ROUTER but never answer"
    )
    faults.add_argument(
        "--start-seq",
        type=_int_arg(0, MAX_SEQ),
        default=None,
        metavar="N",
        help="first seq (default: 0; time.time_ns() with --engine trtllm)",
    )
    faults.add_argument(
        "--start-delay",
        type=_seconds_arg,
        default=0.0,
        metavar="S",
        help="open the sockets, then stay silent S s (answering replays) before the first batch",
    )


def _engines_from_args(args: argparse.Namespace, context: zmq.asyncio.Context) -> list[SimulatedEngine]:
    _check_args(args)
    try:
        engines = _build(args, context)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _refuse_collisions(engines)
    return engines


def _check_args(args: argparse.Namespace) -> None:
    """Flags that need another flag (one line naming both)."""
    if args.replay_endpoint is None:
        needs = [
            flag
            for flag, given in (
                ("--replay-dead", args.replay_dead),
                ("--replay-delay", args.replay_delay > 0),
                ("--replay-drop", bool(args.replay_drop)),
                ("--replay-cut", args.replay_cut is not None),
                ("--replay-pace", args.replay_pace),
            )
            if given
        ]
        if needs:
            raise UsageError(f"{' and '.join(needs)} need{'s' if len(needs) == 1 else ''} --replay-endpoint")
    if args.restart_down is not None and not args.restart_at:
        raise UsageError("--restart-down needs --restart-at")
    if args.sglang_metadata and args.engine != "sglang":
        raise UsageError("--sglang-metadata needs --engine sglang")
    if args.routed and args.dp_size < 2:
        raise UsageError("--routed needs --dp-size 2 or more (ranks to route between)")
    if args.cpu_offload and args.cpu_blocks < _OFFLOAD_CHUNK_BLOCKS:
        raise UsageError(f"--cpu-blocks must be at least {_OFFLOAD_CHUNK_BLOCKS} with --cpu-offload")


def _build(args: argparse.Namespace, context: zmq.asyncio.Context) -> list[SimulatedEngine]:
    """The engines the flags describe; ValueError for a value the engine refuses."""
    faults = Faults(
        skip=tuple(args.skip),
        restart_at=tuple(args.restart_at),
        garbage_at=tuple(args.garbage_at),
        replay_delay=args.replay_delay,
        replay_dead=args.replay_dead,
        start_seq=args.start_seq,
        restart_down=args.restart_down,
        lose_tail=args.lose_tail,
        replay_drop=tuple(args.replay_drop),
        replay_cut=args.replay_cut,
        drop_queue=tuple(args.drop_queue),
    )
    return build_engines(
        args.dp_size,
        args.endpoint,
        replay_endpoint=args.replay_endpoint,
        topic=args.topic,
        rate=args.rate,
        batches=args.batches,
        form=args.format,
        hash_kind=args.hash,
        replay_layout=args.replay_layout,
        buffer_steps=args.buffer_steps,
        hwm=args.hwm,
        seed=args.seed,
        faults=faults,
        workload_options={
            "block_size": args.block_size,
            "gpu_capacity_blocks": args.gpu_blocks,
            "cpu_offload": args.cpu_offload,
            "cpu_capacity_blocks": args.cpu_blocks,
            "clear_every": args.clear_every,
            "events_per_batch": args.events_per_batch,
            "report_hits": args.report_hits,
            "conversations": args.conversations,
            "route_weights": (1.0,) * args.dp_size if args.routed else (),
        },
        context=context,
        engine=args.engine,
        replay_hwm=args.replay_hwm,
        replay_pace=args.replay_pace,
        heartbeat=args.heartbeat,
        sglang_metadata=args.sglang_metadata,
    )


def _refuse_collisions(engines: list[SimulatedEngine]) -> None:
    """vLLM does not notice overlapping port ranges (5557/5558 with 2 ranks); we refuse them."""
    seen: dict[str, str] = {}
    for engine in engines:
        for role, ep in (("publish", engine.endpoint), ("replay", engine.replay_endpoint)):
            if ep is None or (role == "publish" and not engine.pub_binds) or ep.endswith((":*", ":0")):
                continue
            what = f"rank {engine.dp_rank}'s {role} endpoint"
            if ep in seen:
                raise UsageError(f"{what} {ep} collides with {seen[ep]}")
            seen[ep] = what


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
        if args.start_delay > 0:
            # Bound and answering replays, but silent: a consumer connects and catches up on nothing.
            await asyncio.gather(*(engine.serve_replays(args.start_delay) for engine in engines))
        await asyncio.gather(*(engine.run() for engine in engines))
        if not stopped and args.linger != 0:
            for engine in engines:
                # Said so that whoever waits for the whole run (a test) waits for this line.
                print(
                    f"simulate: rank {engine.dp_rank} done after {engine.batches_done} batches; lingering", flush=True
                )
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
