"""The cluster's commands: ``kvgateway ingest``, ``kvgateway edge``, and ``serve --workers``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import importlib.util
import logging
import signal
from typing import Any

from kvgateway import config
from kvgateway.cluster import options as nats_options
from kvgateway.runtime.startup import StartupError

logger = logging.getLogger("kvgateway.cluster")

INGEST_DESCRIPTION = """Read the engines' KV-event streams (as `kvgateway serve` does) and publish every
batch and notice to a NATS JetStream stream, once (deduplicated by id), for `kvgateway edge`
processes to serve. HTTP serves only /healthz, /readyz and /metrics (--host, --port)."""

EDGE_DESCRIPTION = """Follow the NATS JetStream stream written by `kvgateway ingest` and serve the whole web
protocol (WebSocket, SSE, /v1/occupancy, the dashboard) exactly as `kvgateway serve` does. A client
resumes on any edge of the same stream. The edge connects to no engine: it lists the sources it is
given (--source or --config), or else those the ingest processes announced."""


def add_ingest_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_serve_arguments(parser, skip=config.CLIENT_ONLY)
    for action in parser._actions:
        if "--host" in action.option_strings:  # probes and metrics only: no token on any address
            action.help = "HTTP listen address of the probes and metrics (default 127.0.0.1); $KVGATEWAY_HOST"
    parser.description = INGEST_DESCRIPTION
    parser.epilog = None
    nats_options.add_nats_arguments(parser)
    _add_child_argument(parser)
    # serve --workers gives its ingest the same member id at every start: a restarted ingest
    # reclaims its own leases at once (cluster/shards.py). The lease time is for tests.
    parser.add_argument("--member", help=argparse.SUPPRESS)
    parser.add_argument("--lease-seconds", type=float, default=None, help=argparse.SUPPRESS)


def add_edge_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_serve_arguments(parser)
    parser.description = EDGE_DESCRIPTION
    parser.epilog = None
    nats_options.add_nats_arguments(parser)
    parser.add_argument(
        "--reuse-port", action="store_true", help="share --port with other edges on this machine (SO_REUSEPORT)"
    )
    _add_child_argument(parser)


def add_workers_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("many cores (NATS JetStream; each also $KVGATEWAY_..., or [cluster] in the file)")
    group.add_argument(
        "--workers",
        metavar="N",
        help="run a private nats-server, one ingest and N edge processes sharing --port (default: one process)",
    )
    group.add_argument(
        "--nats",
        action="append",
        metavar="URL",
        help="with --workers: use this NATS server instead of starting a private one",
    )
    group.add_argument(
        "--state-dir",
        metavar="DIR",
        help="where --workers keeps the nats-server store (default: ./kvgateway-state)",
    )


def _add_child_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)


def exit_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent dies (``serve --workers`` was killed)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def require_nats() -> None:
    """The NATS client is the ``nats`` extra: without it, one line saying how to get it."""
    if importlib.util.find_spec("nats") is None:
        raise config.ConfigError("the NATS client is missing: pip install 'kvgateway[nats]' (the nats extra)")


def run_ingest(args: argparse.Namespace) -> int:
    require_nats()
    from kvgateway.cluster.ingest_role import IngestRole
    from kvgateway.serve import server
    from kvgateway.serve.app import probe_app

    settings = config.settings_from_args(args)
    if not settings.sources:
        raise config.ConfigError("no sources: give --source, or a config file with [[sources]]")
    options = _options(args, "kvgateway-ingest")
    if args.exit_with_parent:
        exit_with_parent()

    leases: dict[str, Any] = {} if args.lease_seconds is None else {"lease_seconds": args.lease_seconds}

    def make(settings: config.Settings) -> IngestRole:
        return IngestRole(settings, options, member=args.member, **leases)

    return server.run(settings, make, probe_app)


def run_edge(args: argparse.Namespace) -> int:
    require_nats()
    from kvgateway.cluster.edge import EdgeRole, edge_app
    from kvgateway.serve import server

    settings = config.settings_from_args(args)
    options = _options(args, "kvgateway-edge")
    if args.exit_with_parent:
        exit_with_parent()

    def make(settings: config.Settings) -> EdgeRole:
        return EdgeRole(settings, options)

    async def discover(settings: config.Settings) -> config.Settings:
        return settings if settings.sources else await _discover_sources(settings, options)

    return server.run(settings, make, edge_app, prepare=discover, reuse_port=args.reuse_port)


def _options(args: argparse.Namespace, name: str) -> nats_options.NatsOptions:
    try:
        return nats_options.options_from_args(args, name)
    except ValueError as exc:
        raise config.ConfigError(str(exc)) from None


async def _discover_sources(settings: config.Settings, options: nats_options.NatsOptions) -> config.Settings:
    """An edge given no sources lists those the ingest processes announced."""
    from dataclasses import replace

    from kvgateway.cluster import nats_link
    from kvgateway.cluster.sources import read_sources

    try:
        nc = await nats_link.connect(options)
    except Exception as exc:
        raise StartupError(f"cannot follow stream {options.stream}: {exc}") from None
    try:
        js = nc.jetstream()
        await nats_link.wait_stream(js, options, 30)  # the ingest announces its sources right after
        sources = await read_sources(js, options)
        for _ in range(20):  # ... creating the stream: a moment's wait for it
            if sources:
                break
            await asyncio.sleep(0.25)
            sources = await read_sources(js, options)
    except Exception as exc:
        raise StartupError(f"cannot follow stream {options.stream}: {exc}") from None
    finally:
        await nats_link.close(nc)
    logger.info("sources announced by ingest: %s", ", ".join(s.name for s in sources) or "none yet")
    return replace(settings, sources=sources)
