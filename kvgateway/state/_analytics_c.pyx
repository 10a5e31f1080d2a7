# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, annotation_typing=False
"""The compiled pass of the cache analytics: :mod:`kvgateway.state._analytics_py`'s
``AnalyticsPass``, its tables worked on by a thread of their own.

The same figures, tables and orders as the reference (checked by
tests/unit/state/test_analytics_differential.py); what changes is where the work runs. The
analytics' per-hash work (each stored hash asked of the recently evicted, each removed one of the
sampled stored, the sampled blocks' lifetimes) was about a tenth of the live gateway's main thread
a batch, and none of it has to be done before the batch goes on: nothing reads the analytics'
tables but the analytics' own readers (``/metrics``, ``/v1/analytics``, the tests). So the pass,
on the main thread, only copies each event's hashes (their words or bytes, as the wire sent them)
into a queue of records, and a C thread applies them to C tables (``state/_ordered.pxd``) without
the interpreter. Every read of the tables (:attr:`AnalyticsPass.tiers`, ``counted``, a stats'
fields) first waits until the thread has applied every record queued (:meth:`_Engine.flush`, the
GIL released meanwhile), so a reader sees exactly the state the reference would after the same
calls: the thread changes when the work is done, never what it finds.

What stays on the main thread, in Python objects as in the reference: the routes (a raw medium's
normalised name and tier, cached), the sampling decision (made from an event's first hash), the
first blocks of chains (``roots``), and the numbering of hashes of no C table's kind (a wider int,
bytes of another length: ``_OTHER``, numbered once and kept in a dict beside, so that the thread
compares numbers where the reference compares objects). Engine times are read as floats, as the
wire's ``ts`` is one (the reference reads them so too).

The thread starts with the first record and sleeps when the queue is empty; the main thread wakes
it once 16 KiB are queued, or when a reader waits, so a flood costs a wake-up every few dozen
batches rather than one a batch. A full queue makes the main thread wait for room (the analytics
never fall more than a queue behind). The thread and the tables are :class:`_Engine`'s, which
the pass and each stats view hold: it stops and joins the thread when the last of them is gone.
It does not survive a fork (nothing here forks with a pass alive): a pass used in a forked child
raises rather than waiting for a thread that is not there.
"""

from collections import OrderedDict
import sys

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_RawFree, PyMem_RawMalloc, PyMem_RawRealloc
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from kvgateway._pylong cimport HASH_MODULUS, negative_long, u64_long  # a 64-bit CPython's int hash; ints made back
from kvgateway.engine._slots cimport Fields, field, field_offset, fields_of  # a Struct's field read from its slot
from kvgateway.engine._tokens_c cimport HASHES_BLOB, Hashes  # hashes as the wire sent them
from kvgateway.state._hashtable cimport CONTENT, _BYTES, _INT, _NEG, _OTHER, Key, _key_in, _key_of, key_hash
from kvgateway.state._hashtable cimport hash_count, hash_hashed, hash_key, hash_object  # an event's hashes
from kvgateway.state._ordered cimport (
    ORDERED_DEAD, Ordered, ordered_append, ordered_find, ordered_free, ordered_take,
)

from kvgateway.engine.mediums import medium_tier, normalise_medium
from kvgateway.engine.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored
from kvgateway.log.records import BatchRecord, NoticeRecord
from kvgateway.runtime.metrics import LIFETIME_BUCKETS
from kvgateway.state._analytics_py import MAX_ROOTS, MAX_ROUTES, MAX_TRACKED, REFETCH_WINDOW_SECONDS, SAMPLE, TierStats


cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    ctypedef unsigned long pthread_t  # opaque: only kept and handed back
    int pthread_mutex_init(pthread_mutex_t*, void*)
    int pthread_mutex_destroy(pthread_mutex_t*)
    int pthread_mutex_lock(pthread_mutex_t*)
    int pthread_mutex_unlock(pthread_mutex_t*)
    int pthread_cond_init(pthread_cond_t*, void*)
    int pthread_cond_destroy(pthread_cond_t*)
    int pthread_cond_wait(pthread_cond_t*, pthread_mutex_t*)
    int pthread_cond_signal(pthread_cond_t*)
    int pthread_cond_broadcast(pthread_cond_t*)
    int pthread_create(pthread_t*, void*, void* (*)(void*) noexcept nogil, void*)
    int pthread_join(pthread_t, void**)
    int pthread_atfork(void (*)() noexcept nogil, void (*)() noexcept nogil, void (*)() noexcept nogil)


cdef long _forks = 0  # forks this process made a child of (each child counts its own)


cdef void _forked() noexcept nogil:
    global _forks
    _forks += 1


pthread_atfork(NULL, NULL, _forked)  # a child of a fork has no thread of any engine made before it


cdef object _BlockStored = BlockStored
cdef object _BlockRemoved = BlockRemoved
cdef object _AllBlocksCleared = AllBlocksCleared
cdef object _BatchRecord = BatchRecord
cdef object _Batch = Batch
cdef object _NoticeRecord = NoticeRecord
cdef object _OrderedDict = OrderedDict
cdef object _TierStats = TierStats
cdef Py_hash_t _SAMPLE = SAMPLE
cdef object _UNSEEN = object()  # no event's medium yet in this batch
cdef bint _HASH_IN_LINE = sys.hash_info.modulus == HASH_MODULUS  # a 64-bit CPython's int hash


# --- the lifetime buckets' bounds, as C doubles --------------------------------------------------

cdef enum:
    _MAX_BOUNDS = 32


cdef double _BOUNDS[_MAX_BOUNDS]
cdef Py_ssize_t _NBOUNDS = 0


def _bounds_in_c():
    """The bounds copied into ``_BOUNDS``: the thread buckets a lifetime as ``bisect_left`` does,
    which a C comparison does only for floats in order, without NaN (metrics.py's are)."""
    bounds = tuple(LIFETIME_BUCKETS)
    if len(bounds) > _MAX_BOUNDS or any(type(b) is not float or b != b for b in bounds) or list(bounds) != sorted(bounds):
        raise ImportError("the lifetime buckets are not floats in order: the compiled analytics cannot bucket them")
    for i in range(len(bounds)):
        _BOUNDS[i] = bounds[i]
    return len(bounds)


_NBOUNDS = _bounds_in_c()


cdef inline Py_ssize_t _bucket_of(double seconds) noexcept nogil:
    """``bisect_left(LIFETIME_BUCKETS, seconds)``: the first bound not below ``seconds``."""
    cdef Py_ssize_t i
    for i in range(_NBOUNDS):
        if not _BOUNDS[i] < seconds:
            return i
    return _NBOUNDS


# The fields the pass reads, per event (msgspec keeps a Struct's fields in slots at fixed offsets)
cdef Fields _STORED = fields_of(BlockStored)
cdef Fields _REMOVED = fields_of(BlockRemoved)
cdef Fields _BATCH = fields_of(Batch)
cdef Py_ssize_t _RECORD_BATCH = field_offset(BatchRecord, "batch")
cdef Py_ssize_t _RECORD_STREAM = field_offset(BatchRecord, "stream")


# --- the sampling decision (the main thread's) -----------------------------------------------------

cdef inline uint64_t _first_eight(const unsigned char* data, Py_ssize_t n) noexcept:
    """Bytes' first eight (or fewer) read as a little-endian number."""
    cdef uint64_t key = 0
    cdef Py_ssize_t i
    for i in range(min(n, 8)):
        key |= (<uint64_t>data[i]) << (8 * i)
    return key


cdef inline bint _followed_of(Key* k, object h) except -1:
    """Whether a chain whose first block is ``h`` (its key ``k``) is followed: the reference's
    ``sample_key(h) % SAMPLE == 0`` (bytes' first eight bytes, an int's ``hash()`` with Python's modulo)."""
    if k.kind == _BYTES:
        return _first_eight(k.data, CONTENT) % <uint64_t>_SAMPLE == 0
    if type(h) is bytes:  # of another length than 32
        return _first_eight(<const unsigned char*>PyBytes_AS_STRING(h), PyBytes_GET_SIZE(h)) % <uint64_t>_SAMPLE == 0
    return key_hash(k, h, _HASH_IN_LINE) % _SAMPLE == 0


cdef inline bint _followed_first(object hashes) except -1:
    """Whether the chain of ``hashes`` (a list or a Hashes, not empty) is followed."""
    cdef Key k
    if hash_count(hashes) > 0:
        hash_key(hashes, 0, &k)
        return _followed_of(&k, hash_hashed(hashes, 0, &k, _HASH_IN_LINE))
    h = hashes[0]
    _key_of(h, &k)
    return _followed_of(&k, h)


# --- the thread's state: a tier's tables and counts, the queue of records -------------------------

cdef struct _Tier:
    Ordered stored  # the sampled blocks in the cache, oldest first: their store's time
    Ordered evicted  # the sampled blocks evicted lately, oldest first: their eviction's time
    long long lifetimes
    long long evictions
    long long refetches
    double lifetime_sum
    long long buckets[_MAX_BOUNDS + 1]
    bint counted  # in the worker's ``counted`` (a sampled eviction seen)
    Py_ssize_t id  # its view's place in the pass's ``_views``


cdef enum:
    _REC_STORED = 1
    _REC_REMOVED = 2
    _REC_CLEAR = 3
    _REC_WRAP = 4  # the rest of the buffer unused: the next record is at its start
    # a record's form: a Hashes' (HASHES_U64, HASHES_I64, HASHES_BLOB: its array copied), or
    _FORM_KEYS = 3  # n keys of any kind, _KEY_SIZE bytes each (a list's hashes)
    _KEY_SIZE = 48  # a word, a kind, 32 bytes
    _CHUNK = 1024  # hashes a record at most: an event of more is split (the work is per hash, in order)
    _QUEUE_BYTES = 1 << 20
    _WAKE_BYTES = 16384  # queued before a sleeping thread is woken (a reader wakes it at once)


cdef struct _Record:
    uint32_t type
    uint32_t n
    _Tier* tier
    double ts
    uint32_t form
    uint32_t followed


cdef struct _Worker:
    unsigned char* buf  # _QUEUE_BYTES, records at 8-byte boundaries
    size_t head  # bytes consumed (the thread's to move, under the mutex)
    size_t tail  # bytes published (the main thread's to move, under the mutex)
    pthread_mutex_t mutex
    pthread_cond_t wake  # the thread waits here for records
    pthread_cond_t done  # the main thread waits here for the thread to catch up
    bint sleeping
    int waiters
    bint stop
    bint failed  # an allocation failed in the thread: it applies nothing more
    double window
    Py_ssize_t max_tracked
    _Tier** counted  # the tiers with a sampled eviction, in the order of their first
    size_t ncounted
    size_t counted_cap


cdef inline size_t _aligned(size_t n) noexcept nogil:
    return (n + 7) & ~(<size_t>7)


cdef inline void _key_of_record(_Record* r, const unsigned char* data, size_t i, Key* k) noexcept nogil:
    """The key of hash ``i`` of record ``r`` (its payload ``data``)."""
    if r.form != _FORM_KEYS:
        _key_in(r.form, data, i, k)
        return
    data = data + i * _KEY_SIZE
    k.key = (<const uint64_t*>data)[0]
    k.kind = <int>(<const uint64_t*>data)[1]
    k.data = data + 16 if k.kind == _BYTES else NULL


cdef int _stored(_Worker* w, _Record* r, const unsigned char* data) noexcept nogil:
    """A stored event: each hash evicted lately is a refetch if within the window (and leaves the
    evicted); a followed chain's hashes not yet stored are, at the event's time (the oldest out past
    the bound). The reference's ``_refetched`` and ``_sampled``, hash by hash in the same order."""
    cdef _Tier* t = r.tier
    cdef size_t i
    cdef Py_ssize_t pos
    cdef Key h
    cdef double evicted
    if t.evicted.n:
        for i in range(r.n):
            _key_of_record(r, data, i, &h)
            pos = ordered_find(&t.evicted, &h)
            if pos >= 0:
                evicted = t.evicted.values[pos]
                ordered_take(&t.evicted, pos)
                if r.ts - evicted <= w.window:
                    t.refetches += 1
    if r.followed:
        for i in range(r.n):
            _key_of_record(r, data, i, &h)
            if ordered_find(&t.stored, &h) < 0:  # a second copy keeps the first one's time
                if ordered_append(&t.stored, &h, r.ts) < 0:
                    return -1
                if <Py_ssize_t>t.stored.n > w.max_tracked:
                    ordered_take(&t.stored, t.stored.head)
    return 0


cdef int _removed(_Worker* w, _Record* r, const unsigned char* data) noexcept nogil:
    """A removed event: each followed block stored is evicted (its lifetime bucketed, its eviction
    kept as the newest); the tier counted at its first. The reference's ``_removed``."""
    cdef _Tier* t = r.tier
    cdef size_t i
    cdef Py_ssize_t pos
    cdef Key h
    cdef double stored, seconds
    cdef _Tier** grown
    if not t.stored.n:
        return 0
    for i in range(r.n):
        _key_of_record(r, data, i, &h)
        pos = ordered_find(&t.stored, &h)
        if pos < 0:
            continue  # not followed (or stored before the gateway watched)
        stored = t.stored.values[pos]
        ordered_take(&t.stored, pos)
        t.evictions += 1
        pos = ordered_find(&t.evicted, &h)
        if pos >= 0:  # evicted again: its time the new one, and the newest (move_to_end)
            ordered_take(&t.evicted, pos)
        if ordered_append(&t.evicted, &h, r.ts) < 0:
            return -1
        if <Py_ssize_t>t.evicted.n > w.max_tracked:
            ordered_take(&t.evicted, t.evicted.head)
        seconds = r.ts - stored
        if not seconds > 0.0:  # max(0.0, seconds): the first of the largest
            seconds = 0.0
        t.lifetimes += 1
        t.lifetime_sum += seconds
        t.buckets[_bucket_of(seconds)] += 1
    if t.evictions and not t.counted:
        if w.ncounted == w.counted_cap:
            grown = <_Tier**>PyMem_RawRealloc(w.counted, (w.counted_cap * 2 + 8) * sizeof(_Tier*))
            if grown is NULL:
                return -1
            w.counted = grown
            w.counted_cap = w.counted_cap * 2 + 8
        w.counted[w.ncounted] = t
        w.ncounted += 1
        t.counted = True
    return 0


cdef int _apply_record(_Worker* w, _Record* r) noexcept nogil:
    cdef const unsigned char* data = (<const unsigned char*>r) + sizeof(_Record)
    if r.type == _REC_STORED:
        return _stored(w, r, data)
    if r.type == _REC_REMOVED:
        return _removed(w, r, data)
    if r.type == _REC_CLEAR:
        ordered_free(&r.tier.stored)  # every entry out, the memory back (as OrderedDict.clear)
    return 0


cdef inline size_t _record_size(_Record* r) noexcept nogil:
    cdef size_t each
    if r.type == _REC_CLEAR:
        return sizeof(_Record)
    if r.form == HASHES_BLOB:
        each = CONTENT
    elif r.form == _FORM_KEYS:
        each = _KEY_SIZE
    else:
        each = 8
    return _aligned(sizeof(_Record) + r.n * each)


cdef void* _run(void* arg) noexcept nogil:
    """The thread: records applied as they are published, in order; asleep when there are none."""
    cdef _Worker* w = <_Worker*>arg
    cdef size_t head, end, offset
    cdef _Record* r
    pthread_mutex_lock(&w.mutex)
    while True:
        while w.head == w.tail and not w.stop:
            w.sleeping = True
            pthread_cond_wait(&w.wake, &w.mutex)
            w.sleeping = False
        if w.stop:
            break
        head, end = w.head, w.tail
        pthread_mutex_unlock(&w.mutex)
        while head != end:
            offset = head & (_QUEUE_BYTES - 1)
            r = <_Record*>(w.buf + offset)
            if r.type == _REC_WRAP:
                head += _QUEUE_BYTES - offset
                continue
            if not w.failed and _apply_record(w, r) < 0:
                w.failed = True  # no memory: nothing more is applied; the main thread raises
            head += _record_size(r)
        pthread_mutex_lock(&w.mutex)
        w.head = head
        if w.waiters:
            pthread_cond_broadcast(&w.done)
    pthread_mutex_unlock(&w.mutex)
    return NULL


cdef class _Engine:
    """The thread, its queue and the tiers' C state; held by the pass and by every stats view,
    freed (the thread stopped and joined first) with the last of them. Main-thread methods only."""

    cdef _Worker* w
    cdef pthread_t thread
    cdef bint started
    cdef long forks  # ``_forks`` when the thread started: another count is a forked child's
    cdef size_t pending  # bytes written past the published tail (records the main thread has made)
    cdef size_t head_seen  # the thread's head when last published (it only grows)
    cdef _Tier** tiers  # every tier made, to free
    cdef Py_ssize_t ntiers, tiers_cap
    cdef dict others  # a hash of kind _OTHER by its number

    def __cinit__(self, double window, Py_ssize_t max_tracked):
        self.w = <_Worker*>PyMem_RawMalloc(sizeof(_Worker))
        if self.w is NULL:
            raise MemoryError()
        memset(self.w, 0, sizeof(_Worker))
        self.w.window = window
        self.w.max_tracked = max_tracked
        pthread_mutex_init(&self.w.mutex, NULL)
        pthread_cond_init(&self.w.wake, NULL)
        pthread_cond_init(&self.w.done, NULL)
        self.others = {}

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.w is NULL:
            return
        # a forked child has no thread to stop, and its copy of the mutex may be held: memory only
        cdef bint forked = self.started and _forks != self.forks
        if self.started and not forked:
            with nogil:
                pthread_mutex_lock(&self.w.mutex)
                self.w.stop = True
                pthread_cond_signal(&self.w.wake)
                pthread_mutex_unlock(&self.w.mutex)
                pthread_join(self.thread, NULL)
        for i in range(self.ntiers):
            ordered_free(&self.tiers[i].stored)
            ordered_free(&self.tiers[i].evicted)
            PyMem_RawFree(self.tiers[i])
        PyMem_RawFree(self.tiers)
        PyMem_RawFree(self.w.counted)
        PyMem_RawFree(self.w.buf)
        if not forked:
            pthread_cond_destroy(&self.w.done)
            pthread_cond_destroy(&self.w.wake)
            pthread_mutex_destroy(&self.w.mutex)
        PyMem_RawFree(self.w)

    cdef _Tier* new_tier(self, Py_ssize_t id) except NULL:
        cdef _Tier** grown
        cdef _Tier* t = <_Tier*>PyMem_RawMalloc(sizeof(_Tier))
        if t is NULL:
            raise MemoryError()
        memset(t, 0, sizeof(_Tier))
        t.id = id
        if self.ntiers == self.tiers_cap:
            grown = <_Tier**>PyMem_RawRealloc(self.tiers, (self.tiers_cap * 2 + 8) * sizeof(_Tier*))
            if grown is NULL:
                PyMem_RawFree(t)
                raise MemoryError()
            self.tiers = grown
            self.tiers_cap = self.tiers_cap * 2 + 8
        self.tiers[self.ntiers] = t
        self.ntiers += 1
        return t

    cdef int _check(self) except -1:
        if self.started and _forks != self.forks:
            raise RuntimeError("the cache analytics' thread does not survive a fork: make the pass in the child")
        if self.w.failed:
            raise MemoryError("the cache analytics' thread ran out of memory")
        return 0

    cdef unsigned char* reserve(self, size_t size) except NULL:
        """Room for a record of ``size`` bytes (8-aligned, at most a few chunks' worth) at the end of
        what was written: waits for the thread where the queue is full. The record is the caller's
        to fill before the next reserve; :meth:`publish` hands it over."""
        cdef _Worker* w = self.w
        cdef size_t offset, need
        if w.buf is NULL:
            w.buf = <unsigned char*>PyMem_RawMalloc(_QUEUE_BYTES)
            if w.buf is NULL:
                raise MemoryError()
        offset = (w.tail + self.pending) & (_QUEUE_BYTES - 1)
        need = size if offset + size <= _QUEUE_BYTES else size + (_QUEUE_BYTES - offset)
        if w.tail + self.pending + need - self.head_seen > _QUEUE_BYTES:
            self._wait_for_room(need)
        if offset + size > _QUEUE_BYTES:
            (<_Record*>(w.buf + offset)).type = _REC_WRAP
            self.pending += _QUEUE_BYTES - offset
            offset = 0
        self.pending += size
        return w.buf + offset

    cdef int _wait_for_room(self, size_t need) except -1:
        cdef _Worker* w = self.w
        self.publish(True)
        with nogil:
            pthread_mutex_lock(&w.mutex)
            while w.tail + need - w.head > _QUEUE_BYTES and not w.failed:
                w.waiters += 1
                pthread_cond_wait(&w.done, &w.mutex)
                w.waiters -= 1
            self.head_seen = w.head
            pthread_mutex_unlock(&w.mutex)
        return self._check()

    cdef int publish(self, bint wake) except -1:
        """The records written so far to the thread: woken if asleep and ``wake`` or enough is queued."""
        cdef _Worker* w = self.w
        if not self.pending:
            return 0
        if not self.started:
            self.forks = _forks
            if pthread_create(&self.thread, NULL, _run, w) != 0:
                raise RuntimeError("the cache analytics' thread could not be started")
            self.started = True
        self._check()
        pthread_mutex_lock(&w.mutex)
        w.tail += self.pending
        self.pending = 0
        if w.sleeping and (wake or w.tail - w.head >= _WAKE_BYTES):
            pthread_cond_signal(&w.wake)
        self.head_seen = w.head
        pthread_mutex_unlock(&w.mutex)
        return 0

    cdef int flush(self) except -1:
        """Return once the thread has applied every record made: the tables are the reader's until
        the next record is published (the thread touches nothing while the queue is empty)."""
        cdef _Worker* w = self.w
        self.publish(True)
        if not self.started:
            return 0
        self._check()
        with nogil:
            pthread_mutex_lock(&w.mutex)
            while w.head != w.tail and not w.failed:
                w.waiters += 1
                if w.sleeping:
                    pthread_cond_signal(&w.wake)
                pthread_cond_wait(&w.done, &w.mutex)
                w.waiters -= 1
            pthread_mutex_unlock(&w.mutex)
        return self._check()


# --- the readers' views --------------------------------------------------------------------------

cdef object _key_object(_Engine engine, uint8_t kind, uint64_t word, const unsigned char* blob):
    """The hash an entry's key stands for, as the reference's table holds it (equal, same type)."""
    if kind == _INT:
        return u64_long(word)
    if kind == _NEG:
        return negative_long(word)
    if kind == _BYTES:
        return PyBytes_FromStringAndSize(<const char*>blob, CONTENT)
    return engine.others[word]


cdef class _Entries:
    """A stats' sampled blocks stored (or evicted), read as the reference's ``OrderedDict`` of hash
    to time reads: ``len``, iteration in order, ``items``, ``keys``, ``values``, ``in``."""

    cdef _Stats stats
    cdef bint evicted

    cdef Ordered* _table(self) except NULL:
        self.stats.engine.flush()
        return &self.stats.tier.evicted if self.evicted else &self.stats.tier.stored

    def __len__(self):
        return self._table().n

    def items(self):
        cdef Ordered* o = self._table()
        cdef size_t i
        out = []
        for i in range(o.head, o.tail):
            if o.kinds[i] != ORDERED_DEAD:
                out.append((_key_object(self.stats.engine, o.kinds[i], o.words[i], o.blobs + i * CONTENT if o.blobs is not NULL else NULL), o.values[i]))
        return out

    def keys(self):
        return [key for key, _ in self.items()]

    def values(self):
        return [value for _, value in self.items()]

    def __iter__(self):
        return iter(self.keys())

    def __contains__(self, h):
        cdef Ordered* o = self._table()
        cdef Key k
        _key_of(h, &k)
        if k.kind == _OTHER:
            return h in self.keys()
        return ordered_find(o, &k) >= 0

    def __repr__(self):
        return repr(_OrderedDict(self.items()))  # the reference's, as this Python writes it


cdef class _Stats:
    """One stream's tier, read as the reference's :class:`TierStats` reads (its fields, its
    ``lifetime_quantile`` and ``to_json``): from the thread's C state, once it has caught up."""

    cdef _Engine engine
    cdef _Tier* tier
    cdef readonly object key  # (stream, tier)

    @property
    def stored_at(self):
        entries = _Entries()
        entries.stats, entries.evicted = self, False
        return entries

    @property
    def evicted_at(self):
        entries = _Entries()
        entries.stats, entries.evicted = self, True
        return entries

    # the counts, each read once the thread has applied every record queued
    buckets = property(lambda self: _counts_of(self)[0])
    lifetimes = property(lambda self: _counts_of(self)[1])
    lifetime_sum = property(lambda self: _counts_of(self)[2])
    evictions = property(lambda self: _counts_of(self)[3])
    refetches = property(lambda self: _counts_of(self)[4])

    def _counts(self):
        """The reference's stats with these counts (its tables left empty): its methods, reused."""
        buckets, lifetimes, lifetime_sum, evictions, refetches = _counts_of(self)
        return _TierStats(
            buckets=buckets, lifetimes=lifetimes, lifetime_sum=lifetime_sum, evictions=evictions, refetches=refetches
        )

    def lifetime_quantile(self, q):
        return self._counts().lifetime_quantile(q)

    def to_json(self):
        return self._counts().to_json()

    def __repr__(self):
        return (
            f"TierStats(stored_at={self.stored_at!r}, evicted_at={self.evicted_at!r}, buckets={self.buckets!r}, "
            f"lifetimes={self.lifetimes!r}, lifetime_sum={self.lifetime_sum!r}, evictions={self.evictions!r}, "
            f"refetches={self.refetches!r})"
        )


def _counts_of(_Stats stats):
    """(buckets, lifetimes, lifetime_sum, evictions, refetches) of ``stats``' tier, once the thread
    has applied every record queued."""
    stats.engine.flush()
    cdef _Tier* t = stats.tier
    return [t.buckets[i] for i in range(_NBOUNDS + 1)], t.lifetimes, t.lifetime_sum, t.evictions, t.refetches


cdef class _Route:
    """A cached route (the public ``routes`` entry's normalised medium and tier) with its stats."""

    cdef object medium, tier
    cdef _Stats stats

    def __cinit__(self, medium, tier, _Stats stats):
        self.medium = medium
        self.tier = tier
        self.stats = stats


# --- the pass ------------------------------------------------------------------------------------

cdef class AnalyticsPass:
    """The analytics' state and the pass over each batch: see the reference's docstring. The bounds
    and the window are fixed once made (the thread reads them)."""

    cdef readonly object refetch_window
    cdef readonly Py_ssize_t max_tracked, max_roots, max_routes
    cdef public dict roots, routes
    cdef dict _tiers  # (stream, tier): its _Stats
    cdef list _views  # the _Stats by their tier's id
    cdef dict _routes  # (stream, raw medium): a _Route, beside each of ``routes``
    cdef _Engine _engine
    cdef dict _other_ids  # a hash of kind _OTHER: its number (the engine's ``others`` the other way)
    cdef uint64_t _next_other
    cdef Py_ssize_t _others_limit
    # the last route ``_routes`` gave, and its key's two objects: a batch's stream and medium are
    # nearly always the previous batch's (the same objects), and ``_routes`` is only added to
    cdef object _last_stream, _last_medium
    cdef _Route _last_routed

    def __init__(
        self,
        refetch_window=REFETCH_WINDOW_SECONDS,
        Py_ssize_t max_tracked=MAX_TRACKED,
        Py_ssize_t max_roots=MAX_ROOTS,
        Py_ssize_t max_routes=MAX_ROUTES,
    ):
        self.refetch_window = refetch_window
        self.max_tracked = max_tracked
        self.max_roots = max_roots
        self.max_routes = max_routes
        self._engine = _Engine(float(refetch_window), max_tracked)
        self._tiers = {}
        self._views = []
        self.roots = {}
        self.routes = {}
        self._routes = {}
        self._other_ids = {}
        self._next_other = 0
        self._others_limit = 65536
        self._last_stream = self._last_medium = self._last_routed = None

    @property
    def tiers(self):
        self._engine.flush()
        return self._tiers

    @property
    def counted(self):
        cdef _Worker* w = self._engine.w
        cdef size_t i
        self._engine.flush()
        counted = {}
        for i in range(w.ncounted):
            stats = self._views[w.counted[i].id]
            counted[stats.key] = stats
        return counted

    def tier(self, stream, tier):
        return self._tier(stream, tier)

    cdef _Stats _tier(self, object stream, object tier):
        cdef _Stats stats = self._tiers.get((stream, tier))
        if stats is None:
            stats = _Stats()
            stats.engine = self._engine
            stats.tier = self._engine.new_tier(len(self._views))
            self._views.append(stats)
            stats.key = (stream, tier)
            self._tiers[(stream, tier)] = stats
        return stats

    def follow(self, entry):
        record = entry.record
        if type(record) is _BatchRecord:
            batch = field(record, _BatchRecord, _RECORD_BATCH, "batch")
            self._apply(
                field(record, _BatchRecord, _RECORD_STREAM, "stream"),
                field(batch, _Batch, _BATCH.events, "events"),
                field(batch, _Batch, _BATCH.ts, "ts"),
            )
        elif type(record) is _NoticeRecord and record.kind == "restart":
            self._forget(record.stream)

    def route(self, stream, medium):
        return self._route(stream, medium)

    cdef tuple _route(self, object stream, object medium):
        route = self.routes.get((stream, medium))
        if route is None:
            tier = medium_tier(medium)
            route = (normalise_medium(medium), tier, self._tier(stream, tier))
            if len(self.routes) < self.max_routes:
                self.routes[(stream, medium)] = route
        return route

    cdef _Route _routed(self, object stream, object medium):
        """:meth:`route`'s answer with the tier's stats, cached beside ``routes`` (as it is)."""
        if self._last_routed is not None and stream is self._last_stream and medium is self._last_medium:
            return self._last_routed  # what ``_routes`` answers the same two objects
        key = (stream, medium)
        cdef _Route routed = self._routes.get(key)
        if routed is None:
            route = self._route(stream, medium)
            routed = _Route(route[0], route[1], route[2])
            if key in self.routes:
                self._routes[key] = routed
            else:
                return routed  # not kept: made again next time, as the reference does
        self._last_stream, self._last_medium, self._last_routed = stream, medium, routed
        return routed

    def apply(self, stream, events, ts):
        self._apply(stream, events, ts)

    cdef int _apply(self, object stream, object events, object ts) except -1:
        cdef object seen = _UNSEEN  # the previous event's raw medium, whose route is ``routed``
        cdef _Route routed = None
        cdef double at = ts  # a float (the wire's), or what float() makes of it
        try:
            for event in events:
                kind = type(event)
                if kind is _BlockStored:
                    hashes = field(event, _BlockStored, _STORED.block_hashes, "block_hashes")
                    if not hashes:
                        continue
                    medium = field(event, _BlockStored, _STORED.medium, "medium")
                elif kind is _BlockRemoved:
                    hashes = field(event, _BlockRemoved, _REMOVED.block_hashes, "block_hashes")
                    medium = field(event, _BlockRemoved, _REMOVED.medium, "medium")
                else:
                    if kind is _AllBlocksCleared:
                        self._forget(stream)
                    continue
                if not (medium is seen or medium == seen):
                    routed = self._routed(stream, medium)
                    seen = medium
                if kind is _BlockRemoved:
                    if not hashes:
                        continue  # routed (its tier made, as the reference's), nothing to evict
                    self._queue(_REC_REMOVED, routed.stats.tier, at, False, hashes)
                    continue
                self._queue(_REC_STORED, routed.stats.tier, at, _followed_first(hashes), hashes)
                if field(event, _BlockStored, _STORED.parent_block_hash, "parent_block_hash") is None:
                    self._root(stream, routed.medium, hash_object(hashes, 0) if hash_count(hashes) > 0 else hashes[0])
        finally:
            self._engine.publish(False)
        return 0

    cdef int _queue(self, uint32_t type_, _Tier* tier, double ts, bint followed, object hashes) except -1:
        """An event's hashes into records for the thread (split every _CHUNK hashes)."""
        cdef Py_ssize_t n = hash_count(hashes), start, count, i
        cdef Hashes compact
        cdef uint32_t form
        cdef size_t each
        cdef _Record* r
        cdef unsigned char* data
        cdef Key k
        if n < 0:  # another iterable: as the list it holds
            hashes = list(hashes)
            n = len(hashes)
        if type(hashes) is Hashes:
            compact = <Hashes>hashes
            form = compact.form
            each = CONTENT if form == HASHES_BLOB else 8
        else:
            form = _FORM_KEYS
            each = _KEY_SIZE
            if len(self._other_ids) + n > self._others_limit:
                self._drop_unheld_others()  # before any record of the event: it waits for the queue
        start = 0
        while start < n:
            count = min(n - start, _CHUNK)
            r = <_Record*>self._engine.reserve(_aligned(sizeof(_Record) + count * each))
            r.type, r.n, r.tier, r.ts, r.form, r.followed = type_, <uint32_t>count, tier, ts, form, followed
            data = (<unsigned char*>r) + sizeof(_Record)
            if form != _FORM_KEYS:
                memcpy(data, compact.data + start * each, count * each)
            else:
                for i in range(count):
                    h = hashes[start + i]
                    _key_of(h, &k)
                    (<uint64_t*>data)[0] = self._number(h) if k.kind == _OTHER else k.key
                    (<uint64_t*>data)[1] = <uint64_t>k.kind
                    if k.kind == _BYTES:
                        memcpy(data + 16, k.data, CONTENT)
                    data += _KEY_SIZE
            start += count
        return 0

    cdef object _number(self, object h):
        """The number of ``h``, a hash of kind _OTHER (equal hashes, one number): the thread compares
        numbers where the reference compares objects. Numbers no table holds are dropped once there
        are many (:meth:`_drop_unheld_others`, between events)."""
        number = self._other_ids.get(h)
        if number is None:
            number = self._other_ids[h] = self._next_other
            self._engine.others[number] = h
            self._next_other += 1
        return number

    cdef int _drop_unheld_others(self) except -1:
        cdef Py_ssize_t t
        cdef size_t i
        cdef Ordered* o
        self._engine.flush()
        held = set()
        for t in range(2 * self._engine.ntiers):
            o = &self._engine.tiers[t // 2].evicted if t % 2 else &self._engine.tiers[t // 2].stored
            for i in range(o.head, o.tail):
                if o.kinds[i] == _OTHER:
                    held.add(o.words[i])
        others = self._engine.others
        self._engine.others = {number: others[number] for number in held}
        self._other_ids = {h: number for number, h in self._engine.others.items()}
        self._others_limit = max(65536, 2 * len(held))
        return 0

    cdef int _root(self, object stream, object medium, object h) except -1:
        roots = self.roots.get(stream)
        if roots is None:
            roots = self.roots[stream] = _OrderedDict()
        key = (medium, h)
        roots[key] = None
        roots.move_to_end(key)
        if len(roots) > self.max_roots:
            roots.popitem(False)
        return 0

    def forget(self, stream):
        """The engine's cache is gone (restart, AllBlocksCleared): its blocks died unobserved."""
        self._forget(stream)
        self._engine.publish(False)

    cdef int _forget(self, object stream) except -1:
        cdef _Stats stats
        cdef _Record* r
        for (key, tier), stats in self._tiers.items():
            if key == stream:
                r = <_Record*>self._engine.reserve(sizeof(_Record))
                r.type, r.n, r.tier, r.ts, r.form, r.followed = _REC_CLEAR, 0, stats.tier, 0.0, 0, 0
        return 0
