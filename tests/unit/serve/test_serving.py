"""kvgateway.serve.serving: the serving half built over its ring log and fed through it (no ingest, no
sockets): every follower sees each record once, the hello's snapshot and statuses are the state at its
offset, and readiness is the status board's."""

from __future__ import annotations

import json

from kvgateway.config import Settings, SourceConfig
from kvgateway.log.records import STATUS, NoticeRecord, batch_record
from kvgateway.log.status import StreamStatus
from kvgateway.protocol.filters import ClientFilter
from kvgateway.runtime.metrics import Metrics
from kvgateway.serve.query import ClientRequest
from kvgateway.serve.serving import Serving
from tests.support.events import batch, removed, stored

NOW = 1000.0


def make_serving() -> Serving:
    sources = (SourceConfig(name="a", endpoint="tcp://127.0.0.1:1", dp_size=2),)
    return Serving(Settings(sources=sources), Metrics(), clock=lambda: NOW)


def connected(serving: Serving, dp_rank: int) -> None:
    shown = serving.board.status(("a", dp_rank))
    assert shown is not None
    status = StreamStatus(shown.config, connected=True, down_reason="connected")
    serving.log.append(NoticeRecord(("a", dp_rank), STATUS, status.report(None, NOW)))


def test_one_append_reaches_every_follower() -> None:
    serving = make_serving()
    offset = serving.log.append(
        batch_record(("a", 1), 41, batch(stored(1, 2), removed(2)), received=NOW, replayed=False)
    )
    assert offset == 1 == serving.hub.offset == serving.log.last_offset
    assert serving.index.stream("a", 1).resident_blocks() == 1
    shown = serving.board.status(("a", 1))
    assert shown is not None and shown.last_seq == 41
    assert serving.activity.last_live == {("a", 1): NOW}
    assert serving.routers.resident(("a", 1), 1) and not serving.routers.resident(("a", 1), 2)


def test_a_fresh_hello_carries_the_state_at_its_offset_and_a_resumed_one_none() -> None:
    serving = make_serving()
    serving.log.append(batch_record(("a", 0), 7, batch(stored(5)), received=NOW, replayed=False))
    fresh = serving.subscribe_held(ClientRequest(ClientFilter()), "ws")
    hello = json.loads(fresh.hello)
    assert (hello["offset"], hello["recovered"]) == (1, False)
    assert hello["occupancy"] == json.loads(json.dumps(serving.snapshot(1)))
    assert [s["last_seq"] for s in hello["sources"]] == ["7", None]
    resumed = serving.subscribe_held(ClientRequest(ClientFilter(), f"{serving.log.epoch}:0"), "sse")
    assert json.loads(resumed.hello)["occupancy"] is None and resumed.recovered
    only_rank_1 = serving.statuses(ClientFilter(dp_ranks=frozenset({1})))
    assert [(s["source"], s["dp_rank"]) for s in only_rank_1] == [("a", 1)]


def test_ready_once_the_board_shows_every_stream_up() -> None:
    serving = make_serving()
    ready, detail = serving.readiness()
    assert not ready and [s["dp_rank"] for s in detail["not_ready"]] == [0, 1]
    connected(serving, 0)
    assert [s["dp_rank"] for s in serving.readiness()[1]["not_ready"]] == [1]
    connected(serving, 1)
    assert serving.readiness() == (True, {"streams": 2, "not_ready": []})
    assert serving.health() == {"epoch": serving.hub.epoch, "uptime_seconds": 0.0}
