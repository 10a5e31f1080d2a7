"""The Go example router (examples/go/router): builds offline, its own tests pass, and fed the
messages the gateway would send (state messages from kvgateway.blocks, batches rendered by
kvgateway.wire, notices) its index equals the /v1/blocks document and its answers equal
kvgateway.lookup's, at several offsets. No network: the routes are not wired yet (see
docs/design/routers-wiring.md); the end-to-end run against ``kvgateway simulate`` comes with them.

Skipped, with the reason, where ``go`` or Debian's gorilla/websocket package is missing
(``apt-get install golang-go golang-github-gorilla-websocket-dev``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kvgateway.blocks import blocks_document, capture, state_messages
from kvgateway.lookup import lookup_hashes, parse_hash
from kvgateway.occupancy import OccupancyIndex
from kvgateway.render import hash_text, render_events
from kvgateway.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored, Event, Hash
from tests.support import REPO

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


class Gateway:
    """The messages a gateway would send one client, built from the same sans-I/O parts."""

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
            "seq": self.offset,
            "ts": 0.0,
            "events": render_events(events),
        }
        self._line(message)

    def notice(self, source: str, dp_rank: int, kind: str, **fields: Any) -> None:
        self.offset += 1
        if kind == "restart":
            self.occupancy.stream(source, dp_rank).reset()
        elif kind in ("unrecovered_gap", "stale"):
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
        sources = [{"source": s.source, "dp_rank": s.dp_rank, "state": "up"} for s in streams]
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
            streams.append({"source": stream["source"], "dp_rank": stream["dp_rank"], "blocks": blocks})
    return {"epoch": doc["epoch"], "offset": doc["offset"], "streams": streams}


def _scenario(rng: random.Random, gateway: Gateway, steps: int, expected: list[Any]) -> None:
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
            gateway.batch(source, dp_rank, event)
        elif roll < 0.85:
            hashes = rng.sample(pool, rng.randint(1, 4))
            extra = {"group_idx": rng.choice([0, 1])} if rng.random() < 0.3 else {}
            gateway.batch(source, dp_rank, BlockRemoved(hashes, rng.choice(mediums), extra))
        elif roll < 0.9:
            gateway.batch(source, dp_rank, AllBlocksCleared())
        elif roll < 0.95:
            gateway.notice(source, dp_rank, "restart", seq=0, previous=9, reason="seq_reset")
        else:
            gateway.notice(source, dp_rank, "unrecovered_gap", first=1, last=2, count=2, reason="evicted")
        if rng.random() < 0.2:
            chain = [hash_text(h) for h in rng.sample(pool, rng.randint(1, 8))]
            gateway.query(chain)
            answer = lookup_hashes(gateway.occupancy.streams(), [parse_hash(t) for t in chain], gateway.offset)
            expected.append(("query", answer))
    gateway.dump()
    doc = blocks_document(gateway.epoch, gateway.offset, capture(gateway.occupancy.streams()))
    expected.append(("dump", _comparable_document(doc)))


def _normalise_answer(answer: dict[str, Any]) -> dict[str, Any]:
    # Streams that never had a block are listed by the gateway (its index knows them) but not by
    # the router when it never saw them; compare the streams with at least one block in common.
    return {"offset": answer["offset"], "streams": [s for s in answer["streams"] if s["blocks"]]}


@pytest.mark.parametrize("seed", range(6))
def test_router_index_and_answers_equal_the_gateways(router_bin: Path, seed: int) -> None:
    rng = random.Random(seed)
    gateway = Gateway()
    expected: list[Any] = []
    # Before the router connects: history it only learns through the snapshot.
    _scenario(rng, gateway, 60, [])
    gateway.lines.clear()
    gateway.hello_with_snapshot(chunk_blocks=rng.choice([1, 3, 1000]))
    for _ in range(3):  # several offsets
        _scenario(rng, gateway, 40, expected)
    proc = subprocess.run(
        [str(router_bin), "-replay"],
        input="\n".join(gateway.lines) + "\n",
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
        else:
            assert _normalise_answer(got) == _normalise_answer(want)
