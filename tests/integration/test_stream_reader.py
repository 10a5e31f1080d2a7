"""StreamReader with real ZeroMQ sockets and no HTTP: an engine's PUB and replay ROUTER in the test,
the reader's outlet on a real log and index."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import zmq

from kvgateway.config import StreamConfig
from kvgateway.engine import wire
from kvgateway.ingest import reader as reader_module
from kvgateway.ingest.outlet import StreamOutlet
from kvgateway.ingest.reader import StreamReader
from kvgateway.log.entry import Entry
from kvgateway.log.ordered import MemoryLog
from kvgateway.log.records import STATUS, BatchRecord, NoticeRecord
from kvgateway.simulator import encode
from kvgateway.state.occupancy import OccupancyIndex
from tests.support import until as support_until

TOPIC = b"kv"


def payload(seq: int) -> bytes:
    stored = wire.BlockStored([seq + 1], None, [1, 2], 2)
    return encode.encode_batch(wire.Batch(time.time(), [stored], 0))


class Engine:
    """A PUB socket and a replay ROUTER holding every batch 'published', as vLLM's buffer does."""

    def __init__(
        self, context: zmq.Context[zmq.Socket[bytes]], endpoints: tuple[str, str] = ("tcp://127.0.0.1:*",) * 2
    ) -> None:
        self.pub = context.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(endpoints[0])
        self.router = context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(endpoints[1])
        self.buffer: dict[int, bytes] = {}
        self.requests: list[int] = []

    def endpoints(self) -> tuple[str, str]:
        return self.pub.getsockopt_string(zmq.LAST_ENDPOINT), self.router.getsockopt_string(zmq.LAST_ENDPOINT)

    def publish(self, seq: int, *, drop: bool = False) -> None:
        """Buffer the batch; send it live unless ``drop`` (the PUB socket's high-water mark)."""
        self.buffer[seq] = payload(seq)
        if not drop:
            self.pub.send_multipart([TOPIC, wire.seq_bytes(seq), self.buffer[seq]])

    def answer(self) -> None:
        """Answer every replay request queued now: the buffer from the seq asked, then the end marker."""
        while True:
            try:
                identity, empty, start = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            first = int.from_bytes(start, "big")
            self.requests.append(first)
            for seq in sorted(s for s in self.buffer if s >= first):
                self.router.send_multipart([identity, empty, wire.seq_bytes(seq), self.buffer[seq]])
            self.router.send_multipart([identity, empty, wire.END_SEQ_BYTES, b""])

    def close(self) -> None:
        self.pub.close(linger=0)
        self.router.close(linger=0)


async def until(condition: Callable[[], bool], engine: Engine, within: float = 120.0) -> None:
    """:func:`tests.support.until`, the engine answering replay requests between the tries."""

    def answered() -> bool:
        if condition():
            return True
        engine.answer()
        return False

    await support_until(answered, within, "the condition", interval=0.01)


def run(
    scenario: Callable[[Engine, StreamReader, list[Any], OccupancyIndex], Coroutine[Any, Any, None]],
    *,
    quiet_seconds: float = reader_module.QUIET_SECONDS,
) -> None:
    async def main() -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        engine = Engine(context)
        endpoint, replay = engine.endpoints()
        config = StreamConfig("e", 0, endpoint, replay, TOPIC.decode(), False, {})
        log = MemoryLog()
        index = OccupancyIndex()
        log.follow(index.follow)
        records: list[Any] = []

        def keep(entry: Entry) -> None:
            record = entry.record
            if not (isinstance(record, NoticeRecord) and record.kind == STATUS):  # status: test_status_board
                records.append(record)

        log.follow(keep)
        outlet = StreamOutlet(config, log, clock=time.time)
        reader = StreamReader(
            config, context, outlet, replay_slots=asyncio.Semaphore(1), replay_timeout=2.0, quiet_seconds=quiet_seconds
        )
        reader.start()
        try:
            await scenario(engine, reader, records, index)
        finally:
            await reader.stop()
            engine.close()
            context.destroy(linger=0)

    asyncio.run(main())


def delivered(records: list[Any]) -> list[int]:
    return [r.seq for r in records if isinstance(r, BatchRecord)]


def test_a_batch_the_live_stream_dropped_is_replayed_and_all_arrive_in_order() -> None:
    async def scenario(engine: Engine, reader: StreamReader, records: list[Any], index: OccupancyIndex) -> None:
        outlet = reader._outlet
        # the catch-up at connect asks the engine's whole buffer (nothing yet)
        await until(lambda: engine.requests == [0] and reader.sequencer.replay_token is None, engine)
        assert outlet.status.connected
        await until(_subscribed(engine, records), engine)
        for seq in range(1, 4):
            engine.publish(seq, drop=seq == 2)
        await until(lambda: delivered(records) == [0, 1, 2, 3], engine)
        assert engine.requests[-1] == 1  # from the last delivered seq, whose bytes it checks
        counters = outlet.status.counters
        assert (counters["gaps"], counters["missed"], counters["replayed"]) == (1, 1, 1)
        assert outlet.replay_requests["recovered"] >= 1
        assert reader.sequencer.held == 0 and outlet.held == 0
        assert index.stream("e", 0).medium_stats(time.time())["GPU"].blocks == 4
        assert [r.kind for r in records if isinstance(r, NoticeRecord)] == ["up"]

    run(scenario)


def test_a_burst_after_a_quiet_probe_arms_the_quiet_timer_and_its_dropped_tail_is_fetched() -> None:
    """The live loop hands a lone delivery to the outlet without the reader's pass over the actions
    only while the quiet timer is armed: after a quiet probe (the timer then disarmed), the next
    burst's deliveries arm it again, and that burst's tail the PUB socket dropped is fetched."""

    async def scenario(engine: Engine, reader: StreamReader, records: list[Any], index: OccupancyIndex) -> None:
        await until(lambda: engine.requests == [0] and reader.sequencer.replay_token is None, engine)
        await until(_subscribed(engine, records), engine)
        # The first burst (seq 0) ends in a quiet probe from the anchor, which finds nothing more;
        # then the stream is quiet and nothing arms the timer.
        sequencer = reader.sequencer
        await until(
            lambda: len(engine.requests) >= 2 and sequencer.replay_token is None and reader._quiet is None, engine
        )
        asked = len(engine.requests)
        for seq in range(1, 6):
            engine.publish(seq, drop=seq >= 4)  # the burst's tail never comes live
        # (seq 0 may come twice: the probe's reply brings the buffer's, whose bytes differ from the
        # one delivered, each publish of it being stamped anew: an identity restart, rule 11)
        await until(lambda: delivered(records)[-6:] == list(range(6)), engine)
        assert engine.requests[asked:] == [3]  # the second burst's probe, from its last live seq

    run(scenario, quiet_seconds=0.2)


def test_an_undecodable_and_a_malformed_message_are_counted_and_skipped() -> None:
    async def scenario(engine: Engine, reader: StreamReader, records: list[Any], index: OccupancyIndex) -> None:
        outlet = reader._outlet
        await until(lambda: engine.requests == [0] and reader.sequencer.replay_token is None, engine)
        await until(_subscribed(engine, records), engine)
        engine.pub.send_multipart([TOPIC, b"short"])  # two frames: no seq at all
        engine.pub.send_multipart([TOPIC, wire.seq_bytes(1), b"\xc1"])  # 0xc1: never valid msgpack
        engine.publish(2)
        await until(lambda: delivered(records) == [0, 2], engine)
        assert outlet.status.counters["decode_errors"] == 2
        assert outlet.status.last_seq == 2
        stale = [r.fields["reason"] for r in records if isinstance(r, NoticeRecord) and r.kind == "stale"]
        assert stale == ["undecodable"]

    run(scenario)


def _subscribed(engine: Engine, records: list[Any]) -> Callable[[], bool]:
    """Publish seq 0 until it arrives: a SUB's subscription reaches the PUB a moment after connecting."""

    def check() -> bool:
        if delivered(records):
            return True
        engine.pub.send_multipart([TOPIC, wire.seq_bytes(0), payload(0)])
        engine.buffer[0] = payload(0)
        return False

    return check


def test_a_backlog_whose_last_batch_ends_a_turn_still_ends_in_the_disconnect(monkeypatch: Any) -> None:
    """A disconnect's backlog is read in turns; when its last batch is the last of a turn (a turn
    ends at its time budget, here after every batch), the queue is empty without a read having
    found it so: the disconnect must still be applied (found under load: the stream stayed up)."""

    async def scenario(engine: Engine, reader: StreamReader, records: list[Any], index: OccupancyIndex) -> None:
        outlet = reader._outlet
        await until(lambda: engine.requests == [0] and reader.sequencer.replay_token is None, engine)
        await until(_subscribed(engine, records), engine)
        monkeypatch.setattr(reader_module, "TURN_SECONDS", 0.0)  # from here on, a turn reads one batch
        for seq in range(1, 41):
            engine.publish(seq)
        engine.pub.close(linger=5_000)  # every batch on its way, then the publisher is gone
        # The loop held on purpose (no await): the batches queue at the reader, and the disconnect
        # behind them, before it reads any.
        time.sleep(0.5)  # noqa: ASYNC251
        await until(lambda: delivered(records) == list(range(41)) and not outlet.status.connected, engine)
        assert [r.kind for r in records if isinstance(r, NoticeRecord)] == ["up", "down"]

    run(scenario)


def test_a_new_connections_batch_read_before_its_handshake_event_comes_after_up(monkeypatch: Any) -> None:
    """The ZeroMQ thread queues a connection's handshake event on the monitor, then its batches on
    the SUB. A loaded machine can stall the loop between a burst's look at the monitor and its
    reads, so a restarted engine's first batch is read while the reader still knows no connection
    (found under load: a client saw ``down``, then batches, then ``up``; or ``restart`` before
    ``up``). Here the burst's look always comes too early and the monitor's own callback is off:
    the batch must still come after ``up`` and the restart, never as the old process's."""

    async def scenario(engine: Engine, reader: StreamReader, records: list[Any], index: OccupancyIndex) -> None:
        outlet = reader._outlet
        await until(lambda: engine.requests == [0] and reader.sequencer.replay_token is None, engine)
        await until(_subscribed(engine, records), engine)
        for seq in range(1, 4):
            engine.publish(seq)
        await until(lambda: delivered(records) == [0, 1, 2, 3], engine)
        endpoints = engine.endpoints()
        engine.close()  # the engine dies
        await support_until(lambda: not outlet.status.connected, 10, "down")
        down_at = len(records)

        loop = asyncio.get_running_loop()
        assert reader.monitor is not None and reader.monitor.fd is not None
        loop.remove_reader(reader.monitor.fd)
        looks = reader._poll_monitor

        def too_early() -> None:
            if sys._getframe(1).f_code.co_name != "_read_live":  # the burst's look finds nothing yet
                looks()

        monkeypatch.setattr(reader, "_poll_monitor", too_early)
        restarted = Engine(engine.pub.context, endpoints)  # a new process on the same ports
        try:
            restarted.buffer[0] = body = payload(0)

            def first_batch() -> bool:
                if delivered(records)[4:]:
                    return True
                restarted.pub.send_multipart([TOPIC, wire.seq_bytes(0), body])  # until it is subscribed
                return False

            await until(first_batch, restarted, within=30)
            after = [r.kind if isinstance(r, NoticeRecord) else r.seq for r in records[down_at:]]
            assert after == ["up", "restart", 0], after
        finally:
            restarted.close()

    run(scenario)
