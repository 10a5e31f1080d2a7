"""ZeroMQ endpoint rules shared by engines and the gateway (vLLM's conventions)."""

from __future__ import annotations

import re

WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "::", "[::]"})
"""Hosts that mean "every interface": an endpoint with one of them can only be bound."""

_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]*\]|[^:/\[\]]+):(?P<port>[^:/\[\]]+)$")


def offset_endpoint(endpoint: str, rank: int) -> str:
    """DP rank ``rank``'s endpoint, by vLLM's rule: TCP port + rank, ``inproc``/``ipc`` suffix ``_dp{rank}``.

    Rank 0 keeps the endpoint as given. A wildcard TCP port (``*`` or ``0``) stays a wildcard, so
    every rank gets its own ephemeral port (vLLM would fail to offset it).
    """
    if rank < 0:
        raise ValueError("rank must not be negative")
    if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError(f"unsupported endpoint {endpoint!r}: use tcp://, ipc:// or inproc://")
    if rank == 0:
        return endpoint
    if not endpoint.startswith("tcp://"):
        return f"{endpoint}_dp{rank}"
    base, sep, port = endpoint.rpartition(":")
    if not sep or base == "tcp":
        raise ValueError(f"TCP endpoint {endpoint!r} has no port")
    if port in ("*", "0"):
        return endpoint
    if not port.isdigit():
        raise ValueError(f"TCP endpoint {endpoint!r} has a bad port {port!r}")
    new_port = int(port) + rank
    if new_port > 65535:
        raise ValueError(f"rank {rank}'s port {new_port} (from {endpoint!r}) is above 65535")
    return f"{base}:{new_port}"


def rank_endpoints(endpoint: str, replay: str | None, dp_size: int) -> list[tuple[int, str, str | None]]:
    """``(rank, endpoint, replay endpoint)`` of each of ``dp_size`` DP ranks (:func:`offset_endpoint`):
    the one per-rank expansion, for the gateway's streams and the simulator's engines alike."""
    return [
        (rank, offset_endpoint(endpoint, rank), None if replay is None else offset_endpoint(replay, rank))
        for rank in range(dp_size)
    ]


def endpoint_problem(value: str, *, wildcard_port: bool = False) -> str | None:
    """Why ``value`` is not an endpoint kvgateway accepts, in a few words; None when it is one.

    The one rule for the gateway's sources and the simulator's sockets: ``tcp://HOST:PORT``
    (an IPv6 host in brackets; PORT 1-65535, or ``*`` or ``0`` where ``wildcard_port``),
    ``ipc://PATH`` or ``inproc://NAME``."""
    if value.startswith("tcp://"):
        parts = split_tcp(value)
        if parts is None:
            return "is not tcp://HOST:PORT"
        port = parts[1]
        if wildcard_port and port in ("*", "0"):
            return None
        if not port.isdigit():
            return "is not tcp://HOST:PORT"
        if not 0 < int(port) < 65536:
            return f"port {port} is not in 1-65535"
        return None
    if value.startswith(("ipc://", "inproc://")) and value.partition("://")[2]:
        return None
    return "must start with tcp://, ipc:// or inproc://"


def split_tcp(endpoint: str) -> tuple[str, str] | None:
    """``(host, port)`` of a ``tcp://HOST:PORT`` endpoint, the host without IPv6 brackets; else None."""
    match = _TCP.match(endpoint)
    if match is None:
        return None
    host = match["host"]
    return (host[1:-1] if host.startswith("[") else host), match["port"]


def tcp_endpoint(host: str, port: int | str) -> str:
    """``tcp://HOST:PORT``, with brackets around an IPv6 address."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def is_wildcard(endpoint: str) -> bool:
    """A TCP endpoint on every interface (``*``, ``0.0.0.0``, ``[::]``): one only a binder can use.

    An IPv6 address is not a wildcard because it contains ``::`` (``tcp://[::1]:5557``,
    ``tcp://[fd00::5]:5557`` name one host): vLLM's own heuristic gets this wrong.
    """
    parts = split_tcp(endpoint)
    return parts is not None and (parts[0] in WILDCARD_HOSTS or parts[0] == "")


def is_ipv6(endpoint: str) -> bool:
    """A TCP endpoint whose host is an IPv6 address: its socket needs ``zmq.IPV6`` set, or ZeroMQ
    refuses it (bind: "No such device") or never reaches it."""
    parts = split_tcp(endpoint)
    return parts is not None and ":" in parts[0]


def binds(endpoint: str) -> bool:
    """Whether a socket binds: on a wildcard host or port (nothing to connect to), ``ipc`` and
    ``inproc``; otherwise it connects.

    vLLM's publisher also binds any endpoint containing ``::`` (so every IPv6 address); this
    rule binds only the real wildcard ``[::]``, so ``tcp://[::1]:5557`` connects.
    """
    parts = split_tcp(endpoint)
    wildcard_port = parts is not None and parts[1] in ("*", "0")
    return is_wildcard(endpoint) or wildcard_port or endpoint.startswith(("ipc://", "inproc://"))


def vllm_binds(endpoint: str) -> bool:
    """What vLLM's ZmqEventPublisher actually does with its PUB endpoint: bind when the text
    contains ``*`` or ``::`` or is ``ipc``/``inproc``, connect otherwise (spec: vLLM's
    ``_socket_setup``). Used to predict an engine from its ``--kv-events-config``."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
