"""kvgateway.cluster.order: a batch that arrives after a later one of its stream becomes a stale notice,
the same live and read back."""

from __future__ import annotations

from kvgateway.cluster import records
from kvgateway.log.ordered import MemoryLog
from kvgateway.log.records import NoticeRecord, batch_record
from tests.support.events import batch, removed


def test_a_late_batch_becomes_the_same_stale_notice_live_and_read_back() -> None:
    from kvgateway.cluster.order import OrderGuard

    guard = OrderGuard()

    def wire_batch(seq: int, generation: int = 0) -> records.WireRecord:
        record = batch_record(
            ("s", 0), seq, batch(removed(seq), ts=float(seq), dp_rank=None), received=1.0, replayed=False
        )
        return records.decode(records.encode_record(record, generation))

    assert type(guard.admit(1, wire_batch(5))).__name__ == "BatchRecord"
    assert type(guard.admit(2, wire_batch(7))).__name__ == "BatchRecord"
    late = guard.admit(3, wire_batch(6))
    assert isinstance(late, NoticeRecord) and late.kind == "stale" and late.fields["seq"] == 6
    assert guard.at(3, wire_batch(6)) == late  # a resume reading offset 3 back renders the same
    assert type(guard.at(2, wire_batch(7))).__name__ == "BatchRecord"
    assert type(guard.admit(4, wire_batch(0, generation=1))).__name__ == "BatchRecord"  # a restarted engine
    MemoryLog().append(late)  # a valid notice
