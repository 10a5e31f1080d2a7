"""What no single value shows: checks across settings, after every layer was applied (names
given twice, streams on one address, a token for a host others reach, the NATS windows)."""

from __future__ import annotations

from dataclasses import replace

from kvgateway.config.addresses import check_overlaps, is_loopback
from kvgateway.config.cluster import NATS_SCHEMES, NatsOptions
from kvgateway.config.errors import ConfigError
from kvgateway.config.settings import Settings


def validate(settings: Settings, *, clients: bool = True) -> Settings:
    """``clients``: the process serves web clients (every command but ``ingest``), so a host other
    machines reach needs a token."""
    names = [source.name for source in settings.sources]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"source {name!r}: key 'name': given twice")
    check_overlaps(settings.sources)
    if settings.token is not None and not settings.token.strip():
        raise ConfigError("token: empty")
    if clients and not is_loopback(settings.host) and settings.token is None and not settings.allow_unauthenticated:
        raise ConfigError(
            f"host {settings.host!r} is reachable from other machines and no token is set: "
            "give --token/--token-file/KVGATEWAY_TOKEN, or --allow-unauthenticated to accept that risk"
        )
    return settings


def validate_nats(options: NatsOptions, *, needs_servers: bool) -> NatsOptions:
    """The options with each server URL apart (a value may hold several, comma-separated)."""
    servers = tuple(url.strip() for value in options.servers for url in value.split(",") if url.strip())
    if needs_servers and not servers:
        raise ConfigError("no NATS server: give --nats URL, $KVGATEWAY_NATS or [cluster] nats in the file")
    if options.retention_seconds <= 0 or options.duplicate_window_seconds <= 0:
        raise ConfigError("--nats-retention and --nats-duplicate-window must be > 0")
    if options.duplicate_window_seconds > options.retention_seconds:
        raise ConfigError("--nats-duplicate-window cannot exceed --nats-retention")
    if options.checkpoint_seconds < 0:
        raise ConfigError("--nats-checkpoint must be >= 0 (0: no checkpoints)")
    for url in servers:
        scheme, sep, _ = url.partition("://")
        if sep and scheme.lower() not in NATS_SCHEMES:
            raise ConfigError(
                f"--nats {url!r}: {scheme}:// is not NATS; give nats://HOST:PORT (or tls://, ws://, wss://)"
            )
    return replace(options, servers=servers)
