"""``kvgateway simulate`` as the tests run it: started, ready (every rank printed its readiness
line), its endpoints read from that line, and a silent warm-up before the run a test watches."""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

import zmq

from kvgateway.engine import wire
from tests.support.ports import established
from tests.support.processes import Proc, Start
from tests.support.waits import wait_until

SIM_READY = re.compile(r"^simulate: rank (\d+) publishing (?:on|to) (\S+)(?: \(connect\))? replay (\S+)$")
"""The simulator's readiness line, one per rank."""

WARMUP_BASE = 1_000_000
"""Seqs of the simulator's warm-up run (see :func:`warmup`), far above any seq a test reaches."""


@dataclass(frozen=True)
class PubMessage:
    """One PUB message as a subscriber reads it off the simulator."""

    topic: bytes
    seq: int
    batch: wire.Batch


def decode_pub(frames: Sequence[bytes]) -> PubMessage:
    """A whole PUB message ``[topic, seq, payload]``, read as the gateway reads it
    (:func:`kvgateway.engine.wire.split_message`, :func:`~kvgateway.engine.wire.decode_batch`);
    raises :class:`~kvgateway.engine.wire.DecodeError`."""
    seq, payload = wire.split_message(frames)
    return PubMessage(bytes(frames[0]), seq, wire.decode_batch(payload))


def start_sim(start: Start, *args: str, ranks: int = 1, timeout: float = 30.0, wait: bool = True) -> Proc:
    """``kvgateway simulate ARGS``; returns once every rank printed its readiness line (or at once)."""
    proc = start("simulate", *args)
    if wait:
        sim_ready(proc, ranks, timeout)
    return proc


SEEN_DELAY = 3.0
"""The simulator's silent start under :func:`start_sim_seen`: the gateway's reconnects back off to
2 s while nothing listens, so its connection comes within about 2.1 s of the bind; what is left is
for the ZeroMQ handshake and the subscription, milliseconds on a quiet machine."""


def start_sim_seen(start: Start, port: int, *args: str, ranks: int = 1, timeout: float = 60.0) -> Proc:
    """``kvgateway simulate ARGS`` whose run the gateway sees from its first batch: silent for
    :data:`SEEN_DELAY` s (answering replays) and held (SIGSTOP) from its readiness line until a
    peer's TCP connection to ``port`` (the gateway's SUB) is established, which the kernel
    completes for a stopped process. ZeroMQ's PUB drops what it sends before the subscription
    arrives (the "slow joiner"); without the hold, which of the first batches arrive live, which
    by the catch-up and which not at all (no replay socket) depends on the machine's speed."""
    proc = start_sim(start, *args, "--start-delay", str(SEEN_DELAY), ranks=ranks)
    with proc.held():
        wait_until(lambda: established(port), timeout=timeout, what=f"a connection to the engine's port {port}")
    return proc


def sim_ready(proc: Proc, ranks: int = 1, timeout: float = 30.0) -> None:
    sim_endpoints(proc, ranks, timeout)


def sim_endpoints(proc: Proc, ranks: int = 1, timeout: float = 30.0) -> list[tuple[int, str, str]]:
    """(rank, publish endpoint, replay endpoint) of each rank of a ``kvgateway simulate``, from
    its readiness lines (returns once every rank printed one)."""
    found = []
    for rank in range(ranks):
        match = proc.wait_for(rf"^simulate: rank {rank} publishing ", timeout=timeout)
        ready = SIM_READY.match(match.string)
        assert ready is not None, match.string
        found.append((int(ready[1]), ready[2], ready[3]))
    return found


def sim_done(proc: Proc, ranks: int = 1, timeout: float = 30.0) -> None:
    """Until every rank of a ``kvgateway simulate --batches N`` published its last batch (it says
    so when it lingers, answering replays, as it does unless ``--linger 0``)."""
    for rank in range(ranks):
        proc.wait_for(rf"^simulate: rank {rank} done after \d+ batches", timeout=timeout)


def warmup(seconds: float) -> list[str]:
    """Simulator flags for a silent start of ``seconds`` before the run a test watches.

    ZeroMQ's PUB drops what it sends before a subscriber's subscription has arrived (the "slow
    joiner"), and the gateway asks a connecting engine for its history: which seqs arrive live and
    which by that catch-up would be left to chance. So the simulator opens its sockets and stays
    silent (answering replays) for ``seconds``: the gateway connects, catches up on an empty buffer
    (one ``recovered`` recovery that brings nothing), and the run begins at seq 0, received live.
    """
    return [] if seconds <= 0 else ["--start-delay", str(seconds)]


class EngineWatch:
    """A subscriber of an engine's PUB endpoint beside the gateway's, reading in a thread: the last
    seq the engine published. A test that needs the engine to go on by N batches while something
    is down waits for that here, whatever the machine's speed, where sleeping N / rate seconds
    does not hold on a loaded machine (the engine publishes late and fewer)."""

    def __init__(self, endpoint: str) -> None:
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._sub = self._context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(endpoint)
        self.last_seq = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            if self._sub.poll(50):
                frames = self._sub.recv_multipart()
                if len(frames) >= 3 and len(frames[-2]) == 8:
                    self.last_seq = int.from_bytes(frames[-2], "big")

    def wait_past(self, seq: int, timeout: float) -> int:
        """Until the engine published a batch after ``seq``; returns the last seq seen."""
        wait_until(lambda: self.last_seq > seq, timeout, 0.02, f"the engine past seq {seq}")
        return self.last_seq

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._context.destroy(linger=0)

    def __enter__(self) -> EngineWatch:
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
