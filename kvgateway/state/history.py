"""A bounded time series per stream and medium, for ``GET /v1/history`` and the dashboard's charts.

Sans-I/O: the caller samples (:meth:`History.sample`) every ``interval`` seconds with readings it
took from the index and the statuses; nothing here reads a clock or a socket.

Memory is fixed when a series is created: every field of a stream and of each of its mediums is a
preallocated ring (``array``) of ``horizon / interval`` slots, overwritten in place (720 slots for
an hour at 5 s). A point costs 61 bytes per stream (40 of them the prefill attribution's cumulative
tokens per origin) plus 20 per medium; :meth:`History.nbytes`
reports the total (a gauge). A missing value is NaN (floats) or -1 (counts) and leaves the JSON as
null. Fill is not stored: it is blocks / the configured capacity, a constant.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kvgateway.engine.mediums import medium_tier
from kvgateway.engine.wire import Stream
from kvgateway.protocol.filters import ClientFilter

INTERVAL_SECONDS: Final = 5.0
HORIZON_SECONDS: Final = 3600.0
MAX_POINTS: Final = 10_000
"""Points in one /v1/history answer, over all its streams: beyond it the step grows (rendering
costs about 20 microseconds a point on the event loop; 256 streams x an hour would be 184,320)."""

STATES: Final = ("unknown", "up", "degraded", "stale", "down")
"""The states a point records (code = index): /v1/sources' ``state``."""
_STATE_CODE: Final = {name: code for code, name in enumerate(STATES)}
_NAN: Final = math.nan


@dataclass(frozen=True, slots=True)
class MediumReading:
    """One medium of one stream at a sampling instant (as :class:`~kvgateway.state.occupancy.MediumStats` gives)."""

    blocks: int
    tokens: int
    stores_per_s: float
    removes_per_s: float
    capacity_blocks: int | None = None


@dataclass(frozen=True, slots=True)
class StreamReading:
    """One stream at a sampling instant. ``lag_seconds``: None unless a live batch arrived within
    the interval (a lag kept from the last batch of a silent or down stream means nothing).
    ``batch_age_seconds``: since the last batch (None: none yet). ``restarts``: cumulative."""

    source: str
    dp_rank: int
    state: str
    lag_seconds: float | None
    batch_age_seconds: float | None
    restarts: int
    mediums: Mapping[str, MediumReading] = field(default_factory=dict)
    stored_tokens: tuple[int, ...] = ()
    """Tokens stored into the GPU tier so far, per origin (:data:`ORIGINS` order); empty: none counted."""


ORIGINS: Final = ("hit", "offloaded", "refetch", "elsewhere", "new")
"""The prefill attribution's origins (:mod:`kvgateway.state.attribution`), as a point renders them."""


def _floats(size: int) -> array[float]:
    return array("f", [_NAN]) * size


def _ints(size: int) -> array[int]:
    return array("i", [-1]) * size


def _num(value: float) -> float | None:
    """A stored float as JSON: null for NaN, rounded (float32 holds about 7 digits)."""
    return None if math.isnan(value) else round(value, 3)


class _MediumSeries:
    __slots__ = ("blocks", "capacity", "removes", "stores", "tokens")

    def __init__(self, size: int) -> None:
        self.blocks = _ints(size)
        self.tokens = array("d", [_NAN]) * size  # float64: exact up to 2**53 tokens
        self.stores = _floats(size)
        self.removes = _floats(size)
        self.capacity: int | None = None

    def put(self, i: int, reading: MediumReading | None) -> None:
        if reading is None:
            self.blocks[i], self.tokens[i], self.stores[i], self.removes[i] = -1, _NAN, _NAN, _NAN
            return
        self.blocks[i] = min(reading.blocks, 2**31 - 1)
        self.tokens[i] = float(reading.tokens)
        self.stores[i] = reading.stores_per_s
        self.removes[i] = reading.removes_per_s
        if reading.capacity_blocks:
            self.capacity = reading.capacity_blocks

    def point(self, i: int) -> dict[str, Any] | None:
        blocks = self.blocks[i]
        if blocks < 0:
            return None
        cap = self.capacity
        return {
            "blocks": blocks,
            "tokens": int(self.tokens[i]),
            "fill": round(blocks / cap, 4) if cap else None,
            "stores_per_s": _num(self.stores[i]),
            "removes_per_s": _num(self.removes[i]),
        }

    def nbytes(self) -> int:
        return sum(a.itemsize * len(a) for a in (self.blocks, self.tokens, self.stores, self.removes))


class StreamSeries:
    """The ring of one stream: slot ``n % size`` holds the ``n``-th sample."""

    __slots__ = (
        "age",
        "count",
        "dp_rank",
        "lag",
        "mediums",
        "origins",
        "restarts",
        "size",
        "source",
        "state",
        "times",
    )

    def __init__(self, source: str, dp_rank: int, size: int) -> None:
        self.source = source
        self.dp_rank = dp_rank
        self.size = size
        self.count = 0  # samples ever taken
        self.times = array("d", [_NAN]) * size
        self.state = array("b", [0]) * size
        self.lag = _floats(size)
        self.age = _floats(size)
        self.restarts = _ints(size)
        self.mediums: dict[str, _MediumSeries] = {}
        self.origins = [array("d", [_NAN]) * size for _ in ORIGINS]  # cumulative tokens (float64: exact)

    def put(self, t: float, reading: StreamReading) -> None:
        last = (self.count - 1) % self.size
        if self.count and self.times[last] >= t:
            i = last  # the same slot sampled again (or a clock step back): overwrite the newest point
        else:
            i = self.count % self.size
            self.count += 1
        self.times[i] = t
        self.state[i] = _STATE_CODE.get(reading.state, 0)
        self.lag[i] = _NAN if reading.lag_seconds is None else reading.lag_seconds
        self.age[i] = _NAN if reading.batch_age_seconds is None else reading.batch_age_seconds
        self.restarts[i] = reading.restarts
        for origin, value in zip(self.origins, reading.stored_tokens or (_NAN,) * len(ORIGINS), strict=True):
            origin[i] = value
        for name in reading.mediums:
            if name not in self.mediums:
                self.mediums[name] = _MediumSeries(self.size)
        for name, series in self.mediums.items():
            series.put(i, reading.mediums.get(name))

    def slots(self, since: float | None, step: int) -> list[int]:
        """Ring slots, oldest first, after ``since``, every ``step``-th counted back from the newest."""
        newest = self.count - 1
        oldest = max(0, self.count - self.size)
        out = [n % self.size for n in range(newest, oldest - 1, -step)]
        if since is not None:
            out = [i for i in out if self.times[i] > since]
        out.reverse()
        return out

    def chosen(self, mediums: frozenset[str] | None) -> list[tuple[str, _MediumSeries]]:
        """The mediums a filter passes (a tier name passes its tier), sorted."""
        return [
            (name, self.mediums[name])
            for name in sorted(self.mediums)
            if mediums is None or name in mediums or medium_tier(name) in mediums
        ]

    def before(self, i: int, step: int) -> int | None:
        """The slot of the sample ``step`` samples before slot ``i``'s, if the ring still holds it."""
        n = self.count - 1 - (self.count - 1 - i) % self.size
        earlier = n - step
        return earlier % self.size if earlier >= max(0, self.count - self.size) else None

    def stored(self, i: int, step: int) -> dict[str, int] | None:
        """Tokens stored per origin between the point ``step`` samples before and slot ``i``."""
        j = self.before(i, step)
        if j is None:
            return None
        out = {}
        for name, series in zip(ORIGINS, self.origins, strict=True):
            delta = series[i] - series[j]
            if math.isnan(delta):
                return None
            out[name] = max(0, int(delta))
        return out

    def point(self, i: int, chosen: list[tuple[str, _MediumSeries]], step: int = 1) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, series in chosen:
            value = series.point(i)
            if value is not None:
                values[name] = value
        restarts = self.restarts[i]
        return {
            "t": self.times[i],
            "state": STATES[self.state[i]],
            "lag_seconds": _num(self.lag[i]),
            "batch_age_seconds": _num(self.age[i]),
            "restarts": None if restarts < 0 else restarts,
            "mediums": values,
            "stored_tokens": self.stored(i, step),
        }

    def nbytes(self) -> int:
        rings: list[array[Any]] = [self.times, self.state, self.lag, self.age, self.restarts, *self.origins]
        own = sum(a.itemsize * len(a) for a in rings)
        return own + sum(m.nbytes() for m in self.mediums.values())


WAKE_AFTER: Final = 0.02
"""How far into its interval a sample is taken, as a share of the interval (100 ms of 5 s)."""


class History:
    """Every stream's series. ``interval`` seconds between samples, ``horizon`` seconds kept."""

    def __init__(self, interval: float = INTERVAL_SECONDS, horizon: float = HORIZON_SECONDS) -> None:
        if interval <= 0 or horizon < interval:
            raise ValueError(f"history: need 0 < interval <= horizon, got {interval} and {horizon}")
        self.interval = interval
        self.size = int(horizon // interval)
        self._streams: dict[Stream, StreamSeries] = {}

    def slot_time(self, now: float) -> float:
        """The sample time of ``now``: the start of its interval (points of all streams line up)."""
        return math.floor(now / self.interval) * self.interval

    def next_sample_in(self, now: float) -> float:
        """Seconds from ``now`` to the next sample: a little after the next interval starts, never
        before it. A timer can fire a few milliseconds early against this clock; a sample taken
        just before the boundary would put two intervals' counts into one point and leave the next
        nearly empty (a full-height bar, then a gap, in every chart)."""
        wake = self.slot_time(now) + self.interval + self.interval * WAKE_AFTER
        return wake - now

    def sample(self, now: float, readings: Iterable[StreamReading]) -> None:
        t = self.slot_time(now)
        for reading in readings:
            key = (reading.source, reading.dp_rank)
            series = self._streams.get(key)
            if series is None:
                series = self._streams[key] = StreamSeries(reading.source, reading.dp_rank, self.size)
            series.put(t, reading)

    def streams(self, chosen: ClientFilter | None = None) -> list[StreamSeries]:
        return [
            self._streams[key]
            for key in sorted(self._streams)
            if chosen is None or chosen.matches_stream(key[0], key[1])
        ]

    def nbytes(self) -> int:
        """Bytes held by the rings (preallocated: the bound, not the points taken so far)."""
        return sum(series.nbytes() for series in self._streams.values())

    def to_json(
        self, epoch: str, chosen: ClientFilter | None = None, since: float | None = None, step: int = 1
    ) -> dict[str, Any]:
        """The /v1/history document: the chosen streams' points after ``since``, every ``step``-th,
        or every n-th for the smallest multiple n of ``step`` that keeps to :data:`MAX_POINTS`."""
        mediums = chosen.mediums if chosen is not None else None
        picked = self.streams(chosen)
        total = sum(len(series.slots(since, 1)) for series in picked)
        if total > MAX_POINTS * step:
            step *= -(-total // (MAX_POINTS * step))
        streams = []
        for series in picked:
            names = series.chosen(mediums)
            points = [series.point(i, names, step) for i in series.slots(since, step)]
            streams.append({"source": series.source, "dp_rank": series.dp_rank, "points": points})
        return {
            "epoch": epoch,
            "interval_seconds": self.interval * step,
            "horizon_seconds": self.interval * self.size,
            "streams": streams,
        }
