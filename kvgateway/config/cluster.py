"""The cluster's settings: what every role is given to reach NATS JetStream, and what
``serve --workers`` runs. They are keys of the file's ``[cluster]`` table (and flags and
variables: kvgateway.config.options); nothing here imports a NATS client, so the command line
works without the ``nats`` extra installed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NatsOptions:
    servers: tuple[str, ...] = ()
    stream: str = "KVGATEWAY"
    subject_prefix: str = "kvgateway"
    retention_seconds: float = 600.0
    duplicate_window_seconds: float = 120.0
    checkpoint_seconds: float = 30.0  # an edge's index checkpoints (0: none); see cluster/checkpoints.py
    linger_seconds: float = 0.003  # ingest: how long a publish waits for company (cluster/publisher.py)
    leases: bool = True  # ingest: share the sources with the other ingest processes (cluster/shards.py)
    replicas: int = 1
    creds: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token_file: str | None = None
    name: str = "kvgateway"  # the client's name, per role: not a setting


@dataclass(frozen=True, slots=True)
class Workers:
    """``serve --workers N``: N edge processes and an ingest on this machine, over a private
    nats-server kept in ``state_dir`` (unless NATS servers are given)."""

    count: int | None = None  # None: one process
    state_dir: str = "kvgateway-state"


NATS_SCHEMES = ("nats", "tls", "ws", "wss")
"""The URL schemes nats-py connects with (a URL without one is nats://)."""
