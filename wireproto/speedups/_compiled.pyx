# cython: language_level=3, boundscheck=False, wraparound=False
"""The fast path compiled (Cython): the twin of `_pure.py`, name for name, behaving the same
(tests/speedups holds them to it). docs/performance.md ("The compiled fast path") says what each
piece is for; the docstrings are in `_pure.py`."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memchr, memcpy
from twisted.logger import Logger

from wireproto.speedups._pure import FLUSH_AT

log = Logger(namespace="wireproto.speedups")

# The SHA-256 of this file as setup.py compiled it (empty when built another way): the facade
# runs the plain-Python twin instead of a build older than its source.
cdef extern from *:
    """
    #ifndef WIREPROTO_SOURCE_DIGEST
    #define WIREPROTO_SOURCE_DIGEST ""
    #endif
    """
    const char* WIREPROTO_SOURCE_DIGEST

SOURCE_DIGEST = WIREPROTO_SOURCE_DIGEST.decode("ascii")

cdef Py_ssize_t _depth = 0
cdef list _dirty = []


cdef Py_ssize_t _FLUSH_AT = FLUSH_AT  # the twin's bound, one for both


cdef class Outbox:
    cdef object _write
    cdef list _pending
    cdef Py_ssize_t _waiting
    cdef bint _listed
    cdef bint _closed

    def __init__(self, write):
        self._write = write
        self._pending = []
        self._waiting = 0
        self._listed = False
        self._closed = False

    cpdef write(self, prepared):
        if self._closed:
            return
        if _depth == 0:
            self._write(prepared)
            return
        self._pending.append(prepared)
        self._waiting += len(prepared)
        if not self._listed:
            self._listed = True
            _dirty.append(self)
        if self._waiting > _FLUSH_AT:
            self.flush()

    cpdef flush(self):
        cdef list pending = self._pending
        if pending:
            self._pending = []
            self._waiting = 0
            if len(pending) == 1:
                self._write(pending[0])
            else:
                self._write(b"".join(pending))

    cpdef discard(self):
        self._pending = []
        self._waiting = 0

    cpdef close(self):
        self.discard()
        self._closed = True

    @property
    def waiting(self):
        return self._waiting


def batch_begin():
    global _depth
    _depth += 1


def batch_end():
    global _depth
    if _depth <= 0:
        raise RuntimeError("batch_end without batch_begin")
    if _depth > 1 or not _dirty:
        _depth -= 1
        return
    cdef list dirty
    cdef Outbox outbox
    try:
        while _dirty:
            dirty = _dirty[:]
            del _dirty[:]
            for outbox in dirty:
                outbox._listed = False
                try:
                    outbox.flush()
                except Exception:
                    log.failure("writing a connection's waiting frames failed",
                                event="write_failed")
    finally:
        _depth -= 1


def batching():
    return _depth > 0


def deliver_frames(targets, sender, dict cache not None):
    cdef Py_ssize_t delivered = 0
    cdef list rest = None
    for subscriber in targets:
        if subscriber is sender:
            continue
        delivered += 1
        if subscriber.writes_now:
            prepared = cache.get(subscriber.frame_key) or subscriber.frame_from_cache(cache)
            if prepared is not None:
                frame, size = prepared
                subscriber.sent += 1
                subscriber.sent_bytes += size
                subscriber.write_frame(frame)
                continue
        if rest is None:
            rest = []
        rest.append(subscriber)
    return delivered, rest


def length32_deliver(bytes buffer not None, Py_ssize_t limit, deliver, reader):
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


# -- websocket: the frames of a WebSocket connection (wireproto/transports/websocket.py) --------

cdef class FrameGate:
    cdef object _write
    cdef public bint open

    def __init__(self, write):
        self._write = write
        self.open = True

    def write(self, prepared):
        if self.open:
            self._write(prepared)

    def close(self):
        self.open = False


def ws_frame(bytes payload not None, bint binary):
    cdef Py_ssize_t size = len(payload)
    cdef Py_ssize_t header = 2 if size < 126 else (4 if size < 0x10000 else 10)
    cdef bytes result = PyBytes_FromStringAndSize(NULL, header + size)
    cdef unsigned char* out = <unsigned char*>PyBytes_AS_STRING(result)
    cdef int shift
    out[0] = 0x82 if binary else 0x81
    if size < 126:
        out[1] = <unsigned char>size
    elif size < 0x10000:
        out[1] = 126
        out[2] = <unsigned char>(size >> 8)
        out[3] = <unsigned char>size
    else:
        out[1] = 127
        for shift in range(8):
            out[2 + shift] = <unsigned char>((<uint64_t>size) >> (56 - 8 * shift))
    if size:
        memcpy(out + header, PyBytes_AS_STRING(payload), size)
    return result


cdef bytes _unmask(const unsigned char* data, Py_ssize_t size, const unsigned char* mask):
    cdef bytes result = PyBytes_FromStringAndSize(NULL, size)
    cdef unsigned char* out = <unsigned char*>PyBytes_AS_STRING(result)
    cdef uint32_t key32
    cdef uint64_t key64, word
    cdef Py_ssize_t i = 0
    memcpy(&key32, mask, 4)
    key64 = (<uint64_t>key32 << 32) | key32
    while i + 8 <= size:
        memcpy(&word, data + i, 8)
        word ^= key64
        memcpy(out + i, &word, 8)
        i += 8
    while i < size:
        out[i] = data[i] ^ mask[i & 3]
        i += 1
    return result


def ws_unmask(bytes payload not None, bytes mask not None):
    if len(mask) != 4:
        raise ValueError("a WebSocket mask is four bytes")
    return _unmask(<const unsigned char*>PyBytes_AS_STRING(payload), len(payload),
                   <const unsigned char*>PyBytes_AS_STRING(mask))


def ws_deliver(bytes buffer not None, Py_ssize_t start, bint masked, Py_ssize_t limit,
               bint check_utf8, deliver, gate):
    cdef const unsigned char* data = <const unsigned char*>PyBytes_AS_STRING(buffer)
    cdef Py_ssize_t end = len(buffer)
    if start < 0 or start > end:  # never read outside the buffer
        raise ValueError(f"ws_deliver starts within its buffer of {end} bytes, not at {start}")
    cdef Py_ssize_t length, at, frame_end
    cdef unsigned char first, second
    cdef bytes payload
    while gate.open and end - start >= 2:
        first = data[start]
        if first != 0x82 and first != 0x81:
            break
        second = data[start + 1]
        if ((second & 0x80) != 0) != masked:
            break
        length = second & 0x7F
        at = start + 2
        if length == 126:
            if end - start < 4:
                break
            length = (<Py_ssize_t>data[at] << 8) | data[at + 1]
            if length < 126:
                break
            at += 2
        elif length == 127:
            break
        if limit and length > limit:
            break
        if masked:
            if at + 4 > end:
                break
            frame_end = at + 4 + length
            if frame_end > end:
                break
            payload = _unmask(data + at + 4, length, data + at)
        else:
            frame_end = at + length
            if frame_end > end:
                break
            payload = PyBytes_FromStringAndSize(<const char*>data + at, length)
        if first == 0x81 and check_utf8:
            try:
                PyUnicode_DecodeUTF8(PyBytes_AS_STRING(payload), length, NULL)
            except UnicodeDecodeError:
                break
        start = frame_end
        deliver(payload, first == 0x82)
    return start


# -- readers: the lines and COBS cuts ------------------------------------------------------------

def lines_deliver(bytes buffer not None, Py_ssize_t limit, deliver, reader):
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


def cobs_deliver(bytes buffer not None, Py_ssize_t max_frame, Py_ssize_t limit, deliver,
                 reader):
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
