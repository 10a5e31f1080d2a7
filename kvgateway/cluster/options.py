"""The cluster's NATS options (flags, and what a child process is given); imports no NATS client,
so the command line works without the ``nats`` extra installed."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NatsOptions:
    servers: tuple[str, ...]
    stream: str = "KVGATEWAY"
    subject_prefix: str = "kvgateway"
    retention_seconds: float = 600.0
    duplicate_window_seconds: float = 120.0
    checkpoint_seconds: float = 30.0  # an edge's index checkpoints (0: none); see cluster/checkpoints.py
    leases: bool = True  # ingest: share the sources with the other ingest processes (cluster/shards.py)
    replicas: int = 1
    creds: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token_file: str | None = None
    name: str = "kvgateway"


HEARTBEAT_SECONDS = 5.0
"""An ingest process reports every stream it reads this often, changed or not (a ``status`` record):
a late edge learns each stream's status within this time, and every edge that the ingest is alive."""

INGEST_SILENCE_SECONDS = 15.0
"""An edge that has heard no status of a stream for this long shows it down, reason ``ingest
unreachable`` (three heartbeats missed: the ingest process reading it is gone or cut off)."""

NATS_SCHEMES = ("nats", "tls", "ws", "wss")
"""The URL schemes nats-py connects with (a URL without one is nats://)."""


def add_nats_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags; each is also a ``KVGATEWAY_*`` variable and a ``[cluster]`` key (config.CLUSTER_OPTIONS),
    so none has an argparse default: None means "not given" until config.resolve_cluster has looked."""
    group = parser.add_argument_group(
        "NATS JetStream (each also $KVGATEWAY_NATS_..., or [cluster] nats_... in the file)"
    )
    group.add_argument(
        "--nats",
        action="append",
        metavar="URL",
        help="a NATS server URL (repeatable; $KVGATEWAY_NATS: comma-separated)",
    )
    group.add_argument("--nats-stream", metavar="NAME", help="the stream (default KVGATEWAY)")
    group.add_argument(
        "--nats-subject-prefix", metavar="PREFIX", help="subjects PREFIX.SOURCE.RANK (default kvgateway)"
    )
    group.add_argument(
        "--nats-retention", metavar="SECONDS", help="the stream's max_age, the recovery window (default 600)"
    )
    group.add_argument(
        "--nats-duplicate-window",
        metavar="SECONDS",
        help="how long a batch id is remembered against duplicates (default 120)",
    )
    group.add_argument(
        "--nats-checkpoint",
        metavar="SECONDS",
        help="edge: write an index checkpoint this often, for edges started later (0: never; default 30)",
    )
    group.add_argument(
        "--nats-leases",
        metavar="BOOL",
        help="ingest: share the sources with the other ingest processes through leases, each stream read "
        "by one (default true; false: read them all, e.g. a hot standby)",
    )
    group.add_argument("--nats-replicas", metavar="N", help="stream replicas (1, 3 or 5; default 1)")
    group.add_argument("--nats-creds", metavar="FILE", help="a NATS credentials file (JWT + nkey seed)")
    group.add_argument("--nats-token-file", metavar="FILE", help="read a NATS token from FILE")
    group.add_argument("--nats-tls-ca", metavar="FILE", help="CA bundle to verify the NATS servers")
    group.add_argument("--nats-tls-cert", metavar="FILE", help="client certificate (mutual TLS)")
    group.add_argument("--nats-tls-key", metavar="FILE", help="client certificate's key")


def options_from_args(args: argparse.Namespace, name: str) -> NatsOptions:
    """The options of resolved ``args`` (config.resolve_cluster: flags, environment, file)."""
    if not args.nats:
        raise ValueError("no NATS server: give --nats URL, $KVGATEWAY_NATS or [cluster] nats in the file")
    default = NatsOptions(servers=())
    retention = default.retention_seconds if args.nats_retention is None else args.nats_retention
    window = default.duplicate_window_seconds if args.nats_duplicate_window is None else args.nats_duplicate_window
    if retention <= 0 or window <= 0:
        raise ValueError("--nats-retention and --nats-duplicate-window must be > 0")
    if window > retention:
        raise ValueError("--nats-duplicate-window cannot exceed --nats-retention")
    every = default.checkpoint_seconds if args.nats_checkpoint is None else args.nats_checkpoint
    if every < 0:
        raise ValueError("--nats-checkpoint must be >= 0 (0: no checkpoints)")
    servers = tuple(url.strip() for value in args.nats for url in value.split(",") if url.strip())
    for url in servers:
        scheme, sep, _ = url.partition("://")
        if sep and scheme.lower() not in NATS_SCHEMES:
            raise ValueError(
                f"--nats {url!r}: {scheme}:// is not NATS; give nats://HOST:PORT (or tls://, ws://, wss://)"
            )
    return NatsOptions(
        servers=servers,
        stream=args.nats_stream or default.stream,
        subject_prefix=args.nats_subject_prefix or default.subject_prefix,
        retention_seconds=retention,
        duplicate_window_seconds=window,
        checkpoint_seconds=every,
        leases=default.leases if args.nats_leases is None else bool(args.nats_leases),
        replicas=default.replicas if args.nats_replicas is None else args.nats_replicas,
        creds=args.nats_creds,
        tls_ca=args.nats_tls_ca,
        tls_cert=args.nats_tls_cert,
        tls_key=args.nats_tls_key,
        token_file=args.nats_token_file,
        name=name,
    )


def options_to_argv(options: NatsOptions) -> list[str]:
    """The flags that give ``options`` to a child process."""
    argv = [
        *(arg for url in options.servers for arg in ("--nats", url)),
        *("--nats-stream", options.stream, "--nats-subject-prefix", options.subject_prefix),
        *("--nats-retention", str(options.retention_seconds), "--nats-checkpoint", str(options.checkpoint_seconds)),
        *("--nats-leases", "true" if options.leases else "false"),
        *("--nats-duplicate-window", str(options.duplicate_window_seconds), "--nats-replicas", str(options.replicas)),
    ]
    for flag, value in (
        ("--nats-creds", options.creds),
        ("--nats-tls-ca", options.tls_ca),
        ("--nats-tls-cert", options.tls_cert),
        ("--nats-tls-key", options.tls_key),
        ("--nats-token-file", options.token_file),
    ):
        if value is not None:
            argv += [flag, value]
    return argv
