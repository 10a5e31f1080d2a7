# cython: language_level=3
"""The compiled twin of :mod:`kvgateway.engine._receive_py` (the same API: ``receiver(sock)``): one
whole ZeroMQ message taken from a socket without blocking, each frame straight from libzmq into a
``bytes``.

pyzmq takes a frame as a ``zmq.Frame`` made in Python (then copied into ``bytes``), or copies it
but cannot say whether more frames follow without ``getsockopt(RCVMORE)``, which converts the
option to its enum first: 2.5-4 us an engine's three-frame message (the reference takes
Frames). Here each frame is ``zmq_msg_recv`` into a message on the C stack, ``zmq_msg_more`` and
one ``bytes``: 0.2-0.3 of the reference's time. The GIL is kept: a receive that does not block
does not wait.

No header and no link: the functions are those of the libzmq pyzmq runs on, looked up at import
through pyzmq's own extension (:func:`_functions`), and the socket is pyzmq's (its
``underlying`` handle, used only while pyzmq has not closed it). When they cannot be had that
way, importing this module raises ImportError and the pure-Python receive runs
(kvgateway.runtime.extensions.load)."""

import ctypes
import os

import zmq

from libc.stdint cimport uintptr_t
from libc.errno cimport EAGAIN, EINTR
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.list cimport PyList_Append

cdef extern from *:
    """
    /* zmq_msg_t as zmq.h lays it out: 64 bytes, aligned as a pointer. */
    typedef union { unsigned char bytes_[64]; void *align_; } kvg_zmq_msg;
    typedef int (*kvg_msg_fn)(kvg_zmq_msg *);
    typedef int (*kvg_msg_recv_fn)(kvg_zmq_msg *, void *, int);
    typedef void *(*kvg_msg_data_fn)(kvg_zmq_msg *);
    typedef size_t (*kvg_msg_size_fn)(const kvg_zmq_msg *);
    typedef int (*kvg_msg_more_fn)(const kvg_zmq_msg *);
    typedef int (*kvg_errno_fn)(void);
    """
    ctypedef struct kvg_zmq_msg:
        pass
    ctypedef int (*kvg_msg_fn)(kvg_zmq_msg *) noexcept nogil
    ctypedef int (*kvg_msg_recv_fn)(kvg_zmq_msg *, void *, int) noexcept nogil
    ctypedef void *(*kvg_msg_data_fn)(kvg_zmq_msg *) noexcept nogil
    ctypedef size_t (*kvg_msg_size_fn)(const kvg_zmq_msg *) noexcept nogil
    ctypedef int (*kvg_msg_more_fn)(const kvg_zmq_msg *) noexcept nogil
    ctypedef int (*kvg_errno_fn)() noexcept nogil

cdef int DONTWAIT = 1  # ZMQ_DONTWAIT

cdef kvg_msg_fn msg_init
cdef kvg_msg_fn msg_close
cdef kvg_msg_recv_fn msg_recv
cdef kvg_msg_data_fn msg_data
cdef kvg_msg_size_fn msg_size
cdef kvg_msg_more_fn msg_more
cdef kvg_errno_fn zmq_errno_fn


FUNCTIONS = ("zmq_msg_init", "zmq_msg_close", "zmq_msg_recv", "zmq_msg_data", "zmq_msg_size", "zmq_msg_more", "zmq_errno")


def _functions():
    """The addresses of :data:`FUNCTIONS` in the libzmq pyzmq's extension runs on; ImportError
    when they cannot be had from it."""
    from zmq.backend.cython import _zmq

    try:
        # The extension already loaded, never another copy; a symbol looked up through it is the
        # one it uses (its own, or that of the library it links, searched after it).
        extension = ctypes.CDLL(_zmq.__file__, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        addresses = [ctypes.cast(getattr(extension, name), ctypes.c_void_p).value for name in FUNCTIONS]
        major, minor, patch = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        extension.zmq_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
    except (AttributeError, OSError) as exc:
        raise ImportError(f"libzmq's functions are not reachable through pyzmq: {exc}") from exc
    if (major.value, minor.value, patch.value) != zmq.zmq_version_info() or not all(addresses):
        raise ImportError("the libzmq found through pyzmq is not the one it reports")
    return addresses


def _bind():
    global msg_init, msg_close, msg_recv, msg_data, msg_size, msg_more, zmq_errno_fn
    addresses = _functions()
    msg_init = <kvg_msg_fn><uintptr_t>addresses[0]
    msg_close = <kvg_msg_fn><uintptr_t>addresses[1]
    msg_recv = <kvg_msg_recv_fn><uintptr_t>addresses[2]
    msg_data = <kvg_msg_data_fn><uintptr_t>addresses[3]
    msg_size = <kvg_msg_size_fn><uintptr_t>addresses[4]
    msg_more = <kvg_msg_more_fn><uintptr_t>addresses[5]
    zmq_errno_fn = <kvg_errno_fn><uintptr_t>addresses[6]


_bind()


def _error(int err):
    """What pyzmq raises for ``err`` from a receive."""
    if err == EAGAIN:
        return zmq.Again(err)
    if err == zmq.ETERM:
        return zmq.ContextTerminated(err)
    return zmq.ZMQError(err)


cdef class Receiver:
    """Receives one whole message from ``sock`` without blocking: its frames, or None when no
    message is queued. Raises what pyzmq's receive raises (a closed socket, a terminated context)."""

    cdef object _sock
    cdef void *_handle

    def __cinit__(self, sock):
        self._sock = sock
        self._handle = <void *><uintptr_t>sock.underlying

    def __call__(self):
        cdef kvg_zmq_msg msg
        cdef int err, more
        cdef list frames
        cdef object data
        if self._sock._closed:
            raise zmq.ZMQError(zmq.ENOTSOCK)
        frames = []
        while True:
            msg_init(&msg)
            while msg_recv(&msg, self._handle, DONTWAIT) < 0:
                err = zmq_errno_fn()
                if err == EINTR:
                    continue
                msg_close(&msg)
                if err == EAGAIN and not frames:
                    return None
                raise _error(err)
            more = msg_more(&msg)
            try:
                data = PyBytes_FromStringAndSize(<char *>msg_data(&msg), <Py_ssize_t>msg_size(&msg))
            finally:
                msg_close(&msg)
            PyList_Append(frames, data)
            if not more:
                return frames


def receiver(sock):
    """A function that receives one whole message from ``sock`` without blocking, None when none
    is queued (:func:`kvgateway.engine._receive_py.receiver`)."""
    return Receiver(sock)
