"""What no single value shows: checks across settings, after every layer was applied (names
given twice, streams on one address, a token for a host others reach, the NATS windows)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kvgateway.config.addresses import check_overlaps, is_loopback
from kvgateway.config.cluster import NATS_SCHEMES, NatsOptions
from kvgateway.config.errors import ConfigError
from kvgateway.config.options import OPTION_BY_KEY
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


def validate_nats(options: NatsOptions, *, needs_servers: bool, given: Mapping[str, str] | None = None) -> NatsOptions:
    """The options with each server URL apart (a value may hold several, comma-separated).
    ``given``: where each option was given (:attr:`~kvgateway.config.loading.Loaded.given`), so an
    error names the flag, the variable or the file's key that holds the value; an option not given
    is named by its flag."""
    where = dict(given or {})
    servers = tuple(url.strip() for value in options.servers for url in value.split(",") if url.strip())
    if needs_servers and not servers:
        raise ConfigError("no NATS server: give --nats URL, $KVGATEWAY_NATS or [cluster] nats in the file")
    windows = {"nats_retention": options.retention_seconds, "nats_duplicate_window": options.duplicate_window_seconds}
    for key, seconds in windows.items():
        if seconds <= 0:
            raise ConfigError(f"{_named(key, where)}: must be > 0, got {seconds:g}")
    if options.duplicate_window_seconds > options.retention_seconds:
        raise ConfigError(
            "the NATS duplicate window cannot exceed the retention: "
            f"{_value('nats_duplicate_window', options.duplicate_window_seconds, where)} > "
            f"{_value('nats_retention', options.retention_seconds, where)}"
        )
    if options.checkpoint_seconds < 0:
        raise ConfigError(
            f"{_named('nats_checkpoint', where)}: must be >= 0 (0: no checkpoints), got {options.checkpoint_seconds:g}"
        )
    for url in servers:
        scheme, sep, _ = url.partition("://")
        if sep and scheme.lower() not in NATS_SCHEMES:
            raise ConfigError(
                f"{_named('nats', where)} {url!r}: {scheme}:// is not NATS; give nats://HOST:PORT (or tls://, ws://, wss://)"
            )
    return replace(options, servers=servers)


def _named(key: str, given: Mapping[str, str]) -> str:
    """An option as it was given (``--nats-retention``, ``KVGATEWAY_NATS_RETENTION`` or
    ``[cluster] key 'nats_retention'``); one not given, by its flag."""
    return given.get(key) or OPTION_BY_KEY[key].flag_name


def _value(key: str, value: float, given: Mapping[str, str]) -> str:
    """``where = value``, or ``--flag = value (default)`` for an option not given."""
    return f"{given[key]} = {value:g}" if key in given else f"{OPTION_BY_KEY[key].flag_name} = {value:g} (default)"
