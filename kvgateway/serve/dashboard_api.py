"""What the dashboard reads beyond the stream: ``GET /v1/history`` (fed by a sampler task) and
``GET /v1/analytics``.

Thin: the series live in :mod:`kvgateway.state.history` and the analytics in
:mod:`kvgateway.state.analytics` (both sans-I/O; they follow the log, wired with the serving
half's other followers in :class:`~kvgateway.serve.serving.Serving`). This module reads the index
and statuses every interval, and serves the documents. The app creates one :class:`DashboardData`
per gateway; its lifespan starts and stops the sampler.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from kvgateway.runtime.tasks import cancel_and_wait
from kvgateway.serve.http_query import bad_request, read_query
from kvgateway.serve.query import BadRequest, check_once
from kvgateway.state.history import History, MediumReading, StreamReading
from kvgateway.state.occupancy import StreamIndex

if TYPE_CHECKING:
    from kvgateway.serve.serving import Serving

logger = logging.getLogger("kvgateway.web")

PREFIX_EVERY: Final = 6
"""The prefix-spread gauge is refreshed every this many samples (30 s): it looks blocks up in every stream."""


class DashboardData:
    """The history of one gateway and its sampler task."""

    def __init__(self, serving: Serving, history: History | None = None) -> None:
        self.serving = serving
        self.history = history if history is not None else History()
        self.activity = serving.activity  # both follow the log (wired in Serving)
        self.analytics = serving.analytics
        self.attribution = serving.attribution
        self._task: asyncio.Task[None] | None = None
        self._samples = 0

    def readings(self, now: float) -> list[StreamReading]:
        serving = self.serving
        out = []
        for source, dp_rank in serving.board.streams:
            status, index = serving.board.status((source, dp_rank), now), serving.index.stream(source, dp_rank)
            assert status is not None
            last = self.activity.last_batch.get((source, dp_rank))
            live = self.activity.last_live.get((source, dp_rank))
            # Lag means something only for a batch that arrived live within this interval.
            fresh = status.connected and live is not None and now - live <= self.history.interval
            mediums = {
                name: MediumReading(s.blocks, s.tokens, s.stores_per_s, s.removes_per_s, s.capacity_blocks)
                for name, s in index.medium_stats(now).items()
            }
            out.append(
                StreamReading(
                    source,
                    dp_rank,
                    status.state(now, index.stale),
                    status.lag_seconds if fresh else None,
                    None if last is None else max(0.0, now - last),
                    status.counters["restarts"],
                    mediums,
                    tuple(self.attribution.account((source, dp_rank)).tokens),
                )
            )
        return out

    def up_streams(self, indexes: Iterable[StreamIndex]) -> list[StreamIndex]:
        """The streams whose engine is connected: a down engine's blocks are not a prefix's home."""
        board, now = self.serving.board, self.serving.clock()
        return [
            index
            for index in indexes
            if (status := board.status((index.source, index.dp_rank), now)) is not None and status.connected
        ]

    def sample(self) -> None:
        now = self.serving.clock()
        self.history.sample(now, self.readings(now))
        self.serving.metrics.history_bytes.set(self.history.nbytes())
        held, bound = self.analytics.tracked()
        self.serving.metrics.analytics_tracked.set(held)
        self.serving.metrics.analytics_tracked_bound.set(bound)
        if self._samples % PREFIX_EVERY == 0:
            spread = self.analytics.prefix_spread(self.up_streams(self.serving.index.streams()))
            if spread["mean_engines"] is not None:
                self.serving.metrics.prefix_engines_mean.set(spread["mean_engines"])
        self._samples += 1

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        sampled: float | None = None
        while True:
            now = self.serving.clock()
            # One sample per interval: a timer that fires early (a loaded machine) waits again
            # rather than sampling the interval it has already sampled.
            if self.history.slot_time(now) != sampled:
                sampled = self.history.slot_time(now)
                try:
                    self.sample()
                except Exception:  # a bug here must not end the sampling for good
                    logger.exception("history sampling failed")
            await asyncio.sleep(self.history.next_sample_in(now))


def parse_history_query(own: dict[str, list[str]], interval: float) -> tuple[float | None, int]:
    """``since`` and ``step`` (in samples) of a /v1/history request, from its own parameters
    (:func:`kvgateway.serve.query.parse_route_query`); raises :class:`BadRequest`."""
    since: float | None = None
    step = 1
    for name in ("since", "step"):
        check_once(name, own.get(name, []))
    for value in own.get("since", []):
        try:
            since = float(value)
        except ValueError:
            since = math.nan
        if not math.isfinite(since):
            raise BadRequest(f"since: expected a time in seconds since the epoch, got {value[:64]!r}")
    for value in own.get("step", []):
        seconds = int(value) if value.isdigit() and len(value) < 7 else 0
        if seconds <= 0 or seconds % interval:
            raise BadRequest(f"step: expected a positive multiple of {interval:g} seconds, got {value[:64]!r}")
        step = int(seconds // interval)
    return since, step


async def history_endpoint(request: Request) -> Response:
    data: DashboardData = request.app.state.dashboard_data
    serving = data.serving
    try:
        client, own = read_query(request, "/v1/history")
        since, step = parse_history_query(own, data.history.interval)
    except BadRequest as exc:
        return bad_request(serving, exc)
    body = data.history.to_json(serving.log.epoch, client.filter, since, step)
    return Response(msgspec.json.encode(body), media_type="application/json")


async def analytics_endpoint(request: Request) -> Response:
    data: DashboardData = request.app.state.dashboard_data
    serving = data.serving
    try:
        client, _ = read_query(request, "/v1/analytics")
    except BadRequest as exc:
        return bad_request(serving, exc)
    streams = serving.routers.matching(serving.board.streams, client.filter)
    body = {"epoch": serving.log.epoch, **data.analytics.to_json(streams, up=data.up_streams(streams))}
    now = serving.clock()
    for entry, index in zip(body["streams"], streams, strict=True):  # both sorted by stream
        entry["prefill"] = data.attribution.stream_json(index, now)
    body["prefill"] = data.attribution.to_json(streams, now)
    return Response(msgspec.json.encode(body), media_type="application/json")
