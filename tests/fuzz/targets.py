"""One fuzz target per decoder: each takes arbitrary input and may only return a value or raise
`wireproto.errors.ProtocolError`. Anything else (a ValueError, a KeyError, a recursion error) is
a defect the fuzzer reports.

A target takes bytes; `str` decoders get text drawn from them by atheris (`run.py`), which
reaches non-ASCII and surrogate-free Unicode far more often than decoding random bytes would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wireproto.codecs import engineio, nats, nydus, phyllo, subble, ubre, websmq, wpheader
from wireproto.codecs.phyllo import MINIMAL, REDUCED, ChunkSplitter, StackDecoder


@dataclass(frozen=True)
class Target:
    decode: Callable[[Any], Any]
    # "bytes": the raw input; "text": Unicode drawn from it.
    takes: str = "bytes"


def _phyllo_document(data: bytes) -> Any:
    return phyllo.deserialize(phyllo.decode_document(data))


def _phyllo_stream(stack: Any) -> Callable[[bytes], Any]:
    def feed(data: bytes) -> Any:
        return StackDecoder(stack).feed(data)

    return feed


def _chunks(data: bytes) -> Any:
    return ChunkSplitter().feed(data)


def _nats_stream(data: bytes) -> Any:
    """The bytes after the first fed in two reads, cut where the first says; the same bytes
    decoded whole must give the same events (an AssertionError is a finding too)."""
    cut, stream = (data[0], data[1:]) if data else (0, b"")
    decoder = nats.Decoder(max_control_line=64, max_payload=256)
    events = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
    whole = nats.decode(stream)
    assert events == whole, (events, whole)
    return events


def _wpheader(data: bytes) -> Any:
    """A header block that holds a Wp line (the rest of the input), its encodings split off a
    payload of the same bytes."""
    header = wpheader.decode(b"NATS/1.0\r\nWp: " + data)
    return header if header is None else wpheader.split(header.carried, data)


TARGETS: dict[str, Target] = {
    "websmq": Target(websmq.decode),
    "ubre": Target(ubre.decode),
    "ubre-json": Target(ubre.decode_json, "text"),
    "subble-from-client": Target(lambda data: subble.decode(data, sender="client")),
    "subble-from-server": Target(lambda data: subble.decode(data, sender="server")),
    "nydus": Target(nydus.decode, "text"),
    "nydus-bytes": Target(nydus.decode),
    "engineio-packet": Target(engineio.decode_packet, "text"),
    "engineio-payload": Target(engineio.decode_payload),
    "engineio-payload-text": Target(engineio.decode_payload, "text"),
    "engineio-handshake": Target(engineio.decode_handshake, "text"),
    "phyllo": Target(phyllo.decode),
    "phyllo-reduced": Target(REDUCED.decode),
    "phyllo-frame": Target(phyllo.decode_frame),
    "phyllo-datagram": Target(phyllo.decode_datagram),
    "phyllo-validated-datagram": Target(phyllo.decode_validated_datagram),
    "phyllo-message": Target(phyllo.decode_message),
    "phyllo-document": Target(_phyllo_document),
    "phyllo-chunks": Target(_chunks),
    "phyllo-reduced-stream": Target(_phyllo_stream(REDUCED)),
    "phyllo-minimal-stream": Target(_phyllo_stream(MINIMAL)),
    "nats": Target(_nats_stream),
    "wpheader": Target(_wpheader),
}
