"""ZeroMQ endpoint rules shared by engines and the gateway (vLLM's conventions)."""

from __future__ import annotations


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


def binds(endpoint: str) -> bool:
    """vLLM's heuristic: the PUB socket binds on wildcards, ``ipc`` and ``inproc``; otherwise it connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
