"""Phyllo chunked stream (type 0x12): a byte stream cut into chunks by 0x00 delimiters.

The sender writes `00 chunk 00`: the leading delimiter ends whatever noise came before, so a
receiver that joins mid-stream resynchronises on the next message. A chunk holds no 0x00 (the
frame layer above COBS-encodes it). Empty chunks, as between two delimiters, are ignored.

A receiver's buffer is small: phyllo-cpp keeps at most 255 bytes of a chunk (127 on classic AVR,
80 on an Uno). `ChunkSplitter` drops a longer chunk up to the next delimiter and reports it.
"""

from __future__ import annotations

from wireproto.codecs.serialization import binary
from wireproto.errors import BadLength, FrameTooLarge, InvalidField, ProtocolError

__all__ = ["DELIMITER", "MAX_CHUNK_LENGTH", "ChunkSplitter", "encode_chunk"]

DELIMITER = b"\x00"
MAX_CHUNK_LENGTH = 255
"""phyllo-cpp's default chunk limit."""


def encode_chunk(chunk: bytes, max_length: int = MAX_CHUNK_LENGTH) -> bytes:
    """`00 chunk 00`, refusing a chunk the receiver would ignore, cut or misread."""
    if not chunk:
        raise BadLength("Phyllo chunk is empty: a receiver ignores empty chunks")
    if len(chunk) > max_length:
        raise FrameTooLarge(
            f"Phyllo chunk of {len(chunk)} bytes is over the {max_length}-byte limit"
        )
    zero = bytes(chunk).find(0)
    if zero >= 0:
        raise InvalidField(
            f"Phyllo chunk has a 0x00 at byte {zero}: chunks carry only non-null bytes "
            "(COBS-encode the frame first)",
            offset=zero,
        )
    return _delimit(chunk)


def _delimit(chunk: bytes) -> bytes:
    return b"".join((DELIMITER, chunk, DELIMITER))


class ChunkSplitter:
    """Incremental receiver: `feed()` bytes as they arrive, get the complete chunks back.

    `feed()` never raises on bad input. A chunk longer than `max_length` is dropped up to the
    next delimiter (that is the resync) and reported as a `FrameTooLarge` in `errors`, which
    holds the errors found during the latest `feed()` call (a new list each call). Good chunks
    before and after it in the same call are still returned. `offset` of an error is the
    position of the chunk's first byte in the whole stream fed so far.
    """

    __slots__ = ("max_length", "errors", "_partial", "_partial_start", "_dropping", "_fed")

    def __init__(self, max_length: int = MAX_CHUNK_LENGTH) -> None:
        if max_length < 1:
            raise ValueError(f"max_length must be at least 1, not {max_length}")
        self.max_length = max_length
        self.errors: list[ProtocolError] = []
        # Bytes of a chunk whose end delimiter has not come yet; a bytearray, so that a chunk
        # fed one byte at a time grows in linear time.
        self._partial = bytearray()
        self._partial_start = 0
        self._dropping = False  # inside an over-long chunk, waiting for its end delimiter
        self._fed = 0

    def feed(self, data: bytes) -> list[bytes]:
        self.errors = []
        if type(data) is not bytes:
            data = binary(data, "Phyllo chunked stream")
        parts = data.split(DELIMITER)
        tail = parts.pop()  # after the last delimiter: a chunk still incomplete
        chunks: list[bytes] = []
        at = self._fed  # stream position of the part being looked at
        if parts:
            head = parts[0]
            if self._dropping:
                self._dropping = False
                at += len(head) + 1
                del parts[0]
            elif self._partial:
                self._partial += head
                parts[0] = bytes(self._partial)
                at = self._partial_start
            self._partial.clear()
            max_length = self.max_length
            for part in parts:
                if len(part) > max_length:
                    self._report(at)
                elif part:
                    chunks.append(part)
                at += len(part) + 1
        if not self._dropping and tail:
            if not self._partial:
                self._partial_start = at
            self._partial += tail
            if len(self._partial) > self.max_length:
                self._report(self._partial_start)
                self._dropping = True
                self._partial.clear()
        self._fed += len(data)
        return chunks

    def _report(self, start: int) -> None:
        self.errors.append(
            FrameTooLarge(
                f"Phyllo chunk at stream byte {start} is longer than {self.max_length} bytes: "
                "dropped up to the next 0x00 delimiter",
                offset=start,
            )
        )
