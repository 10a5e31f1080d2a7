"""Settings: one typed object that CLI flags, the environment and the TOML file all land in.

Precedence, for every setting: command-line flag > environment (``KVGATEWAY_*``) > TOML file
(``--config`` or ``KVGATEWAY_CONFIG``) > built-in default. Every ``[server]`` key has a flag
(``--ring-bytes``) and a variable (``KVGATEWAY_RING_BYTES``); sources are ``--source`` flags,
``KVGATEWAY_SOURCES`` (specs separated by ``;``) or ``[[sources]]`` tables, and the first of
those given replaces the others as a whole.

Errors are one line and name the setting the way it was given: ``--port`` for a flag,
``KVGATEWAY_PORT`` for a variable, ``[server] key 'port'`` for the file.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import json
import os
import re
import socket
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvgateway.engine.endpoints import (
    WILDCARD_HOSTS,
    endpoint_problem,
    is_wildcard,
    rank_endpoints,
    split_tcp,
    tcp_endpoint,
    vllm_binds,
)
from kvgateway.engine.wire import Stream

CONFIG_ENV = "KVGATEWAY_CONFIG"
TOKEN_ENV = "KVGATEWAY_TOKEN"
SOURCES_ENV = "KVGATEWAY_SOURCES"
ENV_PREFIX = "KVGATEWAY_"
NO_EXTENSIONS_ENV = "KVGATEWAY_NO_EXTENSIONS"
"""Not a setting: set (to anything but empty or 0), the process runs the pure-Python core
(:mod:`kvgateway.runtime.extensions`)."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_MEDIUM = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
SOURCE_KEYS = ("name", "endpoint", "replay", "topic", "dp_size", "bind", "capacity_blocks", "host", "kv_events_config")
MAX_DP_SIZE = 1024

KV_EVENTS_KEYS = (
    "enable_kv_cache_events",
    "publisher",
    "endpoint",
    "replay_endpoint",
    "buffer_steps",
    "hwm",
    "max_queue_size",
    "topic",
)
"""vLLM's KVEventsConfig fields: the JSON keys of ``vllm serve --kv-events-config``."""

LEARNED_FLOOR = 65_536
"""The learned chains' cap never follows the fleet below this (kvgateway/state/learner.py says why)."""
LEARNED_PER_RESIDENT = 1.25
"""The learned chains' cap follows the fleet at this many entries per resident block (kvgateway/state/learner.py)."""


def unknown_name(what: str, name: str, known: Sequence[str], prefix: str = "") -> str:
    """``what`` (``unknown key 'ring_byts'``) with the closest known name, or every known name
    when none is close: a typo is named back, a guess gets the whole list. Names are compared
    without ``prefix`` (``KVGATEWAY_``), which would make every variable look alike."""
    bare = {item.removeprefix(prefix): item for item in known}
    close = difflib.get_close_matches(name.removeprefix(prefix), bare, n=1, cutoff=0.75)
    if close:
        return f"{what}: did you mean {bare[close[0]]!r}?"
    return f"{what} (known: {', '.join(known)})"


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
    def key(self) -> Stream:
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
    max_learned_blocks: int = 2_000_000
    refetch_window: float = 60.0
    lookup_rate: float = 1000.0
    lookup_burst: int = 200
    max_snapshots: int = 4
    snapshot_queue_bytes: int = 8 * 1024 * 1024
    log_format: str = "text"
    log_level: str = "info"

    def streams(self) -> list[StreamConfig]:
        return [stream for source in self.sources for stream in expand_source(source)]


# --- endpoints -----------------------------------------------------------------------------


def _check_endpoint(source: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"source {source!r}: key {key!r}: expected an endpoint string")
    problem = endpoint_problem(value)
    if problem is not None:
        if value.startswith("tcp://"):
            problem = "is not tcp://HOST:PORT"  # with the port's range in the message of old
        raise ConfigError(f"source {source!r}: key {key!r}: {value!r} {problem}")
    return value


def expand_source(source: SourceConfig) -> list[StreamConfig]:
    return [
        StreamConfig(
            source=source.name,
            dp_rank=rank,
            endpoint=endpoint,
            replay=replay,
            topic=source.topic,
            bind=source.bind,
            capacity_blocks=source.capacity_blocks,
        )
        for rank, endpoint, replay in rank_endpoints(source.endpoint, source.replay, source.dp_size)
    ]


def resolve_host(host: str) -> frozenset[str] | None:
    """The addresses a host name stands for (an address stands for itself); None when it does not resolve."""
    if host in WILDCARD_HOSTS or host == "":
        return frozenset({"*"})
    try:
        return frozenset({str(ipaddress.ip_address(host))})
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    return frozenset(str(info[4][0]) for info in infos)


def _address_keys(address: str, cache: dict[str, frozenset[str] | None], unresolved: list[str]) -> list[str]:
    """Comparable forms of an endpoint: one per resolved address of a TCP host, else the text."""
    parts = split_tcp(address)
    if parts is None:
        return [address]
    host, port = parts
    if host not in cache:
        cache[host] = resolve_host(host)
        if cache[host] is None:
            unresolved.append(host)
    resolved = cache[host]
    if resolved is None:  # compared by name: the best there is until it resolves
        return [f"tcp://{host.lower()}:{port}"]
    return [f"tcp://{ip}:{port}" for ip in sorted(resolved)]


def check_overlaps(sources: Sequence[SourceConfig]) -> list[str]:
    """Reject two streams on one address (vLLM does not check its PUB and replay ranges).

    Addresses are compared resolved: ``tcp://localhost:7557`` and ``tcp://127.0.0.1:7557`` are
    one address. Returns the host names that did not resolve (compared by name instead).
    """
    seen: dict[str, str] = {}
    cache: dict[str, frozenset[str] | None] = {}
    unresolved: list[str] = []
    for source in sources:
        for stream in expand_source(source):
            for role, address in (("endpoint", stream.endpoint), ("replay", stream.replay)):
                if address is None:
                    continue
                what = f"source {stream.source!r} rank {stream.dp_rank} {role} {address}"
                for key in _address_keys(address, cache, unresolved):
                    if key in seen and seen[key] != what:
                        same = "" if key == address else f" (both are {key})"
                        raise ConfigError(f"{what} collides with {seen[key]}{same}")
                    seen[key] = what
    return unresolved


def unresolved_hosts(settings: Settings) -> list[str]:
    """Engine host names that do not resolve now (said at start: the engine cannot be reached yet)."""
    return check_overlaps(settings.sources)


# --- sources -------------------------------------------------------------------------------


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
            medium, colon, number = part.partition(":")
            if not colon:
                raise ConfigError(
                    f"source {source!r}: key 'capacity_blocks': expected MEDIUM:BLOCKS, "
                    f"separated by '/' (GPU:8192/CPU:65536), got {part!r}"
                )
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


def _engine_side(name: str, host: object, endpoint: str, role: str) -> str:
    """The gateway's address for an endpoint vLLM binds: a wildcard host becomes the engine's host."""
    if not is_wildcard(endpoint):
        return endpoint  # a named address (or ipc://) is reachable as it is
    if not isinstance(host, str) or not host.strip():
        raise ConfigError(
            f"source {name!r}: key 'host' is required: kv_events_config's {role} {endpoint!r} "
            "is a wildcard, so the gateway needs the engine's host name or address"
        )
    parts = split_tcp(endpoint)
    assert parts is not None  # is_wildcard() only holds for tcp://HOST:PORT
    return tcp_endpoint(host.strip().strip("[]"), parts[1])


def vllm_source(raw: Mapping[str, object], name: str) -> dict[str, object]:
    """endpoint, replay, topic and bind of a source given as vLLM's ``--kv-events-config``.

    The engine's publisher binds its PUB socket when its endpoint contains ``*`` or ``::`` or is
    ``ipc``/``inproc`` (vLLM's rule), and then the gateway connects to it, at ``host`` for a
    wildcard; otherwise the engine connects out and the gateway binds that address. The replay
    ROUTER is always bound by the engine. Ranks are offset by vLLM's rule in :func:`expand_source`.
    """
    text = raw["kv_events_config"]
    where = f"source {name!r}: key 'kv_events_config'"
    if isinstance(text, Mapping):
        spec: object = dict(text)
    elif isinstance(text, str):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    else:
        raise ConfigError(f"{where}: expected the JSON given to vllm serve --kv-events-config")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a JSON object")
    for key in spec:
        if key not in KV_EVENTS_KEYS:
            raise ConfigError(unknown_name(f"{where}: unknown key {key!r}", key, KV_EVENTS_KEYS))
    for key in ("endpoint", "replay", "topic", "bind"):
        if key in raw:
            raise ConfigError(f"source {name!r}: key {key!r}: derived from kv_events_config; give one or the other")
    if spec.get("enable_kv_cache_events") is not True:
        raise ConfigError(f'{where}: vLLM publishes nothing unless "enable_kv_cache_events": true')
    if spec.get("publisher", "null") != "zmq":
        raise ConfigError(f'{where}: vLLM publishes over ZeroMQ only with "publisher": "zmq"')
    endpoint = spec.get("endpoint", "tcp://*:5557")  # vLLM's defaults
    replay = spec.get("replay_endpoint")
    topic = spec.get("topic", "")
    if not isinstance(endpoint, str) or not isinstance(topic, str) or not isinstance(replay, str | None):
        raise ConfigError(f"{where}: endpoint, replay_endpoint and topic must be strings")
    _check_endpoint(name, "kv_events_config.endpoint", endpoint)
    if replay is not None:
        _check_endpoint(name, "kv_events_config.replay_endpoint", replay)
    dp_size = _parse_int(name, "dp_size", raw.get("dp_size", 1), 1, MAX_DP_SIZE)
    for value in (endpoint, replay):
        if value is not None and value.startswith("ipc://") and dp_size > 1:
            # vLLM's offset rule knows only tcp (port + r) and inproc (suffix); it fails on ipc.
            raise ConfigError(f"{where}: vLLM cannot run DP ranks on {value!r}; give tcp:// endpoints")
        if value is not None and value.startswith("inproc://"):
            raise ConfigError(f"{where}: {value!r} is inside the engine's process; give tcp:// or ipc://")
    out: dict[str, object] = {"topic": topic}
    if vllm_binds(endpoint):
        out["endpoint"] = _engine_side(name, raw.get("host"), endpoint, "endpoint")
        out["bind"] = False
    else:
        out["endpoint"] = endpoint  # the engine connects here: it is the gateway's address to bind
        out["bind"] = True
    if replay is not None:
        out["replay"] = _engine_side(name, raw.get("host"), replay, "replay_endpoint")
    return out


def source_from_mapping(raw: Mapping[str, object], where: str) -> SourceConfig:
    name = raw.get("name")
    if name is None:
        raise ConfigError(f"{where}: key 'name' is missing (name=NAME: 1-64 letters, digits, '_', '.', '-')")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(
            f"{where}: key 'name': expected 1-64 characters of letters, digits, '_', '.', '-', got {name!r}"
        )
    for key in raw:
        if key not in SOURCE_KEYS:
            raise ConfigError(unknown_name(f"source {name!r}: unknown key {key!r}", key, SOURCE_KEYS))
    if "kv_events_config" in raw:
        raw = {**raw, **vllm_source(raw, name)}
    elif "host" in raw:
        raise ConfigError(f"source {name!r}: key 'host' goes with kv_events_config; give endpoint= otherwise")
    if "endpoint" not in raw:
        raise ConfigError(f"source {name!r}: key 'endpoint' is required (or kv_events_config and host)")
    endpoint = _check_endpoint(name, "endpoint", raw["endpoint"])
    replay = None if raw.get("replay") in (None, "") else _check_endpoint(name, "replay", raw["replay"])
    topic = raw.get("topic", "")
    if not isinstance(topic, str):
        raise ConfigError(f"source {name!r}: key 'topic': expected a string")
    dp_size = _parse_int(name, "dp_size", raw.get("dp_size", 1), 1, MAX_DP_SIZE)
    # A wildcard address can only be bound; any other is connected to unless bind=true. (vLLM's
    # publisher also binds anything containing '::', which would make every IPv6 engine unreachable.)
    bind = _parse_bool(name, "bind", raw.get("bind", False)) or is_wildcard(endpoint)
    if replay is not None and is_wildcard(replay):
        raise ConfigError(f"source {name!r}: key 'replay': the engine binds its replay socket; give its address")
    if dp_size > 1:
        for key, value in (("endpoint", endpoint), ("replay", replay)):
            if value is not None and value.startswith("tcp://") and int(value.rsplit(":", 1)[1]) + dp_size > 65536:
                raise ConfigError(f"source {name!r}: key {key!r}: port + dp_size runs past 65535")
    capacity = _parse_capacity(name, raw["capacity_blocks"]) if "capacity_blocks" in raw else {}
    return SourceConfig(name, endpoint, replay, topic, dp_size, bind, capacity)


def split_top_level(text: str, separator: str) -> list[str]:
    """Split at ``separator`` outside JSON braces, brackets and strings (a kv_events_config value
    is JSON, with commas of its own)."""
    parts: list[str] = []
    depth = 0
    quoted = escaped = False
    current: list[str] = []
    for char in text:
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth = max(0, depth - 1)
        elif char == separator and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return parts


def parse_source_flag(text: str, flag: str = "--source") -> SourceConfig:
    """``name=NAME,endpoint=tcp://HOST:PORT[,replay=...][,topic=...][,dp_size=N][,bind=true]``, or
    ``name=NAME,host=HOST,dp_size=N,kv_events_config=JSON`` (vLLM's own flag value)."""
    raw: dict[str, object] = {}
    for part in split_top_level(text, ","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{flag} {text!r}: expected key=value pairs separated by commas, got {part!r}")
        if key in raw:
            raise ConfigError(f"{flag} {text!r}: key {key!r} given twice")
        raw[key] = value.strip()
    return source_from_mapping(raw, f"{flag} {text!r}")


# --- server settings: one table for the file, the environment and the flags ------------------


@dataclass(frozen=True, slots=True)
class Option:
    """One ``[server]`` setting, also a flag and a ``KVGATEWAY_*`` variable."""

    key: str
    kind: type
    group: str
    help: str
    limits: tuple[float, float] | None = None
    choices: tuple[str, ...] = ()
    flag: str = ""  # default: --key-with-dashes
    metavar: str | None = None

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.key.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def dest(self) -> str:
        return self.flag_name[2:].replace("-", "_")


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")

GROUPS = {
    "http": "HTTP",
    "security": "security",
    "limits": "limits",
    "routers": "routers (GET /v1/blocks, POST /v1/lookup, snapshot=blocks)",
    "logging": "logging",
}

OPTIONS: tuple[Option, ...] = (
    Option("host", str, "http", "HTTP listen address (default 127.0.0.1; any other needs a token)"),
    Option("port", int, "http", "HTTP port, 0 = any free port (default 8080)", (0, 65535)),
    Option(
        "keepalive_seconds",
        float,
        "http",
        "WebSocket ping and SSE keepalive interval in seconds (default 15)",
        (0.1, 3600),
    ),
    Option("token", str, "security", "bearer token required on /v1/* (prefer --token-file: argv is visible)"),
    Option("token_file", str, "security", "read the bearer token from FILE", metavar="FILE"),
    Option(
        "allowed_origins",
        list,
        "security",
        "a browser Origin allowed to open a WebSocket (repeatable; variable: comma-separated)",
        flag="--allowed-origin",
        metavar="ORIGIN",
    ),
    Option(
        "allowed_hosts",
        list,
        "security",
        "a Host name clients may use (repeatable; variable: comma-separated); guards against DNS rebinding",
        flag="--allowed-host",
        metavar="NAME",
    ),
    Option("allow_unauthenticated", bool, "security", "allow a non-loopback --host without a token"),
    Option("max_clients", int, "limits", "web clients at once (default 1000)", (1, 1_000_000)),
    Option("ring_messages", int, "limits", "resume ring size in messages (default 10000)", (1, 10_000_000)),
    Option("ring_bytes", int, "limits", "resume ring size in bytes (default 64 MiB)", (1024, 2**40), metavar="BYTES"),
    Option(
        "client_queue_bytes",
        int,
        "limits",
        "per-client queue before it is cut (default 1 MiB)",
        (1024, 2**34),
        metavar="BYTES",
    ),
    Option("replay_timeout", float, "limits", "seconds to wait for an engine's replay (default 5)", (0.05, 3600)),
    Option("restart_window", int, "limits", "seq drop that means a publisher restart (default 1024)", (1, 2**62)),
    Option("hold_limit", int, "limits", "live batches held per stream in a replay (default 10000)", (1, 10_000_000)),
    Option("max_concurrent_replays", int, "limits", "replays in flight across all streams (default 4)", (1, 1024)),
    Option(
        "max_learned_blocks",
        int,
        "routers",
        f"ceiling of learned token chains for lookups by token_ids (the cap follows the fleet: "
        f"{LEARNED_PER_RESIDENT:g} per resident block, at least {LEARNED_FLOOR}); 0 = off (default 2000000)",
        (0, 2**32),
    ),
    Option(
        "refetch_window",
        float,
        "limits",
        "seconds within which a block evicted and stored again counts as a refetch (default 60)",
        (1, 86_400),
        metavar="SECONDS",
    ),
    Option(
        "lookup_rate",
        float,
        "routers",
        "POST /v1/lookup per second, all clients (default 1000)",
        (0.01, 1e7),
        metavar="PER_SECOND",
    ),
    Option("lookup_burst", int, "routers", "lookups allowed at once above the rate (default 200)", (1, 10_000_000)),
    Option("max_snapshots", int, "routers", "block snapshots served at once (default 4)", (1, 1024)),
    Option(
        "snapshot_queue_bytes",
        int,
        "routers",
        "a client's live queue while its block snapshot is sent (default 8 MiB)",
        (1024, 2**34),
        metavar="BYTES",
    ),
    Option("log_format", str, "logging", "text or json (default text)", choices=LOG_FORMATS),
    Option("log_level", str, "logging", "debug shows every HTTP request (default info)", choices=LOG_LEVELS),
)
OPTION_BY_KEY = {option.key: option for option in OPTIONS}

CLUSTER_TABLE = "cluster"
CLUSTER_OPTIONS: tuple[Option, ...] = (
    Option("workers", int, "cluster", "serve: edge processes (none: one process)", (1, 1024)),
    Option("state_dir", str, "cluster", "serve --workers: the private nats-server's store"),
    Option("nats", list, "cluster", "NATS server URLs"),
    Option("nats_stream", str, "cluster", "the stream"),
    Option("nats_subject_prefix", str, "cluster", "subjects PREFIX.SOURCE.RANK"),
    Option("nats_retention", float, "cluster", "the stream's max_age"),
    Option("nats_duplicate_window", float, "cluster", "the stream's duplicate window"),
    Option("nats_checkpoint", float, "cluster", "edge: seconds between index checkpoints (0: none)"),
    Option("nats_leases", bool, "cluster", "ingest: share the sources with the other ingest processes"),
    Option("nats_replicas", int, "cluster", "stream replicas", (1, 5)),
    Option("nats_creds", str, "cluster", "a NATS credentials file"),
    Option("nats_token_file", str, "cluster", "a NATS token file"),
    Option("nats_tls_ca", str, "cluster", "CA bundle"),
    Option("nats_tls_cert", str, "cluster", "client certificate"),
    Option("nats_tls_key", str, "cluster", "client certificate's key"),
)
"""The cluster's settings (``serve --workers``, ``ingest``, ``edge``): flags, ``KVGATEWAY_*``
variables and keys of the file's ``[cluster]`` table, with the same precedence as the rest. They
land on the parsed arguments (:func:`resolve_cluster`), not in :class:`Settings`."""
CLUSTER_BY_KEY = {option.key: option for option in CLUSTER_OPTIONS}
_SERVER_KEYS: dict[str, type] = {option.key: option.kind for option in OPTIONS}


def _coerce(option: Option, value: object, where: str) -> object:
    """Check one value of ``option``; ``where`` names it as the user gave it (flag, variable, key)."""
    kind = option.kind
    if isinstance(value, str) and kind is not str and kind is not list:  # flag and variable text
        text = value.strip()
        if kind is bool:
            if text.lower() not in ("true", "1", "yes", "false", "0", "no"):
                raise ConfigError(f"{where}: expected true or false, got {value!r}")
            value = text.lower() in ("true", "1", "yes")
        else:
            try:
                value = int(text) if kind is int else float(text)
            except ValueError:
                what = "an integer" if kind is int else "a number"
                raise ConfigError(f"{where}: expected {what}, got {value!r}") from None
    if kind is list and isinstance(value, str):  # a variable: comma-separated
        value = [item.strip() for item in value.split(",") if item.strip()]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, bool):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if not isinstance(value, kind):
        names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list"}
        raise ConfigError(f"{where}: expected {names[kind]}, got {value!r}")
    if option.limits is not None:
        low, high = option.limits
        assert isinstance(value, int | float)
        if not low <= value <= high:
            raise ConfigError(f"{where}: must be from {low:g} to {high:g}, got {value!r}")
    if option.choices:
        value = str(value).lower()
        if value not in option.choices:
            raise ConfigError(f"{where}: one of {', '.join(option.choices)}, got {value!r}")
    if kind is str and not str(value).strip():
        raise ConfigError(f"{where}: empty")
    if kind is list:
        assert isinstance(value, list)
        if not all(isinstance(item, str) and item.strip() for item in value):
            raise ConfigError(f"{where}: expected a list of non-empty strings")
        items = [item.strip() for item in value]
        return tuple(item.lower() for item in items) if option.key == "allowed_hosts" else tuple(items)
    return value


def _apply(changes: dict[str, Any], key: str, value: object) -> None:
    if key == "token_file":
        changes["token"] = read_token_file(str(value))
    elif key == "token":
        changes["token"] = str(value).strip()
    else:
        changes[key] = value


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
    """A TOML document's settings over ``base`` (the defaults)."""
    settings = base or Settings()
    for key in data:
        if key not in ("server", "sources", CLUSTER_TABLE):
            raise ConfigError(f"config: unknown table {key!r} (expected [server], [[sources]] and [cluster])")
    _cluster_table(data)  # checked here with the rest; applied by resolve_cluster
    server = data.get("server", {})
    if not isinstance(server, Mapping):
        raise ConfigError("config: [server] must be a table")
    changes: dict[str, Any] = {}
    for key, value in server.items():
        option = OPTION_BY_KEY.get(key)
        if option is None:
            raise ConfigError(unknown_name(f"[server]: unknown key {key!r}", key, list(OPTION_BY_KEY)))
        _apply(changes, key, _coerce(option, value, f"[server] key {key!r}"))
    sources_raw = data.get("sources", [])
    if not isinstance(sources_raw, list) or not all(isinstance(item, Mapping) for item in sources_raw):
        raise ConfigError("config: sources must be [[sources]] tables")
    if sources_raw:
        changes["sources"] = tuple(
            source_from_mapping(item, f"[[sources]] #{index + 1}") for index, item in enumerate(sources_raw)
        )
    return replace(settings, **changes)


_SERVICE_LINK = re.compile(r"^KVGATEWAY_(SERVICE_|PORT_\d+_)")
"""Kubernetes' service-link variables for a Service named kvgateway: not ours, never an error."""


def settings_from_env(env: Mapping[str, str], base: Settings) -> Settings:
    """``KVGATEWAY_*`` variables over ``base``; an unknown ``KVGATEWAY_`` name is an error (a typo
    would otherwise be silently ignored)."""
    known = {option.env for option in (*OPTIONS, *CLUSTER_OPTIONS)} | {CONFIG_ENV, SOURCES_ENV, NO_EXTENSIONS_ENV}
    cluster = {option.env for option in CLUSTER_OPTIONS}  # for resolve_cluster
    changes: dict[str, Any] = {}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in (CONFIG_ENV, NO_EXTENSIONS_ENV) or _SERVICE_LINK.match(name):
            continue
        if name == OPTION_BY_KEY["port"].env and env[name].startswith("tcp://"):
            raise ConfigError(
                f"{name}={env[name]!r} was set by Kubernetes for a Service named kvgateway: "
                "set enableServiceLinks: false in the pod spec (deploy/k8s does)"
            )
        if name not in known:
            raise ConfigError(unknown_name(f"{name}: unknown variable", name, sorted(known), ENV_PREFIX))
        if name in cluster:
            continue
        value = env[name]
        if name == SOURCES_ENV:
            specs = [spec.strip() for spec in split_top_level(value, ";") if spec.strip()]
            if not specs:
                raise ConfigError(f"{SOURCES_ENV}: empty")
            changes["sources"] = tuple(parse_source_flag(spec, SOURCES_ENV) for spec in specs)
            continue
        option = next(option for option in OPTIONS if option.env == name)
        _apply(changes, option.key, _coerce(option, value, name))
    return replace(base, **changes)


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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# --- command line --------------------------------------------------------------------------

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


CLIENT_ONLY = frozenset(
    {
        "token",
        "token_file",
        "allowed_origins",
        "allowed_hosts",
        "allow_unauthenticated",
        "max_clients",
        "client_queue_bytes",
        "keepalive_seconds",
        "lookup_rate",
        "lookup_burst",
        "max_snapshots",
        "snapshot_queue_bytes",
    }
)
"""The settings of web clients (auth, limits, routers' queries): ``kvgateway ingest`` serves no
client, so it has no flags for them (a shared file or environment may still hold them)."""


def add_serve_arguments(parser: argparse.ArgumentParser, *, skip: frozenset[str] = frozenset()) -> None:
    parser.description = SERVE_DESCRIPTION
    parser.epilog = SERVE_EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    engines = parser.add_argument_group("engines")
    engines.add_argument("--config", metavar="FILE", help=f"TOML file ([server], [[sources]]); or ${CONFIG_ENV}")
    engines.add_argument(
        "--source",
        action="append",
        metavar="SPEC",
        help="name=NAME,endpoint=tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T][,dp_size=N][,bind=true]"
        "[,capacity_blocks=GPU:N/CPU:N], or name=NAME,host=HOST,dp_size=N,kv_events_config=JSON with the "
        f"JSON given to vllm serve --kv-events-config (repeatable; or ${SOURCES_ENV}, specs separated by ';'; "
        "replaces the file's sources)",
    )
    add_server_arguments(parser, skip=skip)


def add_server_arguments(parser: argparse.ArgumentParser, *, skip: frozenset[str] = frozenset()) -> None:
    """The HTTP-side flags, shared by ``serve`` and ``demo``: one per [server] key but ``skip``."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for option in OPTIONS:
        if option.key in skip:
            continue
        if option.group not in groups:
            groups[option.group] = parser.add_argument_group(GROUPS[option.group])
        group = groups[option.group]
        env = f"; ${option.env}"
        if option.kind is bool:
            group.add_argument(option.flag_name, action="store_true", default=None, help=option.help + env)
        elif option.kind is list:
            group.add_argument(option.flag_name, action="append", metavar=option.metavar, help=option.help + env)
        else:
            default_metavar = {int: "N", float: "SECONDS"}.get(option.kind, option.key.split("_")[-1].upper())
            metavar = option.metavar or ("|".join(option.choices) if option.choices else default_metavar)
            # Values are checked by _coerce, not argparse: one wording for flags, variables and keys.
            group.add_argument(option.flag_name, metavar=metavar, help=option.help + env)


def flag_names(parser: argparse.ArgumentParser) -> set[str]:
    """Every --flag of ``parser`` and its subcommands (for the docs test)."""
    names: set[str] = set()
    for action in parser._actions:
        names.update(opt for opt in action.option_strings if opt.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names |= flag_names(sub)
    return names


def _config_path(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    if getattr(args, "config", None) == "":
        raise ConfigError("--config: empty")
    return getattr(args, "config", None) or env.get(CONFIG_ENV) or None


def _cluster_table(data: Mapping[str, Any]) -> dict[str, object]:
    """The file's ``[cluster]`` keys, checked."""
    table = data.get(CLUSTER_TABLE, {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"config: [{CLUSTER_TABLE}] must be a table")
    out: dict[str, object] = {}
    for key, value in table.items():
        option = CLUSTER_BY_KEY.get(key)
        if option is None:
            raise ConfigError(unknown_name(f"[{CLUSTER_TABLE}]: unknown key {key!r}", key, list(CLUSTER_BY_KEY)))
        given = [value] if option.kind is list and isinstance(value, str) else value
        out[key] = _coerce(option, given, f"[{CLUSTER_TABLE}] key {key!r}")
    return out


def resolve_cluster(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> None:
    """Fill in ``args``' cluster settings that no flag gave from the environment, then the file's
    ``[cluster]`` table (the command's own flags only: ``serve`` has --workers, --state-dir and
    --nats; ``ingest`` and ``edge`` every --nats-*). Values are checked; None stays "not given"."""
    env = os.environ if environ is None else environ
    path = _config_path(args, env)
    table = _cluster_table(load_file(path)) if path else {}
    for option in CLUSTER_OPTIONS:
        if not hasattr(args, option.dest):
            continue
        value = getattr(args, option.dest)
        if value is not None:
            checked = _coerce(option, list(value) if option.kind is list else value, option.flag_name)
        elif option.env in env:
            checked = _coerce(option, env[option.env], option.env)
        else:
            checked = table.get(option.key)
        setattr(args, option.dest, list(checked) if isinstance(checked, tuple) else checked)


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """Defaults < file < environment < flags (``environ`` defaults to ``os.environ``)."""
    env = os.environ if environ is None else environ
    settings = Settings()
    path = _config_path(args, env)
    if path:
        settings = settings_from_mapping(load_file(path), settings)
    settings = settings_from_env(env, settings)
    flags: dict[str, Any] = {}
    for option in OPTIONS:
        value = getattr(args, option.dest, None)
        if value is None:
            continue
        if option.kind is list:
            checked = _coerce(option, list(value), option.flag_name)
        else:
            checked = _coerce(option, value, option.flag_name)
        _apply(flags, option.key, checked)
    if getattr(args, "source", None):
        flags["sources"] = tuple(parse_source_flag(text) for text in args.source)
    settings = replace(settings, **flags)
    if not settings.sources and getattr(args, "command", None) == "serve":
        raise ConfigError(f"no sources: give --source, ${SOURCES_ENV} or a config file with [[sources]]")
    return validate(settings, clients=getattr(args, "command", None) != "ingest")


SUMMARY_STREAMS = 8
"""Past this many streams the start-up line counts them (each is then a debug line: stream_lines)."""


def _stream_text(stream: StreamConfig) -> str:
    replay = f" replay {stream.replay}" if stream.replay else ""
    return f"{stream.source}[{stream.dp_rank}]={'bind ' if stream.bind else ''}{stream.endpoint}{replay}"


def stream_lines(settings: Settings) -> list[str]:
    """Every stream's addresses, one line each."""
    return [_stream_text(stream) for stream in settings.streams()]


def streams_text(settings: Settings) -> str:
    """The streams, for a start-up line: each one, or a count and some names when there are many."""
    streams = settings.streams()
    if len(streams) > SUMMARY_STREAMS:
        names = [source.name for source in settings.sources]
        shown = ", ".join(names[:3]) + (f" ... {names[-1]}" if len(names) > 3 else "")
        return f"{len(streams)} from {len(names)} sources ({shown}; --log-level debug lists them)"
    return ", ".join(_stream_text(stream) for stream in streams) or "none"


def summary(settings: Settings) -> str:
    """The start-up line: everything an operator checks, never the token itself; one short line
    however many streams there are."""
    listed = streams_text(settings)
    return (
        f"http {settings.host}:{settings.port}, auth {'token' if settings.token else 'none'}, "
        f"ring {settings.ring_messages} msgs/{settings.ring_bytes} B, client queue {settings.client_queue_bytes} B, "
        f"max clients {settings.max_clients}, streams: {listed}"
    )
