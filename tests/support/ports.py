"""The one free-port finder of the tests."""

from __future__ import annotations

import socket


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, *, spacing: int = 1, host: str = "127.0.0.1") -> list[int]:
    """``count`` ports free on ``host`` now (``""``: every interface), each with ``spacing - 1``
    free neighbours above it (a DP range: rank N's port is the base + N)."""
    found: list[int] = []
    for _ in range(50 * count):
        if len(found) == count:
            return found
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            base = int(probe.getsockname()[1])
        if base + spacing >= 65535:
            continue
        taken = {p for b in found for p in range(b, b + spacing)}
        if any(p in taken for p in range(base, base + spacing)):
            continue
        if all(_bindable(host, port) for port in range(base + 1, base + spacing)):
            found.append(base)
    if len(found) == count:
        return found
    raise RuntimeError(f"no {count} blocks of {spacing} free ports found")


def free_port() -> int:
    (port,) = free_ports(1)
    return port


def established(port: int) -> set[int]:
    """The remote ports of the established TCP connections to local ``port`` (Linux /proc/net). The
    kernel completes a connect to a listening socket whose process is stopped (SIGSTOP): this sees
    that connection before the process accepts it, which nothing in the process can report."""
    found: set[int] = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path, encoding="ascii") as table:
            next(table)
            for row in table:
                local, remote, state = row.split()[1:4]
                if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:  # TCP_ESTABLISHED
                    found.add(int(remote.rsplit(":", 1)[1], 16))
    return found
