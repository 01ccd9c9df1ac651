"""wireproto.pipeline.decode: capture records into analysis columns, with no Spark and no JVM."""

from __future__ import annotations

from pathlib import Path

import pytest

from wireproto import capture
from wireproto.codecs import nydus, phyllo, subble, ubre, websmq
from wireproto.pipeline.decode import Decoded, decode_message, decode_record

WEBSMQ, UBRE, NYDUS, SUBBLE, PHYLLO = (
    capture.PROTOCOLS[name] for name in ("websmq", "ubre", "nydus", "subble", "phyllo"))
IN, OUT = capture.Kind.IN, capture.Kind.OUT


def ok(message_type: str, topic: str | None, request_id: str | None, size: int) -> Decoded:
    return Decoded(message_type, topic, request_id, size, None)


@pytest.mark.parametrize(("protocol", "kind", "data", "binary", "expected"), [
    (WEBSMQ, IN, websmq.encode(websmq.Publish("sensors/dev1", b"21.5")), True,
     ok("publish", "sensors/dev1", None, 4)),
    (WEBSMQ, IN, websmq.encode(websmq.Subscribe("sensors/+")), True,
     ok("subscribe", "sensors/+", None, 0)),
    (WEBSMQ, IN, websmq.encode(websmq.Unsubscribe("a/b")), True, ok("unsubscribe", "a/b", None, 0)),
    (WEBSMQ, IN, websmq.encode(websmq.LastWill("gone", b"bye!")), True,
     ok("last_will", "gone", None, 4)),
    (UBRE, IN, ubre.encode(ubre.Request(7, {"a": 2, "b": 3}, name="add")), False,
     ok("request", "add", "7", len(b'{"a":2,"b":3}'))),
    (UBRE, OUT, ubre.encode(ubre.Success(7, 5)), False, ok("success", None, "7", 1)),
    (UBRE, OUT, ubre.encode(ubre.Fail("x9", {"error": "no"})), False,
     ok("fail", None, "x9", len(b'{"error":"no"}'))),
    (UBRE, IN, ubre.encode(ubre.Request("r1", b"xyz"), binary=True), True,
     ok("request", None, "r1", 3)),
    (UBRE, OUT, ubre.encode(ubre.Success("r1"), binary=True), True, ok("success", None, "r1", 0)),
    (UBRE, IN, ubre.encode(ubre.Publish("t/1", "héllo")), False,
     ok("publish", "t/1", None, len('"héllo"'.encode()))),
    (UBRE, IN, ubre.encode(ubre.Subscribe("t/+"), binary=True), True,
     ok("subscribe", "t/+", None, 0)),
    (NYDUS, IN, nydus.encode(nydus.Invoke("abc", "/sensors/dev1", {"x": 1})).encode(), False,
     ok("invoke", "/sensors/dev1", "abc", len(b'{"x":1}'))),
    (NYDUS, OUT, nydus.encode(nydus.Result("abc", [1, 2])).encode(), False,
     ok("result", None, "abc", 5)),
    (NYDUS, OUT, nydus.encode(nydus.Error("abc", {"message": "no"})).encode(), False,
     ok("error", None, "abc", len(b'{"message":"no"}'))),
    (NYDUS, OUT, nydus.encode(nydus.Result("q")).encode(), False, ok("result", None, "q", 0)),
    (NYDUS, OUT, nydus.encode(nydus.Publish("/a b|c", "é")).encode(), False,
     ok("publish", "/a b|c", None, len('"é"'.encode()))),
    (NYDUS, OUT, b"0|3", False, ok("welcome", None, None, 1)),
    (SUBBLE, IN, subble.encode(subble.ProduceEvent(
        "c1", subble.SerializationFormat.JSON, "temp", b'{"v":1}')), True,
     ok("produce_event", "temp", None, 7)),
    (SUBBLE, OUT, subble.encode(subble.Event(
        subble.MessageCode.CLIENT_EVENT, subble.SerializationFormat.MSGPACK, 1_700_000_000_000,
        "temp", "guid-1", "c1", b"\x01\x02")), True, ok("event", "temp", None, 2)),
    (SUBBLE, IN, subble.encode(subble.HandshakeRequest(subscribe=("temp",))), True,
     ok("handshake_request", None, None, 0)),
    (SUBBLE, OUT, subble.encode(subble.HandshakeResponse(subble.MessageCode.OK)), True,
     ok("handshake_response", None, None, 0)),
    (PHYLLO, IN, phyllo.encode(phyllo.PubSubMessage(0x40, b"dev1/t", b"abc")), True,
     ok("document", "dev1/t", None, 3)),
])
def test_messages_decode_into_columns(protocol: int, kind: int, data: bytes, binary: bool,
                                      expected: Decoded) -> None:
    assert decode_message(protocol, kind, data, binary) == expected


def test_subble_decodes_by_sender() -> None:
    # Code 27 is a produce event from a client and an event from the host: the direction says.
    produce = subble.encode(subble.ProduceEvent("c1", 0, "temp", b"\x01"))
    assert decode_message(SUBBLE, IN, produce, True).message_type == "produce_event"
    wrong = decode_message(SUBBLE, OUT, produce, True)
    assert wrong.message_type is None and wrong.decode_error is not None


def test_open_and_close_records() -> None:
    for protocol in (0, WEBSMQ, UBRE, 99):
        assert decode_message(protocol, capture.Kind.OPEN, b'{"peer":"x"}', False) == Decoded(
            "open", None, None, 0, None)
        assert decode_message(protocol, capture.Kind.CLOSE, b"{}", False) == Decoded(
            "close", None, None, 0, None)


@pytest.mark.parametrize(("protocol", "data", "binary", "error"), [
    (WEBSMQ, b"\x00", True, "TruncatedFrame: "),
    (WEBSMQ, b"\x00\x09ab", True, "TruncatedFrame: "),
    (WEBSMQ, b"\x00\x02a#", True, "InvalidTopic: "),
    (WEBSMQ, b"", True, "TruncatedFrame: "),
    (UBRE, b"{not json", False, "BadJSON: "),
    (UBRE, b'{"hello": 1}', False, "UnknownType: "),
    (UBRE, b"R\x00\x02", True, "TruncatedFrame: "),
    (UBRE, b"R\x00\x00\x00\x00\x00\x00", False, "BadJSON: "),  # binary type in a text frame
    (UBRE, b"", False, ""),
    (NYDUS, b"9|", False, "UnknownType: "),
    (NYDUS, b"1$a", False, "TruncatedFrame: "),
    (NYDUS, b"\xff\xfe", False, "BadEncoding: "),
    (SUBBLE, b"", True, "TruncatedFrame: "),
    (SUBBLE, b"\x63", True, "UnknownType: "),
    (PHYLLO, b"\x00\x01\x00", True, ""),
    (0, b"anything", True, "unknown protocol code 0"),
    (42, b"anything", True, "unknown protocol code 42"),
])
def test_a_malformed_message_never_raises(protocol: int, data: bytes, binary: bool,
                                          error: str) -> None:
    for kind in (IN, OUT):
        decoded = decode_message(protocol, kind, data, binary)
        assert decoded.message_type is None and decoded.topic is None
        assert decoded.request_id is None and decoded.body_size is None
        assert decoded.decode_error and decoded.decode_error.startswith(error), decoded


def test_decode_records_of_a_capture_file(tmp_path: Path) -> None:
    clock = iter(range(1_700_000_000_000_000_000, 1_800_000_000_000_000_000, 1000))
    with capture.CaptureWriter(tmp_path, clock=lambda: next(clock)) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "ws")
        writer.message(1, "in", websmq.encode(websmq.Publish("t", b"12345")), True)
        writer.message(1, "in", b"\xc0", True)
        writer.open_connection(2, "127.0.0.1:5001", "ubre", "ws")
        writer.message(2, "in", ubre.encode(ubre.Request(1, 2, name="double")), False)
        writer.message(2, "out", ubre.encode(ubre.Success(1, 4)), False)
        writer.message(2, "out", capture.encode_batch([ubre.encode(ubre.Success(2, 6)),
                                                       ubre.encode(ubre.Fail(3, "no"))]),
                       False, batch=True)
        writer.message(2, "out", b"\x00\x00\x00\x09abc", False, batch=True)  # does not split
        writer.close_connection(2, "done")
        writer.close_connection(1)
    (path,) = capture.capture_files(tmp_path)
    rows = [row for record in capture.iter_records(path) for row in decode_record(record)]
    assert [row.message_type for row in rows] == [
        "open", "publish", None, "open", "request", "success", "success", "fail", None, "close",
        "close"]
    assert [row.request_id for row in rows[6:8]] == ["2", "3"]
    assert rows[8].decode_error.startswith("CorruptCapture: batch record")
    assert rows[1] == ok("publish", "t", None, 5)
    assert rows[2].decode_error.startswith("TruncatedFrame: ")
    assert rows[4].request_id == rows[5].request_id == "1"
    assert rows[4].topic == "double"


def test_cluster_calls_decode_as_calls_and_replies() -> None:
    from wireproto.cluster.callcapture import NO_RESPONDERS, encode_nats_message
    from wireproto.cluster.calls import BUSY

    code = capture.PROTOCOLS["cluster"]
    call = encode_nats_message("wireproto.call.ubre.add", "_INBOX.ab.7", None, b"12345")
    assert decode_message(code, capture.Kind.OUT, call, True) == Decoded(
        "call", "wireproto.call.ubre.add", "_INBOX.ab.7", 5, None)
    reply = encode_nats_message("_INBOX.ab.7", None, None, b"42")
    assert decode_message(code, capture.Kind.IN, reply, True) == Decoded(
        "reply", None, "_INBOX.ab.7", 2, None)
    for headers in (NO_RESPONDERS, BUSY):
        refused = encode_nats_message("_INBOX.ab.8", None, headers, b"")
        assert decode_message(code, capture.Kind.IN, refused, True).message_type == "refused"
    broken = decode_message(code, capture.Kind.IN, b"\x93\x01\x02\x03", True)
    assert broken.message_type is None and broken.decode_error.startswith("ValueError")
