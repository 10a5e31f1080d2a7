# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of :mod:`kvgateway.log._ring_py` (the same API: ``Ring``, ``RingAppender``): the
ring and the append, step for step, as extension types.

Their attributes are C fields (an offset stays a Python int: JetStream's sequences are unsigned 64-bit,
and the reference's arithmetic is Python's); the appender calls its ring's append and the bounds'
test in C; a Struct's fields (the record's, the batch's, the message's, an entry's) are read from
their slots (engine/_slots.pxd). What is not on the per-batch path (the offsets, a trim past the byte
bound, a resume's read, a filter's variant) is the reference's own functions, run on these rings."""

from kvgateway.engine._slots cimport field, field_offset  # a Struct's field read from its slot

from kvgateway.engine.wire import Batch
from kvgateway.log import _ring_py
from kvgateway.log.entry import Entry
from kvgateway.log.records import BatchRecord, make_entry
from kvgateway.protocol import render
from kvgateway.protocol.messages import EncodedBatch, OutMessage

cdef object _Batch = Batch
cdef object _Entry = Entry
cdef object _BatchRecord = BatchRecord
cdef object _EncodedBatch = EncodedBatch
cdef object _OutMessage = OutMessage
cdef object _make_entry = make_entry
cdef object _batch_message = render.batch_message  # the chosen renderer's (compiled with this core)
cdef object _ring_init = _ring_py.Ring.__init__
cdef object _appender_init = _ring_py.RingAppender.__init__

cdef Py_ssize_t _R_STREAM = field_offset(BatchRecord, "stream")
cdef Py_ssize_t _R_SEQ = field_offset(BatchRecord, "seq")
cdef Py_ssize_t _R_BATCH = field_offset(BatchRecord, "batch")
cdef Py_ssize_t _R_EVENTS = field_offset(BatchRecord, "events")
cdef Py_ssize_t _R_KEYS = field_offset(BatchRecord, "keys")
cdef Py_ssize_t _TS = field_offset(Batch, "ts")
cdef Py_ssize_t _MESSAGE = field_offset(EncodedBatch, "message")
cdef Py_ssize_t _DATA = field_offset(OutMessage, "data")
cdef Py_ssize_t _E_OFFSET = field_offset(Entry, "offset")
cdef Py_ssize_t _E_SIZE = field_offset(Entry, "size")


cdef class Ring:
    """:class:`kvgateway.log._ring_py.Ring`."""

    cdef public Py_ssize_t max_messages
    cdef public long long max_bytes
    cdef public long long bytes
    cdef public object _entries
    cdef public object _next

    def __init__(self, *args, **kwargs):
        """The reference's own constructor (its checks, its fields), run on this type's fields."""
        _ring_init(self, *args, **kwargs)

    def __len__(self):
        return len(self._entries)

    def append(self, entry):
        """:meth:`kvgateway.log._ring_py.Ring.append`."""
        return self._append(entry)

    cdef Py_ssize_t _append(self, entry) except -1:
        offset = field(entry, _Entry, _E_OFFSET, "offset")
        if offset != self._next:
            raise ValueError(f"ring expected offset {self._next}, got {offset}")
        entries = self._entries
        cdef Py_ssize_t held = len(entries)
        while held and held >= self.max_messages:  # oldest first: dropped by the trim after anyway
            self.bytes -= entries.popleft().size
            held -= 1
        entries.append(entry)
        self._next = self._next + 1
        self.bytes += field(entry, _Entry, _E_SIZE, "size")
        return held + 1

    # Not on the per-batch path (a trim past the byte bound, a resume's read, a filtered client's first
    # read of an entry, the offsets a client is told): the reference's own code, run on this ring (its
    # attributes are the same names).
    first_offset = _ring_py.Ring.first_offset
    last_offset = _ring_py.Ring.last_offset
    trim = _ring_py.Ring.trim
    since = _ring_py.Ring.since
    message_for = _ring_py.Ring.message_for


cdef class RingAppender:
    """:class:`kvgateway.log._ring_py.RingAppender`."""

    cdef public Ring ring
    cdef public object epoch
    cdef public object offset
    cdef public list followers
    cdef public object appended
    cdef public bint fed

    def __init__(self, *args, **kwargs):
        """The reference's own constructor, run on this type's fields."""
        _appender_init(self, *args, **kwargs)

    def append(self, record):
        """:meth:`kvgateway.log._ring_py.RingAppender.append`."""
        cdef Ring ring
        cdef Py_ssize_t held
        offset = self.offset + 1
        if type(record) is _BatchRecord:
            stream = field(record, _BatchRecord, _R_STREAM, "stream")
            batch = _batch_message(
                self.epoch,
                offset,
                stream,
                seq=field(record, _BatchRecord, _R_SEQ, "seq"),
                ts=field(field(record, _BatchRecord, _R_BATCH, "batch"), _Batch, _TS, "ts"),
                events=field(record, _BatchRecord, _R_EVENTS, "events"),
            )
            message = field(batch, _EncodedBatch, _MESSAGE, "message")
            entry = _Entry(
                offset,
                stream,
                message,
                batch,
                field(record, _BatchRecord, _R_KEYS, "keys"),
                len(field(message, _OutMessage, _DATA, "data")),
                record,
            )
        else:
            entry = _make_entry(self.epoch, offset, record)
        self.offset = offset
        self.fed = True
        ring = self.ring
        held = ring._append(entry)
        for follower in self.followers:
            follower(entry)
        entry.record = None
        if held > ring.max_messages or ring.bytes > ring.max_bytes:
            ring.trim()
        if self.appended is not None:
            self.appended(offset)
        return offset
