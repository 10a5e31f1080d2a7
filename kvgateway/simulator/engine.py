"""One DP rank's simulated publisher on ZeroMQ (asyncio), and the faults it can inject.

What the engine does like vLLM's ``ZmqEventPublisher`` (its own behaviour, not a fault):

* one loop publishes: each turn it answers at most one waiting replay request, then publishes the
  next batch ``[topic, seq8, payload]`` and appends ``(seq, payload)`` to a bounded buffer;
* a replay is answered in one tight, unpaced loop over the buffer from the requested seq, through
  a ROUTER at libzmq's default send high-water mark (1,000 messages per peer). The ROUTER drops
  what exceeds it, so a long reply to a consumer that does not drain fast enough has holes (and
  may lose its end marker), while the batches stay in the buffer. Live publishing waits meanwhile;
* a request that is not exactly ``[identity, b"", seq8]`` gets no answer at all;
* a restart is a new process: seq from 0, empty buffer, empty cache.

``engine="sglang"`` and ``engine="trtllm"`` change the defaults to those engines' habits (see
:data:`FLAVOURS`); every explicit argument wins. :class:`Faults` adds deterministic versions of
what the real publishers do by accident (replay holes, cut replies, lost queue tails, drops).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, TypedDict, Unpack

import zmq
import zmq.asyncio

from kvgateway.engine import wire
from kvgateway.engine.endpoints import binds, is_ipv6, rank_endpoints
from kvgateway.simulator import encode
from kvgateway.simulator.workload import HASH_KINDS, HashKind, Workload

# One logger for the whole simulator package (tests filter on it).
logger = logging.getLogger("kvgateway.simulator")

ReplayLayout: TypeAlias = Literal["topic", "plain"]
EngineFlavour: TypeAlias = Literal["vllm", "sglang", "trtllm"]

ENGINE_FLAVOURS: Final = ("vllm", "sglang", "trtllm")
EVENT_FORMS: Final = ("map", "array")
REPLAY_LAYOUTS: Final = ("topic", "plain")

MAX_SEQ: Final = (1 << 64) - 2
"""Highest usable seq: 2**64 - 1 is 0xFF*8, the replay end marker."""

PUB_HWM: Final = 100_000  # vLLM's default hwm
REPLAY_HWM: Final = 1000  # libzmq's default SNDHWM, which vLLM keeps on its replay ROUTER
TRTLLM_HEARTBEAT: Final = 5.0


@dataclass(frozen=True)
class Flavour:
    """What one engine does by default; :class:`SimulatedEngine` arguments override each field."""

    form: encode.EventForm
    hash_kind: HashKind
    replay_layout: ReplayLayout
    heartbeat: float  # seconds of silence before an empty batch; 0: never
    clear_on_start: bool  # the first batch of every process is AllBlocksCleared
    seq_from_time: bool  # a process's first seq is its time.time_ns()
    dialect: encode.Dialect


FLAVOURS: Final[dict[str, Flavour]] = {
    # vLLM >= 0.26: map events, unsigned hashes, replies with a topic frame, seq from 0.
    "vllm": Flavour("map", "int", "topic", 0.0, False, False, "vllm"),
    # SGLang: positional events, signed hashes, replies without a topic frame, a clear at start.
    "sglang": Flavour("array", "signed", "plain", 0.0, True, False, "sglang"),
    # TensorRT-LLM: map events, seq from time.time_ns(), heartbeats every 5 s when idle.
    "trtllm": Flavour("map", "int", "topic", TRTLLM_HEARTBEAT, False, True, "vllm"),
}


# --- faults ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Faults:
    """Deliberate misbehaviour of one publisher.

    Live stream:

    * ``skip``: inclusive seq ranges published to the replay buffer but not sent live (a lossy
      network or a slow subscriber at the HWM).
    * ``garbage_at``: that seq's payload is undecodable, live and in replay. ``skip`` and
      ``garbage_at`` apply each time the seq comes round (again after a restart).
    * ``drop_queue`` (TensorRT-LLM's queue overflow): inclusive seq ranges that are consumed but
      never sent nor buffered; the next batch published starts with ``AllBlocksCleared`` (a clear
      fence) and the workload's cache restarts empty. No replay can fill that gap.
    * ``start_seq``: the first seq (None: 0, or ``time.time_ns()`` for TensorRT-LLM).

    Process lifecycle:

    * ``restart_at``: after publishing that seq the engine becomes a new process: seq from 0 (a new
      ``time.time_ns()`` for TensorRT-LLM), an empty replay buffer and cache. Each entry fires
      once, so list a seq k times to restart there k times (every N + 1 batches).
    * ``restart_down``: None: the restart happens in place, the sockets stay open and a subscriber
      sees no disconnect (only the seq going back). A number: a real restart: PUB and ROUTER are
      closed, the engine stays down that many seconds, then binds/connects again.
    * ``lose_tail``: when :meth:`SimulatedEngine.stop` interrupts :meth:`SimulatedEngine.run`,
      this many more batches are generated (consuming seqs) but never sent nor buffered, like
      vLLM's ``shutdown()`` closing its sockets on a queue that still holds batches.

    Replay:

    * ``replay_delay``: requests are answered this many seconds late (live publishing goes on).
    * ``replay_dead``: the ROUTER is bound but requests are read and dropped.
    * ``replay_drop``: ``(low, high, replies)``: seqs low..high are left out of the first
      ``replies`` replies that contain any of them (a ROUTER's HWM drop, made deterministic).
    * ``replay_cut``: ``(items, replies)``: the first ``replies`` replies stop after ``items``
      items and send no end marker (SGLang's cut reply).
    """

    skip: tuple[tuple[int, int], ...] = ()
    restart_at: tuple[int, ...] = ()
    garbage_at: tuple[int, ...] = ()
    replay_delay: float = 0.0
    replay_dead: bool = False
    start_seq: int | None = None
    restart_down: float | None = None
    lose_tail: int = 0
    replay_drop: tuple[tuple[int, int, int], ...] = ()
    replay_cut: tuple[int, int] | None = None
    drop_queue: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        for low, high in (*self.skip, *self.drop_queue):
            if not 0 <= low <= high:
                raise ValueError(f"bad seq range {low}-{high}")
        for low, high, replies in self.replay_drop:
            if not 0 <= low <= high or replies < 1:
                raise ValueError(f"bad replay_drop {low}-{high}x{replies}")
        if self.replay_cut is not None and (self.replay_cut[0] < 0 or self.replay_cut[1] < 1):
            raise ValueError(f"bad replay_cut {self.replay_cut[0]}x{self.replay_cut[1]}")
        if any(s < 0 for s in (*self.restart_at, *self.garbage_at)):
            raise ValueError("restart_at and garbage_at seqs must not be negative")
        if self.replay_delay < 0:
            raise ValueError("replay_delay must not be negative")
        if self.restart_down is not None and not 0 <= self.restart_down < float("inf"):
            raise ValueError("restart_down must be a finite number >= 0 (or None)")
        if self.lose_tail < 0:
            raise ValueError("lose_tail must not be negative")
        if self.start_seq is not None and not 0 <= self.start_seq <= MAX_SEQ:
            raise ValueError(f"start_seq must be between 0 and {MAX_SEQ}")

    def skips(self, seq: int) -> bool:
        return any(low <= seq <= high for low, high in self.skip)

    def drops_queued(self, seq: int) -> bool:
        return any(low <= seq <= high for low, high in self.drop_queue)


def garbage_payload(seq: int) -> bytes:
    """Undecodable bytes (0xC1 is never valid msgpack) standing in for seq's payload."""
    return b"\xc1garbage for seq " + str(seq).encode()


@dataclass(slots=True)
class Reply:
    """What the engine did with one replay request (for tests and logs)."""

    start: int
    planned: int  # buffered batches with seq >= start
    sent: int = 0  # items the ROUTER accepted
    hwm_dropped: list[int] = field(default_factory=list)  # seqs the ROUTER dropped at its HWM
    fault_dropped: list[int] = field(default_factory=list)  # seqs left out by replay_drop / replay_cut
    end_marker: bool = False  # the ROUTER accepted the end marker


# --- the engine -----------------------------------------------------------------------------

_IDLE_SLICE: Final = 0.05  # longest sleep between checks of stop() and replay requests
_YIELD_EVERY: Final = 32  # rate 0: batches between yields to the event loop
_PUBLISHED_KEPT: Final = 100_000
_REBIND_TIMEOUT: Final = 5.0  # a closed socket's address is released by libzmq's threads, not at once
_PACE_POLL_MS: Final = 50


def _flavour(engine: str) -> Flavour:
    if engine not in FLAVOURS:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_FLAVOURS)}, not {engine!r}")
    return FLAVOURS[engine]


def _check_options(
    *, rate: float, batches: int | None, buffer_steps: int, hwm: int, replay_hwm: int, heartbeat: float
) -> None:
    if rate < 0:
        raise ValueError("rate must not be negative")
    if batches is not None and batches < 0:
        raise ValueError("batches must not be negative")
    if buffer_steps < 0:
        raise ValueError("buffer_steps must not be negative")
    if hwm < 0 or replay_hwm < 0:
        raise ValueError("hwm and replay_hwm must not be negative")
    if not 0 <= heartbeat < float("inf"):
        raise ValueError("heartbeat must be a finite number >= 0")


def _check_choices(form: str, replay_layout: str, hash_kind: str) -> None:
    if form not in EVENT_FORMS:
        raise ValueError(f"form must be one of {', '.join(EVENT_FORMS)}")
    if replay_layout not in REPLAY_LAYOUTS:
        raise ValueError(f"replay_layout must be one of {', '.join(REPLAY_LAYOUTS)}")
    if hash_kind not in HASH_KINDS:
        raise ValueError(f"hash_kind must be one of {', '.join(HASH_KINDS)}")


class SimulatedEngine:
    """One DP rank's publisher (PUB + optional ROUTER replay) on asyncio, like vLLM's by default.

    Endpoints are used as given: use :func:`build_engines` (or :func:`offset_endpoint`) for the
    per-rank offsets. ``seed`` and ``hash_kind`` build the default workload (its ``stream`` is
    ``dp_rank``) and are ignored when ``workload`` is given. The PUB socket binds or connects by
    :func:`binds`; the replay ROUTER always binds. After :meth:`run` returns, only
    :meth:`serve_replays` answers replays.

    ``engine`` picks the defaults of ``form``, ``hash_kind``, ``replay_layout``, ``heartbeat``,
    ``clear_on_start``, the first seq and the workload's dialect (:data:`FLAVOURS`); arguments left
    None take them. ``replay_hwm``: the ROUTER's SNDHWM (0: unlimited). ``replay_pace``: the polite
    mode: replies wait for the ROUTER to be writable (yielding to other tasks) and never drop.
    ``heartbeat``: seconds of silence after which an empty batch is published (0: never).
    ``sglang_metadata``: the default workload adds SGLang's metadata map to every BlockStored.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "kv-events",
        dp_rank: int = 0,
        rate: float = 100.0,
        batches: int | None = None,
        form: encode.EventForm | None = None,
        hash_kind: HashKind | None = None,
        replay_layout: ReplayLayout | None = None,
        buffer_steps: int = 10_000,
        seed: int = 0,
        faults: Faults | None = None,
        workload: Workload | None = None,
        context: zmq.asyncio.Context | None = None,
        hwm: int = PUB_HWM,
        engine: EngineFlavour = "vllm",
        replay_hwm: int = REPLAY_HWM,
        replay_pace: bool = False,
        heartbeat: float | None = None,
        clear_on_start: bool | None = None,
        sglang_metadata: bool = False,
    ) -> None:
        flavour = _flavour(engine)
        form = flavour.form if form is None else form
        hash_kind = flavour.hash_kind if hash_kind is None else hash_kind
        replay_layout = flavour.replay_layout if replay_layout is None else replay_layout
        heartbeat = flavour.heartbeat if heartbeat is None else heartbeat
        _check_options(
            rate=rate, batches=batches, buffer_steps=buffer_steps, hwm=hwm, replay_hwm=replay_hwm, heartbeat=heartbeat
        )
        _check_choices(form, replay_layout, hash_kind)
        self.engine: EngineFlavour = engine
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.dp_rank = dp_rank
        self.rate = rate
        self.batches = batches
        self.form: encode.EventForm = form
        self.replay_layout: ReplayLayout = replay_layout
        self.replay_hwm = replay_hwm
        self.replay_pace = replay_pace
        self.heartbeat = heartbeat
        self.clear_on_start = flavour.clear_on_start if clear_on_start is None else clear_on_start
        self.dialect: encode.Dialect = flavour.dialect
        self._seq_from_time = flavour.seq_from_time
        self._hwm = hwm
        self.faults = faults if faults is not None else Faults()
        if workload is None:
            workload = Workload(
                seed, hash_kind=hash_kind, stream=dp_rank, dialect=self.dialect, metadata=sglang_metadata
            )
        self.workload = workload
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._own_context = context is None
        self._context = context if context is not None else zmq.asyncio.Context()
        self._init_run_state()

    def _init_run_state(self) -> None:
        """What changes as the engine runs: seqs, faults still to inject, records, its sockets."""
        self._topic_bytes = self.topic.encode()
        self._next_seq = self.faults.start_seq if self.faults.start_seq is not None else self._process_first_seq()
        self._restarts_left = Counter(self.faults.restart_at)
        self._garbage = frozenset(self.faults.garbage_at)
        self._drops_left = [replies for _, _, replies in self.faults.replay_drop]
        self._cuts_left = 0 if self.faults.replay_cut is None else self.faults.replay_cut[1]
        self._published: deque[int] = deque(maxlen=_PUBLISHED_KEPT)
        self._done = 0
        self._fresh_process = True  # the next batch is this process's first
        self._fence = False  # the next batch published starts with AllBlocksCleared (after drop_queue)
        self._restart_due = False
        self._last_sent = 0.0  # loop time of the last batch handed to the PUB socket (heartbeats)
        self.queue_dropped: list[int] = []  # seqs consumed by drop_queue, never sent nor buffered
        self.tail_lost: list[int] = []  # seqs consumed by lose_tail at stop, never sent nor buffered
        self.heartbeat_seqs: list[int] = []
        self.replies: deque[Reply] = deque(maxlen=1000)
        self.restarts = 0
        self._pending: deque[tuple[float, bytes, int]] = deque()  # delayed replays: due, identity, start
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        # Synchronous shadows of the two sockets: sends never wait, and a replay is one tight loop.
        self._pub_sync: zmq.Socket[bytes] | None = None
        self._replay_sync: zmq.Socket[bytes] | None = None
        self._bound_endpoint = self.endpoint
        self._replay_bound: str | None = None
        self._stopping = False
        self._closed = False

    # -- state -------------------------------------------------------------------------------

    @property
    def published(self) -> list[int]:
        """Seqs sent live so far, in order (skipped seqs are absent; the last 100,000 are kept)."""
        return list(self._published)

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def batches_done(self) -> int:
        """Batches generated so far (skipped, garbage, dropped and lost ones too; not heartbeats)."""
        return self._done

    @property
    def bound_endpoint(self) -> str:
        """The PUB address in use (with the real port when bound to a wildcard port)."""
        return self._bound_endpoint

    @property
    def replay_bound_endpoint(self) -> str | None:
        return self._replay_bound

    @property
    def pub_binds(self) -> bool:
        return binds(self.endpoint)

    def _process_first_seq(self) -> int:
        return min(time.time_ns(), MAX_SEQ) if self._seq_from_time else 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Create, bind and connect the sockets; raises ``zmq.ZMQError`` (e.g. address in use)."""
        if self._pub is not None:
            return
        self._open(self.endpoint, self.replay_endpoint)

    def _open(self, endpoint: str, replay_endpoint: str | None) -> None:
        pub = self._context.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, self._hwm)
        if is_ipv6(endpoint):
            pub.setsockopt(zmq.IPV6, 1)
        try:
            if self.pub_binds:
                pub.bind(endpoint)
                self._bound_endpoint = _last_endpoint(pub, endpoint)
            else:
                pub.connect(endpoint)
        except zmq.ZMQError:
            pub.close(linger=0)
            raise
        if replay_endpoint is not None:
            replay = self._context.socket(zmq.ROUTER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.setsockopt(zmq.SNDHWM, self.replay_hwm)
            # Mandatory routing changes nothing on the wire (a full pipe drops the whole message
            # either way) but reports each drop, so the engine can count it or, paced, wait.
            replay.setsockopt(zmq.ROUTER_MANDATORY, 1)
            if is_ipv6(replay_endpoint):
                replay.setsockopt(zmq.IPV6, 1)
            try:
                replay.bind(replay_endpoint)
            except zmq.ZMQError:
                replay.close(linger=0)
                pub.close(linger=0)
                raise
            self._replay = replay
            self._replay_sync = zmq.Socket.shadow(replay.underlying)
            self._replay_bound = _last_endpoint(replay, replay_endpoint)
        self._pub = pub
        self._pub_sync = zmq.Socket.shadow(pub.underlying)

    def _close_sockets(self) -> None:
        self._pub_sync = self._replay_sync = None
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None

    def stop(self) -> None:
        """Ask :meth:`run` / :meth:`serve_replays` to return (within about 50 ms). Safe from signal handlers."""
        self._stopping = True

    async def close(self) -> None:
        self._stopping = True
        if self._closed:
            return
        self._closed = True
        self._close_sockets()
        if self._own_context:
            self._context.term()

    async def run(self) -> None:
        """Publish until ``batches`` are done or :meth:`stop`, answering replays in between.

        Interrupted by :meth:`stop`, the engine then loses ``faults.lose_tail`` batches.
        """
        await self.start()
        loop = asyncio.get_running_loop()
        interval = 1.0 / self.rate if self.rate > 0 else 0.0
        due = loop.time()
        self._last_sent = loop.time()
        while not self._stopping and (self.batches is None or self._done < self.batches):
            if self._restart_due:
                await self._restart()
                due = loop.time()
                continue
            await self._service_replays(limit=1)
            if interval:
                now = loop.time()
                if now < due:
                    self._maybe_heartbeat()
                    await self._idle(due - now)
                    continue
                # Keep the long-run rate exact, but do not burst to catch up after a long stall.
                due = max(due + interval, now - 1.0)
            self._publish_one()
            if not interval and self._done % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
        if self._stopping and not self._closed and (self.batches is None or self._done < self.batches):
            self._lose_tail()

    async def serve_replays(self, seconds: float | None = None) -> None:
        """Only answer replay requests (and send heartbeats), for ``seconds`` (None: until :meth:`stop`)."""
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        while not self._stopping:
            await self._service_replays()
            self._maybe_heartbeat()
            remaining = _IDLE_SLICE if deadline is None else deadline - loop.time()
            if remaining <= 0:
                return
            await self._idle(remaining)

    # -- publishing --------------------------------------------------------------------------

    def _publish_one(self) -> None:
        seq = self._next_seq
        self._done += 1
        if self.faults.drops_queued(seq):
            # The batch was made, then dropped from a full queue: its seq is gone for good.
            self.workload.next_batch(time.time(), self.dp_rank)
            self.queue_dropped.append(seq)
            self._fence = True
            self._after(seq)
            return
        if self._fresh_process and self.clear_on_start:
            batch = wire.Batch(ts=time.time(), events=[wire.AllBlocksCleared()], dp_rank=self.dp_rank)
            self.workload.reset_cache()
        else:
            if self._fence:
                self.workload.reset_cache()
            batch = self.workload.next_batch(time.time(), self.dp_rank)
            if self._fence:
                batch.events.insert(0, wire.AllBlocksCleared())
        self._fence = False
        self._fresh_process = False
        self._send(seq, batch)
        self._after(seq)

    def _maybe_heartbeat(self) -> None:
        """TensorRT-LLM: an empty batch after ``heartbeat`` seconds without one (a fence if pending)."""
        if not self.heartbeat or self._pub_sync is None or self._restart_due:
            return
        if asyncio.get_running_loop().time() - self._last_sent < self.heartbeat:
            return
        seq = self._next_seq
        events: list[wire.Event] = []
        if self._fence:
            self.workload.reset_cache()
            events.append(wire.AllBlocksCleared())
            self._fence = False
        self.heartbeat_seqs.append(seq)
        self._send(seq, wire.Batch(ts=time.time(), events=events, dp_rank=self.dp_rank))
        self._after(seq)

    def _send(self, seq: int, batch: wire.Batch) -> None:
        assert self._pub_sync is not None
        if seq in self._garbage:
            payload = garbage_payload(seq)
        else:
            payload = encode.encode_batch(batch, self.form, dialect=self.dialect)
        self._buffer.append((seq, payload))
        self._last_sent = asyncio.get_running_loop().time()
        if not self.faults.skips(seq):
            with contextlib.suppress(zmq.Again):  # a PUB drops at its HWM, as vLLM's does
                self._pub_sync.send_multipart([self._topic_bytes, wire.seq_bytes(seq), payload], flags=zmq.NOBLOCK)
            self._published.append(seq)

    def _after(self, seq: int) -> None:
        """Advance the seq; a restart listed for ``seq`` makes the engine a new process."""
        if self._restarts_left[seq] > 0:
            self._restarts_left[seq] -= 1
            if self.faults.restart_down is None:
                self._new_process()  # in place: same sockets, so no subscriber sees a disconnect
            else:
                self._restart_due = True
                self._next_seq = min(seq + 1, MAX_SEQ)
        else:
            self._next_seq = min(seq + 1, MAX_SEQ)

    def _new_process(self) -> None:
        """A new engine process: seq from its start value, nothing to replay, an empty KV cache."""
        self.restarts += 1
        self._next_seq = self._process_first_seq()
        self._buffer.clear()
        self._pending.clear()
        self.workload.reset_cache()
        self._fresh_process = True
        self._fence = False

    async def _restart(self) -> None:
        """A real restart: close both sockets, stay down ``faults.restart_down`` s, open them again."""
        self._restart_due = False
        down = self.faults.restart_down or 0.0
        pub_endpoint = self._bound_endpoint if self.pub_binds else self.endpoint
        replay_endpoint = self._replay_bound
        self._close_sockets()
        loop = asyncio.get_running_loop()
        logger.info("rank %d: restarting, down for %.3g s", self.dp_rank, down)
        back = loop.time() + down
        for _ in range(math.ceil(down / _IDLE_SLICE) + 1):
            if self._stopping or loop.time() >= back:
                break
            await asyncio.sleep(min(_IDLE_SLICE, back - loop.time()))
        if self._stopping:
            return
        self._new_process()
        # The old sockets' addresses are released by libzmq's own threads: retry briefly.
        deadline = loop.time() + _REBIND_TIMEOUT
        while True:
            try:
                self._open(pub_endpoint, replay_endpoint)
                break
            except zmq.ZMQError as exc:
                if exc.errno != errno.EADDRINUSE or loop.time() > deadline or self._stopping:
                    raise
                await asyncio.sleep(0.01)
        self._last_sent = loop.time()

    def _lose_tail(self) -> None:
        """vLLM's shutdown(): what was still queued is never published nor buffered."""
        for _ in range(self.faults.lose_tail):
            seq = self._next_seq
            self.workload.next_batch(time.time(), self.dp_rank)
            self._done += 1
            self.tail_lost.append(seq)
            self._next_seq = min(seq + 1, MAX_SEQ)

    async def _idle(self, limit: float) -> None:
        """Sleep up to ``limit`` seconds (at most one slice), waking early for a replay request."""
        timeout = min(limit, _IDLE_SLICE)
        if self._pending:
            timeout = max(0.0, min(timeout, self._pending[0][0] - asyncio.get_running_loop().time()))
        if self._replay is None:
            await asyncio.sleep(timeout)
        else:
            await self._replay.poll(timeout=int(timeout * 1000) + 1)

    # -- replay ------------------------------------------------------------------------------

    async def _service_replays(self, limit: int | None = None) -> None:
        """Answer waiting requests (at most ``limit``: vLLM's loop takes one per batch) and due delayed ones."""
        loop = asyncio.get_running_loop()
        served = 0
        while self._replay_sync is not None and (limit is None or served < limit):
            try:
                frames = self._replay_sync.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            served += 1
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != wire.SEQ_BYTES:
                logger.warning(
                    "rank %d: ignored a replay request of %d frames (%s); expected identity, empty, 8-byte seq",
                    self.dp_rank,
                    len(frames),
                    "/".join(str(len(f)) for f in frames),
                )
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            if self.faults.replay_dead:
                logger.debug("rank %d: dropped a replay request from seq %d (replay_dead)", self.dp_rank, start)
                continue
            if self.faults.replay_delay > 0:
                self._pending.append((loop.time() + self.faults.replay_delay, identity, start))
                continue
            await self._answer(identity, start)
        while self._pending and self._pending[0][0] <= loop.time() and self._replay_sync is not None:
            _, identity, start = self._pending.popleft()
            await self._answer(identity, start)

    def _plan(self, start: int) -> tuple[Reply, list[tuple[int, bytes]], bool]:
        """The items of a reply from ``start`` after the replay faults, and whether it ends with a marker."""
        items = [(seq, payload) for seq, payload in self._buffer if seq >= start]
        reply = Reply(start=start, planned=len(items))
        dropped: list[tuple[int, int]] = []
        for index, (low, high, _) in enumerate(self.faults.replay_drop):
            if self._drops_left[index] > 0 and any(low <= seq <= high for seq, _ in items):
                self._drops_left[index] -= 1
                dropped.append((low, high))
        if dropped:
            kept = [(s, p) for s, p in items if not any(low <= s <= high for low, high in dropped)]
            reply.fault_dropped = [s for s, _ in items if any(low <= s <= high for low, high in dropped)]
            items = kept
        end = True
        if self._cuts_left > 0 and self.faults.replay_cut is not None:
            self._cuts_left -= 1
            cut = self.faults.replay_cut[0]
            reply.fault_dropped += [s for s, _ in items[cut:]]
            items, end = items[:cut], False
        return reply, items, end

    async def _answer(self, identity: bytes, start: int) -> None:
        reply, items, end = self._plan(start)
        self.replies.append(reply)
        topic_frames = [self._topic_bytes] if self.replay_layout == "topic" else []
        end_frames = [identity, b"", *([b""] if self.replay_layout == "topic" else []), wire.END_SEQ_BYTES, b""]
        if self.replay_pace:
            for seq, payload in items:
                if not await self._send_paced([identity, b"", *topic_frames, wire.seq_bytes(seq), payload]):
                    break
                reply.sent += 1
            else:
                reply.end_marker = end and await self._send_paced(end_frames)
        else:
            # vLLM: one tight loop, no pacing, no yielding; the ROUTER drops what exceeds its HWM.
            for seq, payload in items:
                outcome = self._send_now([identity, b"", *topic_frames, wire.seq_bytes(seq), payload])
                if outcome is None:
                    break
                if outcome:
                    reply.sent += 1
                else:
                    reply.hwm_dropped.append(seq)
            else:
                reply.end_marker = end and bool(self._send_now(end_frames))
        if reply.hwm_dropped:
            logger.info(
                "rank %d: replay from seq %d: the ROUTER dropped %d of %d batches at its HWM",
                self.dp_rank,
                start,
                len(reply.hwm_dropped),
                len(items),
            )
        logger.debug("rank %d: replayed %d batches from seq %d", self.dp_rank, reply.sent, start)

    def _send_now(self, frames: list[bytes]) -> bool | None:
        """One non-blocking send: True if queued, False if dropped at the HWM, None if the peer is gone."""
        sock = self._replay_sync
        if sock is None:
            return None
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                return None
            raise
        return True

    async def _send_paced(self, frames: list[bytes]) -> bool:
        """Send once the peer's pipe has room; False when the peer is gone or the engine stops."""
        while True:
            outcome = self._send_now(frames)
            if outcome is not None and outcome:
                return True
            if outcome is None or self._replay is None or self._closed:
                return False
            poller = zmq.asyncio.Poller()
            poller.register(self._replay, zmq.POLLOUT)
            await poller.poll(_PACE_POLL_MS)
            # POLLOUT means some peer has room, maybe not this one: do not spin on another's room.
            events = self._replay.getsockopt(zmq.EVENTS) if self._replay is not None else 0
            if isinstance(events, int) and events & zmq.POLLOUT:
                await asyncio.sleep(0.001)


def _last_endpoint(sock: zmq.asyncio.Socket, fallback: str) -> str:
    value = sock.getsockopt(zmq.LAST_ENDPOINT)
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text or fallback


class EngineOptions(TypedDict, total=False):
    """The keywords of :class:`SimulatedEngine` that every rank of an engine shares (see there)."""

    topic: str
    rate: float
    batches: int | None
    form: encode.EventForm | None
    hash_kind: HashKind | None
    replay_layout: ReplayLayout | None
    buffer_steps: int
    faults: Faults | None
    context: zmq.asyncio.Context | None
    hwm: int
    engine: EngineFlavour
    replay_hwm: int
    replay_pace: bool
    heartbeat: float | None
    clear_on_start: bool | None


def build_engines(
    dp_size: int,
    endpoint: str,
    *,
    replay_endpoint: str | None = None,
    seed: int = 0,
    workload_options: dict[str, Any] | None = None,
    sglang_metadata: bool = False,
    **options: Unpack[EngineOptions],
) -> list[SimulatedEngine]:
    """One engine per DP rank with vLLM's endpoint offsets; ranks share the seed's system prompts.

    ``workload_options`` are passed to every rank's :class:`Workload` (``stream`` is the rank);
    ``hash_kind``, the dialect and ``sglang_metadata`` fill in what they leave out. ``options``
    go to every :class:`SimulatedEngine` as they are.
    """
    if dp_size < 1:
        raise ValueError("dp_size must be at least 1")
    flavour = _flavour(options.get("engine", "vllm"))
    hash_kind = options.get("hash_kind")
    workload = dict(workload_options or {})
    workload.setdefault("hash_kind", flavour.hash_kind if hash_kind is None else hash_kind)
    workload.setdefault("dialect", flavour.dialect)
    workload.setdefault("metadata", sglang_metadata)
    return [
        SimulatedEngine(
            pub, replay_endpoint=replay, dp_rank=rank, workload=Workload(seed, stream=rank, **workload), **options
        )
        for rank, pub, replay in rank_endpoints(endpoint, replay_endpoint, dp_size)
    ]
