"""The Engine.IO 4 codec: packets, polling payloads and the open packet's JSON.

Vectors are from shared/specs/NOTES.md (the wire capture) and from engine.io-parser 5.2.3 itself
(encodePacket / encodePayload / decodePayload run under Node, outputs pasted here).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wireproto.codecs.engineio import (
    SEPARATOR,
    Handshake,
    Packet,
    PacketType,
    decode_handshake,
    decode_packet,
    decode_payload,
    encode_handshake,
    encode_packet,
    encode_payload,
    encode_text_packet,
)
from wireproto.errors import (
    BadEncoding,
    BadJSON,
    InvalidField,
    ProtocolError,
    TruncatedFrame,
    UnknownType,
)

CAPTURED_OPEN = (
    '0{"sid":"lv_VI97HAXpY6yYWAAAC","upgrades":["websocket"],"pingInterval":25000,'
    '"pingTimeout":20000,"maxPayload":1000000}'
)

PACKETS = [
    (Packet(PacketType.OPEN, CAPTURED_OPEN[1:]), CAPTURED_OPEN),
    (Packet(PacketType.CLOSE), "1"),
    (Packet(PacketType.PING), "2"),
    (Packet(PacketType.PING, "probe"), "2probe"),
    (Packet(PacketType.PONG, "probe"), "3probe"),
    (Packet(PacketType.MESSAGE, "hello"), "4hello"),
    (Packet(PacketType.MESSAGE, "0|3"), "40|3"),  # nydus WELCOME, as captured
    (Packet(PacketType.MESSAGE), "4"),
    (Packet(PacketType.MESSAGE, "€ ünï"), "4€ ünï"),
    (Packet(PacketType.UPGRADE), "5"),
    (Packet(PacketType.NOOP), "6"),
    (Packet(PacketType.MESSAGE, b"\x01\x02\x03"), b"\x01\x02\x03"),
    (Packet(PacketType.MESSAGE, b""), b""),
]


@pytest.mark.parametrize(("packet", "frame"), PACKETS)
def test_packet_encodes_to_its_websocket_frame(packet, frame):
    assert encode_packet(packet) == frame


@pytest.mark.parametrize(("packet", "frame"), PACKETS)
def test_websocket_frame_decodes_to_its_packet(packet, frame):
    decoded = decode_packet(frame)
    assert decoded == packet
    assert decoded.binary == isinstance(frame, bytes)


def test_base64_in_a_text_frame_is_a_binary_message_as_in_engine_io_parser():
    assert decode_packet("bAQID") == Packet(PacketType.MESSAGE, b"\x01\x02\x03")
    assert decode_packet("b") == Packet(PacketType.MESSAGE, b"")


def test_payload_joins_packets_with_the_record_separator_and_base64_for_binary():
    # engine.io-parser: encodePayload([Buffer[1,2,3,4], "€", ping, open "{}"])
    packets = [
        Packet(PacketType.MESSAGE, b"\x01\x02\x03\x04"),
        Packet(PacketType.MESSAGE, "€"),
        Packet(PacketType.PING),
        Packet(PacketType.OPEN, "{}"),
    ]
    assert encode_payload(packets) == "bAQIDBA==\x1e4€\x1e2\x1e0{}"
    assert decode_payload("bAQIDBA==\x1e4€\x1e2\x1e0{}") == packets
    assert decode_payload("bAQIDBA==\x1e4€\x1e2\x1e0{}".encode()) == packets


def test_payload_of_one_packet_has_no_separator():
    assert encode_payload([Packet(PacketType.MESSAGE, "hello")]) == "4hello"
    assert decode_payload(b"3") == [Packet(PacketType.PONG)]


@pytest.mark.parametrize(
    ("frame", "error", "words"),
    [
        ("", TruncatedFrame, "empty"),
        ("7", UnknownType, "'7'"),
        ("x4", UnknownType, "'x'"),
        ("b!!!!", InvalidField, "base64"),
        ("bAQI", InvalidField, "base64"),  # bad padding
    ],
)
def test_bad_frames_are_refused_clearly(frame, error, words):
    with pytest.raises(error, match="Engine.IO") as caught:
        decode_packet(frame)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("body", "error", "words"),
    [
        (b"4ok\x1e", TruncatedFrame, "packet 2 of the polling payload"),
        (b"4ok\x1e9", UnknownType, "packet 2"),
        (b"4\xff", BadEncoding, "UTF-8"),
        (b"", TruncatedFrame, "packet 1"),
    ],
)
def test_bad_payloads_are_refused_clearly(body, error, words):
    with pytest.raises(error) as caught:
        decode_payload(body)
    assert words in str(caught.value)
    assert isinstance(caught.value, ProtocolError)


def test_text_with_the_separator_cannot_be_encoded():
    with pytest.raises(InvalidField, match="U\\+001E"):
        encode_packet(Packet(PacketType.MESSAGE, "a\x1eb"))
    with pytest.raises(InvalidField, match="U\\+001E"):
        encode_payload([Packet(PacketType.MESSAGE, "a\x1eb")])


@pytest.mark.parametrize(("packet", "frame"), [(p, f) for p, f in PACKETS if isinstance(f, str)])
def test_a_text_packet_encodes_to_the_text_frame_it_is_in_a_payload_too(packet, frame):
    assert encode_text_packet(packet) == frame == encode_payload([packet])


def test_a_text_packet_is_text():
    with pytest.raises(InvalidField, match="MESSAGE packet cannot carry bytes"):
        encode_text_packet(Packet(PacketType.MESSAGE, b"x"))
    with pytest.raises(InvalidField, match="U\\+001E"):
        encode_text_packet(Packet(PacketType.MESSAGE, "a\x1eb"))


def test_only_a_message_packet_carries_bytes():
    with pytest.raises(InvalidField, match="PING packet cannot carry bytes"):
        encode_packet(Packet(PacketType.PING, b"x"))


def test_handshake_encodes_in_engine_io_key_order():
    handshake = Handshake("lv_VI97HAXpY6yYWAAAC", ("websocket",), 25000, 20000, 1_000_000)
    assert "0" + encode_handshake(handshake) == CAPTURED_OPEN
    assert decode_handshake(CAPTURED_OPEN[1:]) == handshake


@pytest.mark.parametrize(
    ("text", "error", "words"),
    [
        ("[1]", BadJSON, "not an object"),
        ("{", BadJSON, "invalid JSON"),
        ('{"upgrades":[],"pingInterval":1,"pingTimeout":1,"maxPayload":1}', InvalidField, "sid"),
        ('{"sid":"a","pingInterval":"25000","pingTimeout":1,"maxPayload":1}', InvalidField,
         "pingInterval"),
        ('{"sid":"a","pingInterval":1,"pingTimeout":1}', InvalidField, "maxPayload"),
        ('{"sid":"a","upgrades":"websocket","pingInterval":1,"pingTimeout":1,"maxPayload":1}',
         InvalidField, "upgrades"),
    ],
)
def test_bad_handshakes_are_refused_clearly(text, error, words):
    with pytest.raises(error) as caught:
        decode_handshake(text)
    assert words in str(caught.value)


text_packets = st.builds(
    Packet,
    st.sampled_from(list(PacketType)),
    st.text().filter(lambda s: SEPARATOR not in s),
)
binary_packets = st.builds(Packet, st.just(PacketType.MESSAGE), st.binary())


@given(st.lists(text_packets | binary_packets, min_size=1, max_size=6))
def test_payloads_round_trip(packets):
    assert decode_payload(encode_payload(packets)) == packets
    assert [decode_packet(encode_packet(p)) for p in packets] == packets


@pytest.mark.parametrize("frame", ["bé", "b\u00ff\u00ff", "bQUJD\u2028", "4hi\x1ebé"])
def test_base64_packets_with_non_ascii_text_are_protocol_errors(frame):
    # Found by the coverage-guided fuzzer (tests/fuzz): base64 of a str raised ValueError.
    with pytest.raises(InvalidField, match="not valid base64"):
        decode_payload(frame)


def _encoded_the_general_way(packet: Packet) -> object:
    from wireproto.codecs.engineio import _is_binary_message, _text

    try:
        return packet.data if _is_binary_message(packet) else _text(packet)
    except InvalidField as error:
        return ("error", str(error))


@given(
    st.sampled_from(list(PacketType)) | st.integers(0, 9) | st.booleans(),
    st.text(alphabet=st.sampled_from("ab\x1eé")) | st.binary(max_size=8),
)
def test_the_text_fast_path_encodes_as_the_general_path(packet_type, data):
    packet = Packet(packet_type, data)
    try:
        encoded: object = encode_packet(packet)
    except InvalidField as error:
        encoded = ("error", str(error))
    assert encoded == _encoded_the_general_way(packet)
