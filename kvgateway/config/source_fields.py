"""One value of a source's key checked (an endpoint, an integer, true or false, the capacities),
in the words every form of a source shares: ``source 'NAME': key 'KEY': ...``."""

from __future__ import annotations

import re
from collections.abc import Mapping

from kvgateway.config.errors import ConfigError
from kvgateway.engine.endpoints import endpoint_problem

MAX_DP_SIZE = 1024
_MEDIUM = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")


def check_endpoint(source: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"source {source!r}: key {key!r}: expected an endpoint string")
    problem = endpoint_problem(value)
    if problem is not None:
        if value.startswith("tcp://"):
            problem = "is not tcp://HOST:PORT"  # with the port's range in the message of old
        raise ConfigError(f"source {source!r}: key {key!r}: {value!r} {problem}")
    return value


def parse_bool(source: str, key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ConfigError(f"source {source!r}: key {key!r}: expected true or false, got {value!r}")


def parse_int(source: str, key: str, value: object, low: int, high: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"source {source!r}: key {key!r}: expected an integer from {low} to {high}, got {value!r}")
    return value


def parse_capacity(source: str, value: object) -> dict[str, int]:
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
        out[medium.upper()] = parse_int(source, f"capacity_blocks.{medium}", blocks, 1, 2**40)
    return out
