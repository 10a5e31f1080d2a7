"""One DP rank's simulated publisher on ZeroMQ (asyncio), and the faults it can inject."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

import zmq
import zmq.asyncio

from kvgateway import wire
from kvgateway.endpoints import binds, offset_endpoint
from kvgateway.simulator.workload import HashKind, Workload

# One logger for the whole simulator package (tests filter on it).
log = logging.getLogger("kvgateway.simulator")

ReplayLayout: TypeAlias = Literal["topic", "plain"]
EngineFlavour: TypeAlias = Literal["vllm", "sglang", "trtllm"]

ENGINE_FLAVOURS: Final = ("vllm", "sglang", "trtllm")

EVENT_FORMS: Final = ("map", "array")
REPLAY_LAYOUTS: Final = ("topic", "plain")

MAX_SEQ: Final = (1 << 64) - 2
"""Highest usable seq: 2**64 - 1 is 0xFF*8, the replay end marker."""


# --- faults ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Faults:
    """Deliberate misbehaviour of one publisher.

    ``skip``: inclusive seq ranges published to the replay buffer but not sent live (a lossy
    network or a slow subscriber at the HWM). ``restart_at``: after publishing that seq the next
    seq is 0 and the replay buffer is empty, like a new process; each entry fires once, so list a
    seq k times to restart there k times (every N + 1 batches). ``garbage_at``:
    that seq's payload is undecodable, live and in replay. ``skip`` and ``garbage_at`` apply each
    time the seq comes round (again after a restart). ``replay_delay``: replay requests are answered
    this many seconds late (live publishing goes on meanwhile). ``replay_dead``: the ROUTER is bound
    but requests are read and dropped. ``start_seq``: the first seq (TensorRT-LLM starts at its
    ``time.time_ns()``).
    """

    skip: tuple[tuple[int, int], ...] = ()
    restart_at: tuple[int, ...] = ()
    garbage_at: tuple[int, ...] = ()
    replay_delay: float = 0.0
    replay_dead: bool = False
    start_seq: int = 0

    def __post_init__(self) -> None:
        for low, high in self.skip:
            if not 0 <= low <= high:
                raise ValueError(f"bad skip range {low}-{high}")
        if any(s < 0 for s in (*self.restart_at, *self.garbage_at)):
            raise ValueError("restart_at and garbage_at seqs must not be negative")
        if self.replay_delay < 0:
            raise ValueError("replay_delay must not be negative")
        if not 0 <= self.start_seq <= MAX_SEQ:
            raise ValueError(f"start_seq must be between 0 and {MAX_SEQ}")

    def skips(self, seq: int) -> bool:
        return any(low <= seq <= high for low, high in self.skip)


def garbage_payload(seq: int) -> bytes:
    """Undecodable bytes (0xC1 is never valid msgpack) standing in for seq's payload."""
    return b"\xc1garbage for seq " + str(seq).encode()


# --- endpoints ------------------------------------------------------------------------------


def _is_ipv6(endpoint: str) -> bool:
    return endpoint.startswith("tcp://") and ("[" in endpoint or "::" in endpoint)


# --- the engine -----------------------------------------------------------------------------

_IDLE_SLICE: Final = 0.05  # longest sleep between checks of stop() and replay requests
_YIELD_EVERY: Final = 32  # rate 0: batches between yields to the event loop
_REPLAY_YIELD_EVERY: Final = 256
PUB_HWM: Final = 100_000  # vLLM's default hwm
REPLAY_HWM: Final = 1000  # libzmq's default SNDHWM, which vLLM keeps on its replay ROUTER
_PUBLISHED_KEPT: Final = 100_000


class SimulatedEngine:
    """One DP rank's vLLM-compatible publisher (PUB + optional ROUTER replay) on asyncio.

    Endpoints are used as given: use :func:`build_engines` (or :func:`offset_endpoint`) for the
    per-rank offsets. ``seed`` and ``hash_kind`` build the default workload (its ``stream`` is
    ``dp_rank``) and are ignored when ``workload`` is given. The PUB socket binds or connects by
    :func:`binds`; the replay ROUTER always binds. Replay requests are served by the publishing
    loop itself, as in vLLM, so a long replay delays live publishing (the loop yields to other
    tasks every few hundred replies). After :meth:`run` returns, only :meth:`serve_replays`
    answers replays.
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
        form: wire.EventForm = "map",
        hash_kind: HashKind = "int",
        replay_layout: ReplayLayout = "topic",
        buffer_steps: int = 10_000,
        seed: int = 0,
        faults: Faults | None = None,
        workload: Workload | None = None,
        context: zmq.asyncio.Context | None = None,
        hwm: int = PUB_HWM,
    ) -> None:
        if rate < 0:
            raise ValueError("rate must not be negative")
        if batches is not None and batches < 0:
            raise ValueError("batches must not be negative")
        if buffer_steps < 0:
            raise ValueError("buffer_steps must not be negative")
        if hwm < 0:
            raise ValueError("hwm must not be negative")
        self._hwm = hwm
        if form not in EVENT_FORMS:
            raise ValueError(f"form must be one of {', '.join(EVENT_FORMS)}")
        if replay_layout not in REPLAY_LAYOUTS:
            raise ValueError(f"replay_layout must be one of {', '.join(REPLAY_LAYOUTS)}")
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.dp_rank = dp_rank
        self.rate = rate
        self.batches = batches
        self.form: wire.EventForm = form
        self.replay_layout: ReplayLayout = replay_layout
        self.faults = faults if faults is not None else Faults()
        self.workload = workload if workload is not None else Workload(seed, hash_kind=hash_kind, stream=dp_rank)
        self._topic_bytes = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        # A full replay must fit in the ROUTER's queue, or libzmq silently cuts it (default 1000).
        self._replay_hwm = max(1000, buffer_steps + 16)
        self._next_seq = self.faults.start_seq
        self._restarts_left = Counter(self.faults.restart_at)
        self._garbage = frozenset(self.faults.garbage_at)
        self._published: deque[int] = deque(maxlen=_PUBLISHED_KEPT)
        self._done = 0
        self._pending: deque[tuple[float, bytes, int]] = deque()  # delayed replays: due, identity, start
        self._own_context = context is None
        self._context = context if context is not None else zmq.asyncio.Context()
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._bound_endpoint = endpoint
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
        """Batches generated so far, including skipped and garbage ones."""
        return self._done

    @property
    def buffered_seqs(self) -> list[int]:
        return [seq for seq, _ in self._buffer]

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

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Create, bind and connect the sockets; raises ``zmq.ZMQError`` (e.g. address in use)."""
        if self._pub is not None:
            return
        pub = self._context.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, self._hwm)
        if _is_ipv6(self.endpoint):
            pub.setsockopt(zmq.IPV6, 1)
        try:
            if self.pub_binds:
                pub.bind(self.endpoint)
                self._bound_endpoint = _last_endpoint(pub, self.endpoint)
            else:
                pub.connect(self.endpoint)
        except zmq.ZMQError:
            pub.close(linger=0)
            raise
        self._pub = pub
        if self.replay_endpoint is not None:
            replay = self._context.socket(zmq.ROUTER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.setsockopt(zmq.SNDHWM, self._replay_hwm)
            if _is_ipv6(self.replay_endpoint):
                replay.setsockopt(zmq.IPV6, 1)
            try:
                replay.bind(self.replay_endpoint)
            except zmq.ZMQError:
                replay.close(linger=0)
                raise
            self._replay = replay
            self._replay_bound = _last_endpoint(replay, self.replay_endpoint)

    def stop(self) -> None:
        """Ask :meth:`run` / :meth:`serve_replays` to return (within about 50 ms). Safe from signal handlers."""
        self._stopping = True

    async def close(self) -> None:
        self._stopping = True
        if self._closed:
            return
        self._closed = True
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
        if self._own_context:
            self._context.term()

    async def run(self) -> None:
        """Publish until ``batches`` are done or :meth:`stop`, answering replays in between."""
        await self.start()
        loop = asyncio.get_running_loop()
        interval = 1.0 / self.rate if self.rate > 0 else 0.0
        due = loop.time()
        while not self._stopping and (self.batches is None or self._done < self.batches):
            await self._service_replays()
            if interval:
                now = loop.time()
                if now < due:
                    await self._idle(due - now)
                    continue
                # Keep the long-run rate exact, but do not burst to catch up after a long stall.
                due = max(due + interval, now - 1.0)
            await self._publish_one()
            if not interval and self._done % _YIELD_EVERY == 0:
                await asyncio.sleep(0)

    async def serve_replays(self, seconds: float | None = None) -> None:
        """Only answer replay requests, for ``seconds`` (None: until :meth:`stop`)."""
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        while not self._stopping:
            await self._service_replays()
            remaining = _IDLE_SLICE if deadline is None else deadline - loop.time()
            if remaining <= 0:
                return
            await self._idle(remaining)

    # -- publishing --------------------------------------------------------------------------

    async def _publish_one(self) -> None:
        assert self._pub is not None
        seq = self._next_seq
        batch = self.workload.next_batch(time.time(), self.dp_rank)
        payload = garbage_payload(seq) if seq in self._garbage else wire.encode_batch(batch, self.form)
        self._buffer.append((seq, payload))
        if not self.faults.skips(seq):
            await self._pub.send_multipart([self._topic_bytes, wire.seq_bytes(seq), payload])
            self._published.append(seq)
        self._done += 1
        if self._restarts_left[seq] > 0:
            # A new process: seq from 0, nothing to replay, an empty KV cache.
            self._restarts_left[seq] -= 1
            self._next_seq = 0
            self._buffer.clear()
            self._pending.clear()
            self.workload.reset_cache()
        else:
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

    async def _service_replays(self) -> None:
        replay = self._replay
        if replay is None:
            return
        loop = asyncio.get_running_loop()
        while _readable(replay):
            frames = await replay.recv_multipart()
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != wire.SEQ_BYTES:
                log.warning(
                    "rank %d: ignored a replay request of %d frames (%s); expected identity, empty, 8-byte seq",
                    self.dp_rank,
                    len(frames),
                    "/".join(str(len(f)) for f in frames),
                )
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            if self.faults.replay_dead:
                log.debug("rank %d: dropped a replay request from seq %d (replay_dead)", self.dp_rank, start)
                continue
            if self.faults.replay_delay > 0:
                self._pending.append((loop.time() + self.faults.replay_delay, identity, start))
                continue
            await self._answer(identity, start)
        while self._pending and self._pending[0][0] <= loop.time():
            _, identity, start = self._pending.popleft()
            await self._answer(identity, start)

    async def _answer(self, identity: bytes, start: int) -> None:
        assert self._replay is not None
        topic_frames = [self._topic_bytes] if self.replay_layout == "topic" else []
        sent = 0
        for seq, payload in list(self._buffer):
            if seq < start:
                continue
            await self._replay.send_multipart([identity, b"", *topic_frames, wire.seq_bytes(seq), payload])
            sent += 1
            if sent % _REPLAY_YIELD_EVERY == 0:
                await asyncio.sleep(0)
        end_topic = [b""] if self.replay_layout == "topic" else []
        await self._replay.send_multipart([identity, b"", *end_topic, wire.END_SEQ_BYTES, b""])
        log.debug("rank %d: replayed %d batches from seq %d", self.dp_rank, sent, start)


def _readable(sock: zmq.asyncio.Socket) -> bool:
    events = sock.getsockopt(zmq.EVENTS)
    return isinstance(events, int) and bool(events & zmq.POLLIN)


def _last_endpoint(sock: zmq.asyncio.Socket, fallback: str) -> str:
    value = sock.getsockopt(zmq.LAST_ENDPOINT)
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text or fallback


def build_engines(
    dp_size: int,
    endpoint: str,
    *,
    replay_endpoint: str | None = None,
    topic: str = "kv-events",
    rate: float = 100.0,
    batches: int | None = None,
    form: wire.EventForm = "map",
    hash_kind: HashKind = "int",
    replay_layout: ReplayLayout = "topic",
    buffer_steps: int = 10_000,
    seed: int = 0,
    faults: Faults | None = None,
    workload_options: dict[str, Any] | None = None,
    context: zmq.asyncio.Context | None = None,
    hwm: int = PUB_HWM,
) -> list[SimulatedEngine]:
    """One engine per DP rank with vLLM's endpoint offsets; ranks share the seed's system prompts.

    ``workload_options`` are passed to every rank's :class:`Workload` (``stream`` is the rank).
    """
    if dp_size < 1:
        raise ValueError("dp_size must be at least 1")
    options = dict(workload_options or {})
    options.setdefault("hash_kind", hash_kind)
    engines: list[SimulatedEngine] = []
    for rank in range(dp_size):
        engines.append(
            SimulatedEngine(
                offset_endpoint(endpoint, rank),
                replay_endpoint=None if replay_endpoint is None else offset_endpoint(replay_endpoint, rank),
                topic=topic,
                dp_rank=rank,
                rate=rate,
                batches=batches,
                form=form,
                replay_layout=replay_layout,
                buffer_steps=buffer_steps,
                hwm=hwm,
                faults=faults,
                workload=Workload(seed, stream=rank, **options),
                context=context,
            )
        )
    return engines
