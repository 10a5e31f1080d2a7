"""Why a stream stays down, as the gateway finds out (``diagnose_connect``): real loopback sockets,
on both event loops the gateway runs on (uvloop, and asyncio's own where uvloop is missing).

A stream of an absent engine is diagnosed every 30 s, 67 times a second with 2,000 of them, so the
diagnosis is a bare non-blocking socket watched by the loop, and DNS is asked only for a name;
these tests hold its answers to what the OS says, whichever way it is asked."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
import uvloop

from kvgateway.ingest.streams import diagnose_connect
from tests.support import free_port

T = TypeVar("T")

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, T]], T]:
    factory = LOOPS[request.param]

    def on_loop(coro: Coroutine[Any, Any, T]) -> T:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)

    return on_loop


@contextmanager
def unanswered() -> Iterator[int]:
    """A port whose SYNs go unanswered: a listener whose accept queue (of one) is full, so the
    kernel drops every further connection attempt, as a firewall or a dead host would."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            yield port


def test_a_closed_port_is_refused_by_address_and_by_name(run: Callable[..., Any]) -> None:
    port = free_port()
    refused = ("connection refused, retrying", "refused")
    assert run(diagnose_connect(f"tcp://127.0.0.1:{port}")) == refused
    assert run(diagnose_connect(f"tcp://localhost:{port}")) == refused  # asked of getaddrinfo
    assert run(diagnose_connect(f"tcp://127.1:{port}")) == refused  # a form only getaddrinfo reads


def test_an_ipv6_literal_is_tried_over_ipv6(run: Callable[..., Any]) -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = int(probe.getsockname()[1])
    except OSError:
        pytest.skip("no IPv6 loopback here")
    # Bound but not listening: refused. Listening on ::1 only: reached, which IPv4 could not.
    assert run(diagnose_connect(f"tcp://[::1]:{port}")) == ("connection refused, retrying", "refused")
    with socket.socket(socket.AF_INET6) as listener:
        listener.bind(("::1", 0))
        listener.listen(1)
        assert run(diagnose_connect(f"tcp://[::1]:{listener.getsockname()[1]}")) is None


def test_a_listening_port_is_no_failure(run: Callable[..., Any]) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        assert run(diagnose_connect(f"tcp://127.0.0.1:{listener.getsockname()[1]}")) is None


def test_a_name_that_does_not_resolve_says_so(run: Callable[..., Any]) -> None:
    reason, code = run(diagnose_connect("tcp://no-such-engine.invalid:5557"))
    assert reason.startswith("cannot resolve host 'no-such-engine.invalid': ") and code == "unresolved"


def test_a_port_that_never_answers_is_no_answer(run: Callable[..., Any]) -> None:
    with unanswered() as port:
        endpoint = f"tcp://127.0.0.1:{port}"
        assert run(diagnose_connect(endpoint, within=0.2)) == (
            f"no answer from {endpoint} within 0.2 s, retrying",
            "no_answer",
        )


def test_no_endpoint_to_diagnose_is_no_failure(run: Callable[..., Any]) -> None:
    assert run(diagnose_connect("ipc:///tmp/engine")) is None
    assert run(diagnose_connect("tcp://127.0.0.1:*")) is None


def test_a_cancelled_diagnosis_leaves_no_socket_open(run: Callable[..., Any]) -> None:
    """The ingest cancels diagnoses when it stops: the socket and the loop's watch go with them."""

    async def cancelled(port: int) -> tuple[int, int, int, bool]:
        before = len(os.listdir("/proc/self/fd"))
        task = asyncio.ensure_future(diagnose_connect(f"tcp://127.0.0.1:{port}", within=60.0))
        await asyncio.sleep(0)  # its first step: the socket opened, the connection waited for
        waiting = len(os.listdir("/proc/self/fd"))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return before, waiting, len(os.listdir("/proc/self/fd")), task.cancelled()

    with unanswered() as port:
        before, waiting, after, was_cancelled = run(cancelled(port))
    assert waiting == before + 1
    assert was_cancelled and after == before
