"""Capture files: every message a broker sees, in append-only, rotated, self-describing files.

docs/pipeline.md, "Capture files", describes the format. Its parts:

- `format`: the file header, records and batches, encoded and decoded (sans-IO);
- `reader`: reading files, stopping cleanly at a torn last record;
- `walk`: a capture as both replays read it (its files found and ordered, records read with
  plain reads, a file that ends early said), a bounded amount of work at a time;
- `log`: the writers' sans-IO core, which batches records and cuts them into chunks for files;
- `writer`: `CaptureWriter` and `ThreadedCaptureWriter`, which rotate files;
- `wrapper`: the broker's side, which wraps each connection's protocol and transport and writes
  what crosses them.

The names below are the format's, the reader's and the writer's public API.
"""

from wireproto.capture.format import (
    CONFIG_FILE_BYTES,
    DEFAULT_MAX_FILE_BYTES,
    FLAG_BATCH,
    FLAG_BINARY,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    MAX_FILE_BYTES,
    MIN_FILE_BYTES,
    PROTOCOLS,
    RECORD_FIELDS,
    RECORD_HEADER,
    TRANSPORTS,
    CaptureError,
    CaptureHeader,
    CorruptCapture,
    IncompleteCapture,
    Kind,
    NotACapture,
    Record,
    count_messages,
    decode_file_header,
    decode_record,
    encode_batch,
    encode_file_header,
    encode_record,
    record_messages,
)
from wireproto.capture.reader import (
    Batch,
    Scan,
    Segment,
    capture_files,
    iter_records,
    ranges_from_boundaries,
    read_batch,
    read_batch_from,
    read_header,
    scan_offsets,
    segments,
    split_ranges,
)
from wireproto.capture.writer import (
    DEFAULT_FILE_MODE,
    CaptureCounters,
    CaptureSettings,
    CaptureWriter,
    ThreadedCaptureWriter,
)

__all__ = [
    "MAGIC",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "RECORD_HEADER",
    "RECORD_FIELDS",
    "Kind",
    "PROTOCOLS",
    "TRANSPORTS",
    "FLAG_BINARY",
    "FLAG_BATCH",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_FILE_MODE",
    "CaptureSettings",
    "CONFIG_FILE_BYTES",
    "MIN_FILE_BYTES",
    "MAX_FILE_BYTES",
    "CaptureError",
    "NotACapture",
    "IncompleteCapture",
    "CorruptCapture",
    "CaptureHeader",
    "Record",
    "Scan",
    "Batch",
    "Segment",
    "CaptureCounters",
    "encode_file_header",
    "decode_file_header",
    "encode_record",
    "decode_record",
    "record_messages",
    "count_messages",
    "encode_batch",
    "read_header",
    "iter_records",
    "scan_offsets",
    "segments",
    "split_ranges",
    "ranges_from_boundaries",
    "read_batch",
    "read_batch_from",
    "capture_files",
    "CaptureWriter",
    "ThreadedCaptureWriter",
]
