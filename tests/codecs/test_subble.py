"""SubbleSocket codec: hand-built byte vectors, round trips, fuzzing and every error path.

The spec has no byte examples, so the vectors below are written out field by field from
specs/subblesocket.md and NOTES.md "SubbleSocket": every "4 + N" length is an int32
little-endian, the version is 1 byte each, the value separator is "1 + N", request data runs to
the end of the message, and the event date time is an int64 little-endian count of milliseconds.
"""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wireproto.codecs import subble
from wireproto.codecs.subble import (
    PROTOCOL_VERSION,
    Event,
    EventError,
    HandshakeRequest,
    HandshakeResponse,
    MessageCode,
    ProduceEvent,
    Sender,
    SerializationFormat,
    Version,
    datetime_to_ms,
    decode,
    encode,
    pack_payload,
    supports_version,
    unpack_payload,
)
from wireproto.errors import (
    BadEncoding,
    BadJSON,
    BadLength,
    InvalidField,
    InvalidTopic,
    ProtocolError,
    TruncatedFrame,
    UnknownType,
)

# -- Vectors: the byte layout, field by field --------------------------------------------------

# The C# reference's own test data (1.0.20, "some client ID", S1 S2, P1 P2, request data
# ff 23 19), laid out as NOTES.md says.
HANDSHAKE_REQUEST = (
    "01"  # request code 1, Request Access
    "01 00 14"  # version 1.0.20: major, minor, patch, one byte each
    "0e000000"  # client ID length 14 (int32 LE)
    "73 6f 6d 65 20 63 6c 69 65 6e 74 20 49 44"  # "some client ID"
    "01"  # value separator length 1 (one byte)
    "3b"  # ";"
    "05000000"  # subscribe list length 5
    "53 31 3b 53 32"  # "S1;S2"
    "05000000"  # produce list length 5
    "50 31 3b 50 32"  # "P1;P2"
    "ff 23 19"  # request data: the rest of the message
)

# The smallest handshake: no client ID (asks the server for one), no lists, no request data.
HANDSHAKE_REQUEST_EMPTY = (
    "01"  # request code 1
    "01 00 00"  # version 1.0.0
    "00000000"  # client ID length 0
    "01 3b"  # separator ";"
    "00000000"  # subscribe list length 0: no names
    "00000000"  # produce list length 0: no names
)

# A separator of 3 bytes of UTF-8 ("→"), and one name on the produce list.
HANDSHAKE_REQUEST_ARROW = (
    "01 01 00 00"  # request code 1, version 1.0.0
    "04000000 63 2d 34 32"  # client ID "c-42"
    "03 e2 86 92"  # separator length 3, "→"
    "05000000 61 e2 86 92 62"  # subscribe list "a→b"
    "04000000 74 65 6d 70"  # produce list "temp"
)

HANDSHAKE_RESPONSE_NEW_ID = (
    "03"  # response code 3, OK - new client ID created
    "04000000"  # message length 4
    "63 2d 34 32"  # "c-42", the new client ID
    "ff 23 19"  # request data echoed
)

HANDSHAKE_RESPONSE_OK = (
    "02"  # response code 2, OK
    "00000000"  # no message
)

HANDSHAKE_RESPONSE_INVALID_CLIENT = (
    "0c"  # response code 12, NOT OK - invalid client ID
    "0e000000"  # message length 14
    "75 6e 6b 6e 6f 77 6e 20 63 6c 69 65 6e 74"  # "unknown client"
)

PRODUCE_EVENT = (
    "1b"  # request code 27 from a client: create an event
    "04000000 63 2d 34 32"  # client ID "c-42"
    "01"  # serialization format 1, JSON
    "04000000 74 65 6d 70"  # event type name "temp"
    "0a000000"  # payload length 10
    "7b 22 63 22 3a 32 31 2e 35 7d"  # payload {"c":21.5}
    "72 31"  # request data "r1"
)

SERVER_EVENT = (
    "1a"  # event request code 26, Server Event
    "00"  # serialization format 0, MessagePack
    "7b 68 e5 cf 8b 01 00 00"  # date time 1700000000123 ms (0x18bcfe5687b), int64 LE
    "04000000 74 65 6d 70"  # event type name "temp"
    "24000000"  # event GUID length 36
    "30 66 38 66 61 64 35 62 2d 64 39 63 62 2d 34 36 39 66"  # "0f8fad5b-d9cb-469f"
    "2d 61 31 36 35 2d 37 30 38 36 37 37 32 38 39 35 30 65"  # "-a165-70867728950e"
    "07000000 73 65 6e 73 6f 72 73"  # source name "sensors"
    "0c000000"  # payload length 12
    "81 a1 63 cb 40 35 80 00 00 00 00 00"  # payload, msgpack {"c": 21.5}
)

# The server echoes the client's own event with code 27 and its request data.
CLIENT_EVENT_ECHO = (
    "1b"  # event request code 27, Client Event
    "01"  # serialization format 1, JSON
    "ff ff ff ff ff ff ff ff"  # date time -1 ms: 1969-12-31T23:59:59.999Z (signed)
    "04000000 74 65 6d 70"  # event type name "temp"
    "01000000 67"  # event GUID "g"
    "04000000 63 2d 34 32"  # source name "c-42"
    "0a000000 7b 22 63 22 3a 32 31 2e 35 7d"  # payload {"c":21.5}
    "72 31"  # request data "r1" echoed
)

# Serialization formats 51 to 255 are the implementor's own and are carried as an int.
IMPLEMENTOR_FORMAT_EVENT = (
    "1a"  # code 26
    "c8"  # serialization format 200
    "00 00 00 00 00 00 00 00"  # date time 0: the epoch
    "00000000 00000000 00000000 00000000"  # empty type, GUID, source and payload
)

EVENT_NOT_DECLARED = (
    "33"  # error code 51, Event not declared (C# Event_Forbidden)
    "11000000"  # message length 17
    "74 65 6d 70 20 6e 6f 74 20 64 65 63 6c 61 72 65 64"  # "temp not declared"
    "72 31"  # request data "r1" echoed
)

UNKNOWN_SERVER_ERROR = (
    "34"  # error code 52, Unknown Server Error (C# Event_Error_Unknown)
    "00000000"  # no message
)

GUID = "0f8fad5b-d9cb-469f-a165-70867728950e"
VECTORS = [
    (
        "handshake request",
        "client",
        HANDSHAKE_REQUEST,
        HandshakeRequest(
            Version(1, 0, 20), "some client ID", ";", ("S1", "S2"), ("P1", "P2"), b"\xff\x23\x19"
        ),
    ),
    ("empty handshake request", "client", HANDSHAKE_REQUEST_EMPTY, HandshakeRequest()),
    (
        "handshake request, 3-byte separator",
        "client",
        HANDSHAKE_REQUEST_ARROW,
        HandshakeRequest(Version(1, 0, 0), "c-42", "→", ("a", "b"), ("temp",)),
    ),
    (
        "handshake response, new client ID",
        "server",
        HANDSHAKE_RESPONSE_NEW_ID,
        HandshakeResponse(MessageCode.OK_NEW_CLIENT_ID, "c-42", b"\xff\x23\x19"),
    ),
    ("handshake response, OK", "server", HANDSHAKE_RESPONSE_OK, HandshakeResponse(MessageCode.OK)),
    (
        "handshake response, invalid client",
        "server",
        HANDSHAKE_RESPONSE_INVALID_CLIENT,
        HandshakeResponse(MessageCode.INVALID_CLIENT_ID, "unknown client"),
    ),
    (
        "produce event",
        "client",
        PRODUCE_EVENT,
        ProduceEvent("c-42", SerializationFormat.JSON, "temp", b'{"c":21.5}', b"r1"),
    ),
    (
        "server event",
        "server",
        SERVER_EVENT,
        Event(
            MessageCode.SERVER_EVENT,
            SerializationFormat.MSGPACK,
            1_700_000_000_123,
            "temp",
            GUID,
            "sensors",
            bytes.fromhex("81 a1 63 cb 40 35 80 00 00 00 00 00"),
        ),
    ),
    (
        "client event echoed",
        "server",
        CLIENT_EVENT_ECHO,
        Event(
            MessageCode.CLIENT_EVENT,
            SerializationFormat.JSON,
            -1,
            "temp",
            "g",
            "c-42",
            b'{"c":21.5}',
            b"r1",
        ),
    ),
    (
        "event in an implementor format",
        "server",
        IMPLEMENTOR_FORMAT_EVENT,
        Event(MessageCode.SERVER_EVENT, 200, 0, "", "", "", b""),
    ),
    (
        "event not declared",
        "server",
        EVENT_NOT_DECLARED,
        EventError(MessageCode.EVENT_NOT_DECLARED, "temp not declared", b"r1"),
    ),
    (
        "unknown server error",
        "server",
        UNKNOWN_SERVER_ERROR,
        EventError(MessageCode.UNKNOWN_SERVER_ERROR),
    ),
]
VECTOR_IDS = [v[0] for v in VECTORS]


@pytest.mark.parametrize(("name", "sender", "hex_", "message"), VECTORS, ids=VECTOR_IDS)
def test_vector_decodes(name, sender, hex_, message):
    decoded = decode(bytes.fromhex(hex_), sender=sender)
    assert decoded == message
    assert type(decoded) is type(message)


@pytest.mark.parametrize(("name", "sender", "hex_", "message"), VECTORS, ids=VECTOR_IDS)
def test_vector_encodes(name, sender, hex_, message):
    assert encode(message).hex() == bytes.fromhex(hex_).hex()


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_decode_accepts_bytes_like(wrap):
    data = wrap(bytes.fromhex(PRODUCE_EVENT))
    message = decode(data, sender=Sender.CLIENT)
    assert message.payload == b'{"c":21.5}'
    assert type(message.payload) is bytes and type(message.request_data) is bytes


def test_decoded_fields_have_the_documented_types():
    event = decode(bytes.fromhex(SERVER_EVENT), sender="server")
    assert event.code is MessageCode.SERVER_EVENT
    assert event.format is SerializationFormat.MSGPACK
    assert event.datetime == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert unpack_payload(event.payload, event.format) == {"c": 21.5}
    request = decode(bytes.fromhex(HANDSHAKE_REQUEST), sender="client")
    assert type(request.version) is Version and str(request.version) == "1.0.20"
    assert decode(bytes.fromhex(IMPLEMENTOR_FORMAT_EVENT), sender="server").format == 200
    error = decode(bytes.fromhex(EVENT_NOT_DECLARED), sender="server")
    assert error.code is MessageCode.EVENT_FORBIDDEN  # the C# name is an alias


def test_messages_are_hashable_values():
    first = decode(bytes.fromhex(SERVER_EVENT), sender="server")
    second = decode(bytes.fromhex(SERVER_EVENT), sender="server")
    assert first == second and hash(first) == hash(second)
    assert len({first, second}) == 1


# -- Code 27 depends on who sent it ------------------------------------------------------------


def test_code_27_from_a_client_is_a_produce_request_and_from_a_server_an_event():
    client_bytes = bytes.fromhex(PRODUCE_EVENT)
    assert isinstance(decode(client_bytes, sender="client"), ProduceEvent)
    # The same bytes read as a server event: format 0x04 is reserved.
    with pytest.raises(InvalidField, match="SubbleSocket event: serialization format 4"):
        decode(client_bytes, sender="server")
    server_bytes = bytes.fromhex(CLIENT_EVENT_ECHO)
    assert isinstance(decode(server_bytes, sender=Sender.SERVER), Event)


def test_sender_is_required_and_checked():
    with pytest.raises(TypeError):
        decode(bytes.fromhex(PRODUCE_EVENT))  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="sender must be 'client' or 'server', not 'host'"):
        decode(bytes.fromhex(PRODUCE_EVENT), sender="host")


@pytest.mark.parametrize("code", [2, 3, 10, 11, 12, 25, 26, 51, 52, 0, 28, 255])
def test_a_client_sends_only_codes_1_and_27(code):
    with pytest.raises(UnknownType, match=f"code {code} from a client: a client sends only 1"):
        decode(bytes([code]) + bytes(20), sender="client")


@pytest.mark.parametrize("code", [1, 0, 4, 13, 28, 50, 53, 255])
def test_a_server_sends_only_response_event_and_error_codes(code):
    with pytest.raises(UnknownType, match=f"code {code} from a server: a server sends only 2, 3"):
        decode(bytes([code]) + bytes(20), sender="server")


def test_decode_refuses_str_as_bad_input_and_other_types_as_a_bug():
    with pytest.raises(BadEncoding, match="SubbleSocket is binary: got text"):
        decode("\x01", sender="client")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="SubbleSocket is binary"):
        decode(None, sender="client")  # type: ignore[arg-type]


# -- Lists and the value separator -------------------------------------------------------------


def handshake_with_lists(separator: bytes, subscribe: bytes, produce: bytes = b"") -> bytes:
    return (
        bytes.fromhex("01 01 00 00 00000000")
        + bytes([len(separator)])
        + separator
        + len(subscribe).to_bytes(4, "little")
        + subscribe
        + len(produce).to_bytes(4, "little")
        + produce
    )


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (b"a;;b", ("a", "b")),
        (b";a;b;", ("a", "b")),
        (b";", ()),
        (b";;;", ()),
        (b"a", ("a",)),
        (b"a b", ("a b",)),
    ],
)
def test_empty_names_between_separators_are_dropped(raw, names):
    assert decode(handshake_with_lists(b";", raw), sender="client").subscribe == names


def test_names_match_exactly_and_keep_case_and_spaces():
    message = decode(handshake_with_lists(b", ", b"Temp, temp ,x", b"A"), sender="client")
    assert message.subscribe == ("Temp", "temp ,x")
    assert message.produce == ("A",)


def test_the_csharp_reference_layout_is_refused():
    # The C# codec writes the version as 3 int32 and the separator as "4 + N"; NOTES.md settles
    # 1 byte each and "1 + N". Read as NOTES.md says, the C# bytes give an empty client ID and
    # then a separator length of 0.
    csharp = bytes.fromhex(
        "01 01000000 00000000 14000000"  # code, version 1.0.20 as three int32
        "04000000 63 2d 34 32"  # client ID "c-42"
        "01000000 3b"  # separator as "4 + N"
        "00000000 00000000"
    )
    with pytest.raises(InvalidField, match="the value separator is empty"):
        decode(csharp, sender="client")


@pytest.mark.parametrize(
    ("names", "separator", "match"),
    [
        (("a;b",), ";", r"the name 'a;b' in the subscribe list contains the value separator ';'"),
        (("a", ""), ";", "the subscribe list has an empty name"),
        (("a", "b"), "aa", r"would not read back: a name runs into the value separator 'aa'"),
        (("xab", "y"), "aba", "would not read back"),
    ],
)
def test_encode_refuses_names_that_would_not_read_back(names, separator, match):
    with pytest.raises(InvalidTopic, match=match):
        encode(HandshakeRequest(separator=separator, subscribe=names))


def test_encode_checks_the_produce_list_too():
    with pytest.raises(InvalidTopic, match="in the produce list contains the value separator"):
        encode(HandshakeRequest(produce=("ok", "no;pe")))


def test_a_list_given_as_a_str_is_a_type_error():
    with pytest.raises(TypeError, match="tuple of names, not a str"):
        encode(HandshakeRequest(subscribe="temp"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("separator", "match"),
    [("", "is 0 bytes of UTF-8; it must be 1 to 255"), ("é" * 128, "is 256 bytes")],
)
def test_encode_refuses_a_separator_out_of_range(separator, match):
    with pytest.raises(InvalidField, match=match):
        encode(HandshakeRequest(separator=separator))


def test_a_255_byte_separator_is_allowed():
    separator = "x" * 255
    message = HandshakeRequest(separator=separator, subscribe=("a", "b"))
    data = encode(message)
    assert data[8] == 255  # after the code, the version and an empty client ID
    assert decode(data, sender="client") == message


# -- Versions ----------------------------------------------------------------------------------


def test_version_rule_matches_the_csharp_semversion_tests():
    v1, v2, v3, v4 = Version(5, 3, 3), Version(5, 6, 1), Version(6, 1, 1), Version(6, 1, 5)
    assert not v1.is_compatible_with(v2)
    assert not v1.is_compatible_with(v3)
    assert not v1.is_compatible_with(v4)
    assert v2.is_compatible_with(v1)
    assert not v2.is_compatible_with(v3)
    assert v3.is_compatible_with(v3)
    assert v4.is_compatible_with(v3)
    assert not v3.is_compatible_with(v4)


@pytest.mark.parametrize(
    ("client", "accepted"),
    [
        (Version(1, 0, 0), True),
        (Version(1, 0, 1), True),  # a newer patch than the host: compatible with 1.0.0
        (Version(1, 1, 0), True),  # a newer minor
        (Version(1, 255, 255), True),
        (Version(0, 9, 9), False),
        (Version(2, 0, 0), False),
        (Version(0, 0, 0), False),
    ],
)
def test_a_1_0_0_host_accepts_every_client_compatible_with_it(client, accepted):
    assert PROTOCOL_VERSION == (1, 0, 0)
    assert supports_version(client) is accepted


@pytest.mark.parametrize(
    ("client", "accepted"),
    [
        (Version(1, 2, 3), True),
        (Version(1, 2, 9), True),
        (Version(1, 3, 0), True),
        (Version(1, 2, 2), False),  # older than the host: it may lack what the host relies on
        (Version(1, 1, 200), False),
        (Version(2, 2, 3), False),
    ],
)
def test_a_newer_host_serves_clients_at_least_as_new_in_the_same_major(client, accepted):
    assert supports_version(client, host=Version(1, 2, 3)) is accepted


def test_compatibility_is_not_symmetric():
    host, client = Version(1, 2, 0), Version(1, 0, 5)
    assert host.is_compatible_with(client)
    assert not client.is_compatible_with(host)


@pytest.mark.parametrize("version", [(1, 0, 256), (-1, 0, 0), (1, 0), (1, 0, 0, 0), (1.0, 0, 0)])
def test_encode_refuses_a_version_that_is_not_three_bytes(version):
    with pytest.raises(InvalidField, match="must be 3 numbers from 0 to 255"):
        encode(HandshakeRequest(version=version))


def test_a_plain_tuple_version_encodes():
    assert encode(HandshakeRequest(version=(1, 0, 0))) == bytes.fromhex(HANDSHAKE_REQUEST_EMPTY)


# -- Date time ---------------------------------------------------------------------------------


def test_datetime_to_ms_is_exact_at_millisecond_precision():
    when = datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert datetime_to_ms(when) == 1_700_000_000_123
    assert datetime_to_ms(datetime(1970, 1, 1, tzinfo=UTC)) == 0
    # Another zone gives the same instant.
    plus_two = timezone(timedelta(hours=2))
    assert datetime_to_ms(datetime(2023, 11, 15, 0, 13, 20, 123000, tzinfo=plus_two)) == (
        1_700_000_000_123
    )


def test_datetime_to_ms_floors_sub_millisecond_parts():
    assert datetime_to_ms(datetime(1970, 1, 1, 0, 0, 0, 999, tzinfo=UTC)) == 0
    assert datetime_to_ms(datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)) == -1


def test_datetime_to_ms_refuses_naive_datetimes():
    with pytest.raises(InvalidField, match="must be timezone-aware"):
        datetime_to_ms(datetime(2023, 1, 1))


def test_event_datetime_is_aware_utc():
    event = Event(MessageCode.SERVER_EVENT, 0, -1, "t", "g", "s", b"")
    assert event.datetime == datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    assert event.datetime.tzinfo is UTC


def test_event_datetime_outside_python_range_is_a_protocol_error():
    event = decode(bytes.fromhex("1a 00 ffffffffffffff7f") + bytes(16), sender="server")
    assert event.datetime_ms == 2**63 - 1
    with pytest.raises(InvalidField, match="outside the years 1 to 9999"):
        _ = event.datetime


@given(
    st.datetimes(max_value=datetime(9999, 12, 30), timezones=st.just(UTC)),
    st.integers(0, 999),
)
def test_datetime_round_trips_through_an_event(when, millis):
    when = when.replace(microsecond=millis * 1000)
    event = Event(MessageCode.SERVER_EVENT, 0, datetime_to_ms(when), "t", "g", "s", b"")
    assert decode(encode(event), sender="server").datetime == when


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 1.5, "0"])
def test_encode_refuses_a_datetime_that_is_not_an_int64(value):
    with pytest.raises(InvalidField, match="must be an int of milliseconds that fits in 8 bytes"):
        encode(Event(MessageCode.SERVER_EVENT, 0, value, "t", "g", "s", b""))


def test_int64_extremes_encode():
    for value in (2**63 - 1, -(2**63)):
        event = Event(MessageCode.SERVER_EVENT, 0, value, "", "", "", b"")
        assert decode(encode(event), sender="server").datetime_ms == value


# -- Codes and formats -------------------------------------------------------------------------


def test_code_values_are_the_specs():
    assert {c.name: c.value for c in MessageCode} == {
        "REQUEST_ACCESS": 1,
        "OK": 2,
        "OK_NEW_CLIENT_ID": 3,
        "IP_NOT_ALLOWED": 10,
        "NEW_CLIENTS_NOT_ALLOWED": 11,
        "INVALID_CLIENT_ID": 12,
        "UNKNOWN_HANDSHAKE_ERROR": 25,
        "SERVER_EVENT": 26,
        "CLIENT_EVENT": 27,
        "EVENT_NOT_DECLARED": 51,
        "UNKNOWN_SERVER_ERROR": 52,
    }
    assert MessageCode.EVENT_FORBIDDEN is MessageCode.EVENT_NOT_DECLARED
    assert MessageCode.EVENT_ERROR_UNKNOWN is MessageCode.UNKNOWN_SERVER_ERROR
    assert (SerializationFormat.MSGPACK, SerializationFormat.JSON) == (0, 1)


@pytest.mark.parametrize("code", [10, 11, 25])
def test_every_refusal_code_decodes(code):
    assert decode(bytes([code]) + bytes(4), sender="server") == HandshakeResponse(code)


@pytest.mark.parametrize("format", [2, 7, 50])
def test_reserved_formats_are_refused_on_decode(format):
    produce = bytes.fromhex("1b 00000000") + bytes([format]) + bytes(8)
    with pytest.raises(InvalidField, match=f"serialization format {format} is reserved") as e:
        decode(produce, sender="client")
    assert e.value.offset == 5
    event = bytes.fromhex("1a") + bytes([format]) + bytes(24)
    with pytest.raises(InvalidField, match=f"SubbleSocket event: serialization format {format}"):
        decode(event, sender="server")


@pytest.mark.parametrize("format", [2, 50, 256, -1, "json"])
def test_encode_refuses_formats_outside_the_map(format):
    with pytest.raises(InvalidField, match=r"serialization format .* is not allowed"):
        encode(ProduceEvent("c", format, "t", b""))
    with pytest.raises(InvalidField, match=r"serialization format .* is not allowed"):
        encode(Event(MessageCode.SERVER_EVENT, format, 0, "t", "g", "s", b""))


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (HandshakeResponse(MessageCode.SERVER_EVENT), r"handshake response: code 26 is not one"),
        (HandshakeResponse(MessageCode.REQUEST_ACCESS), r"handshake response: code 1 is not one"),
        (Event(MessageCode.OK, 0, 0, "", "", "", b""), r"SubbleSocket event: code 2 is not one"),
        (EventError(MessageCode.CLIENT_EVENT), r"event error: code 27 is not one of \[51, 52\]"),
    ],
)
def test_encode_refuses_a_code_of_another_message(message, match):
    with pytest.raises(UnknownType, match=match):
        encode(message)


def test_encode_refuses_what_is_not_a_message():
    with pytest.raises(TypeError, match="not a SubbleSocket message: dict"):
        encode({"code": 26})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "message",
    [
        HandshakeRequest(client_id="\ud800"),
        HandshakeRequest(subscribe=("\udfff",)),
        HandshakeResponse(MessageCode.OK, "\ud800"),
        ProduceEvent("c", 1, "\ud800", b""),
        Event(MessageCode.SERVER_EVENT, 0, 0, "t", "\ud800", "s", b""),
        EventError(MessageCode.UNKNOWN_SERVER_ERROR, "\ud800"),
    ],
)
def test_encode_refuses_text_that_is_not_utf8(message):
    with pytest.raises(BadEncoding, match="cannot be written as UTF-8"):
        encode(message)


class _Huge(bytes):
    """Claims a length no int32 can announce, without allocating it."""

    def __len__(self):
        return 2**31


def test_encode_refuses_a_field_longer_than_an_int32_can_announce():
    with pytest.raises(BadLength, match="longer than the 2147483647 bytes"):
        encode(Event(MessageCode.SERVER_EVENT, 0, 0, "t", "g", "s", _Huge()))


# -- Decode error paths ------------------------------------------------------------------------


def test_empty_input():
    for sender in ("client", "server"):
        with pytest.raises(TruncatedFrame, match="empty SubbleSocket message: the code needs 1"):
            decode(b"", sender=sender)


@pytest.mark.parametrize(
    ("hex_", "error", "match", "offset"),
    [
        (
            "01 01 00",
            TruncatedFrame,
            "handshake request of 3 bytes: the code and version need 4",
            0,
        ),
        (
            "01 01 00 00 28000000 61 62 63",
            TruncatedFrame,
            "SubbleSocket handshake request: client ID length 40 but only 3 bytes remain",
            4,
        ),
        (
            "01 01 00 00 000000",
            TruncatedFrame,
            "the client ID length needs 4 bytes but only 3 bytes remain",
            4,
        ),
        ("01 01 00 00 ffffffff", BadLength, "client ID length -1 is negative", 4),
        ("01 01 00 00 00000080", BadLength, "client ID length -2147483648 is negative", 4),
        (
            "01 01 00 00 01000000 61",
            TruncatedFrame,
            "the value separator length needs 1 byte but none remain",
            9,
        ),
        ("01 01 00 00 00000000 00", InvalidField, "the value separator is empty", 8),
        (
            "01 01 00 00 00000000 03 3b",
            TruncatedFrame,
            "value separator length 3 but only 1 byte remain",
            8,
        ),
        (
            "01 01 00 00 00000000 01 ff",
            BadEncoding,
            "the value separator is not valid UTF-8 at byte 0",
            9,
        ),
        (
            "01 01 00 00 02000000 61 c3",
            BadEncoding,
            "handshake request: the client ID is not valid UTF-8 at byte 1",
            9,
        ),
        (
            "01 01 00 00 00000000 01 3b 0100",
            TruncatedFrame,
            "the subscribe list length needs 4 bytes but only 2 bytes remain",
            10,
        ),
        (
            "01 01 00 00 00000000 01 3b 00000000 05000000 61",
            TruncatedFrame,
            "produce list length 5 but only 1 byte remain",
            14,
        ),
        (
            "01 01 00 00 00000000 01 3b 00000000 03000000 61 3b 80",
            BadEncoding,
            "the produce list is not valid UTF-8 at byte 2",
            20,
        ),
        (
            "01 01 00 00 00000000 01 3b 03000000 ed a0 80 00000000",
            BadEncoding,
            # a UTF-8-encoded surrogate is not UTF-8
            "the subscribe list is not valid UTF-8 at byte 0",
            14,
        ),
    ],
)
def test_handshake_request_errors(hex_, error, match, offset):
    with pytest.raises(error, match=match) as e:
        decode(bytes.fromhex(hex_), sender="client")
    assert e.value.offset == offset


@pytest.mark.parametrize(
    ("hex_", "error", "match", "offset"),
    [
        ("1b", TruncatedFrame, "produce event request: the client ID length needs 4 bytes", 1),
        (
            "1b 01000000 ff",
            BadEncoding,
            "produce event request: the client ID is not valid UTF-8 at byte 0",
            5,
        ),
        (
            "1b 00000000",
            TruncatedFrame,
            "the serialization format needs 1 byte but none remain",
            5,
        ),
        ("1b 00000000 01 02000000 74", TruncatedFrame, "event type name length 2 but only 1", 6),
        (
            "1b 00000000 01 01000000 fe 00000000",
            BadEncoding,
            "the event type name is not valid UTF-8",
            10,
        ),
        ("1b 00000000 01 00000000 feffffff", BadLength, "payload length -2 is negative", 10),
        ("1b 00000000 01 00000000 0a000000 7b", TruncatedFrame, "payload length 10 but only 1", 10),
    ],
)
def test_produce_event_errors(hex_, error, match, offset):
    with pytest.raises(error, match=match) as e:
        decode(bytes.fromhex(hex_), sender="client")
    assert e.value.offset == offset


@pytest.mark.parametrize(
    ("hex_", "error", "match", "offset"),
    [
        ("02 0000", TruncatedFrame, "handshake response: the response message length needs 4", 1),
        ("19 05000000 6f6b", TruncatedFrame, "response message length 5 but only 2 bytes", 1),
        ("03 01000000 c0", BadEncoding, "the response message is not valid UTF-8 at byte 0", 5),
        ("1a 00 0000000000", TruncatedFrame, "SubbleSocket event of 7 bytes: the code, serial", 0),
        ("1b 01 0000000000000000", TruncatedFrame, "the event type name length needs 4 bytes", 10),
        (
            "1a 00 0000000000000000 00000000 02000000 61 ff 00000000 00000000",
            BadEncoding,
            "SubbleSocket event: the event GUID is not valid UTF-8 at byte 1",
            19,
        ),
        (
            "1a 00 0000000000000000 00000000 00000000 01000000 80 00000000",
            BadEncoding,
            "the source name is not valid UTF-8 at byte 0",
            22,
        ),
        (
            "1a 00 0000000000000000 00000000 00000000 00000000 ffffff7f",
            TruncatedFrame,
            "payload length 2147483647 but only 0 bytes remain",
            22,
        ),
        ("33 ff000000", TruncatedFrame, "event error: error message length 255 but only 0", 1),
        ("34 f0ffffff", BadLength, "event error: error message length -16 is negative", 1),
        ("33 01000000 ff 72 31", BadEncoding, "the error message is not valid UTF-8", 5),
    ],
)
def test_server_message_errors(hex_, error, match, offset):
    with pytest.raises(error, match=match) as e:
        decode(bytes.fromhex(hex_), sender="server")
    assert e.value.offset == offset


# -- Payload helpers ---------------------------------------------------------------------------


def test_pack_payload_msgpack_and_json():
    assert pack_payload({"c": 21.5}, SerializationFormat.MSGPACK).hex() == (
        "81a163cb4035800000000000"
    )
    assert pack_payload({"c": 21.5, "é": [1, None]}, 1) == '{"c":21.5,"é":[1,null]}'.encode()


def test_msgpack_payload_keeps_str_and_bytes_apart():
    data = pack_payload(["a", b"a"], 0)
    assert data == bytes.fromhex("92 a1 61 c4 01 61")
    assert unpack_payload(data, 0) == ["a", b"a"]


def test_unpack_payload_reads_the_vectors():
    assert unpack_payload(b'{"c":21.5}', SerializationFormat.JSON) == {"c": 21.5}
    assert unpack_payload(bytearray.fromhex("81a163cb4035800000000000"), 0) == {"c": 21.5}


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_unpack_payload_takes_any_bytes_like_for_a_long_msgpack_document(kind):
    # past the depth bound's length, the container bytes are counted: a memoryview has no
    # translate, so it must be read as bytes
    data = pack_payload({"values": list(range(200))}, SerializationFormat.MSGPACK)
    assert unpack_payload(kind(data), 0) == {"values": list(range(200))}


@pytest.mark.parametrize("format", [2, 51, 200, 255])
def test_payload_helpers_refuse_formats_they_cannot_handle(format):
    with pytest.raises(InvalidField, match=f"format {format} is not one wireproto can write"):
        pack_payload(1, format)
    with pytest.raises(InvalidField, match=f"format {format} is not one wireproto can read"):
        unpack_payload(b"1", format)


def test_payload_errors_are_protocol_errors():
    with pytest.raises(BadJSON, match="SubbleSocket event payload: invalid JSON"):
        unpack_payload(b"{", 1)
    with pytest.raises(BadJSON, match="NaN is not JSON"):
        unpack_payload(b"NaN", 1)
    with pytest.raises(BadEncoding, match="SubbleSocket event payload"):
        unpack_payload(b"\xc1", 0)
    with pytest.raises(InvalidField, match="cannot be written as JSON"):
        pack_payload(float("nan"), 1)
    with pytest.raises(InvalidField, match="cannot be written as msgpack"):
        pack_payload(object(), 0)


def test_msgpack_payload_refuses_a_lone_surrogate():
    with pytest.raises(InvalidField, match="cannot be written as msgpack"):
        pack_payload({"k": "\ud800"}, SerializationFormat.MSGPACK)


def test_json_payload_writes_a_lone_surrogate_as_its_json_escape():
    packed = pack_payload({"k": "\ud800"}, SerializationFormat.JSON)
    assert packed == b'{"k":"\\ud800"}'
    assert unpack_payload(packed, SerializationFormat.JSON) == {"k": "\ud800"}


payload_text = st.text(st.characters(codec="utf-8"), max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | payload_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(payload_text, inner, max_size=4),
    max_leaves=12,
)


@given(json_values, st.sampled_from(list(SerializationFormat)))
def test_payload_round_trip(value, format):
    assert unpack_payload(pack_payload(value, format), format) == value


# -- Round trips ---------------------------------------------------------------------------------

utf8_text = st.text(st.characters(codec="utf-8"), max_size=12)
u8 = st.integers(0, 255)
formats = st.sampled_from(list(SerializationFormat)) | st.integers(51, 255)
blobs = st.binary(max_size=24)


@st.composite
def handshake_requests(draw):
    separator = draw(
        st.text(st.characters(codec="utf-8"), min_size=1, max_size=4).filter(
            lambda s: len(s.encode()) <= 255
        )
    )
    names = st.lists(
        st.text(st.characters(codec="utf-8"), min_size=1, max_size=8).filter(
            lambda n: separator not in n
        ),
        max_size=4,
    ).filter(lambda ns: separator.join(ns).split(separator) == ns if ns else True)
    return HandshakeRequest(
        Version(draw(u8), draw(u8), draw(u8)),
        draw(utf8_text),
        separator,
        tuple(draw(names)),
        tuple(draw(names)),
        draw(blobs),
    )


handshake_responses = st.builds(
    HandshakeResponse,
    st.sampled_from(sorted(subble.HANDSHAKE_RESPONSE_CODES)).map(MessageCode),
    utf8_text,
    blobs,
)
produce_events = st.builds(ProduceEvent, utf8_text, formats, utf8_text, blobs, blobs)
events = st.builds(
    Event,
    st.sampled_from([MessageCode.SERVER_EVENT, MessageCode.CLIENT_EVENT]),
    formats,
    st.integers(-(2**63), 2**63 - 1),
    utf8_text,
    utf8_text,
    utf8_text,
    blobs,
    blobs,
)
event_errors = st.builds(
    EventError,
    st.sampled_from([MessageCode.EVENT_NOT_DECLARED, MessageCode.UNKNOWN_SERVER_ERROR]),
    utf8_text,
    blobs,
)
client_messages = handshake_requests() | produce_events
server_messages = handshake_responses | events | event_errors


@given(handshake_requests())
def test_handshake_request_round_trip(message):
    assert decode(encode(message), sender="client") == message


@given(handshake_responses)
def test_handshake_response_round_trip(message):
    assert decode(encode(message), sender="server") == message


@given(produce_events)
def test_produce_event_round_trip(message):
    assert decode(encode(message), sender="client") == message


@given(events)
def test_event_round_trip(message):
    assert decode(encode(message), sender="server") == message


@given(event_errors)
def test_event_error_round_trip(message):
    assert decode(encode(message), sender="server") == message


# -- Fuzzing -------------------------------------------------------------------------------------

MESSAGE_TYPES = (HandshakeRequest, HandshakeResponse, ProduceEvent, Event, EventError)


def decode_or_protocol_error(data: bytes, sender: str) -> None:
    try:
        message = decode(data, sender=sender)
    except ProtocolError:
        return
    assert isinstance(message, MESSAGE_TYPES)
    # Whatever decodes re-encodes to something that reads back the same.
    assert decode(encode(message), sender=sender) == message


@given(st.binary(max_size=64), st.sampled_from(["client", "server"]))
def test_fuzz_arbitrary_bytes(data, sender):
    decode_or_protocol_error(data, sender)


@given(
    st.sampled_from([1, 27, 2, 3, 10, 11, 12, 25, 26, 51, 52]),
    st.binary(max_size=8),
    st.lists(st.binary(max_size=6), max_size=6),
    st.binary(max_size=6),
    st.sampled_from(["client", "server"]),
)
def test_fuzz_valid_codes_and_plausible_lengths(code, head, fields, tail, sender):
    # Small, mostly-right length prefixes reach the field and UTF-8 checks deep in each message.
    body = b"".join(len(f).to_bytes(4, "little") + f for f in fields)
    decode_or_protocol_error(bytes([code]) + head + body + tail, sender)


@st.composite
def mutated(draw):
    sender, strategy = draw(
        st.sampled_from([("client", client_messages), ("server", server_messages)])
    )
    data = bytearray(encode(draw(strategy)))
    action = draw(st.sampled_from(["flip", "truncate", "insert"]))
    at = draw(st.integers(0, len(data) - 1))
    if action == "flip":
        data[at] = draw(u8)
    elif action == "truncate":
        del data[at:]
    else:
        data.insert(at, draw(u8))
    return bytes(data), sender


@given(mutated())
def test_fuzz_mutated_valid_messages(case):
    decode_or_protocol_error(*case)


@pytest.mark.parametrize(("name", "sender", "hex_", "message"), VECTORS, ids=VECTOR_IDS)
def test_every_truncation_of_a_vector_is_a_protocol_error_or_shorter_request_data(
    name, sender, hex_, message
):
    data = bytes.fromhex(hex_)
    for end in range(len(data)):
        decode_or_protocol_error(data[:end], sender)
