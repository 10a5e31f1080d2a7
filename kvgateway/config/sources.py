"""A source (one engine) from each form it is given in: a ``[[sources]]`` table, a ``--source``
flag's ``key=value`` pairs, or ``KVGATEWAY_SOURCES`` (specs separated by ``;``)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from kvgateway.config.errors import ConfigError, unknown_name
from kvgateway.config.settings import SourceConfig
from kvgateway.config.source_fields import MAX_DP_SIZE, check_endpoint, parse_bool, parse_capacity, parse_int
from kvgateway.config.vllm import vllm_source
from kvgateway.engine.endpoints import is_wildcard

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SOURCE_KEYS = ("name", "endpoint", "replay", "topic", "dp_size", "bind", "capacity_blocks", "host", "kv_events_config")


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
    endpoint = check_endpoint(name, "endpoint", raw["endpoint"])
    replay = None if raw.get("replay") in (None, "") else check_endpoint(name, "replay", raw["replay"])
    topic = raw.get("topic", "")
    if not isinstance(topic, str):
        raise ConfigError(f"source {name!r}: key 'topic': expected a string")
    dp_size = parse_int(name, "dp_size", raw.get("dp_size", 1), 1, MAX_DP_SIZE)
    # A wildcard address can only be bound; any other is connected to unless bind=true. (vLLM's
    # publisher also binds anything containing '::', which would make every IPv6 engine unreachable.)
    bind = parse_bool(name, "bind", raw.get("bind", False)) or is_wildcard(endpoint)
    if replay is not None and is_wildcard(replay):
        raise ConfigError(f"source {name!r}: key 'replay': the engine binds its replay socket; give its address")
    if dp_size > 1:
        for key, value in (("endpoint", endpoint), ("replay", replay)):
            if value is not None and value.startswith("tcp://") and int(value.rsplit(":", 1)[1]) + dp_size > 65536:
                raise ConfigError(f"source {name!r}: key {key!r}: port + dp_size runs past 65535")
    capacity = parse_capacity(name, raw["capacity_blocks"]) if "capacity_blocks" in raw else {}
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


def parse_source_specs(text: str, where: str) -> tuple[SourceConfig, ...]:
    """Specs separated by ``;`` (``KVGATEWAY_SOURCES``), each as a ``--source`` flag's."""
    specs = [spec.strip() for spec in split_top_level(text, ";") if spec.strip()]
    if not specs:
        raise ConfigError(f"{where}: empty")
    return tuple(parse_source_flag(spec, where) for spec in specs)


def sources_from_tables(tables: object) -> tuple[SourceConfig, ...]:
    """The file's ``[[sources]]`` tables."""
    if not isinstance(tables, list) or not all(isinstance(item, Mapping) for item in tables):
        raise ConfigError("config: sources must be [[sources]] tables")
    return tuple(source_from_mapping(item, f"[[sources]] #{index + 1}") for index, item in enumerate(tables))
