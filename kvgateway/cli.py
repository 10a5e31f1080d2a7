"""The ``kvgateway`` command: ``simulate``, ``serve`` and ``demo``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from kvgateway import __version__
from kvgateway.runtime.extensions import core


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    from kvgateway import config, demo, simulator
    from kvgateway.cluster import commands as cluster

    parser = _Parser(prog="kvgateway", description="An observable gateway for LLM engines' KV-cache events.")
    parser.add_argument("--version", action="version", version=f"kvgateway {__version__} ({core()} core)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    simulator.add_arguments(
        sub.add_parser("simulate", help="run a vLLM-compatible engine publisher (for demos and tests)")
    )
    serve = sub.add_parser("serve", help="subscribe to engines and serve their events")
    config.add_serve_arguments(serve)
    cluster.add_workers_arguments(serve)
    cluster.add_ingest_arguments(sub.add_parser("ingest", help="read engines, publish to NATS JetStream"))
    cluster.add_edge_arguments(sub.add_parser("edge", help="serve clients from NATS JetStream"))
    demo.add_arguments(sub.add_parser("demo", help="simulated engines and the gateway in one process"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from kvgateway import config, demo, simulator

    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # a first try: show what there is rather than "the following arguments are required"
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    from kvgateway.cluster import commands as cluster

    try:
        if args.command in ("serve", "ingest", "edge"):
            config.resolve_cluster(args)  # --workers, --nats...: flags, then the environment, then the file
        if args.command == "ingest":
            return cluster.run_ingest(args)
        if args.command == "edge":
            return cluster.run_edge(args)
        if args.command == "serve" and args.workers is None and args.nats:
            raise config.ConfigError("--nats needs --workers (or run kvgateway ingest and kvgateway edge)")
        if args.command == "serve" and args.workers is not None:
            from kvgateway.cluster import supervisor

            return supervisor.run(args, argv)
        if args.command == "simulate":
            return simulator.run(args)
        if args.command == "serve":
            from kvgateway.gateway import OneProcess, one_process_app
            from kvgateway.serve import server

            return server.run(config.settings_from_args(args), OneProcess, one_process_app)
        if args.command == "demo":
            return demo.run(args)
    except (simulator.UsageError, config.ConfigError) as exc:
        sys.stderr.write(f"kvgateway {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    parser.error(f"unknown command {args.command!r}")
