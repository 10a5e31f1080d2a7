"""The one free-port finder of the tests."""

from __future__ import annotations

import random
import socket
from collections import deque
from pathlib import Path

_handed_out: deque[int] = deque(maxlen=256)
"""The ports this process handed out last: the kernel's free pick for port 0 can give the port it
gave a moment ago (nothing bound it yet), and a test asking twice in a row (a publish and a replay
endpoint) got one port for both: the simulator then refuses to start."""


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux; else the IANA range's)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


LONE_REGION = 4096
"""Lone ports are drawn from the 4096 ports just below the ephemeral range, ranges from below those:
never the kernel's pick for port 0 (an ephemeral port, which any worker's outgoing connection can
take between the check and the bind), and never one region for both, where the lone ports a process
handed out last (:data:`_handed_out`) would sit in nearly every 1000-port block a range asks for."""


def _candidate(host: str, spacing: int) -> int:
    """A port to try as a base: at random in its region below the ports outgoing connections take
    (on a busy machine every connection holds one of those); the kernel's pick where the range leaves
    no room."""
    lone_low = _ephemeral_low() - LONE_REGION
    if spacing > 1 and (top := lone_low - spacing) > 10_000:
        return random.randrange(10_000, top)
    if spacing == 1 and lone_low > 10_000:
        return random.randrange(lone_low, lone_low + LONE_REGION)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def free_ports(count: int, *, spacing: int = 1, host: str = "127.0.0.1") -> list[int]:
    """``count`` ports free on ``host`` now (``""``: every interface), each with ``spacing - 1``
    free neighbours above it (a DP range: rank N's port is the base + N)."""
    found: list[int] = []
    for _ in range(50 * count):
        if len(found) == count:
            break
        base = _candidate(host, spacing)
        if not _bindable(host, base):
            continue
        if base + spacing >= 65535:
            continue
        taken = {p for b in found for p in range(b, b + spacing)}.union(_handed_out)
        if any(p in taken for p in range(base, base + spacing)):
            continue
        if all(_bindable(host, port) for port in range(base + 1, base + spacing)):
            found.append(base)
    if len(found) == count:
        _handed_out.extend(p for b in found for p in range(b, b + spacing))
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
