"""Helpers for end-to-end tests of ``kvgateway serve`` fed by ``kvgateway simulate``.

Everything here talks to real processes over loopback: a WebSocket collector (the
``websockets`` library, in a thread), a one-scrape reader of /metrics, a raw replay client
(DEALER) for ground truth, and a reference-count model of the engine's cache built from the raw
msgpack payloads with msgspec alone (independent of ``kvgateway.engine.wire`` and the gateway's index).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from itertools import pairwise
from typing import Any, Final

import httpx
import msgspec
import zmq
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from kvgateway.engine import wire
from kvgateway.log import render
from tests.support import start_gateway as support_start_gateway

from ._sim_helpers import Layout, parse_replay_reply

BIG_QUEUE = 256 * 1024 * 1024
"""``--client-queue-bytes`` for every gateway: the test's own client must never be cut off."""

WARMUP_BASE = 1_000_000
"""Seqs of the simulator's warm-up run (see :func:`warmup`), far above any seq a test reaches."""


# --- processes --------------------------------------------------------------------------------


start_gateway: Final = partial(support_start_gateway, client_queue_bytes=BIG_QUEUE)
"""The gateway of the integration tests: :func:`tests.support.start_gateway` with a queue no test
client outgrows."""


def warmup(seconds: float) -> list[str]:
    """Simulator flags for a silent start of ``seconds`` before the run a test watches.

    ZeroMQ's PUB drops what it sends before a subscriber's subscription has arrived (the "slow
    joiner"), and the gateway asks a connecting engine for its history: which seqs arrive live and
    which by that catch-up would be left to chance. So the simulator opens its sockets and stays
    silent (answering replays) for ``seconds``: the gateway connects, catches up on an empty buffer
    (one ``recovered`` recovery that brings nothing), and the run begins at seq 0, received live.
    """
    return [] if seconds <= 0 else ["--start-delay", str(seconds)]


# --- the WebSocket client ---------------------------------------------------------------------


class WsCollector:
    """A WebSocket client in a thread that keeps every message with its arrival time (time.time())."""

    def __init__(self, url: str, *, query: str = "", open_timeout: float = 10.0) -> None:
        full = f"{url}?{query}" if query else url
        self.url = full
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self.closed_error: BaseException | None = None
        self._ws: ClientConnection = connect(full, max_size=None, open_timeout=open_timeout).__enter__()
        first = self._ws.recv(timeout=open_timeout)
        assert isinstance(first, str)
        self.hello: dict[str, Any] = json.loads(first)
        assert self.hello["type"] == "hello", self.hello
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for frame in self._ws:
                now = time.time()
                assert isinstance(frame, str)
                for line in frame.split("\n"):
                    self.messages.append((now, json.loads(line)))
        except ConnectionClosed as exc:
            self.closed_error = exc
        except BaseException as exc:  # surfaced by the test through closed_error
            self.closed_error = exc

    def close(self) -> None:
        self._ws.close()
        self._thread.join(5)

    def __enter__(self) -> WsCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # views (each a fresh list: the reader thread keeps appending)

    def of(self, source: str, dp_rank: int) -> list[dict[str, Any]]:
        """Every message of one stream, in arrival order."""
        return [m for _, m in list(self.messages) if m.get("source") == source and m.get("dp_rank") == dp_rank]

    def seqs(self, source: str, dp_rank: int = 0) -> list[int]:
        """The seqs of the stream's batches, in arrival order."""
        return [m["seq"] for m in self.of(source, dp_rank) if m["type"] == "batch"]

    def last_seq(self, source: str, dp_rank: int = 0) -> int | None:
        seqs = self.seqs(source, dp_rank)
        return seqs[-1] if seqs else None

    def notices(self, source: str, dp_rank: int = 0, *kinds: str) -> list[dict[str, Any]]:
        return [
            m
            for m in self.of(source, dp_rank)
            if m["type"] == "notice" and m["kind"] not in ("up", "down", "status") and (not kinds or m["kind"] in kinds)
        ]


# --- /metrics, /v1/sources, /v1/occupancy -----------------------------------------------------

_STREAM_COUNTERS = {
    "received": "kvgateway_batches_received_total",
    "gaps": "kvgateway_sequence_gaps_total",
    "missed": "kvgateway_missed_batches_total",
    "replayed": "kvgateway_replayed_batches_total",
    "unrecovered": "kvgateway_unrecovered_batches_total",
    "restarts": "kvgateway_publisher_restarts_total",
    "duplicates": "kvgateway_duplicate_batches_total",
    "decode_errors": "kvgateway_decode_errors_total",
    "up": "kvgateway_source_up",
    "last_seq": "kvgateway_source_last_seq",
    "queue_depth": "kvgateway_ingest_queue_depth",
}


def scrape(base: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """One GET /metrics: every sample by name."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def stream_metrics(base: str, source: str, dp_rank: int = 0) -> dict[str, Any]:
    """The per-stream ingest counters of one scrape, as ints; ``replay`` maps outcome -> requests (non-zero)."""
    samples = scrape(base)
    want = {"source": source, "dp_rank": str(dp_rank)}

    def select(name: str) -> list[tuple[dict[str, str], float]]:
        return [(labels, v) for labels, v in samples.get(name, []) if all(labels.get(k) == x for k, x in want.items())]

    out: dict[str, Any] = {}
    for key, name in _STREAM_COUNTERS.items():
        found = select(name)
        if key == "unrecovered":  # one series per reason
            out[key] = sum(int(v) for _, v in found)
            out["losses"] = {labels["reason"]: int(v) for labels, v in found if int(v) != 0}
            continue
        assert len(found) == 1, f"{name} for {want}: {found}"
        out[key] = int(found[0][1])
    out["replay"] = {
        labels["outcome"]: int(v) for labels, v in select("kvgateway_replay_requests_total") if int(v) != 0
    }
    return out


def source_status(base: str, source: str, dp_rank: int = 0) -> dict[str, Any]:
    body = httpx.get(f"{base}/v1/sources", timeout=10).json()
    (entry,) = [s for s in body["sources"] if s["source"] == source and s["dp_rank"] == dp_rank]
    return dict(entry)


def occupancy_stream(base: str, source: str, dp_rank: int = 0) -> dict[str, Any]:
    body = httpx.get(f"{base}/v1/occupancy", timeout=10).json()
    (entry,) = [s for s in body["streams"] if s["source"] == source and s["dp_rank"] == dp_rank]
    return dict(entry)


def occupancy_counts(entry: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The exact (rate-free) numbers of an /v1/occupancy stream entry, per medium."""
    keys = ("blocks", "tokens", "block_size", "stores", "removes")
    return {medium: {k: stats[k] for k in keys} for medium, stats in entry["mediums"].items()}


# --- ground truth from the engine itself ------------------------------------------------------


def fetch_history(
    replay_endpoint: str, start: int = 0, timeout: float = 20.0, layout: Layout = "topic"
) -> list[tuple[int, bytes]]:
    """Every batch the engine's replay socket still holds from ``start``: (seq, raw payload).

    The engine sends its reply through a ROUTER that drops past its high-water mark, so a long
    reply can come back with holes or without its end marker: ask again from the first missing
    seq, as the gateway does, until a reply comes back whole, or brings nothing new (a hole the
    engine never buffered stays a hole)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    got: dict[int, bytes] = {}
    deadline = time.monotonic() + timeout
    try:
        ask = start
        while True:
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RCVHWM, 0)
            dealer.connect(replay_endpoint)
            ended = False
            before = len(got)
            try:
                dealer.send_multipart([b"", wire.seq_bytes(ask)])
                while not ended and dealer.poll(2000):
                    seq, payload = parse_replay_reply(dealer.recv_multipart(), layout)
                    if seq == wire.END_SEQ:
                        ended = True
                    else:
                        got.setdefault(seq, payload)
            finally:
                dealer.close(linger=0)
            seqs = sorted(s for s in got if s >= start)
            holes = [a + 1 for a, b in pairwise(seqs) if b != a + 1]
            if (ended and not holes) or (len(got) == before and ask != start):
                return [(seq, got[seq]) for seq in seqs]
            assert time.monotonic() < deadline, f"replay from {start} on {replay_endpoint}: incomplete"
            ask = holes[0] if holes else (seqs[-1] + 1 if seqs else start)
    finally:
        context.term()


@dataclass
class _Medium:
    # (group_idx, hash) -> references
    refs: Counter[tuple[int, Any]] = field(default_factory=Counter)
    block_size: int = 0
    stores: int = 0
    removes: int = 0


class RefModel:
    """An independent reference-count model of one engine publisher's cache.

    Fed raw msgpack payloads (map-form events, as ``kvgateway simulate`` sends by default),
    decoded with msgspec into plain Python values. The rules are those of docs/wire-format.md:
    a store adds one reference per hash, a remove takes one away (an unknown hash is only
    counted), AllBlocksCleared empties every medium; a missing medium is GPU, a missing
    group_idx is group 0.
    """

    def __init__(self) -> None:
        self.mediums: dict[str, _Medium] = {}
        self.unknown_removes = 0
        self.batches = 0

    def _medium(self, name: str | None) -> _Medium:
        return self.mediums.setdefault((name or "GPU").upper(), _Medium())

    def feed_any(self, payload: bytes) -> None:
        """Any layout: events decoded by the gateway's own wire decoder, counted by this model."""
        decoded = wire.decode_batch(payload)
        events = [render.render_event(event) for event in decoded.events]
        self.feed(msgspec.msgpack.encode([decoded.ts, events]))

    def feed(self, payload: bytes) -> None:
        batch = msgspec.msgpack.decode(payload)
        assert isinstance(batch, list) and len(batch) >= 2, batch
        self.batches += 1
        for event in batch[1]:
            assert isinstance(event, dict), f"expected map-form events, got {event!r}"
            kind = event["type"]
            if kind == "AllBlocksCleared":
                for medium in self.mediums.values():
                    medium.refs.clear()
                continue
            if kind not in ("BlockStored", "BlockRemoved"):
                continue
            medium = self._medium(event.get("medium"))
            group = event.get("group_idx") or 0
            hashes = event["block_hashes"]
            if kind == "BlockStored":
                for h in hashes:
                    medium.refs[(group, h)] += 1
                medium.stores += len(hashes)
                if event.get("block_size", 0) > 0:
                    medium.block_size = event["block_size"]
            else:
                for h in hashes:
                    key = (group, h)
                    left = medium.refs.get(key, 0)
                    if left == 0:
                        self.unknown_removes += 1
                    elif left == 1:
                        del medium.refs[key]
                    else:
                        medium.refs[key] = left - 1
                medium.removes += len(hashes)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per medium: resident blocks, their tokens, block size, announced stores and removes."""
        out = {}
        for name, medium in sorted(self.mediums.items()):
            blocks = len(medium.refs)
            out[name] = {
                "blocks": blocks,
                "tokens": blocks * medium.block_size,
                "block_size": medium.block_size,
                "stores": medium.stores,
                "removes": medium.removes,
            }
        return out

    def blocks(self) -> dict[str, int]:
        return {name: len(medium.refs) for name, medium in sorted(self.mediums.items())}
