"""The ``kvgateway`` command: ``simulate``, ``serve``, ``ingest``, ``edge`` and ``demo``."""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from typing import Final, NoReturn

from kvgateway import __version__
from kvgateway.config.arguments import add_arguments
from kvgateway.config.errors import ConfigError
from kvgateway.config.loading import load
from kvgateway.config.options import SERVER_KEYS, OptionSet
from kvgateway.runtime.extensions import core

SERVE_DESCRIPTION = """\
Subscribe to the KV-cache event streams of LLM engines (vLLM, SGLang, TensorRT-LLM) over ZeroMQ
and serve them to web clients: WebSocket and SSE with resume, a REST occupancy snapshot, a
dashboard at /, Prometheus metrics at /metrics, probes at /healthz and /readyz.

Every setting can be given as a flag, as a KVGATEWAY_* environment variable (--ring-bytes is
KVGATEWAY_RING_BYTES) or in the TOML file's [server] table (ring_bytes); a flag beats the
environment, which beats the file, which beats the default."""

SERVE_EPILOG = """\
examples:
  # the engine's own --kv-events-config, its host and its --data-parallel-size
  kvgateway serve --source 'name=vllm-a,host=vllm-host,dp_size=2,kv_events_config={"enable_kv_cache_events": true,
    "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5657", "topic": "kv-events"}'

  # the same by endpoints
  kvgateway serve --source name=vllm-a,endpoint=tcp://vllm-host:5557,replay=tcp://vllm-host:5657,topic=kv-events,dp_size=2

  # from a file, reachable from other machines with a token
  KVGATEWAY_TOKEN_FILE=/run/secrets/token kvgateway serve --config kvgateway.toml --host 0.0.0.0

See deploy/kvgateway.example.toml for every key and docs/operations.md for deployment."""

SERVE = OptionSet(
    keys=(*SERVER_KEYS, "workers", "nats", "state_dir"),
    needs_sources=True,
    help={"nats": "with --workers: use this NATS server instead of starting a private one"},
    groups={"nats": "workers"},
)
"""``kvgateway serve``: every ``[server]`` setting, and ``--workers`` with its NATS and store."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


COMMANDS: Final = ("simulate", "serve", "ingest", "edge", "demo")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``kvgateway`` parser: every command listed; each command's arguments, or with ``command``
    only that command's. A command's arguments come from the module that runs it, and importing
    the simulator, the demo and the cluster's commands for a ``serve`` that needs none of them was
    a tenth of its start-up's imports: a command line names its command first, so it is known
    before the parser is built (``kvgateway --help`` and a mistyped command get every command)."""

    def wanted(name: str) -> bool:
        return command is None or command == name

    parser = _Parser(prog="kvgateway", description="An observable gateway for LLM engines' KV-cache events.")
    parser.add_argument("--version", action="version", version=f"kvgateway {__version__} ({core()} core)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    simulate = sub.add_parser("simulate", help="run a vLLM-compatible engine publisher (for demos and tests)")
    if wanted("simulate"):
        from kvgateway import simulator

        simulator.add_arguments(simulate)
    serve = sub.add_parser(
        "serve",
        help="subscribe to engines and serve their events",
        description=SERVE_DESCRIPTION,
        epilog=SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if wanted("serve"):
        add_arguments(serve, SERVE)
    ingest = sub.add_parser("ingest", help="read engines, publish to NATS JetStream")
    edge = sub.add_parser("edge", help="serve clients from NATS JetStream")
    if wanted("ingest") or wanted("edge"):
        from kvgateway.cluster import commands as cluster

        cluster.add_ingest_arguments(ingest)
        cluster.add_edge_arguments(edge)
    demo = sub.add_parser("demo", help="simulated engines and the gateway in one process")
    if wanted("demo"):
        from kvgateway import demo as demo_command

        demo_command.add_arguments(demo)
    return parser


def run_serve(args: argparse.Namespace, argv: list[str]) -> int:
    """One process, or with ``--workers`` a supervisor of NATS, an ingest and N edges."""
    loaded = load(SERVE, args)
    if loaded.workers.count is None and loaded.nats.servers:
        nats = loaded.given.get("nats", "--nats")  # a flag, a variable or the file's key
        raise ConfigError(f"{nats} needs --workers (or run kvgateway ingest and kvgateway edge)")
    if loaded.workers.count is not None:
        from kvgateway.cluster import supervisor

        gc.enable()  # a supervisor for as long as its children run: see main
        return supervisor.run(loaded, argv)
    from kvgateway.gateway import OneProcess, one_process_app
    from kvgateway.serve import server

    return server.run(loaded.settings, OneProcess, one_process_app, close_clients=OneProcess.close_clients)


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    """The chosen command, its module imported now."""
    if args.command == "serve":
        return run_serve(args, argv)
    gc.enable()  # the collector is held for serve's start-up only: see main
    if args.command == "simulate":
        from kvgateway import simulator

        return simulator.run(args)
    if args.command in ("ingest", "edge"):
        from kvgateway.cluster import commands as cluster

        return cluster.run_ingest(args) if args.command == "ingest" else cluster.run_edge(args)
    from kvgateway import demo

    return demo.run(args)


def _usage_errors() -> tuple[type[Exception], ...]:
    """What a command reports as a one-line usage error: a configuration's, and the simulator's
    (when it was imported: nothing else raises it)."""
    simulator = sys.modules.get("kvgateway.simulator")
    return (ConfigError,) if simulator is None else (ConfigError, simulator.UsageError)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line run. The cyclic garbage collector is held from here until ``serve``'s
    start-up heap is frozen (:func:`kvgateway.serve.server.run`, before the streams open; every
    other command gets it back before it runs): start-up's imports make some 40,000 objects that
    live as long as the process and little garbage, and the collections they set off took 12 to
    14 ms of a 0.2 to 0.3 s start-up. The freeze collects nothing: start-up's little garbage (some
    240 objects) is frozen with the rest (:func:`kvgateway.runtime.memory.freeze_startup_heap`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    gc.disable()
    try:
        parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
        if not argv:  # a first try: show what there is rather than "the following arguments are required"
            parser.print_help()
            return 0
        args = parser.parse_args(argv)
        try:
            return _run(args, argv)
        except _usage_errors() as exc:
            sys.stderr.write(f"kvgateway {args.command}: error: {exc}\n")
            return 2
        except KeyboardInterrupt:
            return 130
    finally:
        gc.enable()  # a start-up that failed, or main called in a process that goes on
