"""``kvgateway demo``: simulated engines and the gateway in one process, with the dashboard."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from kvgateway import config, logs
from kvgateway.config import SourceConfig
from kvgateway.simulator import Faults, HashKind, SimulatedEngine
from kvgateway.simulator import build_engines as simulator_engines

log = logging.getLogger("kvgateway.demo")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_server_arguments(parser)
    parser.add_argument("--rate", type=float, default=20.0, help="batches/s per engine rank (default 20)")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    parser.add_argument(
        "--restart-every",
        type=int,
        default=0,
        metavar="N",
        help="restart engine 'sglang-b' after every N batches (default: never)",
    )


def _check(args: argparse.Namespace) -> None:
    if not 0 < args.rate <= 100_000:
        raise config.ConfigError(f"--rate: expected a rate from 0 (exclusive) to 100000, got {args.rate}")
    if args.restart_every < 0:
        raise config.ConfigError(f"--restart-every: expected N >= 0, got {args.restart_every}")


def demo_sources(sockets: Path) -> tuple[SourceConfig, ...]:
    """Two engines: vLLM-style with two DP ranks, and an SGLang-style one with CPU offload.

    They publish on ipc:// endpoints in a private directory: bound (as vLLM does for ipc),
    local to this machine, and free of port clashes.
    """
    return (
        SourceConfig(
            name="vllm-a",
            endpoint=f"ipc://{sockets}/vllm-a-pub",
            replay=f"ipc://{sockets}/vllm-a-replay",
            topic="kv-events",
            dp_size=2,
            capacity_blocks={"GPU": 2048},
        ),
        SourceConfig(
            name="sglang-b",
            endpoint=f"ipc://{sockets}/sglang-b-pub",
            replay=f"ipc://{sockets}/sglang-b-replay",
            topic="kv-events",
            capacity_blocks={"GPU": 1024, "CPU": 4096},
        ),
    )


def build_engines(args: argparse.Namespace, sources: tuple[SourceConfig, ...]) -> list[SimulatedEngine]:
    engines: list[SimulatedEngine] = []
    for index, source in enumerate(sources):
        offload = source.name == "sglang-b"
        hash_kind: HashKind = "signed" if offload else "int"
        # Each restart_at entry fires once and the seq starts again at 0: (N,) * k restarts k times.
        restart_at = (args.restart_every,) * 10_000 if offload and args.restart_every else ()
        engines += simulator_engines(
            source.dp_size,
            source.endpoint,
            replay_endpoint=source.replay,
            seed=args.seed * 1000 + index,  # one seed per engine: its ranks share system prompts
            workload_options={
                "gpu_capacity_blocks": source.capacity_blocks.get("GPU", 2048),
                "cpu_offload": offload,
                "cpu_capacity_blocks": source.capacity_blocks.get("CPU", 8192),
            },
            topic=source.topic,
            rate=args.rate,
            form="array" if offload else "map",
            replay_layout="plain" if offload else "topic",
            hash_kind=hash_kind,
            faults=Faults(restart_at=restart_at) if restart_at else None,
        )
    return engines


async def _run(args: argparse.Namespace, settings: config.Settings) -> None:
    from kvgateway.server import serve

    with tempfile.TemporaryDirectory(prefix="kvgateway-demo-") as directory:
        sources = demo_sources(Path(directory))
        settings = config.validate(replace(settings, sources=sources))
        engines = build_engines(args, sources)
        for engine in engines:
            await engine.start()
        runners = [asyncio.ensure_future(engine.run()) for engine in engines]

        def ready(url: str) -> None:
            print(f"kvgateway demo: dashboard at {url}", flush=True)
            print("kvgateway demo: press Ctrl-C to stop", flush=True)

        try:
            await serve(settings, ready=ready)
        finally:
            for engine in engines:
                engine.stop()
            for runner in runners:
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await runner
            for engine in engines:
                await engine.close()


def run(args: argparse.Namespace) -> int:
    _check(args)
    settings = config.settings_from_args(args)
    logs.setup(settings.log_level, settings.log_format, secrets=(settings.token,) if settings.token else ())
    from kvgateway.gateway import StartupError
    from kvgateway.server import loop_factory

    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(_run(args, settings))
    except StartupError as exc:
        sys.stderr.write(f"kvgateway demo: error: {exc}\n")
        return 1
    except OSError as exc:
        sys.stderr.write(f"kvgateway demo: error: {exc.strerror or exc}\n")
        return 1
    return 0
