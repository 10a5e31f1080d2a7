"""The cluster's commands: ``kvgateway ingest``, ``kvgateway edge``, and ``serve --workers``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import importlib.util
import logging
import signal
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from kvgateway.config.arguments import add_arguments
from kvgateway.config.cluster import NatsOptions
from kvgateway.config.errors import ConfigError
from kvgateway.config.loading import load
from kvgateway.config.options import CLIENT_ONLY, NATS_KEYS, SERVER_KEYS, OptionSet
from kvgateway.config.settings import Settings
from kvgateway.runtime.startup import StartupError

logger = logging.getLogger("kvgateway.cluster")

INGEST_DESCRIPTION = """Read the engines' KV-event streams (as `kvgateway serve` does) and publish every
batch and notice to a NATS JetStream stream, once (deduplicated by id), for `kvgateway edge`
processes to serve. HTTP serves only /healthz, /readyz and /metrics (--host, --port)."""

EDGE_DESCRIPTION = """Follow the NATS JetStream stream written by `kvgateway ingest` and serve the whole web
protocol (WebSocket, SSE, /v1/occupancy, the dashboard) exactly as `kvgateway serve` does. A client
resumes on any edge of the same stream. The edge connects to no engine: it lists the sources it is
given (--source or --config), or else those the ingest processes announced."""


INGEST = OptionSet(
    keys=(*(key for key in SERVER_KEYS if key not in CLIENT_ONLY), *NATS_KEYS),
    needs_sources=True,
    needs_nats=True,
    clients=False,  # probes and metrics only: no token on any address
    help={"host": "HTTP listen address of the probes and metrics (default 127.0.0.1)"},
)
"""``kvgateway ingest``: the engines' settings and NATS; none of web clients' (it serves none)."""

EDGE = OptionSet(keys=(*SERVER_KEYS, *NATS_KEYS), needs_nats=True)
"""``kvgateway edge``: every setting of ``serve`` and NATS; its sources are optional (announced)."""


def add_ingest_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = INGEST_DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_arguments(parser, INGEST)
    _add_child_argument(parser)
    # serve --workers gives its ingest the same member id at every start: a restarted ingest
    # reclaims its own leases at once (cluster/shards.py). The lease time is for tests.
    parser.add_argument("--member", help=argparse.SUPPRESS)
    parser.add_argument("--lease-seconds", type=float, default=None, help=argparse.SUPPRESS)


def add_edge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = EDGE_DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_arguments(parser, EDGE)
    parser.add_argument(
        "--reuse-port", action="store_true", help="share --port with other edges on this machine (SO_REUSEPORT)"
    )
    _add_child_argument(parser)


def _add_child_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)


def exit_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent dies (``serve --workers`` was killed)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def require_nats() -> None:
    """The NATS client is the ``nats`` extra: without it, one line saying how to get it."""
    if importlib.util.find_spec("nats") is None:
        raise ConfigError("the NATS client is missing: pip install 'kvgateway[nats]' (the nats extra)")


def _cluster_command(args: argparse.Namespace, option_set: OptionSet, name: str) -> tuple[Settings, NatsOptions]:
    """What ``ingest`` and ``edge`` do first: the NATS client there, their options loaded (the
    client's connection named ``name``), and under ``serve --workers`` a death with the parent."""
    require_nats()
    loaded = load(option_set, args)
    if args.exit_with_parent:
        exit_with_parent()
    return loaded.settings, replace(loaded.nats, name=name)


def run_ingest(args: argparse.Namespace) -> int:
    settings, options = _cluster_command(args, INGEST, "kvgateway-ingest")
    from kvgateway.cluster.ingest_role import IngestRole
    from kvgateway.serve import server
    from kvgateway.serve.app import probe_app

    leases: dict[str, Any] = {} if args.lease_seconds is None else {"lease_seconds": args.lease_seconds}

    def make(settings: Settings) -> IngestRole:
        return IngestRole(settings, options, member=args.member, **leases)

    return server.run(settings, make, probe_app)


def run_edge(args: argparse.Namespace) -> int:
    settings, options = _cluster_command(args, EDGE, "kvgateway-edge")
    from kvgateway.cluster.edge import EdgeRole, edge_app
    from kvgateway.serve import server

    def make(settings: Settings) -> EdgeRole:
        return EdgeRole(settings, options)

    @contextlib.asynccontextmanager
    async def discovered(settings: Settings) -> AsyncIterator[Settings]:
        yield settings if settings.sources else await _discover_sources(settings, options)

    return server.run(
        settings, make, edge_app, around=discovered, close_clients=EdgeRole.close_clients, reuse_port=args.reuse_port
    )


async def _discover_sources(settings: Settings, options: NatsOptions) -> Settings:
    """An edge given no sources lists those the ingest processes announced."""
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
