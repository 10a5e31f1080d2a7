"""Slow clients, end to end: a client that stops reading is cut while the others keep receiving every
batch, clients that keep reading survive a stall of the gateway, and a cut client that never reads
again is disconnected."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from tests.support import Start as Starter
from tests.support import arun, free_ports, source_spec, until
from tests.support.web import (
    BODY_WITHIN,
    TEST_WITHIN,
    WITHIN,
    Clients,
    Conn,
    Serve,
    SseParser,
    assert_contiguous,
    check_sse_framing,
    start_simulator,
    wait_streams,
)

pytestmark = pytest.mark.timeout(TEST_WITHIN)


SLOW_QUEUE_BYTES = 65536


def stingy_socket(port: int) -> socket.socket:
    """A connected socket with small kernel buffers (small receive buffer, small segments), so a
    client that never reads backs the gateway up after ~0.5 MB rather than several MB."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


async def read_http_response(sock: socket.socket, within: float) -> tuple[int, dict[str, str], bytes]:
    """Read one chunked HTTP/1.1 response to its last chunk: status, headers, decoded body."""
    loop = asyncio.get_running_loop()
    raw = bytearray()
    async with asyncio.timeout(within):
        while not raw.endswith(b"\r\n0\r\n\r\n"):
            data = await loop.sock_recv(sock, 1 << 16)
            if not data:
                break
            raw += data
    head, _, body = bytes(raw).partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
    assert headers.get("transfer-encoding") == "chunked", headers
    decoded = bytearray()
    position = 0
    while True:
        end = body.index(b"\r\n", position)
        size = int(body[position:end], 16)
        if size == 0:
            break
        decoded += body[end + 2 : end + 2 + size]
        position = end + 2 + size + 2
    return int(status_line.split()[1]), headers, bytes(decoded)


def sse_conn_from_text(text: str, label: str) -> Conn:
    conn = Conn("sse", label, sse_parser=SseParser())
    assert conn.sse_parser is not None
    for line in text.split("\n"):
        event = conn.sse_parser.feed(line)
        if event is not None:
            conn.add(event.data, event)
    conn.ended = True
    return conn


@pytest.mark.slow
def test_slow_clients_are_cut_off_while_50_others_keep_receiving_every_batch(procs: Starter, serve: Serve) -> None:
    """A WebSocket client and an SSE client that never read are cut (1013 "slow consumer"; the
    slow_consumer notice, then the end of the response) and resume from the ring; 50 WebSocket
    clients that read get every batch, in order, all along."""
    http_port, pub, replay = free_ports(3)
    gateway = serve(
        procs, http_port, [source_spec("llama", pub, replay)], "--client-queue-bytes", str(SLOW_QUEUE_BYTES)
    )
    start_simulator(procs, pub, replay, "--rate=20", "--events-per-batch=8-12", "--seed=6")
    wait_streams(gateway, [("llama", 0)])
    slow_labels = {"transport": "ws", "reason": "slow_consumer"}

    async def body() -> None:
        async with Clients(gateway) as clients:
            readers = [(await clients.ws(label=f"reader {i}", parse=False))[0] for i in range(50)]
            slow_ws = await connect(
                gateway.ws_url, sock=stingy_socket(http_port), max_queue=1, proxy=None, open_timeout=15
            )
            clients._closers.append(slow_ws.close)
            slow_sse_sock = stingy_socket(http_port)
            request = f"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{http_port}\r\nAccept: text/event-stream\r\n\r\n"
            await asyncio.get_running_loop().sock_sendall(slow_sse_sock, request.encode())
            try:
                # Neither slow client reads anything until the gateway has cut both.
                await gateway.wait_metric_reaches("kvgateway_client_disconnects_total", 1, 60, **slow_labels)
                await gateway.wait_metric_reaches(
                    "kvgateway_client_disconnects_total", 1, 60, transport="sse", reason="slow_consumer"
                )
                cut_at = await gateway.offset_async()
                cut_readers = [reader.label for reader in readers if reader.ended]
                assert not cut_readers, f"clients that kept reading were cut off too: {cut_readers}"
                slow = Conn("ws", "slow ws")
                clients._spawn(Clients._pump_ws(slow, slow_ws))
                await slow.wait_ended()
                status, headers, sse_body = await read_http_response(slow_sse_sock, WITHIN)
            finally:
                slow_sse_sock.close()
            slow_sse = sse_conn_from_text(sse_body.decode(), "slow sse")

            resumed_ws, _ = await clients.ws(f"last_event_id={slow.last_id}", label="resumed ws", parse=False)
            resumed_sse = await clients.sse(headers={"Last-Event-ID": slow_sse.last_id}, label="resumed sse")
            target = await gateway.offset_async() + 5
            for conn in (resumed_ws, resumed_sse, *readers):
                await conn.wait_offset(target) if conn.parse else await wait_digest_offset(conn, target)
            assert not any(reader.ended for reader in readers), "a reading client was cut off"

        # What the gateway counted: one cut per transport, both resumes recovered.
        assert await gateway.metric_async("kvgateway_client_disconnects_total", **slow_labels) == 1
        assert (
            await gateway.metric_async("kvgateway_client_disconnects_total", transport="sse", reason="slow_consumer")
            == 1
        )
        assert await gateway.metric_async("kvgateway_resumes_total", transport="ws", recovered="true") == 1
        assert await gateway.metric_async("kvgateway_resumes_total", transport="sse", recovered="true") == 1

        # The 50 readers: every offset from their hello on, each message the same text for all.
        reference = readers[0].digest_by_offset()
        for reader in readers:
            first = reader.hello["offset"] + 1
            offsets = reader.digest_offsets()
            assert offsets == list(range(first, first + len(offsets))), f"{reader.label}: gap or duplicate"
            assert offsets[-1] >= target > cut_at
            assert all(reference.get(o, digest) == digest for o, digest in reader.digests[1:] if o is not None)
        union: dict[int, int] = {}
        for reader in readers:
            union.update(reader.digest_by_offset())

        # The slow WebSocket client: what was in flight, in order, then 1013 "slow consumer".
        assert (slow.close_code, slow.close_reason) == (1013, "slow consumer")
        assert slow.hello["recovered"] is False
        assert_contiguous(slow, slow.hello["offset"] + 1)
        assert all(union[o] == digest for o, digest in slow.digests[1:] if o is not None)
        # ... and it resumes from its last id: the gap from the ring, then live.
        assert (resumed_ws.hello["recovered"], resumed_ws.hello["offset"]) == (True, slow.last_offset)
        offsets = resumed_ws.digest_offsets()
        assert offsets == list(range(slow.last_offset + 1, slow.last_offset + 1 + len(offsets)))
        assert all(union[o] == digest for o, digest in resumed_ws.digests[1:] if o is not None)

        # The slow SSE client: what was in flight, the slow_consumer notice (no id), the end.
        assert status == 200
        assert headers["content-type"] == "text/event-stream; charset=utf-8"
        check_sse_framing(slow_sse)
        assert slow_sse.messages[-1] == {
            "type": "notice",
            "kind": "slow_consumer",
            "reason": f"more than {SLOW_QUEUE_BYTES} bytes queued for this client",
        }
        assert slow_sse.sse_events[-1].id is None
        assert_contiguous(slow_sse, slow_sse.hello["offset"] + 1)
        assert slow_sse.last_offset < cut_at + 1
        assert all(union[o] == digest for o, digest in slow_sse.digests[1:] if o is not None)
        assert (resumed_sse.hello["recovered"], resumed_sse.hello["offset"]) == (True, slow_sse.last_offset)
        assert_contiguous(resumed_sse, slow_sse.last_offset + 1)
        assert all(union[o] == digest for o, digest in resumed_sse.digests[1:] if o is not None)
        check_sse_framing(resumed_sse)

    arun(body(), BODY_WITHIN)


async def wait_digest_offset(conn: Conn, offset: int, within: float = WITHIN) -> None:
    def reached() -> bool:
        offsets = conn.digest_offsets()
        return conn.ended or bool(offsets and offsets[-1] >= offset)

    await until(reached, within, f"{conn.label}: offset {offset}")
    if conn.ended:
        raise AssertionError(f"{conn.label} was cut off: {conn.close_code} {conn.close_reason}")


@pytest.mark.slow
def test_clients_that_keep_reading_survive_a_stall_of_the_gateway(procs: Starter, serve: Serve) -> None:
    """A reading client is not a slow consumer just because the gateway itself was descheduled.

    The gateway is paused for a second (SIGSTOP: what a loaded machine, a GC pause or a VM
    steal does) while the engine keeps publishing; when it runs again every client socket is
    idle and writable, and each client drains whatever is queued for it at once. None may be cut.
    """
    http_port, pub, replay = free_ports(3)
    gateway = serve(
        procs, http_port, [source_spec("llama", pub, replay)], "--client-queue-bytes", str(SLOW_QUEUE_BYTES)
    )
    start_simulator(procs, pub, replay, "--rate=40", "--events-per-batch=8-12", "--seed=7")
    wait_streams(gateway, [("llama", 0)])

    async def body() -> None:
        async with Clients(gateway) as clients:
            readers = [(await clients.ws(label=f"ws reader {i}"))[0] for i in range(3)]
            readers.append(await clients.sse(label="sse reader"))
            for reader in readers:
                await reader.wait_messages(5)
            os.kill(gateway.proc.popen.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(1.0)  # the stall itself, not a wait for something
            finally:
                os.kill(gateway.proc.popen.pid, signal.SIGCONT)
            target = await gateway.offset_async() + 20
            for reader in readers:
                await until(lambda r=reader: r.ended or r.last_offset >= target, WITHIN, f"{reader.label} at {target}")
            cut = {
                r.label: (r.close_code, r.close_reason) if r.transport == "ws" else r.messages[-1]
                for r in readers
                if r.ended
            }
            disconnects = await gateway.metric_async("kvgateway_client_disconnects_total", reason="slow_consumer")
            assert (cut, disconnects) == ({}, 0), "clients that kept reading were cut off as slow consumers"
            for reader in readers:
                assert_contiguous(reader, reader.hello["offset"] + 1)

    arun(body(), BODY_WITHIN)


def gateway_holds(gateway_port: int, client_port: int) -> bool:
    """Whether the gateway still holds an established connection from ``client_port`` (Linux /proc)."""
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path) as table:
            next(table)
            for row in table:
                local, remote, state = row.split()[1:4]
                if (
                    int(local.rsplit(":", 1)[1], 16) == gateway_port
                    and int(remote.rsplit(":", 1)[1], 16) == client_port
                ):
                    return state == "01"  # TCP_ESTABLISHED
    return False


CUT_CLIENT_RELEASE_SECONDS = 20.0

"""How long a cut client that never reads again may keep its connection (Mercure: a 5 s dispatch
timeout, Centrifugo: a 1 s write timeout; docs/protocol.md: such a client "is disconnected")."""


@pytest.mark.slow
def test_a_cut_client_that_never_reads_again_is_disconnected(procs: Starter, serve: Serve) -> None:
    """A client that stops reading for good is not only dropped from the hub: its connection is
    closed, so it stops holding a socket, a task and the gateway's send buffer (it no longer counts
    against --max-clients, so nothing else would bound how many such connections pile up)."""
    if not Path("/proc/net/tcp").exists():
        pytest.skip("reads the gateway's sockets from Linux /proc/net/tcp")
    http_port, pub, replay = free_ports(3)
    gateway = serve(
        procs, http_port, [source_spec("llama", pub, replay)], "--client-queue-bytes", str(SLOW_QUEUE_BYTES)
    )
    start_simulator(procs, pub, replay, "--rate=20", "--events-per-batch=8-12", "--seed=8")
    wait_streams(gateway, [("llama", 0)])

    async def body() -> None:
        loop = asyncio.get_running_loop()
        host = f"127.0.0.1:{http_port}"
        ws_sock, sse_sock = stingy_socket(http_port), stingy_socket(http_port)
        try:
            key = base64.b64encode(os.urandom(16)).decode()
            upgrade = (
                f"GET /v1/ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            await loop.sock_sendall(ws_sock, upgrade.encode())
            await loop.sock_sendall(sse_sock, f"GET /v1/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            for transport in ("ws", "sse"):
                await gateway.wait_metric_reaches(
                    "kvgateway_client_disconnects_total", 1, 60, transport=transport, reason="slow_consumer"
                )
            assert await gateway.metric_async("kvgateway_clients") == 0
            ports = {"ws": ws_sock.getsockname()[1], "sse": sse_sock.getsockname()[1]}
            await until(
                lambda: not [t for t, port in ports.items() if gateway_holds(http_port, port)],
                CUT_CLIENT_RELEASE_SECONDS,
                "the gateway to let go of the connections of clients that never read again",
                interval=0.2,
            )
        finally:
            ws_sock.close()
            sse_sock.close()

    arun(body(), BODY_WITHIN)
