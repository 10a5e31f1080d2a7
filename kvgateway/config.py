"""Settings: one typed object that CLI flags, the TOML file and the environment all land in.

Precedence: built-in defaults < TOML file (``--config`` or ``KVGATEWAY_CONFIG``) <
environment (``KVGATEWAY_TOKEN``) < command-line flags. ``--source`` flags, when given,
replace the file's ``[[sources]]`` list as a whole.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvgateway.endpoints import offset_endpoint

CONFIG_ENV = "KVGATEWAY_CONFIG"
TOKEN_ENV = "KVGATEWAY_TOKEN"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]+\]|[^:/\[\]]+):(?P<port>\d{1,5})$")
_MEDIUM = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
SOURCE_KEYS = ("name", "endpoint", "replay", "topic", "dp_size", "bind", "capacity_blocks")
MAX_DP_SIZE = 1024


class ConfigError(ValueError):
    """Invalid configuration; the message is one line naming the source and key."""


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """One engine as configured: ``dp_size`` publishers on consecutive ports."""

    name: str
    endpoint: str
    replay: str | None = None
    topic: str = ""
    dp_size: int = 1
    bind: bool = False
    capacity_blocks: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """One (source, dp_rank) publisher after vLLM's port-offset rule was applied."""

    source: str
    dp_rank: int
    endpoint: str
    replay: str | None
    topic: str
    bind: bool
    capacity_blocks: Mapping[str, int]

    @property
    def key(self) -> tuple[str, int]:
        return (self.source, self.dp_rank)


@dataclass(frozen=True, slots=True)
class Settings:
    sources: tuple[SourceConfig, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    allow_unauthenticated: bool = False
    max_clients: int = 1000
    ring_messages: int = 10_000
    ring_bytes: int = 64 * 1024 * 1024
    client_queue_bytes: int = 1024 * 1024
    replay_timeout: float = 5.0
    restart_window: int = 1024
    hold_limit: int = 10_000
    max_concurrent_replays: int = 4
    keepalive_seconds: float = 15.0
    log_format: str = "text"
    log_level: str = "info"

    def streams(self) -> list[StreamConfig]:
        return [stream for source in self.sources for stream in expand_source(source)]


# --- endpoints -----------------------------------------------------------------------------


def _check_endpoint(source: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"source {source!r}: key {key!r}: expected an endpoint string")
    if value.startswith("tcp://"):
        match = _TCP.match(value)
        if not match or not 0 < int(match["port"]) < 65536:
            raise ConfigError(f"source {source!r}: key {key!r}: {value!r} is not tcp://HOST:PORT")
        return value
    if value.startswith(("ipc://", "inproc://")) and len(value) > len("ipc://"):
        return value
    raise ConfigError(f"source {source!r}: key {key!r}: {value!r} must start with tcp://, ipc:// or inproc://")


def _is_wildcard(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint


def expand_source(source: SourceConfig) -> list[StreamConfig]:
    return [
        StreamConfig(
            source=source.name,
            dp_rank=rank,
            endpoint=offset_endpoint(source.endpoint, rank),
            replay=None if source.replay is None else offset_endpoint(source.replay, rank),
            topic=source.topic,
            bind=source.bind,
            capacity_blocks=source.capacity_blocks,
        )
        for rank in range(source.dp_size)
    ]


def check_overlaps(sources: Sequence[SourceConfig]) -> None:
    """Reject two streams on one address (vLLM does not check its PUB and replay ranges)."""
    seen: dict[str, str] = {}
    for source in sources:
        for stream in expand_source(source):
            for role, address in (("endpoint", stream.endpoint), ("replay", stream.replay)):
                if address is None:
                    continue
                what = f"source {stream.source!r} rank {stream.dp_rank} {role} {address}"
                if address in seen:
                    raise ConfigError(f"{what} collides with {seen[address]}")
                seen[address] = what


# --- parsing -------------------------------------------------------------------------------


def _parse_bool(source: str, key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ConfigError(f"source {source!r}: key {key!r}: expected true or false, got {value!r}")


def _parse_int(source: str, key: str, value: object, low: int, high: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"source {source!r}: key {key!r}: expected an integer from {low} to {high}, got {value!r}")
    return value


def _parse_capacity(source: str, value: object) -> dict[str, int]:
    if isinstance(value, str):  # CLI form: GPU:8192/CPU:65536
        pairs: list[tuple[str, object]] = []
        for part in filter(None, value.split("/")):
            medium, _, number = part.partition(":")
            pairs.append((medium, number))
        value = dict(pairs)
    if not isinstance(value, Mapping):
        raise ConfigError(f"source {source!r}: key 'capacity_blocks': expected a table of medium = blocks")
    out: dict[str, int] = {}
    for medium, blocks in value.items():
        if not isinstance(medium, str) or not _MEDIUM.match(medium):
            raise ConfigError(f"source {source!r}: key 'capacity_blocks': bad medium name {medium!r}")
        out[medium.upper()] = _parse_int(source, f"capacity_blocks.{medium}", blocks, 1, 2**40)
    return out


def source_from_mapping(raw: Mapping[str, object], where: str) -> SourceConfig:
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(
            f"{where}: key 'name': expected 1-64 characters of letters, digits, '_', '.', '-', got {name!r}"
        )
    for key in raw:
        if key not in SOURCE_KEYS:
            raise ConfigError(f"source {name!r}: unknown key {key!r} (known: {', '.join(SOURCE_KEYS)})")
    if "endpoint" not in raw:
        raise ConfigError(f"source {name!r}: key 'endpoint' is required")
    endpoint = _check_endpoint(name, "endpoint", raw["endpoint"])
    replay = None if raw.get("replay") in (None, "") else _check_endpoint(name, "replay", raw["replay"])
    topic = raw.get("topic", "")
    if not isinstance(topic, str):
        raise ConfigError(f"source {name!r}: key 'topic': expected a string")
    dp_size = _parse_int(name, "dp_size", raw.get("dp_size", 1), 1, MAX_DP_SIZE)
    # As with vLLM's publisher: a wildcard address is bound, any other is connected to unless bind=true.
    bind = _parse_bool(name, "bind", raw.get("bind", False)) or _is_wildcard(endpoint)
    if replay is not None and _is_wildcard(replay):
        raise ConfigError(f"source {name!r}: key 'replay': the engine binds its replay socket; give its address")
    if dp_size > 1:
        for key, value in (("endpoint", endpoint), ("replay", replay)):
            if value is not None and value.startswith("tcp://") and int(value.rsplit(":", 1)[1]) + dp_size > 65536:
                raise ConfigError(f"source {name!r}: key {key!r}: port + dp_size runs past 65535")
    capacity = _parse_capacity(name, raw["capacity_blocks"]) if "capacity_blocks" in raw else {}
    return SourceConfig(name, endpoint, replay, topic, dp_size, bind, capacity)


def parse_source_flag(text: str) -> SourceConfig:
    """``name=NAME,endpoint=tcp://HOST:PORT[,replay=...][,topic=...][,dp_size=N][,bind=true]``."""
    raw: dict[str, object] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--source {text!r}: expected key=value pairs separated by commas, got {part!r}")
        if key in raw:
            raise ConfigError(f"--source {text!r}: key {key!r} given twice")
        raw[key] = value.strip()
    return source_from_mapping(raw, f"--source {text!r}")


_SERVER_KEYS: dict[str, type] = {
    "host": str,
    "port": int,
    "token": str,
    "token_file": str,
    "allowed_origins": list,
    "allowed_hosts": list,
    "allow_unauthenticated": bool,
    "max_clients": int,
    "ring_messages": int,
    "ring_bytes": int,
    "client_queue_bytes": int,
    "replay_timeout": float,
    "restart_window": int,
    "hold_limit": int,
    "max_concurrent_replays": int,
    "keepalive_seconds": float,
    "log_format": str,
    "log_level": str,
}

_LIMITS: dict[str, tuple[float, float]] = {
    "port": (0, 65535),
    "max_clients": (1, 1_000_000),
    "ring_messages": (1, 10_000_000),
    "ring_bytes": (1024, 2**40),
    "client_queue_bytes": (1024, 2**34),
    "replay_timeout": (0.05, 3600),
    "restart_window": (1, 2**62),
    "hold_limit": (1, 10_000_000),
    "max_concurrent_replays": (1, 1024),
    "keepalive_seconds": (0.1, 3600),
}

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


def _server_value(key: str, value: object) -> object:
    kind = _SERVER_KEYS.get(key)
    if kind is None:
        raise ConfigError(f"[server]: unknown key {key!r}")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, bool):
        raise ConfigError(f"[server]: key {key!r}: expected an integer")
    if not isinstance(value, kind):
        raise ConfigError(f"[server]: key {key!r}: expected {kind.__name__}, got {value!r}")
    if key in _LIMITS:
        low, high = _LIMITS[key]
        assert isinstance(value, int | float)
        if not low <= value <= high:
            raise ConfigError(f"[server]: key {key!r}: must be from {low:g} to {high:g}, got {value!r}")
    if key == "log_level" and str(value).lower() not in LOG_LEVELS:
        raise ConfigError(f"[server]: key 'log_level': one of {', '.join(LOG_LEVELS)}")
    if key == "log_format" and value not in LOG_FORMATS:
        raise ConfigError(f"[server]: key 'log_format': one of {', '.join(LOG_FORMATS)}")
    if key in ("allowed_origins", "allowed_hosts"):
        assert isinstance(value, list)
        if not all(isinstance(item, str) and item for item in value):
            raise ConfigError(f"[server]: key {key!r}: expected a list of non-empty strings")
        return tuple(value)
    return value


def read_token_file(path: str) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"token file {path!r}: {exc.strerror or exc}") from None
    if not token:
        raise ConfigError(f"token file {path!r} is empty")
    return token


def load_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"config file {path!r}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path!r}: {exc}") from None


def settings_from_mapping(data: Mapping[str, Any], base: Settings | None = None) -> Settings:
    settings = base or Settings()
    for key in data:
        if key not in ("server", "sources"):
            raise ConfigError(f"config: unknown table {key!r} (expected [server] and [[sources]])")
    server = data.get("server", {})
    if not isinstance(server, Mapping):
        raise ConfigError("config: [server] must be a table")
    changes: dict[str, Any] = {}
    for key, value in server.items():
        checked = _server_value(key, value)
        if key == "token_file":
            changes["token"] = read_token_file(str(checked))
        else:
            changes[key] = checked
    sources_raw = data.get("sources", [])
    if not isinstance(sources_raw, list) or not all(isinstance(item, Mapping) for item in sources_raw):
        raise ConfigError("config: sources must be [[sources]] tables")
    if sources_raw:
        changes["sources"] = tuple(
            source_from_mapping(item, f"[[sources]] #{index + 1}") for index, item in enumerate(sources_raw)
        )
    return replace(settings, **changes)


def validate(settings: Settings) -> Settings:
    names = [source.name for source in settings.sources]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"source {name!r}: key 'name': given twice")
    check_overlaps(settings.sources)
    if settings.token is not None and not settings.token.strip():
        raise ConfigError("token: empty")
    if not is_loopback(settings.host) and settings.token is None and not settings.allow_unauthenticated:
        raise ConfigError(
            f"host {settings.host!r} is reachable from other machines and no token is set: "
            "give --token/--token-file/KVGATEWAY_TOKEN, or --allow-unauthenticated to accept that risk"
        )
    return settings


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# --- command line --------------------------------------------------------------------------


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help=f"TOML file ([server], [[sources]]); or ${CONFIG_ENV}")
    parser.add_argument(
        "--source",
        action="append",
        metavar="SPEC",
        help="name=NAME,endpoint=tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T][,dp_size=N][,bind=true]"
        "[,capacity_blocks=GPU:N/CPU:N] (repeatable; replaces the file's sources)",
    )
    add_server_arguments(parser)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The HTTP-side flags, shared by ``serve`` and ``demo``."""
    parser.add_argument("--host", help="HTTP listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="HTTP port (default 8080)")
    parser.add_argument("--token", help=f"bearer token required on /v1/* (or ${TOKEN_ENV}, or --token-file)")
    parser.add_argument("--token-file", metavar="FILE", help="read the token from FILE")
    parser.add_argument(
        "--allowed-origin", action="append", metavar="ORIGIN", help="browser Origin allowed on WebSocket (repeatable)"
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a Host name clients may use (repeatable); guards against DNS rebinding",
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=None,
        help="allow a non-loopback --host without a token",
    )
    parser.add_argument("--max-clients", type=int, help="web clients at once (default 1000)")
    parser.add_argument("--ring-messages", type=int, help="resume ring size in messages (default 10000)")
    parser.add_argument("--ring-bytes", type=int, help="resume ring size in bytes (default 64 MiB)")
    parser.add_argument("--client-queue-bytes", type=int, help="per-client queue before it is cut (default 1 MiB)")
    parser.add_argument("--replay-timeout", type=float, help="seconds to wait for a replay (default 5)")
    parser.add_argument("--restart-window", type=int, help="seq drop that means a restart (default 1024)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, help="text or json (default text)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, help="default info")


_FLAG_KEYS = (
    "host",
    "port",
    "max_clients",
    "ring_messages",
    "ring_bytes",
    "client_queue_bytes",
    "replay_timeout",
    "restart_window",
    "log_format",
    "log_level",
    "allow_unauthenticated",
)


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    settings = Settings()
    path = getattr(args, "config", None) or env.get(CONFIG_ENV)
    if path:
        settings = settings_from_mapping(load_file(path), settings)
    if env.get(TOKEN_ENV):
        settings = replace(settings, token=env[TOKEN_ENV].strip())
    flags: dict[str, Any] = {}
    for key in _FLAG_KEYS:
        value = getattr(args, key, None)
        if value is not None:
            flags[key] = _server_value(key, value)
    if getattr(args, "allowed_origin", None):
        flags["allowed_origins"] = tuple(args.allowed_origin)
    if getattr(args, "allowed_host", None):
        flags["allowed_hosts"] = tuple(host.lower() for host in args.allowed_host)
    if getattr(args, "token_file", None):
        flags["token"] = read_token_file(args.token_file)
    if getattr(args, "token", None):
        flags["token"] = args.token
    if getattr(args, "source", None):
        flags["sources"] = tuple(parse_source_flag(text) for text in args.source)
    settings = replace(settings, **flags)
    if not settings.sources and getattr(args, "command", None) == "serve":
        raise ConfigError("no sources: give --source or a config file with [[sources]]")
    return validate(settings)


def summary(settings: Settings) -> str:
    """The start-up line: everything an operator checks, never the token itself."""
    streams = ", ".join(
        f"{s.source}[{s.dp_rank}]={'bind ' if s.bind else ''}{s.endpoint}" + (f" replay {s.replay}" if s.replay else "")
        for s in settings.streams()
    )
    return (
        f"http {settings.host}:{settings.port}, auth {'token' if settings.token else 'none'}, "
        f"ring {settings.ring_messages} msgs/{settings.ring_bytes} B, client queue {settings.client_queue_bytes} B, "
        f"max clients {settings.max_clients}, streams: {streams or 'none'}"
    )
