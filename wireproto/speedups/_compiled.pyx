# cython: language_level=3, boundscheck=False, wraparound=False
"""The fast path compiled (Cython): the twin of `_pure.py`, name for name, behaving the same
(tests/speedups holds them to it). docs/performance.md ("The compiled fast path") says what each
piece is for; the docstrings are in `_pure.py`."""

from twisted.logger import Logger

log = Logger(namespace="wireproto.speedups")

cdef Py_ssize_t _depth = 0
cdef list _dirty = []


cdef class Outbox:
    cdef object _write
    cdef list _pending

    def __init__(self, write):
        self._write = write
        self._pending = []

    cpdef write(self, prepared):
        if _depth == 0:
            self._write(prepared)
            return
        if not self._pending:
            _dirty.append(self)
        self._pending.append(prepared)

    cpdef flush(self):
        cdef list pending = self._pending
        if pending:
            self._pending = []
            if len(pending) == 1:
                self._write(pending[0])
            else:
                self._write(b"".join(pending))

    cpdef discard(self):
        self._pending = []

    @property
    def waiting(self):
        cdef Py_ssize_t total = 0
        for data in self._pending:
            total += len(<bytes>data)
        return total


def batch_begin():
    global _depth
    _depth += 1


def batch_end():
    global _depth, _dirty
    _depth -= 1
    if _depth or not _dirty:
        return
    cdef list dirty = _dirty
    _dirty = []
    cdef Outbox outbox
    for outbox in dirty:
        try:
            outbox.flush()
        except Exception:
            log.failure("writing a connection's waiting frames failed", event="write_failed")


def batching():
    return _depth > 0


def deliver_frames(targets, sender, dict cache):
    cdef Py_ssize_t delivered = 0
    cdef list rest = None
    cdef tuple prepared
    for subscriber in targets:
        if subscriber is sender:
            continue
        delivered += 1
        if subscriber.writes_now:
            prepared = cache.get(subscriber.frame_key) or subscriber.frame_from_cache(cache)
            if prepared is not None:
                subscriber.sent += 1
                subscriber.sent_bytes += prepared[1]
                subscriber.write_frame(prepared[0])
                continue
        if rest is None:
            rest = []
        rest.append(subscriber)
    return delivered, rest


def length32_deliver(bytes buffer, Py_ssize_t limit, deliver, reader):
    cdef const unsigned char* data = buffer
    cdef Py_ssize_t end = len(buffer)
    cdef Py_ssize_t offset = 0
    cdef Py_ssize_t frame_end
    cdef Py_ssize_t length
    while end - offset >= 4 and not reader.paused:
        length = ((<Py_ssize_t>data[offset] << 24) | (data[offset + 1] << 16)
                  | (data[offset + 2] << 8) | data[offset + 3])
        if length > limit:
            return offset, length
        frame_end = offset + 4 + length
        if frame_end > end:
            break
        message = buffer[offset + 4:frame_end]
        offset = frame_end
        deliver(message, True)
    return offset, -1


# -- readers: the lines and COBS cuts ------------------------------------------------------------

from libc.string cimport memchr, memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc


def lines_deliver(bytes buffer, Py_ssize_t limit, deliver, reader):
    cdef const unsigned char* data = buffer
    cdef Py_ssize_t end = len(buffer)
    cdef Py_ssize_t offset = 0
    cdef Py_ssize_t newline
    cdef Py_ssize_t stop
    cdef const unsigned char* found
    while not reader.paused:
        found = <const unsigned char*>memchr(data + offset, 10, end - offset)
        if found == NULL:
            if end - offset > limit + 1:
                return offset, end - offset
            break
        newline = found - data
        stop = newline - 1 if newline > offset and data[newline - 1] == 13 else newline
        if stop - offset > limit:
            return offset, stop - offset
        message = buffer[offset:stop]
        offset = newline + 1
        deliver(message, False)
    return offset, -1


COBS_TOO_LARGE = 1
COBS_UNDECODABLE = 2


cdef Py_ssize_t _cobs_decode(const unsigned char* data, Py_ssize_t start, Py_ssize_t stop,
                             unsigned char* out) noexcept:
    """Decode data[start:stop] (no zero byte in it) into `out`; its length, or -1 when a
    length code runs past the frame (as cobs.decode refuses it)."""
    cdef Py_ssize_t index = start
    cdef Py_ssize_t written = 0
    cdef Py_ssize_t group_end
    cdef unsigned char code
    while True:
        code = data[index]
        index += 1
        group_end = index + code - 1
        if group_end > stop:
            return -1
        memcpy(out + written, data + index, code - 1)
        written += code - 1
        index = group_end
        if index < stop:
            if code < 0xFF:
                out[written] = 0
                written += 1
        else:
            return written


def cobs_deliver(bytes buffer, Py_ssize_t max_frame, Py_ssize_t limit, deliver, reader):
    cdef const unsigned char* data = buffer
    cdef Py_ssize_t end = len(buffer)
    cdef Py_ssize_t offset = 0
    cdef Py_ssize_t zero
    cdef Py_ssize_t size
    cdef Py_ssize_t length
    cdef const unsigned char* found
    cdef unsigned char* scratch = NULL
    try:
        while not reader.paused:
            found = <const unsigned char*>memchr(data + offset, 0, end - offset)
            if found == NULL:
                if end - offset > max_frame:
                    return offset, COBS_TOO_LARGE, end - offset
                break
            zero = found - data
            size = zero - offset
            if size == 0:
                offset = zero + 1
                continue
            if size > max_frame:
                return offset, COBS_TOO_LARGE, size
            if scratch == NULL:  # a decoded frame is shorter than the read it came in
                scratch = <unsigned char*>PyMem_Malloc(end)
                if scratch == NULL:
                    raise MemoryError()
            length = _cobs_decode(data, offset, zero, scratch)
            if length < 0:
                return offset, COBS_UNDECODABLE, size
            if length > limit:
                return offset, COBS_TOO_LARGE, length
            message = PyBytes_FromStringAndSize(<char*>scratch, length)
            offset = zero + 1
            deliver(message, True)
        return offset, 0, 0
    finally:
        PyMem_Free(scratch)
