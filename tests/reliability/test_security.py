"""Security of a running gateway, checked from outside like an attacker would: every route the
app defines without (or with a wrong) token, foreign origins and hosts, oversized and endless
inbound messages, too many clients, clients that never read, path traversal on the dashboard
files, secrets in error bodies and logs, and the refusal to serve the network unauthenticated.

The routes are taken from ``kvgateway.serve.app.create_app`` itself, so a route added later is covered
without touching this file (and must be either protected or deliberately listed as open here).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
import websockets
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from websockets.exceptions import ConnectionClosed, InvalidStatus

from kvgateway.config import Settings, SourceConfig
from kvgateway.gateway import OneProcess
from kvgateway.serve.app import create_app, static_dir
from kvgateway.serve.server import SEND_TIMEOUT_SECONDS
from tests.support import (
    REPO,
    GatewayProcess,
    Proc,
    Start,
    arun,
    free_ports,
    sim_flags,
    source_spec,
    start_gateway,
    start_sim,
    until,
    wait_until,
)
from tests.support.clients import ResumingClient
from tests.support.metrics import metric

pytestmark = pytest.mark.timeout(120)

TOKEN = "sec-Tok3n-9b2f41c7d0"
REJECTIONS = "kvgateway_client_rejections_total"
OPEN_PATHS = {"/healthz", "/readyz", "/metrics"}
"""Routes that need no token on purpose: probes and Prometheus (docs/security.md)."""


# --- helpers ----------------------------------------------------------------------------------


def app_routes() -> tuple[list[tuple[str, set[str]]], list[str], list[Mount]]:
    """(HTTP routes with their methods, WebSocket routes, mounts) of the app the gateway serves."""
    settings = Settings(sources=(SourceConfig("e", "tcp://127.0.0.1:9"),), token=TOKEN)
    core = OneProcess(settings)
    try:
        app = create_app(core, core.serving)
    finally:
        core.ingest.context.term()
    http: list[tuple[str, set[str]]] = []
    ws: list[str] = []
    mounts: list[Mount] = []
    for route in app.routes:
        if isinstance(route, Route):
            http.append((route.path, set(route.methods or ())))
        elif isinstance(route, WebSocketRoute):
            ws.append(route.path)
        elif isinstance(route, Mount):
            mounts.append(route)
        else:
            raise AssertionError(f"a route of a kind this test does not know: {route!r}")
    return http, ws, mounts


def raw_request(port: int, target: str, *headers: str, method: str = "GET") -> tuple[int, bytes]:
    """One HTTP/1.1 request with the target sent byte for byte (no client-side normalisation)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close", *headers, "", ""]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall("\r\n".join(lines).encode("latin-1"))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        decoded = b""
        while body:
            size_line, _, rest = body.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            decoded += rest[:size]
            body = rest[size + 2 :]
        body = decoded
    return status, body


def ws_handshake_request(port: int, path: str, *headers: str) -> str:
    key = base64.b64encode(os.urandom(16)).decode()
    return "\r\n".join(
        [
            f"GET {path} HTTP/1.1",
            *(headers or (f"Host: 127.0.0.1:{port}",)),
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            "",
            "",
        ]
    )


def stingy_socket(port: int) -> socket.socket:
    """A client socket with the smallest receive buffer: the gateway's writes stall quickly."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    return sock


def never_reading_clients(port: int, count: int) -> list[socket.socket]:
    """``count`` clients, alternately WebSocket and SSE, that send their request and never read."""
    socks = []
    for i in range(count):
        sock = stingy_socket(port)
        request = (
            ws_handshake_request(port, "/v1/ws")
            if i % 2 == 0
            else f"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
        )
        sock.sendall(request.encode())
        socks.append(sock)
    return socks


async def ws_status(url: str, headers: dict[str, str] | None = None, origin: str | None = None) -> tuple[int, bytes]:
    """(101 and the hello, or the refusal's status and body) of one WebSocket handshake."""
    try:
        async with websockets.connect(
            url,
            additional_headers=headers or {},
            origin=origin,  # type: ignore[arg-type]
            open_timeout=10,
            proxy=None,
        ) as ws:
            return 101, str(await asyncio.wait_for(ws.recv(), 10)).encode()
    except InvalidStatus as exc:
        return exc.response.status_code, exc.response.body


def assert_no_secret(body: bytes | str, gateway: GatewayProcess, endpoints: list[str]) -> None:
    text = bytes(body).decode("utf-8", "replace") if not isinstance(body, str) else body
    assert TOKEN not in text, text
    for endpoint in endpoints:
        assert endpoint not in text, f"{endpoint} in {text!r}"
        assert f":{endpoint.rsplit(':', 1)[1]}" not in text, f"the port of {endpoint} in {text!r}"


# --- one guarded gateway for the read-only checks ---------------------------------------------


@pytest.fixture(scope="module")
def guarded() -> Iterator[tuple[GatewayProcess, list[str]]]:
    http, pub, rep = free_ports(3)
    sim = Proc("simulate", "--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{rep}", "--rate", "30")
    # --log-level debug: the per-connection access lines, checked for redaction, are written at debug only.
    proc = Proc(
        "serve",
        "--port",
        str(http),
        "--log-level",
        "debug",
        "--source",
        source_spec("e", pub, rep),
        env={"KVGATEWAY_TOKEN": TOKEN},
    )
    try:
        sim.wait_for("publishing")
        proc.wait_for("serving on http://")
        gateway = GatewayProcess(proc, http, TOKEN)
        gateway.wait_last_seq("e", 0)
        yield gateway, [f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}"]
    finally:
        proc.stop()
        sim.stop()


BAD_HEADERS = [
    {},
    {"Authorization": "Bearer wrong"},
    {"Authorization": f"Bearer {TOKEN[:-1]}"},
    {"Authorization": f"Bearer {TOKEN}x"},
    {"Authorization": f"Bearer {TOKEN.upper()}"},
    {"Authorization": f"Basic {TOKEN}"},
    {"Authorization": f"Token {TOKEN}"},
    {"Authorization": "Bearer"},
    {"Authorization": f"Bearer\t{TOKEN[1:]}"},
]
BAD_QUERIES = ["token=guess-one", f"token={TOKEN[:-1]}", "token=", f"Token={TOKEN}", f"tokens={TOKEN}"]


def test_every_route_but_probes_metrics_and_dashboard_needs_the_token(
    guarded: tuple[GatewayProcess, list[str]],
) -> None:
    gateway, endpoints = guarded
    http_routes, ws_routes, mounts = app_routes()
    assert "/v1/ws" in ws_routes and ("/v1/events", {"GET", "HEAD"}) in http_routes
    before = {
        t: gateway.metric("kvgateway_client_rejections_total", transport=t, reason="unauthorized")
        for t in ("http", "sse", "ws")
    }
    refused = {"http": 0, "sse": 0, "ws": 0}
    open_paths: set[str] = set()
    with httpx.Client(base_url=gateway.base, timeout=10, trust_env=False) as http:
        for path, methods in http_routes:
            for method in sorted(methods):
                attempts = [(h, "") for h in BAD_HEADERS] + [({}, q) for q in BAD_QUERIES]
                for headers, query in attempts:
                    response = http.request(method, path + (f"?{query}" if query else ""), headers=headers)
                    if response.status_code != 401:
                        assert response.status_code == 200, (method, path, response.status_code)
                        open_paths.add(path)
                        assert_no_secret(response.content, gateway, endpoints)
                        continue
                    refused["sse" if path == "/v1/events" else "http"] += 1
                    assert response.headers["www-authenticate"] == 'Bearer realm="kvgateway"'
                    if method == "GET":
                        assert response.json() == {"error": "missing or invalid token"}
                    assert_no_secret(response.content, gateway, endpoints)
                # the right token opens every protected route, as a header or in the query
                if path not in open_paths:
                    for headers, query in [(gateway.headers(), ""), ({}, f"token={TOKEN}")]:
                        url = path + (f"?{query}" if query else "")
                        body = b'{"block_hashes": []}' if method == "POST" else None  # POST /v1/lookup
                        with http.stream(method, url, headers=headers, content=body) as response:
                            assert response.status_code == 200, (method, path)
    for path in ws_routes:
        url = f"ws://127.0.0.1:{gateway.port}{path}"
        for headers in BAD_HEADERS:
            status, body = arun(ws_status(url, headers))
            assert status == 401, (path, headers, status)
            assert_no_secret(body, gateway, endpoints)
            refused["ws"] += 1
        for query in BAD_QUERIES:
            status, body = arun(ws_status(f"{url}?{query}"))
            assert status == 401, (path, query, status)
            refused["ws"] += 1
        assert arun(ws_status(url, gateway.headers()))[0] == 101
        assert arun(ws_status(f"{url}?token={TOKEN}"))[0] == 101
    assert open_paths == OPEN_PATHS, "exactly the probes and /metrics are open"

    # The dashboard: one mount of the static files, every file served without a token, as is.
    (mount,) = mounts
    assert mount.path == "" and isinstance(mount.app, StaticFiles)
    files = [p for p in static_dir().rglob("*") if p.is_file()]
    assert files
    for file in files:
        status, body = raw_request(gateway.port, "/" + file.relative_to(static_dir()).as_posix())
        assert (status, body) == (200, file.read_bytes()), file
    assert raw_request(gateway.port, "/") == (200, (static_dir() / "index.html").read_bytes())

    after = {
        t: gateway.metric("kvgateway_client_rejections_total", transport=t, reason="unauthorized")
        for t in ("http", "sse", "ws")
    }
    assert {t: after[t] - before[t] for t in after} == refused
    log = gateway.proc.output()
    assert TOKEN not in log, "the token was logged"
    assert "guess-one" not in log, "a wrong token was logged"
    assert "token=[redacted]" in log  # the WebSocket lines were written, without the query's token


def test_error_bodies_and_open_endpoints_carry_no_secret(guarded: tuple[GatewayProcess, list[str]]) -> None:
    gateway, endpoints = guarded
    auth = f"Authorization: Bearer {TOKEN}"
    cases = [
        ("/v1/events?dp_rank=-1", 400),
        ("/v1/events?source=nope", 400),
        ("/v1/events?sources=e", 400),
        ("/v1/events?last_event_id=a&last_event_id=b", 400),
        ("/v1/nothing-here", 404),
        ("/v1/sources/extra", 404),
    ]
    for target, status in cases:
        got, body = raw_request(gateway.port, target, auth)
        assert got == status, target
        assert_no_secret(body, gateway, endpoints)
    got, body = raw_request(gateway.port, "/v1/sources", auth, method="POST")
    assert got == 405
    assert_no_secret(body, gateway, endpoints)
    for path in sorted(OPEN_PATHS):
        got, body = raw_request(gateway.port, path)
        assert got == 200
        assert_no_secret(body, gateway, endpoints)
        assert b"tcp://" not in body
    status, body = arun(ws_status(f"ws://127.0.0.1:{gateway.port}/v1/ws", gateway.headers(), "https://evil.test"))
    assert (status, body) == (403, b'{"error":"origin not allowed"}')


TRAVERSALS = [
    "/../pyproject.toml",
    "/%2e%2e/pyproject.toml",
    "/%2E%2E/pyproject.toml",
    "/.%2e/pyproject.toml",
    "/%2e./pyproject.toml",
    "/..%2fpyproject.toml",
    "/..%2Fpyproject.toml",
    "/%2e%2e%2fpyproject.toml",
    "/%252e%252e/pyproject.toml",
    "/..%5cpyproject.toml",
    "/..\\pyproject.toml",
    "/....//pyproject.toml",
    "/..;/pyproject.toml",
    "/%c0%ae%c0%ae/pyproject.toml",
    "/index.html/../../pyproject.toml",
    "/vendor/../../pyproject.toml",
    "/vendor/%2e%2e/%2e%2e/pyproject.toml",
    "/v1/../../pyproject.toml",
    "/./../kvgateway/serve/app.py",
    "/%2e%2e/kvgateway/serve/app.py",
    "/..%2f.git%2fconfig",
    "/../.git/config",
    "/static/../../etc/passwd",
    "/../../../../../../etc/passwd",
    "/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
    "//etc/passwd",
    "/%2fetc%2fpasswd",
    "/etc/passwd%00.html",
    "/..%00/pyproject.toml",
    "http://127.0.0.1/../pyproject.toml",
]


@pytest.mark.parametrize("target", TRAVERSALS)
def test_path_traversal_never_serves_a_file_outside_static(
    guarded: tuple[GatewayProcess, list[str]], target: str
) -> None:
    gateway, _ = guarded
    secrets = [
        (REPO / "pyproject.toml").read_bytes()[:60],
        (REPO / "kvgateway" / "serve" / "app.py").read_bytes()[:60],
        b"[core]",
        b"root:",
    ]
    status, body = raw_request(gateway.port, target)
    assert not any(secret in body for secret in secrets), (target, status, body[:200])
    if status == 200:  # a path that normalises into static/ may serve a dashboard file, nothing else
        assert any(body == p.read_bytes() for p in static_dir().rglob("*") if p.is_file()), target


def test_a_foreign_origin_is_refused_before_the_token_is_looked_at(guarded: tuple[GatewayProcess, list[str]]) -> None:
    gateway, endpoints = guarded
    url = gateway.ws_url
    own = f"http://127.0.0.1:{gateway.port}"
    for origin in [
        "https://evil.test",
        "null",
        f"http://127.0.0.1:{gateway.port}.evil.test",
        f"//127.0.0.1:{gateway.port}",
    ]:
        for headers in [gateway.headers(), {}]:
            status, body = arun(ws_status(url, headers, origin))
            assert status == 403, origin
            assert_no_secret(body, gateway, endpoints)
    assert arun(ws_status(url, gateway.headers(), own))[0] == 101
    assert arun(ws_status(url, gateway.headers()))[0] == 101  # no Origin: not a browser


# --- inbound messages ---------------------------------------------------------------------------


def test_inbound_messages_up_to_64_kib_are_dropped_unread_and_cost_no_memory(
    guarded: tuple[GatewayProcess, list[str]],
) -> None:
    """200 messages of exactly 64 KiB (12.5 MiB) are read and ignored: the connection keeps
    receiving and the gateway's memory does not grow; one byte more closes it with 1009."""
    gateway, _ = guarded

    async def body() -> tuple[int, int | None]:
        rss_before = gateway.rss_kib()
        async with websockets.connect(
            gateway.ws_url, additional_headers=gateway.headers(), max_size=None, proxy=None
        ) as ws:
            await ws.recv()
            for i in range(200):
                await ws.send(bytes([i]) * 65536 if i % 2 else "x" * 65536)
            await asyncio.wait_for(await ws.ping(), 10)
            await asyncio.wait_for(ws.recv(), 10)
            grown = gateway.rss_kib() - rss_before
            await ws.send(b"\0" * 65537)
            with pytest.raises(ConnectionClosed):
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            return grown, ws.close_code

    grown, code = arun(body())
    assert grown < 8 * 1024, f"RSS grew by {grown} KiB"
    assert code == 1009


# --- limits: clients ------------------------------------------------------------------------------


def test_max_clients_counts_both_transports_and_frees_slots(procs: Start) -> None:
    http, pub = free_ports(2)
    gateway = start_gateway(procs, http, [source_spec("e", pub)], "--max-clients", "3")

    async def body() -> None:
        ws_clients = [await ResumingClient(gateway.ws_url).start() for _ in range(2)]
        async with httpx.AsyncClient(base_url=gateway.base, timeout=10, trust_env=False) as client:
            async with client.stream("GET", "/v1/events") as sse:
                assert sse.status_code == 200
                await until(lambda: gateway.metric("kvgateway_clients") == 3, 10, "3 clients")
                refused = await client.get("/v1/events")
                assert (refused.status_code, refused.json()) == (503, {"error": "too many clients"})
                assert refused.headers["retry-after"] == "5"
                async with websockets.connect(gateway.ws_url, proxy=None) as extra:
                    with pytest.raises(ConnectionClosed):
                        await asyncio.wait_for(extra.recv(), 10)  # accepted, then closed: no hello
                    assert (extra.close_code, extra.close_reason) == (1013, "too many clients")
            await ws_clients[0].stop()
            await until(lambda: gateway.metric("kvgateway_clients") == 1, 10, "slots freed")
            async with client.stream("GET", "/v1/events") as again:
                assert again.status_code == 200
        await ws_clients[1].stop()

    arun(body())
    for transport in ("sse", "ws"):
        assert gateway.metric("kvgateway_client_rejections_total", transport=transport, reason="too_many_clients") == 1


# --- clients that never read ------------------------------------------------------------------------

SLOW_ENGINE = ("--rate", "200", "--events-per-batch", "20", "--seed", "9")


@pytest.mark.timeout(300)  # the waits below are bounds for a loaded machine
def test_clients_that_never_read_are_cut_closed_and_cost_bounded_memory(procs: Start) -> None:
    """Two rounds of 8 clients (WebSocket and SSE) that send their request and never read a byte.
    Each is cut as a slow consumer (counted exactly), a client that reads goes on receiving every
    batch, the gateway's memory stays within its bounds (the first round costs at most the
    queues, the second, where a leak would show, almost nothing more), and the gateway drops the
    connections themselves (the kernel's send timeout) though the clients still hold them open."""
    http, pub, rep = free_ports(3)
    start_sim(procs, *sim_flags(pub, rep), *SLOW_ENGINE)
    # 4 MiB a client, not the default 1 MiB: the reader below reads in this test's process, which
    # a loaded machine starves, and it was cut as a slow consumer too (the never-readers take a
    # few seconds more to fill theirs).
    queue = 4 << 20
    gateway = start_gateway(
        procs, http, [source_spec("e", pub, rep)], "--ring-bytes", str(8 << 20), client_queue_bytes=queue
    )
    gateway.wait_last_seq("e", 600)  # the ring has reached its 8 MiB bound: it grows no more
    socks: list[socket.socket] = []

    async def body() -> None:
        reader = await ResumingClient(gateway.ws_url).start()
        rss = [gateway.rss_kib()]
        for round_ in (1, 2):
            socks.extend(never_reading_clients(gateway.port, 8))
            await asyncio.to_thread(
                gateway.wait_metric, "kvgateway_client_disconnects_total", 8 * round_, 120, reason="slow_consumer"
            )
            rss.append(gateway.rss_kib())
        ports = {sock.getsockname()[1] for sock in socks}
        await until(lambda: not open_connections(gateway.port, ports), SEND_TIMEOUT_SECONDS + 60, "closed")
        await until(lambda: gateway.metric("kvgateway_clients") == 1, 60, "only the reader left")
        slow = {
            t: gateway.metric("kvgateway_client_disconnects_total", transport=t, reason="slow_consumer")
            for t in ("ws", "sse")
        }
        await reader.stop()
        assert slow == {"ws": 8, "sse": 8}
        assert len(reader.sessions) == 1 and reader.sessions[0].close_code == 1000, "the reader was never cut"
        seqs = [m["seq"] for m in reader.messages if m["type"] == "batch"]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        first, second = rss[1] - rss[0], rss[2] - rss[1]
        assert first < 8 * queue * 3 // 1024, f"first round: RSS +{first} KiB"
        assert second < 16 * 1024, f"second round: RSS +{second} KiB (a leak?)"

    try:
        arun(body(), 280)
    finally:
        for sock in socks:
            sock.close()


def open_connections(server_port: int, client_ports: set[int]) -> set[int]:
    """The client ports whose connection the server side still holds open (ESTABLISHED)."""
    found = set()
    with open("/proc/net/tcp", encoding="ascii") as table:
        next(table)
        for line in table:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state == "01" and int(local.split(":")[1], 16) == server_port:
                port = int(remote.split(":")[1], 16)
                if port in client_ports:
                    found.add(port)
    return found


# --- logs ------------------------------------------------------------------------------------------


def test_a_token_in_a_percent_encoded_parameter_is_not_logged(procs: Start) -> None:
    http, pub = free_ports(2)
    gateway = start_gateway(procs, http, [source_spec("e", pub)], token=TOKEN)
    encoded = "".join(f"%{byte:02X}" for byte in TOKEN.encode())
    status, _ = arun(ws_status(f"{gateway.ws_url}?%74oken={encoded}"))
    assert status == 101, "the encoded name and value are the token"
    status, _ = arun(ws_status(f"{gateway.ws_url}?%74oken=wrong-guess-314"))
    assert status == 401
    log = gateway.proc.output()
    assert encoded not in log and encoded.lower() not in log, "the token was logged, percent-encoded"
    assert "wrong-guess-314" not in log, "a wrong token was logged"


# --- hosts ---------------------------------------------------------------------------------------


def test_a_foreign_host_header_is_refused_on_a_loopback_gateway(procs: Start) -> None:
    http, pub = free_ports(2)
    gateway = start_gateway(procs, http, [source_spec("e", pub)])
    evil = f"evil.example:{http}"
    request = ws_handshake_request(http, "/v1/ws", f"Host: {evil}", f"Origin: http://{evil}")
    with socket.create_connection(("127.0.0.1", http), timeout=10) as sock:
        sock.sendall(request.encode())
        status_line = sock.recv(4096).split(b"\r\n", 1)[0]
    assert b" 101 " not in status_line, "a DNS-rebinding page opened the WebSocket"
    for path in ("/v1/sources", "/v1/events"):
        status, body = raw_request(http, path, f"Host: {evil}")
        assert status == 400, body
    # counted under the transport each asked for, as the token check counts its refusals
    refused = {t: metric(gateway.base, REJECTIONS, transport=t, reason="forbidden_host") for t in ("ws", "sse", "http")}
    assert refused == {"ws": 1.0, "sse": 1.0, "http": 1.0}


# --- safe defaults -----------------------------------------------------------------------------------


def non_loopback_address() -> str | None:
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent, the route picks the address
        address = str(probe.getsockname()[0])
        return None if address.startswith("127.") else address
    return None


SERVE = (sys.executable, "-m", "kvgateway", "serve")


def serve_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATEWAY_")}
    return {**env, "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "machine"])
def test_serving_the_network_without_a_token_is_refused(host: str) -> None:
    if host == "machine":
        address = non_loopback_address()
        if address is None:
            pytest.skip("this machine has no non-loopback IPv4 address")
        host = address
    (port,) = free_ports(1)
    result = subprocess.run(
        [*SERVE, "--host", host, "--port", str(port), "--source", "name=e,endpoint=tcp://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
        env=serve_env(),
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "--allow-unauthenticated" in lines[0] and host in lines[0]


def test_allow_unauthenticated_starts_with_one_clear_warning() -> None:
    (port,) = free_ports(1)
    proc = subprocess.Popen(
        [
            *SERVE,
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--allow-unauthenticated",
            "--source",
            "name=e,endpoint=tcp://127.0.0.1:9",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=serve_env(),
        cwd=REPO,
    )
    try:
        wait_until(lambda: _healthy(port), 30, 0.1, "the gateway serving")
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    warnings = [line for line in output.splitlines() if "authentication is OFF" in line]
    assert len(warnings) == 1, output
    assert "WARNING" in warnings[0]
    assert warnings[0].endswith(f"authentication is OFF on 0.0.0.0:{port} (--allow-unauthenticated)")


def _healthy(port: int) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2, trust_env=False).status_code == 200
    return False
