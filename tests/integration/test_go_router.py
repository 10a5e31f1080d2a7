"""The Go example router (examples/go/router): builds offline, its own tests pass, and fed the
messages the gateway would send (state messages from kvgateway.state.blocks, batches rendered by
kvgateway.engine.wire, notices) its index equals the /v1/blocks document and its answers equal
kvgateway.state.lookup's, at several offsets (offline, in-process). End to end: the router follows a real
``kvgateway serve`` fed by ``kvgateway simulate`` engines with churn, an engine restart, a forced
gap and a gateway restart, and at several offsets its index equals ``GET /v1/blocks`` and its
answers equal ``POST /v1/lookup``.

Skipped, with the reason, where ``go`` or Debian's gorilla/websocket package is missing
(``apt-get install golang-go golang-github-gorilla-websocket-dev``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from kvgateway.engine.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored, Event, Hash
from kvgateway.protocol.render import hash_text, render_events
from kvgateway.state.blocks import blocks_document, capture, state_messages
from kvgateway.state.digest import hex_digest
from kvgateway.state.lookup import lookup_hashes, parse_hash
from kvgateway.state.occupancy import OccupancyIndex
from tests.support import (
    BIG_QUEUE,
    REPO,
    Proc,
    Start,
    free_ports,
    source_spec,
    start_gateway,
    start_sim,
    wait_until,
    warmup,
)

ROUTER = REPO / "examples" / "go" / "router"
GOPATH = Path("/usr/share/gocode")


def _go_env(tmp_path: Path) -> dict[str, str]:
    """GOPATH mode on Debian's source packages: no module download, no network."""
    return {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOPATH), "GOCACHE": str(tmp_path / "gocache")}


def _run(command: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROUTER, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def go_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if shutil.which("go") is None:
        pytest.skip("no go toolchain (apt-get install golang-go)")
    if not (GOPATH / "src" / "github.com" / "gorilla" / "websocket").is_dir():
        pytest.skip("no gorilla/websocket in /usr/share/gocode (apt-get install golang-github-gorilla-websocket-dev)")
    return _go_env(tmp_path_factory.mktemp("go"))


@pytest.fixture(scope="module")
def router_bin(go_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bin") / "router"
    proc = _run(["go", "build", "-o", str(out), "."], go_env)
    assert proc.returncode == 0, proc.stderr
    return out


def test_go_vet_and_go_test(go_env: dict[str, str]) -> None:
    for command in (["go", "vet", "."], ["go", "test", "-count=1", "."]):
        proc = _run(command, go_env)
        assert proc.returncode == 0, f"{' '.join(command)}:\n{proc.stdout}\n{proc.stderr}"


def test_gofmt_clean(go_env: dict[str, str]) -> None:
    proc = _run(["gofmt", "-l", "."], go_env, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


# --- the Go index against the Python one --------------------------------------------------


class ClientFeed:
    """The lines the router reads: the messages a gateway would send one client, built from the
    gateway's own sans-I/O parts, and the test's queries and dumps between them."""

    def __init__(self, epoch: str = "e0") -> None:
        self.epoch = epoch
        self.offset = 0
        self.occupancy = OccupancyIndex()
        self.lines: list[str] = []

    def _line(self, message: dict[str, Any]) -> None:
        self.lines.append(msgspec.json.encode(message).decode())

    def batch(self, source: str, dp_rank: int, *events: Event) -> None:
        self.offset += 1
        self.occupancy.apply(source, dp_rank, Batch(0.0, list(events), dp_rank), 0.0)
        message = {
            "type": "batch",
            "id": f"{self.epoch}:{self.offset}",
            "offset": self.offset,
            "source": source,
            "dp_rank": dp_rank,
            "seq": str(self.offset),  # an engine seq: a decimal string
            "ts": 0.0,
            "events": render_events(events),
        }
        self._line(message)

    def notice(self, source: str, dp_rank: int, kind: str, **fields: Any) -> None:
        self.offset += 1
        if kind == "restart":
            self.occupancy.stream(source, dp_rank).reset()
        elif kind == "stale":
            self.occupancy.stream(source, dp_rank).mark_stale()
        self._line(
            {
                "type": "notice",
                "kind": kind,
                "id": f"{self.epoch}:{self.offset}",
                "offset": self.offset,
                "source": source,
                "dp_rank": dp_rank,
                **fields,
            }
        )

    def hello_with_snapshot(self, chunk_blocks: int) -> None:
        streams = list(self.occupancy.streams())
        sources = [{"source": s.source, "dp_rank": s.dp_rank, "state": "up", "stale": s.stale} for s in streams]
        self._line(
            {
                "type": "hello",
                "epoch": self.epoch,
                "offset": self.offset,
                "recovered": False,
                "sources": sources,
                "occupancy": None,
            }
        )
        for message in state_messages(capture(streams), self.offset, chunk_blocks):
            self._line(message)

    def digests(self) -> None:
        """A ``digest`` message per stream, at the offset, as a ``digest=SECONDS`` client gets them."""
        for index in self.occupancy.streams():
            value, count = index.digest()
            self._line(
                {
                    "type": "digest",
                    "source": index.source,
                    "dp_rank": index.dp_rank,
                    "offset": self.offset,
                    "digest": hex_digest(value),
                    "block_count": count,
                }
            )

    def query(self, chain: list[str]) -> None:
        self.lines.append(json.dumps({"type": "query", "block_hashes": chain}))

    def dump(self) -> None:
        self.lines.append(json.dumps({"type": "dump"}))


def _comparable_document(doc: dict[str, Any]) -> dict[str, Any]:
    streams = []
    for stream in doc["streams"]:
        blocks = sorted(
            ({k: b[k] for k in ("hash", "refs", "medium", "group_idx")} for b in stream["blocks"]),
            key=lambda b: (b["medium"], b["group_idx"], b["hash"]),
        )
        if blocks:
            streams.append(
                {
                    "source": stream["source"],
                    "dp_rank": stream["dp_rank"],
                    "stale": stream["stale"],
                    "digest": stream["digest"],  # the router's own, the gateway's
                    "blocks": blocks,
                }
            )
    return {"epoch": doc["epoch"], "offset": doc["offset"], "streams": streams}


def _scenario(rng: random.Random, feed: ClientFeed, steps: int, expected: list[Any]) -> None:
    """Churn over 3 streams: stores (chains, duplicates), removes, clears, restarts, gaps, placeholders."""
    pool: list[Hash] = [rng.getrandbits(64) for _ in range(30)] + [-5, 2**64 - 1, b"\x12\x34", b"\xab" * 32]
    streams = [("a", 0), ("a", 1), ("b", 0)]
    mediums = [None, "GPU", "gpu", "CPU", "cpu_pinned", "STORAGE"]
    for _ in range(steps):
        source, dp_rank = rng.choice(streams)
        roll = rng.random()
        if roll < 0.55:
            hashes = rng.sample(pool, rng.randint(1, 6))
            size = rng.choice([16, 16, 32, 0])
            extra: dict[str, Any] = {}
            if rng.random() < 0.3:
                extra["group_idx"] = rng.choice([0, 1, None])
            event = BlockStored(
                hashes,
                None,
                [] if size == 0 else [1] * size * len(hashes),
                size,
                None,
                rng.choice(mediums),
                None,
                extra,
            )
            feed.batch(source, dp_rank, event)
        elif roll < 0.85:
            hashes = rng.sample(pool, rng.randint(1, 4))
            extra = {"group_idx": rng.choice([0, 1])} if rng.random() < 0.3 else {}
            feed.batch(source, dp_rank, BlockRemoved(hashes, rng.choice(mediums), extra))
        elif roll < 0.9:
            feed.batch(source, dp_rank, AllBlocksCleared())
        elif roll < 0.95:
            feed.notice(source, dp_rank, "restart", seq="0", previous="9", reason="seq_reset")
        else:
            feed.notice(source, dp_rank, "unrecovered_gap", first="1", until="2", count=2, reason="evicted")
            feed.notice(source, dp_rank, "stale", reason="unrecovered", seq="1", detail="2 batches lost (evicted)")
        if rng.random() < 0.2:
            chain = [hash_text(h) for h in rng.sample(pool, rng.randint(1, 8))]
            feed.query(chain)
            answer = lookup_hashes(feed.occupancy.streams(), [parse_hash(t) for t in chain], feed.offset)
            expected.append(("query", answer))
    feed.dump()
    doc = blocks_document(feed.epoch, feed.offset, capture(feed.occupancy.streams(), digest=True))
    expected.append(("dump", _comparable_document(doc)))


def _normalise_answer(answer: dict[str, Any]) -> dict[str, Any]:
    # Streams that never had a block are listed by the gateway (its index knows them) but not by
    # the router when it never saw them; compare the streams with at least one block in common.
    return {"offset": answer["offset"], "streams": [s for s in answer["streams"] if s["blocks"]]}


@pytest.mark.parametrize("seed", range(6))
def test_router_index_and_answers_equal_the_gateways(router_bin: Path, seed: int) -> None:
    rng = random.Random(seed)
    feed = ClientFeed()
    expected: list[Any] = []
    # Before the router connects: history it only learns through the snapshot.
    _scenario(rng, feed, 60, [])
    feed.lines.clear()
    feed.hello_with_snapshot(chunk_blocks=rng.choice([1, 3, 1000]))
    checked = 0
    for _ in range(3):  # several offsets, each checked against the gateway's digests
        _scenario(rng, feed, 40, expected)
        feed.digests()
        checked += len(list(feed.occupancy.streams()))
    feed.lines.append(json.dumps({"type": "digests"}))
    expected.append(("digests", {"digest_checks": checked, "digest_mismatches": 0, "last_mismatch_check": 0}))
    # One block dropped from the router's index (its first stream with one), as a missed event
    # would: that stream's next digest tells.
    feed.lines.append(json.dumps({"type": "corrupt"}))
    feed.digests()
    feed.lines.append(json.dumps({"type": "digests"}))
    streams = list(feed.occupancy.streams())
    found = checked + 1 + next(n for n, index in enumerate(streams) if index.resident_blocks())
    checked += len(streams)
    expected.append(("digests", {"digest_checks": checked, "digest_mismatches": 1, "last_mismatch_check": found}))
    proc = subprocess.run(
        [str(router_bin), "-replay"],
        input="\n".join(feed.lines) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    outputs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(outputs) == len(expected)
    for got, (kind, want) in zip(outputs, expected, strict=True):
        if kind == "dump":
            assert _comparable_document(got) == want
        elif kind == "digests":
            assert got == want
        else:
            assert _normalise_answer(got) == _normalise_answer(want)


# --- end to end: the router against a live gateway ------------------------------------------

TOKEN = "tk-go-router-4Fz8"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def router_proc(router_bin: Path) -> Iterator[Callable[[str, int], Proc]]:
    started: list[Proc] = []

    def start(gateway: str, port: int) -> Proc:
        args = ("-gateway", gateway, "-listen", f"127.0.0.1:{port}", "-digest", "1", "-test-hooks")
        proc = Proc(*args, env={"KVGATEWAY_TOKEN": TOKEN}, command=(str(router_bin),))
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop(5)


class Checks:
    """Comparisons of the router with the gateway at the same offset (retried until they line up:
    both move on while they are asked)."""

    def __init__(self, gateway: str, router: str, rng: random.Random) -> None:
        self.gateway = gateway
        self.router = router
        self.rng = rng
        self.offsets: list[int] = []

    def _router_at_least(self, offset: int) -> dict[str, Any]:
        def ahead() -> dict[str, Any] | None:
            doc: dict[str, Any] = httpx.get(f"{self.router}/blocks", timeout=10).json()
            return doc if doc["ready"] and doc["offset"] >= offset else None

        found: dict[str, Any] = wait_until(ahead, timeout=10, interval=0.005, what=f"the router at offset {offset}")
        return found

    def index_once(self) -> dict[str, Any] | None:
        """The gateway's document when the router's index was seen at its offset (and equal)."""
        doc = httpx.get(f"{self.gateway}/v1/blocks", headers=AUTH, timeout=30).json()
        mine = self._router_at_least(doc["offset"])
        if mine["offset"] != doc["offset"]:
            return None
        assert _comparable_document(mine) == _comparable_document(doc), f"index differs at {doc['offset']}"
        return doc

    def answers_once(self, doc: dict[str, Any]) -> bool:
        """Lookups of chains of resident hashes (and one of none): each asked of both until both
        answer at the same offset, then equal."""
        resident = [b["hash"] for s in doc["streams"] for b in s["blocks"]]
        chains = [self.rng.sample(resident, min(len(resident), self.rng.randint(1, 6))) for _ in range(4)]
        for chain in [*chains, ["1", "2"]]:
            for _ in range(50):
                mine = httpx.post(f"{self.router}/lookup", json={"block_hashes": chain}, timeout=10).json()
                theirs = httpx.post(f"{self.gateway}/v1/lookup", json={"block_hashes": chain}, headers=AUTH).json()
                if mine["offset"] == theirs["offset"]:
                    assert _normalise_answer(mine) == _normalise_answer(theirs), chain
                    break
            else:
                return False
        return True

    def digests(self) -> tuple[int, int, int]:
        """The router's digest checks and mismatches so far, and the check that found the last."""
        doc = httpx.get(f"{self.router}/blocks", timeout=10).json()
        return int(doc["digest_checks"]), int(doc["digest_mismatches"]), int(doc["last_mismatch_check"])

    def digest_checked(self) -> None:
        """A digest message of the gateway's, come after now, matched the router's own sums."""
        checks, mismatches, _ = self.digests()
        wait_until(lambda: self.digests()[0] > checks, timeout=30, what="the router's next digest check")
        assert self.digests()[1] == mismatches, "the router's index differs from the gateway's digest"

    def drift_caught(self) -> None:
        """One block dropped from the router's index is caught by the next digest (one interval),
        and the router starts over from a fresh snapshot: equal again."""
        _, mismatches, _ = self.digests()
        dropped = httpx.post(f"{self.router}/corrupt", timeout=10).json()["dropped"]
        assert dropped, "no block to drop"
        # Counted once the block is dropped: the checks made while the request was on its way (three
        # at load 23) came before the drift, and could not catch it.
        checks = self.digests()[0]
        wait_until(lambda: self.digests()[1] == mismatches + 1, timeout=120, what="the drift caught")
        assert self.digests()[2] <= checks + 2  # by the stream's next digest (2 streams a round)
        self.at_some_offset()

    def at_some_offset(self, within: float = 10.0) -> int:
        """An index comparison at a common offset, then a round of answers; that offset."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            doc = self.index_once()
            if doc is not None and self.answers_once(doc):
                self.offsets.append(doc["offset"])
                return int(doc["offset"])
        mine = httpx.get(f"{self.router}/blocks", timeout=10).json()
        theirs = httpx.get(f"{self.gateway}/v1/sources", headers=AUTH, timeout=10).json()["offset"]
        state = (mine["ready"], mine["epoch"], mine["offset"], mine["last_event_id"], theirs)
        raise AssertionError(f"the router and the gateway never lined up: router (ready, epoch, offset, id) {state}")


def _offset(base: str) -> int:
    return int(httpx.get(f"{base}/v1/sources", headers=AUTH, timeout=10).json()["offset"])


def _counters(base: str) -> dict[str, int]:
    sources = httpx.get(f"{base}/v1/sources", headers=AUTH, timeout=10).json()["sources"]
    total: dict[str, int] = {}
    for status in sources:
        for name, value in status["counters"].items():
            total[name] = total.get(name, 0) + value
    return total


@pytest.mark.timeout(90)
def test_router_follows_a_live_gateway_through_churn_restart_gap_and_gateway_restart(
    procs: Start, router_proc: Callable[[str, int], Proc]
) -> None:
    http, router_port = free_ports(2)
    pub, rep = free_ports(2, spacing=2)
    spec = source_spec("a", pub, rep, 2)
    gw = start_gateway(procs, http, [spec], "--token", TOKEN, "--replay-timeout", "0.5", client_queue_bytes=BIG_QUEUE)
    engine = ["--endpoint", f"tcp://*:{pub}", "--replay-endpoint", f"tcp://*:{rep}", "--dp-size", "2"]
    churn = ["--rate", "40", "--cpu-offload", "--gpu-blocks", "256", "--cpu-blocks", "512", "--clear-every", "97"]
    faults = ["--restart-at", "120", "--skip", "160-163", "--replay-drop", "160-163x1000"]
    sim = start_sim(procs, *engine, *churn, *faults, *warmup(1.0), ranks=2)
    router_proc(gw.base, router_port)
    checks = Checks(gw.base, f"http://127.0.0.1:{router_port}", random.Random(7))

    def paused_check() -> None:
        # The engines hold still (SIGSTOP) while both sides are asked: a document of thousands of
        # blocks takes longer to fetch than the engines take to move the offset on.
        os.kill(sim.popen.pid, signal.SIGSTOP)
        try:
            checks.at_some_offset()
            checks.digest_checked()
        finally:
            os.kill(sim.popen.pid, signal.SIGCONT)

    paused_check()  # churn (and clears every 97 batches)
    wait_until(lambda: _counters(gw.base)["restarts"] >= 2, timeout=20, what="both ranks' restarts")
    paused_check()
    wait_until(lambda: _counters(gw.base)["unrecovered"] >= 2, timeout=20, what="the forced gap on both ranks")
    paused_check()
    wait_until(lambda: _offset(gw.base) >= checks.offsets[-1] + 50, timeout=20, what="more churn since the last check")
    paused_check()
    os.kill(sim.popen.pid, signal.SIGSTOP)
    try:
        checks.drift_caught()
    finally:
        os.kill(sim.popen.pid, signal.SIGCONT)

    # A new gateway process: another epoch, so the router's last id is not recovered: a new snapshot.
    gw.proc.stop()
    gw = start_gateway(procs, http, [spec], "--token", TOKEN, "--replay-timeout", "0.5", client_queue_bytes=BIG_QUEUE)
    epoch = httpx.get(f"{gw.base}/healthz", timeout=10).json()["epoch"]
    wait_until(lambda: httpx.get(f"{checks.router}/blocks", timeout=10).json()["epoch"] == epoch, timeout=15)
    paused_check()
    assert len(checks.offsets) == 6 and checks.offsets[:5] == sorted(checks.offsets[:5])
    assert checks.digests()[1] == 1  # the one drift made on purpose, and no other
