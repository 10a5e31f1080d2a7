"""A stream's connection monitor once its reason is known (issue 29): it stops carrying ZeroMQ's
retries (with 2,000 absent engines, 1,000 wakes of the event loop a second), carries them again
when the reason can change, and the stream is diagnosed by a timer instead. Real ZeroMQ sockets
on loopback ports: refused, then a listener that speaks no ZeroMQ, then an engine coming and
going. What must hold: no event lost when the monitor is re-armed, no reason left stale, and the
same reasons, reconnections and diagnoses as a monitor that carries every retry."""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import zmq

from kvgateway.config import StreamConfig
from kvgateway.config.settings import Settings, SourceConfig
from kvgateway.engine import wire
from kvgateway.ingest import reader as reader_module
from kvgateway.ingest import streams as streams_module
from kvgateway.ingest.monitor import DISCONNECTED, HANDSHAKE_FAILED, MONITOR_EVENTS, QUIET_EVENTS, ConnectionMonitor
from kvgateway.ingest.outlet import StreamOutlet
from kvgateway.ingest.reader import StreamReader, not_zeromq_reason
from kvgateway.ingest.streams import Ingest
from kvgateway.log.entry import Entry
from kvgateway.log.ordered import MemoryLog
from kvgateway.log.records import BatchRecord, NoticeRecord
from kvgateway.runtime.metrics import Metrics
from kvgateway.simulator import encode
from tests.support import free_port, until

REFUSED = "connection refused, retrying"


class NoZeroMQ:
    """A TCP listener on ``port`` that accepts each connection and closes it at once: ZeroMQ's
    handshake fails on every attempt. ``connections``: how many it accepted."""

    def __init__(self, port: int) -> None:
        self.connections = 0
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5)


def _batch(seq: int) -> list[bytes]:
    stored = wire.BlockStored([seq + 1], None, [1, 2], 2)
    return [b"kv", wire.seq_bytes(seq), encode.encode_batch(wire.Batch(time.time(), [stored], 0))]


def _reader_run(scenario: Callable[[StreamReader, int, list[str], list[Any]], Coroutine[Any, Any, None]]) -> None:
    """A reader of a closed loopback port; ``seen``: the stream's reason after every connection
    word of its reader ("up" while connected)."""

    async def main() -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        port = free_port()
        config = StreamConfig("e", 0, f"tcp://127.0.0.1:{port}", None, "kv", False, {})
        log = MemoryLog()
        records: list[Any] = []

        def keep(entry: Entry) -> None:
            records.append(entry.record)

        log.follow(keep)
        seen: list[str] = []

        def said(outlet: StreamOutlet, *_: Any) -> None:
            seen.append("up" if outlet.status.connected else outlet.status.down_reason)

        outlet = StreamOutlet(config, log, clock=time.time, on_connection=said)
        reader = StreamReader(config, context, outlet, replay_slots=asyncio.Semaphore(1))
        reader.start()
        try:
            await scenario(reader, port, seen, records)
        finally:
            await reader.stop()
            context.destroy(linger=0)

    asyncio.run(main())


def _monitor(reader: StreamReader) -> ConnectionMonitor:
    assert reader.monitor is not None
    return reader.monitor


def _quiet_and(reader: StreamReader, reason: str) -> Callable[[], bool]:
    def check() -> bool:
        status = reader._outlet.status
        return not status.connected and status.down_reason == reason and _monitor(reader).events == QUIET_EVENTS

    return check


def _batches(records: list[Any]) -> int:
    return sum(1 for r in records if isinstance(r, BatchRecord))


async def _engine_up(reader: StreamReader, port: int, records: list[Any]) -> zmq.Socket[bytes]:
    """An engine's PUB on ``port``, once the stream is up and a batch of it arrived."""
    pub = reader._context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{port}")
    delivered = _batches(records)

    def arrived() -> bool:
        if _batches(records) > delivered:
            return True
        pub.send_multipart(_batch(0))  # until the subscription reached it
        return False

    await until(arrived, 60, "the engine's batch", interval=0.01)
    assert reader._outlet.status.connected
    return pub


def test_the_reason_follows_the_port_refused_not_zeromq_an_engine_and_its_restart() -> None:
    async def scenario(reader: StreamReader, port: int, seen: list[str], records: list[Any]) -> None:
        await until(_quiet_and(reader, REFUSED), 60, "refused, and the monitor quiet")

        # Something that speaks no ZeroMQ takes the port: the quiet monitor carries the failed
        # handshake; re-armed, it carries the retries again, and none of them (the one scheduled
        # as each failed connection closes) is taken for a refusal.
        wrong = NoZeroMQ(port)
        nz = not_zeromq_reason(reader.config.endpoint)
        try:
            await until(lambda: reader._outlet.status.down_reason == nz, 60, "not ZeroMQ")
            assert _monitor(reader).events == MONITOR_EVENTS
            since = len(seen)
            attempts = wrong.connections
            await until(lambda: wrong.connections >= attempts + 4 and len(seen) >= since + 4, 60, "four more")
            assert set(seen[since:]) == {nz}, seen[since:]
        finally:
            wrong.close()
        # It goes: the next retry is a refusal, and the monitor quiet again.
        await until(_quiet_and(reader, REFUSED), 60, "refused again, and quiet")

        # An engine comes, goes and comes back, all seen through the quiet monitor.
        for _ in range(2):
            pub = await _engine_up(reader, port, records)
            before = len(seen)
            pub.close(linger=0)
            await until(_quiet_and(reader, REFUSED), 60, "refused after the engine left")
            assert seen[before:][:2] == ["disconnected", REFUSED], seen[before:]
        kinds = [r.kind for r in records if isinstance(r, NoticeRecord) and r.kind in ("up", "down")]
        assert kinds == ["up", "down", "up", "down"]

    _reader_run(scenario)


def test_no_event_is_lost_when_the_monitor_is_re_armed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Failed handshakes every few milliseconds (each a HANDSHAKE_FAILED then a DISCONNECTED),
    the monitor switched between its two sets of events hundreds of times meanwhile, with events
    queued in the old monitor at each switch: every connection's two events are handled, in order."""

    async def scenario(reader: StreamReader, port: int, seen: list[str], records: list[Any]) -> None:
        handled: list[int] = []
        handle = reader._on_monitor_event

        def record(event: int, frames: list[bytes]) -> None:
            if event & HANDSHAKE_FAILED or event == DISCONNECTED:
                handled.append(HANDSHAKE_FAILED if event & HANDSHAKE_FAILED else DISCONNECTED)
            handle(event, frames)

        reader._on_monitor_event = record  # type: ignore[method-assign]
        wrong = NoZeroMQ(port)
        try:
            for switch in range(300):
                time.sleep(0.002)  # noqa: ASYNC251  the loop held: events queue in the monitor being replaced
                monitor = _monitor(reader)
                monitor._rearm = QUIET_EVENTS if switch % 2 else MONITOR_EVENTS
                monitor._turn_taken = True
                assert monitor._switch()
                await asyncio.sleep(0)
        finally:
            wrong.close()
        await until(lambda: handled.count(HANDSHAKE_FAILED) >= wrong.connections > 100, 60, "every connection's events")
        await until(lambda: handled.count(DISCONNECTED) == handled.count(HANDSHAKE_FAILED), 60, "the last disconnect")
        assert handled == [HANDSHAKE_FAILED, DISCONNECTED] * (len(handled) // 2)

    monkeypatch.setattr(reader_module, "RECONNECT_IVL_MS", 1)  # an attempt every millisecond or two
    _reader_run(scenario)


def test_a_monitor_libzmq_stopped_with_no_socket_left_is_made_again_by_a_timer() -> None:
    """libzmq stops a re-armed SUB's old monitor, then finds no socket for the new one (its reaper
    has not freed the closed ones yet), three times running: the monitor is made again a
    millisecond later by a timer, the event loop running meanwhile, and then carries the stream's
    events (an engine coming)."""

    async def scenario(reader: StreamReader, port: int, seen: list[str], records: list[Any]) -> None:
        await until(_quiet_and(reader, REFUSED), 60, "refused, and the monitor quiet")
        monitor = _monitor(reader)
        sub = monitor._sub
        calls: list[int] = []
        ran: list[int] = []

        class NoSocketLeft:
            """The SUB, whose monitor() finds no socket for the new monitor three times."""

            def monitor(self, address: str, events: int) -> None:
                calls.append(events)
                if len(calls) <= 3:
                    raise zmq.ZMQError(errno.EMFILE)
                sub.monitor(address, events)

        monitor._sub = NoSocketLeft()  # type: ignore[assignment]
        monitor._rearm, monitor._turn_taken = MONITOR_EVENTS, True
        assert monitor._switch()
        asyncio.get_running_loop().call_soon(lambda: ran.append(len(calls)))
        await until(lambda: len(calls) == 4, 60, "the monitor made again")
        assert ran == [1]  # the loop ran after the first try: the retries wait on a timer, not in it
        assert calls == [MONITOR_EVENTS] * 4 and monitor._arming is None
        pub = await _engine_up(reader, port, records)  # seen through the monitor made again
        pub.close(linger=0)
        await until(lambda: seen[-1] == "disconnected" or seen[-1] == REFUSED, 60, "the engine gone")

    _reader_run(scenario)


def test_a_stream_that_stays_down_is_diagnosed_by_a_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its monitor quiet, no retry reaches the ingest: the diagnosis comes every interval all the
    same, with the same reason, and stops while the stream is up; after it goes down, the first
    comes an interval later."""
    diagnosed: list[str] = []

    async def diagnose(endpoint: str, within: float = 3.0) -> tuple[str, str]:
        diagnosed.append(endpoint)
        return "no route to host, retrying", "unreachable"

    monkeypatch.setattr(streams_module, "diagnose_connect", diagnose)
    monkeypatch.setattr(streams_module, "DIAGNOSE_INTERVAL_SECONDS", 0.2)

    async def main() -> None:
        port = free_port()
        settings = Settings(sources=(SourceConfig("e", f"tcp://127.0.0.1:{port}"),))
        log = MemoryLog()
        records: list[Any] = []

        def keep(entry: Entry) -> None:
            records.append(entry.record)

        log.follow(keep)
        ingest = Ingest(settings, log, Metrics())
        ingest.start("started")
        [reader] = ingest.readers
        outlet = ingest.outlets[("e", 0)]
        try:
            await until(lambda: len(diagnosed) >= 4 and _monitor(reader).events == QUIET_EVENTS, 60, "diagnoses")
            assert (outlet.status.down_reason, outlet.status.down_code) == ("no route to host, retrying", "unreachable")
            pub = await _engine_up(reader, port, records)
            assert ("e", 0) not in ingest._next_diagnosis
            counted = len(diagnosed)
            pub.close(linger=0)
            await until(lambda: not outlet.status.connected, 60, "down")
            assert ("e", 0) in ingest._next_diagnosis  # the first of its diagnoses an interval after
            await until(lambda: len(diagnosed) > counted, 60, "a diagnosis while down again")
            await until(lambda: outlet.status.down_code == "unreachable", 60, "diagnosed again")
        finally:
            await ingest.stop()
        assert not ingest._next_diagnosis

    asyncio.run(main())
