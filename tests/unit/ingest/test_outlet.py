"""StreamOutlet without sockets: the sequencer's actions in, status, log records and metrics out."""

from __future__ import annotations

import logging
import re
from functools import partial
from typing import Any

import pytest
from prometheus_client import generate_latest

from kvgateway.config import StreamConfig
from kvgateway.engine.sequencer import (
    CancelReplay,
    Deliver,
    Duplicate,
    GapDetected,
    HistoryTruncated,
    ReplayFinished,
    RequestReplay,
    Restart,
    Unrecovered,
)
from kvgateway.engine.wire import AllBlocksCleared, UnknownEvent
from kvgateway.ingest.outlet import MAX_EVENT_TYPES, OTHER_TYPES, StreamOutlet
from kvgateway.log.entry import Entry
from kvgateway.log.ordered import MemoryLog
from kvgateway.log.records import STATUS, BatchRecord, NoticeRecord
from kvgateway.runtime.metrics import FOLD_AT, LAG_BUCKETS, LagHistogram, Metrics
from kvgateway.state.occupancy import OccupancyIndex
from kvgateway.state.status_board import BoardFigures, StatusBoard
from tests.support import events

NOW = 1000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Rig:
    """One outlet on a real MemoryLog, a real index following it, and a real registry."""

    def __init__(self, *, dp_rank: int = 0, endpoint: str = "tcp://127.0.0.1:5557") -> None:
        self.clock = Clock()
        self.log = MemoryLog()
        self.index = OccupancyIndex()
        self.log.follow(self.index.follow)
        self.records: list[BatchRecord | NoticeRecord] = []
        self.log.follow(self._keep)
        self.connections: list[tuple[bool, bool, str]] = []
        config = StreamConfig("e", dp_rank, endpoint, None, "", False, {})
        self.outlet = StreamOutlet(
            config,
            self.log,
            clock=self.clock,
            on_connection=lambda _, up, changed, why, code: self.connections.append((up, changed, why)),
        )
        # The serving half's view, from the log alone: what /v1/sources and the metrics show.
        self.board = StatusBoard([config], self.index)
        self.log.follow(self.board.follow)
        self.metrics = Metrics()
        self.metrics.streams.add(self.outlet)
        self.metrics.streams.add(BoardFigures(self.board, self.clock))

    def status(self, now: float) -> dict[str, Any]:
        """The stream's entry in /v1/sources, as the status board derives it from the log."""
        (entry,) = self.board.to_json(now)
        return entry

    def _keep(self, entry: Entry) -> None:
        assert entry.record is not None
        self.records.append(entry.record)

    def notices(self) -> list[tuple[str, dict[str, Any]]]:
        return [(r.kind, r.fields) for r in self.records if isinstance(r, NoticeRecord) and r.kind != STATUS]

    def seqs(self) -> list[int]:
        return [r.seq for r in self.records if isinstance(r, BatchRecord)]

    def sample(self, name: str, **labels: str) -> float | None:
        """One sample of the exposition, None when absent."""
        text = generate_latest(self.metrics.registry).decode()
        wanted = {"source": "e", "dp_rank": str(self.outlet.config.dp_rank), **labels}
        for line in text.splitlines():
            match = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
            if match is None or match[1] != name:
                continue
            found = dict(re.findall(r'(\w+)="([^"]*)"', match[2] or ""))
            if found == wanted:
                return float(match[3])
        return None


stored = partial(events.stored, block_size=4)


batch = partial(events.batch, ts=NOW - 0.5)


def test_a_delivered_batch_is_one_record_the_index_applies_and_counts_in_status_and_metrics() -> None:
    rig = Rig()
    rig.outlet.received()
    rig.outlet.apply([Deliver(0, batch(stored(1, 2), events.removed(9)), replayed=False)], NOW, held=0)
    assert rig.seqs() == [0]
    status = rig.status(NOW)
    assert status["last_seq"] == "0"
    assert status["lag_seconds"] == pytest.approx(0.5)
    assert status["counters"]["batches"] == 1
    assert rig.index.stream("e", 0).unknown_removes == 1
    assert rig.sample("kvgateway_batches_received_total") == 1
    assert rig.sample("kvgateway_events_received_total", type="BlockStored") == 1
    assert rig.sample("kvgateway_events_received_total", type="BlockRemoved") == 1
    assert rig.outlet.events == {"BlockStored": 1, "BlockRemoved": 1}  # a type once its first event came
    assert rig.sample("kvgateway_unknown_removes_total") == 1
    assert rig.sample("kvgateway_source_last_seq") == 0
    assert rig.sample("kvgateway_event_lag_seconds_bucket", le="0.25") == 0
    assert rig.sample("kvgateway_event_lag_seconds_bucket", le="0.5") == 1
    assert rig.sample("kvgateway_event_lag_seconds_count") == 1
    assert rig.sample("kvgateway_event_lag_seconds_sum") == pytest.approx(0.5)
    assert rig.sample("kvgateway_cache_blocks", medium="GPU") == 2
    assert rig.sample("kvgateway_cache_tokens", medium="GPU") == 8
    # Events are counted by type, whatever their medium: as the renderer counted them, or, in a
    # batch with an engine's own type, by the record's filter keys; the two summed by type.
    odd = UnknownEvent("Vendor", {"medium": "cpu"})
    mixed = batch(stored(3, medium="CPU"), stored(4, medium="cpu_pinned"), events.cleared(), odd, odd)
    rig.outlet.apply([Deliver(1, mixed, replayed=False)], NOW, held=0)
    assert rig.outlet.events == {"BlockStored": 3, "BlockRemoved": 1, "AllBlocksCleared": 1, "Vendor": 2}
    known = batch(stored(5), events.cleared(), stored(6, medium="CPU"), stored(7), events.removed(5), events.removed(6))
    rig.outlet.apply([Deliver(2, known, replayed=False)], NOW, held=0)
    assert rig.outlet.events == {"BlockStored": 6, "BlockRemoved": 3, "AllBlocksCleared": 2, "Vendor": 2}
    assert rig.sample("kvgateway_events_received_total", type="BlockStored") == 6
    assert rig.sample("kvgateway_events_received_total", type="AllBlocksCleared") == 2
    assert rig.sample("kvgateway_events_received_total", type="Vendor") == 2
    # a faulty engine's ever new types: the first ones named, the rest summed under "other"
    types = [f"Vendor{n}" for n in range(MAX_EVENT_TYPES + 3)]
    rig.outlet.apply([Deliver(3, batch(*(UnknownEvent(t, {}) for t in types)), replayed=False)], NOW, held=0)
    named = MAX_EVENT_TYPES - 1 - 4  # the three known types and "Vendor" came first
    assert rig.outlet.events == {
        "BlockStored": 6,
        "BlockRemoved": 3,
        "AllBlocksCleared": 2,
        "Vendor": 2,
        **dict.fromkeys(types[:named], 1),
        OTHER_TYPES: len(types) - named,
    }
    assert rig.sample("kvgateway_events_received_total", type=OTHER_TYPES) == len(types) - named
    more = batch(stored(8), events.cleared(), events.removed(8))  # the known types are never summed
    rig.outlet.apply([Deliver(4, more, replayed=False)], NOW, held=0)
    assert (rig.outlet.events["BlockStored"], rig.outlet.events["AllBlocksCleared"]) == (7, 3)


def test_the_lags_wait_unbucketed_fold_at_most_and_a_scrape_sees_every_one() -> None:
    rig = Rig()
    lags = rig.outlet.lag.values
    for seq in range(FOLD_AT + 2):
        rig.outlet.apply([Deliver(seq, batch(), replayed=False)], NOW + seq / 1000, held=0)
        assert len(lags) < FOLD_AT
    assert len(lags) == 2  # FOLD_AT + 2 batches, FOLD_AT of them folded as the last one came
    assert rig.sample("kvgateway_event_lag_seconds_count") == FOLD_AT + 2
    assert rig.sample("kvgateway_event_lag_seconds_bucket", le="0.5") == 1, "only the first lag was 0.5 s"
    assert lags == []


def test_a_replayed_batch_counts_as_replayed_and_leaves_the_lag_alone() -> None:
    rig = Rig()
    rig.outlet.apply([Deliver(4, batch(stored(1), ts=NOW - 100), replayed=True)], NOW, held=3)
    status = rig.status(NOW)
    assert status["counters"]["replayed"] == 1
    assert status["lag_seconds"] is None
    assert rig.sample("kvgateway_replayed_batches_total") == 1
    assert rig.sample("kvgateway_event_lag_seconds_count") == 0
    assert rig.sample("kvgateway_ingest_queue_depth") == 3
    assert isinstance(rig.records[0], BatchRecord) and rig.records[0].replayed


def test_a_batch_of_another_rank_is_counted_and_still_delivered() -> None:
    rig = Rig(dp_rank=1)
    rig.outlet.apply([Deliver(0, batch(stored(1), dp_rank=0), replayed=False)], NOW, held=0)
    assert rig.seqs() == [0]
    assert rig.sample("kvgateway_rank_mismatches_total") == 1


def test_an_undecodable_batch_takes_its_seq_and_makes_the_index_stale_once() -> None:
    rig = Rig()
    rig.outlet.decode_error(3, "bad msgpack")
    rig.outlet.apply([Deliver(3, None, replayed=False), Deliver(4, None, replayed=False)], NOW, held=0)
    assert rig.seqs() == []
    assert [kind for kind, _ in rig.notices()] == ["stale"]
    assert rig.notices()[0][1]["reason"] == "undecodable"
    status = rig.status(NOW)
    assert (status["last_seq"], status["stale"], status["stale_reason"]) == ("4", True, "undecodable")
    assert status["counters"]["decode_errors"] == 1
    assert rig.sample("kvgateway_decode_errors_total") == 1
    assert rig.sample("kvgateway_index_stale") == 1


def test_a_gap_and_its_replay_count_once_with_the_purpose_of_the_request() -> None:
    rig = Rig()
    rig.outlet.apply([GapDetected(5, 7), RequestReplay(1, 5, "gap")], NOW, held=1)
    rig.outlet.apply([RequestReplay(2, 6, "gap", attempt=2)], NOW, held=1)
    rig.outlet.apply([ReplayFinished(2, "recovered", 3, attempts=2)], NOW, held=0)
    counters = rig.status(NOW)["counters"]
    assert (counters["gaps"], counters["missed"]) == (1, 3)
    assert rig.sample("kvgateway_sequence_gaps_total") == 1
    assert rig.sample("kvgateway_missed_batches_total") == 3
    assert rig.sample("kvgateway_replay_attempts_total", purpose="gap") == 2
    assert rig.sample("kvgateway_replay_attempts_total", purpose="catch_up") == 0
    assert rig.sample("kvgateway_replay_requests_total", outcome="recovered") == 1
    assert rig.notices() == []


def test_a_tail_probe_that_found_nothing_is_no_recovery() -> None:
    rig = Rig()
    rig.outlet.apply([RequestReplay(1, 9, "tail"), ReplayFinished(1, "recovered", 0)], NOW, held=0)
    assert rig.sample("kvgateway_replay_attempts_total", purpose="tail") == 1
    assert rig.sample("kvgateway_replay_requests_total", outcome="recovered") == 0
    # ...but a tail probe that brought something is one
    rig.outlet.apply([RequestReplay(2, 9, "tail"), ReplayFinished(2, "recovered", 2)], NOW, held=0)
    assert rig.sample("kvgateway_replay_requests_total", outcome="recovered") == 1


def test_unrecovered_batches_are_noticed_make_the_stream_degraded_and_stale() -> None:
    rig = Rig()
    rig.outlet.connection(True, "connected", "connected")
    rig.outlet.apply([Unrecovered(3, 5, "evicted"), Unrecovered(8, 8, "evicted")], NOW, held=0)
    kinds = [kind for kind, _ in rig.notices()]
    # one degraded and one stale notice, however many losses
    assert kinds == ["up", "unrecovered_gap", "stale", "degraded", "unrecovered_gap"]
    assert rig.notices()[1][1] == {"first": 3, "until": 5, "count": 3, "reason": "evicted"}
    assert rig.notices()[3][1] == {"reason": "3 batches unrecovered (evicted)", "reason_code": "evicted"}
    status = rig.status(NOW)
    assert status["state"] == "degraded"
    assert status["unrecovered_by_reason"] == {"evicted": 4}
    assert status["counters"]["unrecovered"] == 4
    assert rig.sample("kvgateway_unrecovered_batches_total", reason="evicted") == 4
    assert rig.sample("kvgateway_unrecovered_batches_total", reason="transit") == 0
    rig.clock.now = NOW + 61
    assert rig.status(rig.clock.now)["state"] == "stale"


def test_losses_at_a_restart_or_fenced_by_the_engine_are_quiet() -> None:
    rig = Rig()
    rig.outlet.connection(True, "connected", "connected")
    rig.outlet.apply([Unrecovered(0, 1, "restart"), Unrecovered(5, 6, "not_sent")], NOW, held=0)
    kinds = [kind for kind, _ in rig.notices()]
    # restart: stale but not degraded; not_sent: degraded but not stale (the engine cleared its cache)
    assert kinds == ["up", "unrecovered_gap", "stale", "unrecovered_gap", "degraded"]
    assert rig.notices()[-1][1]["reason_code"] == "not_sent"
    assert rig.status(NOW)["state"] == "degraded"


def test_a_restart_is_noticed_and_resets_the_index() -> None:
    rig = Rig()
    rig.outlet.apply([Deliver(0, batch(stored(1, 2)), replayed=False), HistoryTruncated(0)], NOW, held=0)
    assert rig.index.stream("e", 0).stale
    rig.outlet.apply([Restart(0, 10, "seq_reset")], NOW, held=0)
    assert rig.notices()[-1] == ("restart", {"seq": 0, "previous": 10, "reason": "seq_reset"})
    index = rig.index.stream("e", 0)
    assert not index.stale
    assert index.medium_stats(NOW)["GPU"].blocks == 0
    assert rig.sample("kvgateway_publisher_restarts_total") == 1
    assert rig.sample("kvgateway_history_truncations_total") == 1


def test_duplicates_and_cancels_change_only_their_counter() -> None:
    rig = Rig()
    rig.outlet.apply([Duplicate(3), Duplicate(4), CancelReplay(1)], NOW, held=0)
    assert rig.notices() == [] and rig.seqs() == [], "nothing a client sees"
    (report,) = rig.records
    assert isinstance(report, NoticeRecord) and report.kind == STATUS, "one status notice for the whole apply"
    assert report.fields["counters"]["duplicates"] == 2
    assert rig.status(NOW)["counters"]["duplicates"] == 2
    assert rig.sample("kvgateway_duplicate_batches_total") == 2


def test_an_all_blocks_cleared_batch_clears_a_stale_index() -> None:
    rig = Rig()
    rig.outlet.apply([Unrecovered(0, 0, "transit")], NOW, held=0)
    assert rig.sample("kvgateway_index_stale") == 1
    assert rig.outlet.staleness.reason == "unrecovered"
    rig.outlet.apply([Deliver(1, batch(), replayed=False)], NOW, held=0)
    assert rig.outlet.staleness.reason == "unrecovered", "a batch without a clear leaves it stale"
    rig.outlet.apply([Deliver(2, batch(AllBlocksCleared()), replayed=False)], NOW, held=0)
    assert rig.sample("kvgateway_index_stale") == 0
    assert rig.outlet.staleness.reason is None, "the ingest's own view (its status notices) too"


def test_connection_changes_are_noticed_once_and_handed_to_the_hook() -> None:
    rig = Rig()
    assert rig.sample("kvgateway_source_up") == 0
    rig.outlet.connection(True, "connected", "connected")
    rig.outlet.connection(True, "connected", "connected")
    rig.outlet.connection(False, "disconnected", "disconnected")
    rig.outlet.connection(False, "connection refused, retrying", "retrying")
    assert [(kind, fields["reason_code"]) for kind, fields in rig.notices()] == [
        ("up", "connected"),
        ("down", "disconnected"),
    ]
    assert rig.connections == [
        (True, True, "connected"),
        (True, False, "connected"),
        (False, True, "disconnected"),
        (False, False, "connection refused, retrying"),
    ]
    status = rig.status(NOW)
    assert (status["state"], status["reason"], status["reason_code"]) == (
        "down",
        "connection refused, retrying",
        "retrying",
    )
    assert rig.sample("kvgateway_source_up") == 0
    rig.outlet.connection(True, "connected", "connected")
    assert rig.sample("kvgateway_source_up") == 1


def test_a_diagnosed_down_reason_stays_until_the_connection_changes() -> None:
    """A host that does not resolve: ZeroMQ's retries (every 2 s at most) say only "retrying", and
    must not overwrite what the diagnosis found, however late it comes."""
    rig = Rig()
    rig.outlet.connection(False, "connection refused, retrying", "retrying")
    rig.outlet.diagnosed("cannot resolve host 'x.invalid': name or service not known", "unresolved")
    for _ in range(3):
        rig.outlet.connection(False, "connection refused, retrying", "retrying")
    assert rig.status(NOW)["reason"] == "cannot resolve host 'x.invalid': name or service not known"
    assert rig.status(NOW)["reason_code"] == "unresolved"
    rig.outlet.diagnosed("connection refused, retrying", "refused")  # the cause changed: the next diagnosis says so
    assert rig.status(NOW)["reason"] == "connection refused, retrying"
    rig.outlet.connection(True, "connected", "connected")
    rig.outlet.diagnosed("late", "no_answer")  # a diagnosis that finishes after the stream came up changes nothing
    rig.outlet.connection(False, "disconnected", "disconnected")
    rig.outlet.connection(False, "connection refused, retrying", "retrying")  # undiagnosed: the latest word wins
    assert (rig.status(NOW)["reason"], rig.status(NOW)["reason_code"]) == ("connection refused, retrying", "retrying")


def test_every_stream_series_exists_before_anything_happens() -> None:
    rig = Rig()
    assert rig.sample("kvgateway_source_last_seq") == -1
    assert rig.sample("kvgateway_batches_received_total") == 0
    for outcome in ("recovered", "partial", "failed", "unavailable"):
        assert rig.sample("kvgateway_replay_requests_total", outcome=outcome) == 0
    assert rig.sample("kvgateway_event_lag_seconds_bucket", le="+Inf") == 0


@pytest.mark.parametrize("value", [0.0, 0.001, 0.0011, 0.5, 60.0, 61.0, -1.0])
def test_lag_histogram_buckets_as_prometheus_does(value: float) -> None:
    histogram = LagHistogram()
    histogram.observe(value)
    cumulative = dict(histogram.cumulative())
    for bound in LAG_BUCKETS:
        key = next(k for k in cumulative if k != "+Inf" and float(k) == bound)
        assert cumulative[key] == (1 if value <= bound else 0), (value, bound)
    assert cumulative["+Inf"] == 1


def test_the_catch_up_at_connect_says_what_it_is(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 33, item 11: every demo stream logged "replay recovered, 1 batches replayed" on a
    fresh start. That batch was published before the gateway read its stream, and the catch-up read it
    from the engine's buffer: nothing was missed, and the log says so."""
    rig = Rig()
    with caplog.at_level(logging.INFO):
        rig.outlet.apply([RequestReplay(1, 0, "catch_up")], NOW, held=0)
        rig.outlet.apply([Deliver(0, batch(stored(1)), True), ReplayFinished(1, "recovered", 1)], NOW, held=0)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("kvgateway")]
    assert lines == [
        "stream e[0]: caught up: 1 batch from the engine's buffer, published before the gateway read its stream "
        "(counted as replayed; nothing was missed)"
    ]
    counters = rig.status(NOW)["counters"]
    assert (counters["replayed"], counters["gaps"], counters["missed"]) == (1, 0, 0)


def test_a_replay_ended_by_a_restart_is_info_a_failed_one_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A publisher restart mid-recovery is routine (the old process's batches are reported lost
    apart); only a replay the socket failed is a warning. Both count as outcome failed."""
    rig = Rig()
    with caplog.at_level(logging.INFO):
        rig.outlet.apply([RequestReplay(1, 5, "gap"), ReplayFinished(1, "failed", 0, by_restart=True)], NOW, held=0)
        rig.outlet.apply([RequestReplay(2, 5, "gap"), ReplayFinished(2, "failed", 0)], NOW, held=0)
    replays = [(r.levelname, r.getMessage()) for r in caplog.records if "replay" in r.getMessage()]
    assert replays == [
        ("INFO", "stream e[0]: replay ended by the publisher's restart, 0 batches replayed in 1 attempt(s)"),
        ("WARNING", "stream e[0]: replay failed, 0 batches replayed in 1 attempt(s)"),
    ]
    assert rig.sample("kvgateway_replay_requests_total", outcome="failed") == 2
