"""wireproto.pipeline.values: the numeric readings of a captured message, with no Spark."""

from __future__ import annotations

import cbor2
import msgpack
import pytest

from wireproto.codecs import nydus, phyllo, subble, ubre, websmq
from wireproto.pipeline.values import document_values, numeric_values, payload_values


def publish(payload: bytes) -> bytes:
    return websmq.encode(websmq.Publish("t", payload))


@pytest.mark.parametrize(("payload", "expected"), [
    (b"21.5", [("value", 21.5)]),
    (b"-3", [("value", -3.0)]),
    (b'{"celsius": 21.5, "on": true, "name": "x", "env": {"hum": 40}}',
     [("celsius", 21.5), ("env.hum", 40.0)]),
    (msgpack.packb({"a": 1, "b": {"c": 2.5, "d": False}, "l": [1, 2]}), [("a", 1.0), ("b.c", 2.5)]),
    (msgpack.packb(3.25), [("value", 3.25)]),
    (msgpack.packb(200), [("value", 200.0)]),
    (b"true", []),  # a bool is not a number
    (b"a", []),  # one byte of text, not the msgpack number 97
    (b"hello", []),
    (b"NaN", []),
    (b"", []),
    (msgpack.packb(1.5) + b"\x01", []),  # extra bytes: not one document
    (b"\xff\xfe\x00", []),
])
def test_payloads(payload: bytes, expected: list[tuple[str, float]]) -> None:
    assert payload_values(payload) == expected
    assert numeric_values("websmq", "in", publish(payload), True) == expected


def test_each_protocol() -> None:
    assert numeric_values("ubre", "in", ubre.encode(ubre.Publish("t", {"v": 2})), False) == [
        ("v", 2.0)]
    binary = ubre.encode(ubre.Publish("t", msgpack.packb({"v": 3})), binary=True)
    assert numeric_values("ubre", "in", binary, True) == [("v", 3.0)]
    request = ubre.encode(ubre.Request(1, {"v": 2}, name="add"))
    assert numeric_values("ubre", "in", request, False) == []  # a request is not a reading
    nydus_publish = nydus.encode(nydus.Publish("/t", {"v": 4})).encode()  # as captured: bytes
    assert numeric_values("nydus", "out", nydus_publish, False) == [("v", 4.0)]
    produced = subble.ProduceEvent("c", subble.SerializationFormat.MSGPACK, "temp",
                                   msgpack.packb({"v": 5}))
    assert numeric_values("subble", "in", subble.encode(produced), True) == [("v", 5.0)]
    event = subble.Event(subble.MessageCode.SERVER_EVENT, subble.SerializationFormat.JSON, 0,
                         "temp", "g", "s", b'{"v": 6}')
    assert numeric_values("subble", "out", subble.encode(event), True) == [("v", 6.0)]
    for document in (phyllo.serialize({"celsius": 21.5}),
                     phyllo.serialize({"celsius": 21.5}, format=phyllo.Format.JSON),
                     phyllo.Document(0x12, 0, cbor2.dumps({"celsius": 21.5}))):
        wire = phyllo.encode(phyllo.message_from_document("temp", document))
        assert numeric_values("phyllo", "in", wire, True) == [("celsius", 21.5)]
        assert document_values(phyllo.encode_document(document)) == [("celsius", 21.5)]


def test_never_raises() -> None:
    for protocol in ("websmq", "ubre", "nydus", "subble", "phyllo", None, "other"):
        for data in (b"", b"\x00", b"\x00\x07a", b"\xff" * 9, b"{"):
            assert numeric_values(protocol, "in", data, True) == []
    assert document_values(b"\x99\x00\x01") == []  # an unknown format
    assert document_values(b"\x11") == []
