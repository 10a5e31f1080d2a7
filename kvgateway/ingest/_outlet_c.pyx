# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of :mod:`kvgateway.ingest._outlet_py` (the same API: ``Delivery``, which
:class:`kvgateway.ingest.outlet.StreamOutlet` holds): :meth:`Delivery.apply`, step for step.

What a delivered batch reads and writes of the delivery are C fields of the extension type (the
outlet reads and sets them as attributes, as before); a Struct's fields (the action's, the batch's,
the events') are read from their slots (engine/_slots.pxd). What is not a delivered batch, a rank
that differs, a report, goes to the outlet's Python through the callables it gave, as in the
reference.

The reference's arithmetic is kept where it is Python's: a lag is a C double only where the clock's
reading and the batch's ``ts`` are both floats (their difference is the same double either way),
and the counters are C ``long long`` (a stream delivers fewer than 2**63 batches and events)."""

from collections import _count_elements

from kvgateway.engine._slots cimport field, field_offset  # a Struct's field read from its slot

from kvgateway.engine.sequencer import Deliver
from kvgateway.ingest import _outlet_py
from kvgateway.engine.wire import Batch
from kvgateway.log.records import BatchRecord
from kvgateway.protocol import render
from kvgateway.protocol.messages import EncodedEvents
from kvgateway.runtime.metrics import FOLD_AT

cdef object _Deliver = Deliver
cdef object _Batch = Batch
cdef object _BatchRecord = BatchRecord
cdef object _EncodedEvents = EncodedEvents
cdef object _events_json = render.events_json  # the chosen renderer's (compiled with this core)
cdef object _count = _count_elements
cdef Py_ssize_t _FOLD_AT = FOLD_AT
cdef object _reference_init = _outlet_py.Delivery.__init__

cdef Py_ssize_t _SEQ = field_offset(Deliver, "seq")
cdef Py_ssize_t _BATCH = field_offset(Deliver, "batch")
cdef Py_ssize_t _REPLAYED = field_offset(Deliver, "replayed")
cdef Py_ssize_t _DP_RANK = field_offset(Batch, "dp_rank")
cdef Py_ssize_t _TS = field_offset(Batch, "ts")
cdef Py_ssize_t _EVENTS = field_offset(Batch, "events")
cdef Py_ssize_t _COUNTS = field_offset(EncodedEvents, "counts")


cdef class Delivery:
    """:class:`kvgateway.ingest._outlet_py.Delivery`, its state in C fields."""

    cdef public object key
    cdef public object dp_rank
    cdef public object status
    cdef public object staleness
    cdef public object lag
    cdef public list lags
    cdef public object log
    cdef public object other
    cdef public object rank_mismatch
    cdef public object report
    cdef public object held
    cdef public bint reported
    cdef public long long shown_batches
    cdef public long long stored
    cdef public long long removed
    cdef public long long cleared
    cdef public dict keyed

    def __init__(self, *args, **kwargs):
        """The reference's own constructor, run on this type's fields."""
        _reference_init(self, *args, **kwargs)

    def apply(self, actions, received, held):
        """:meth:`kvgateway.ingest._outlet_py.Delivery.apply`."""
        cdef double lag
        cdef list lags
        cdef bint float_clock = type(received) is float
        for action in actions:
            if type(action) is not _Deliver:
                self.other(action)
                continue
            batch = field(action, _Deliver, _BATCH, "batch")
            if batch is None:
                self.other(action)
                continue
            seq = field(action, _Deliver, _SEQ, "seq")
            status = self.status
            status.last_seq = seq
            dp_rank = field(batch, _Batch, _DP_RANK, "dp_rank")
            if dp_rank is not None and dp_rank != self.dp_rank:
                self.rank_mismatch(seq, dp_rank)
            replayed = field(action, _Deliver, _REPLAYED, "replayed")
            if replayed:
                status.counters["replayed"] += 1
            else:
                ts = field(batch, _Batch, _TS, "ts")
                lags = self.lags
                if float_clock and type(ts) is float:
                    lag = <double>received - <double>ts
                    status.lag_seconds = lag
                    lags.append(0.0 if lag < 0.0 else lag)
                else:  # Python's arithmetic and comparison, as the reference's
                    value = received - ts
                    status.lag_seconds = value
                    lags.append(0.0 if value < 0.0 else value)
                if len(lags) >= _FOLD_AT:
                    self.lag.fold()
            if self.staleness.reason is not None:
                self.staleness.batch(batch)
            self.shown_batches += 1
            # batch_record's record, made here: its events' JSON and filter keys, then the Struct
            events, keys = _events_json(field(batch, _Batch, _EVENTS, "events"))
            record = _BatchRecord(self.key, seq, batch, received, replayed, events, keys)
            counts = field(events, _EncodedEvents, _COUNTS, "counts")
            if counts is not None and not counts[3]:
                self.stored += counts[0]
                self.removed += counts[1]
                self.cleared += counts[2]
            else:
                _count(self.keyed, keys)
            self.log.append(record)
        self.held = held
        if not self.reported:
            self.report()
