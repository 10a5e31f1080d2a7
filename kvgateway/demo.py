"""``kvgateway demo``: simulated engines and the gateway in one process, with the dashboard."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import zmq.asyncio

from kvgateway import config
from kvgateway.config import SourceConfig
from kvgateway.config.arguments import add_arguments as add_setting_arguments
from kvgateway.config.loading import load
from kvgateway.config.options import SERVER_KEYS, OptionSet
from kvgateway.config.validation import validate
from kvgateway.engine.endpoints import rank_endpoints
from kvgateway.engine.wire import Stream
from kvgateway.runtime.startup import StartupError
from kvgateway.simulator import Faults, SimulatedEngine, Workload

if TYPE_CHECKING:  # the web server is imported when the demo runs, not by every command's parser
    from kvgateway.serve.server import Around

logger = logging.getLogger("kvgateway.demo")


SILENT_SOURCE = "vllm-c"
"""The demo engine that goes quiet now and then (connected, publishing nothing)."""
CLEAR_EVERY = 900
"""vllm-a rank 1 clears its prefix cache every this many batches: its fill rises and falls."""
DEFAULT_RATE = 20.0
"""Batches/s of a demo engine rank at role factor 1 (``--rate``'s default)."""
FLEET_BATCHES_PER_SECOND = 128.0
"""``--streams N`` without ``--rate``: each rank's rate is this divided by N (at most
:data:`DEFAULT_RATE`), so a fleet of any size publishes about 110 batches/s in all (times the
roles' factors) and stays light on a laptop: 64 ranks at 2 batches/s. The four-engine demo
publishes 60."""
FLEET_BLOCKS = 512
"""The fleet's GPU capacities are this many blocks times 1, 2, 4, 8 (source by source): small
caches, so the simulated engines and the gateway's index stay small and fill within minutes."""
REPLAY_SECONDS = 120.0
"""Each demo engine keeps about this many seconds of batches for replay (at least
:data:`MIN_REPLAY_BATCHES`). vLLM keeps 10,000 batches; 64 simulated engines doing that would hold
about 1.5 GB of payloads the gateway never asks for, since it replays only a gap."""
MIN_REPLAY_BATCHES = 64
UNDERSIZED_CONVERSATIONS = 512
"""Conversations sglang-b serves at once: their histories are several times its 4,096-block GPU
cache, so a conversation that comes back (every half minute or so) finds part of its history
evicted (``refetch``) or in the CPU tier (``offloaded``)."""

DEMO = OptionSet(keys=SERVER_KEYS, sources=False)
"""The demo's settings: the HTTP side's (its engines are its own: no --config or --source)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_setting_arguments(parser, DEMO)
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help=f"batches/s per engine rank (default {DEFAULT_RATE:g}; with --streams N: "
        f"{FLEET_BATCHES_PER_SECOND:g}/N, at most {DEFAULT_RATE:g})",
    )
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    parser.add_argument(
        "--restart-every",
        type=int,
        default=2400,
        metavar="N",
        help="restart engine 'sglang-b' (with --streams: the first stream) after every N batches "
        "(default 2400; 0: never)",
    )
    parser.add_argument(
        "--silence",
        type=float,
        nargs=2,
        default=(60.0, 30.0),
        metavar=("TALK", "QUIET"),
        help=f"engine '{SILENT_SOURCE}' (with --streams: the last stream) publishes for TALK seconds, then goes "
        "quiet for QUIET seconds, over and over (default 60 30; QUIET 0: never quiet)",
    )
    parser.add_argument(
        "--streams",
        type=int,
        default=0,
        metavar="N",
        help="a fleet of N streams (sources of 8 ranks each) instead of the four demo engines (default: off)",
    )


def _check(args: argparse.Namespace) -> None:
    if args.rate is not None and not 0 < args.rate <= 100_000:
        raise config.ConfigError(f"--rate: expected a rate from 0 (exclusive) to 100000, got {args.rate}")
    if args.restart_every < 0:
        raise config.ConfigError(f"--restart-every: expected N >= 0, got {args.restart_every}")
    talk, quiet = args.silence
    if talk <= 0 or quiet < 0:
        raise config.ConfigError(f"--silence: expected TALK > 0 and QUIET >= 0, got {talk:g} {quiet:g}")
    if not 0 <= args.streams <= 1024:
        raise config.ConfigError(f"--streams: expected 0 to 1024 streams, got {args.streams}")


@dataclass(frozen=True, slots=True)
class Role:
    """How one demo stream behaves: its share of --rate, cache clears, restarts and silences, and
    its workload: CPU offload, full report mode, conversations in flight, and ``routed`` (every
    rank of the source routed: they share one request sequence, see :func:`role_workload`)."""

    rate_factor: float = 1.0
    clear_every: int = 0
    restarts: bool = False
    silent: bool = False
    cpu_offload: bool = False
    report_hits: bool = False
    routed: bool = False
    conversations: int = 32


def demo_sources(sockets: Path) -> tuple[SourceConfig, ...]:
    """Three engines at different fill levels and rates: vLLM-style with two DP ranks (rank 1
    clears its cache now and then), an SGLang-style one with CPU offload that restarts now and
    then, and a vLLM-style one that goes silent now and then. Capacities are configured.

    Each shows one part of where the prefill goes (docs/operations.md), so that every origin is a
    visible share within a minute or two: vllm-a's ranks share system prompts and one stream of
    conversations routed at random, so a conversation's next turn often lands on the rank that did
    not compute its history (``elsewhere``); sglang-b serves 512 conversations at once from a
    4,096-block GPU cache, so a conversation comes back after its history was evicted (``refetch``)
    or offloaded to its CPU tier (``offloaded``); vllm-c re-announces reused blocks as vLLM's full
    report mode does (``hit``). The rest is ``new``.

    They publish on ipc:// endpoints in a private directory: bound (as vLLM does for ipc),
    local to this machine, and free of port clashes.
    """
    return (
        _source(sockets, "vllm-a", dp_size=2, capacity={"GPU": 32768}),
        _source(sockets, "sglang-b", capacity={"GPU": 4096, "CPU": 8192}),
        _source(sockets, SILENT_SOURCE, capacity={"GPU": 8192}),
    )


def _source(sockets: Path, name: str, *, dp_size: int = 1, capacity: dict[str, int]) -> SourceConfig:
    return SourceConfig(
        name=name,
        endpoint=f"ipc://{sockets}/{name}-pub",
        replay=f"ipc://{sockets}/{name}-replay",
        topic="kv-events",
        dp_size=dp_size,
        capacity_blocks=capacity,
    )


def demo_roles(sources: tuple[SourceConfig, ...]) -> dict[Stream, Role]:
    roles = {
        ("vllm-a", 0): Role(routed=True),
        ("vllm-a", 1): Role(rate_factor=0.5, clear_every=CLEAR_EVERY, routed=True),
        ("sglang-b", 0): Role(restarts=True, cpu_offload=True, conversations=UNDERSIZED_CONVERSATIONS),
        (SILENT_SOURCE, 0): Role(rate_factor=0.5, silent=True, report_hits=True),
    }
    return {(s.name, r): roles.get((s.name, r), Role()) for s in sources for r in range(s.dp_size)}


def fleet_sources(sockets: Path, streams: int) -> tuple[SourceConfig, ...]:
    """``streams`` streams as sources of 8 ranks ("pool-00", "pool-01", ...), GPU capacities from
    :data:`FLEET_BLOCKS` to 8 times that, so their caches fill at different speeds."""
    out = []
    for i, first in enumerate(range(0, streams, 8)):
        size = min(8, streams - first)
        out.append(_source(sockets, f"pool-{i:02d}", dp_size=size, capacity={"GPU": FLEET_BLOCKS << (i % 4)}))
    return tuple(out)


def rank_rate(args: argparse.Namespace) -> float:
    """Batches/s of a rank at role factor 1: ``--rate``, or its default for the demo or fleet."""
    if args.rate is not None:
        return float(args.rate)
    if args.streams:
        return min(DEFAULT_RATE, FLEET_BATCHES_PER_SECOND / int(args.streams))
    return DEFAULT_RATE


def fleet_roles(sources: tuple[SourceConfig, ...]) -> dict[Stream, Role]:
    keys = [(s.name, r) for s in sources for r in range(s.dp_size)]
    roles = {key: Role(rate_factor=0.5 + (n % 4) / 4) for n, key in enumerate(keys)}
    roles[keys[0]] = Role(restarts=True)
    roles[keys[-1]] = Role(silent=len(keys) > 1)
    return roles


def build_engines(
    args: argparse.Namespace,
    sources: tuple[SourceConfig, ...],
    roles: dict[Stream, Role],
    context: zmq.asyncio.Context,
) -> list[tuple[SimulatedEngine, Role]]:
    """One engine per rank, all on ``context``: one ZeroMQ I/O thread for the whole demo, not one
    per engine (64 of them would take turns with the gateway on two cores)."""
    engines: list[tuple[SimulatedEngine, Role]] = []
    base_rate = rank_rate(args)
    for index, source in enumerate(sources):
        seed = args.seed * 1000 + index  # one seed per engine: its ranks share system prompts
        for rank, pub, replay in rank_endpoints(source.endpoint, source.replay, source.dp_size):
            role = roles[(source.name, rank)]
            rate = base_rate * role.rate_factor
            workload = role_workload(source, rank, role, seed, roles)
            # Each restart_at entry fires once and the seq starts again at 0: (N,) * k restarts k times.
            restart_at = (args.restart_every,) * 10_000 if role.restarts and args.restart_every else ()
            engine = SimulatedEngine(
                pub,
                replay_endpoint=replay,
                topic=source.topic,
                dp_rank=rank,
                rate=rate,
                buffer_steps=max(MIN_REPLAY_BATCHES, round(rate * REPLAY_SECONDS)),
                context=context,
                form="array" if role.cpu_offload else "map",
                replay_layout="plain" if role.cpu_offload else "topic",
                hash_kind=workload.hash_kind,
                faults=Faults(restart_at=restart_at) if restart_at else None,
                workload=workload,
            )
            engines.append((engine, role))
    return engines


def role_workload(source: SourceConfig, rank: int, role: Role, seed: int, roles: dict[Stream, Role]) -> Workload:
    """The workload of one demo rank, as its role says. A routed rank shares one request sequence
    with its source's other routed ranks, each request sent at random in proportion to the ranks'
    rates (a load balancer that ignores prefixes)."""
    weights: tuple[float, ...] = ()
    if role.routed:
        weights = tuple(roles[(source.name, r)].rate_factor for r in range(source.dp_size))
    return Workload(
        seed,
        hash_kind="signed" if role.cpu_offload else "int",
        gpu_capacity_blocks=source.capacity_blocks.get("GPU", 2048),
        cpu_offload=role.cpu_offload,
        cpu_capacity_blocks=source.capacity_blocks.get("CPU", 8192),
        clear_every=role.clear_every,
        stream=rank,
        report_hits=role.report_hits,
        conversations=role.conversations,
        route_weights=weights,
    )


async def run_engine(engine: SimulatedEngine, role: Role, silence: tuple[float, float]) -> None:
    """Publish; a silent role alternates TALK seconds of batches with QUIET seconds of nothing
    (replay requests are still answered: the engine is alive, just idle)."""
    talk, quiet = silence
    if not role.silent or quiet <= 0:
        await engine.run()
        return
    while True:
        engine.batches = engine.batches_done + max(1, round(engine.rate * talk))
        await engine.run()
        if engine.batches_done < engine.batches:
            return  # stopped before its batches were done: the demo is ending
        await engine.serve_replays(quiet)


@contextlib.asynccontextmanager
async def running_engines(
    pairs: list[tuple[SimulatedEngine, Role]], silence: tuple[float, float]
) -> AsyncIterator[None]:
    """The engines started and publishing while the gateway serves, stopped after it."""
    engines = [engine for engine, _ in pairs]
    runners: list[asyncio.Future[None]] = []
    try:
        for engine in engines:
            try:
                await engine.start()
            except (zmq.ZMQError, OSError) as exc:
                raise StartupError(f"demo engines: cannot start: {exc}") from None  # it names the address
        runners = [asyncio.ensure_future(run_engine(engine, role, silence)) for engine, role in pairs]
        yield
    finally:
        for engine in engines:
            engine.stop()
        for runner in runners:
            runner.cancel()
        # All at once (one turn of the loop), not a turn per engine; a failed engine is no reason
        # for a traceback at exit.
        await asyncio.gather(*runners, return_exceptions=True)
        for engine in engines:
            await engine.close()


def engines_around(args: argparse.Namespace) -> Around:
    """What the demo runs around its gateway (the shell's ``around``): the engines, publishing on
    ipc:// sockets in a private directory, their sources the gateway's. Its first line names the
    dashboard's address before a line per stream (many, with --streams)."""

    @contextlib.asynccontextmanager
    async def engines(settings: config.Settings) -> AsyncIterator[config.Settings]:
        from kvgateway.serve.server import base_url

        try:
            directory = tempfile.TemporaryDirectory(prefix="kvgateway-demo-")
        except OSError as exc:
            raise StartupError(f"cannot make the engines' socket directory: {exc.strerror or exc}") from None
        with directory:
            sockets = Path(directory.name)
            sources = fleet_sources(sockets, args.streams) if args.streams else demo_sources(sockets)
            roles = fleet_roles(sources) if args.streams else demo_roles(sources)
            settings = validate(replace(settings, sources=sources))
            streams = len(settings.streams())
            print(
                f"kvgateway demo: starting {streams} streams; the dashboard will be at {base_url(settings)}", flush=True
            )
            context = zmq.asyncio.Context()
            try:
                async with running_engines(build_engines(args, sources, roles, context), tuple(args.silence)):
                    yield settings
            finally:
                context.destroy(linger=0)

    return engines


def announce(url: str) -> None:
    """The demo's own lines once the dashboard is served."""
    print(f"kvgateway demo: dashboard at {url}", flush=True)
    print("kvgateway demo: press Ctrl-C to stop", flush=True)


def run(args: argparse.Namespace) -> int:
    """The demo in the one process shell (:func:`kvgateway.serve.server.run`), as ``serve``: the
    single process's role and app, with the engines around them."""
    _check(args)
    settings = load(DEMO, args).settings
    from kvgateway.gateway import OneProcess, one_process_app
    from kvgateway.serve import server

    return server.run(
        settings,
        OneProcess,
        one_process_app,
        around=engines_around(args),
        close_clients=OneProcess.close_clients,
        on_ready=announce,
    )
