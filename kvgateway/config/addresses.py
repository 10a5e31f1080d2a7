"""Addresses: two streams never share one (compared resolved), and the HTTP host that only this
machine reaches."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

from kvgateway.config.errors import ConfigError
from kvgateway.config.settings import Settings, SourceConfig, expand_source
from kvgateway.engine.endpoints import WILDCARD_HOSTS, split_tcp


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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
