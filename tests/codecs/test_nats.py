"""The NATS client protocol codec: a server's operations read as typed events, whole or however
a stream is cut; the client's operations written byte for byte; its limits and every error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wireproto.codecs.nats import (
    PING_COMMAND,
    PONG_COMMAND,
    Connect,
    Decoder,
    Err,
    Info,
    Msg,
    Ok,
    Ping,
    Pong,
    Pub,
    Sub,
    Unsub,
    decode,
    encode,
    encode_pub,
    header_status,
    header_values,
    headers_block,
)
from wireproto.errors import (
    BadEncoding,
    BadJSON,
    BadLength,
    FrameTooLarge,
    InvalidField,
    InvalidTopic,
    ProtocolError,
    TruncatedFrame,
    UnknownType,
)

# -- the decoder (moved from tests/cluster/test_nats_client.py) ---------------------------------

STREAM = (
    b'INFO {"server_id":"x","headers":true}\r\nPING\r\n'
    b"MSG a.b 1 5\r\nhello\r\n"
    b"MSG a.b 2 _INBOX.x 7\r\nab\r\ncd \r\n"
    b"HMSG a.c 3 21 24\r\nNATS/1.0\r\nWp: o 1\r\n\r\nabc\r\n"
    b"HMSG _INBOX.y.1 4 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"
    b"-ERR 'Authorization Violation'\r\n"
)
EVENTS = [
    Info({"server_id": "x", "headers": True}),
    Ping(),
    Msg("a.b", 1, None, None, b"hello"),
    Msg("a.b", 2, "_INBOX.x", None, b"ab\r\ncd "),
    Msg("a.c", 3, None, b"NATS/1.0\r\nWp: o 1\r\n\r\n", b"abc"),
    Msg("_INBOX.y.1", 4, None, b"NATS/1.0 503\r\n\r\n", b""),
    Err("Authorization Violation"),
]


def test_the_parser_reads_every_operation():
    assert Decoder().feed(STREAM) == EVENTS


def test_the_parser_reads_a_stream_split_anywhere():
    for cut in range(1, len(STREAM)):
        parser = Decoder()
        assert parser.feed(STREAM[:cut]) + parser.feed(STREAM[cut:]) == EVENTS
    parser = Decoder()
    assert [event for byte in STREAM for event in parser.feed(bytes([byte]))] == EVENTS


def test_a_line_read_before_is_read_again_split_anywhere_and_checked_again():
    """A decoder reads a message line it has read before by a look-up: the same messages,
    however the bytes are cut, and a payload not ended by CRLF is refused the second time too."""
    messages = [Msg("a.b", 1, None, None, b"hello"), Msg("a.c", 3, None, b"NATS/1.0\r\n\r\n",
                                                       b"abc")]
    stream = b"".join(encode(message) for message in messages)
    parser = Decoder()
    assert parser.feed(stream) == messages
    for cut in range(1, len(stream)):
        assert parser.feed(stream[:cut]) + parser.feed(stream[cut:]) == messages
    assert parser.feed(stream * 3) == messages * 3
    with pytest.raises(InvalidField, match="not followed by CRLF"):
        parser.feed(b"MSG a.b 1 5\r\nhelloXY")
    # A smaller max_payload on another decoder refuses what this one has read.
    with pytest.raises(FrameTooLarge):
        Decoder(max_payload=3).feed(b"MSG a.b 1 5\r\n")


@pytest.mark.parametrize("data", [
    b"WHAT\r\n", b"MSG a b 5\r\n", b"MSG a 1 -1\r\n", b"HMSG a 1 9 5\r\n", b"INFO [1]\r\n",
    b"INFO {\r\n", b"MSG " + b"a" * 5000,
])
def test_the_parser_refuses_what_is_not_nats(data):
    with pytest.raises(ProtocolError):
        Decoder().feed(data)


def test_headers():
    block = headers_block({"Wp": "origin 7", "Other": "x"})
    assert block == b"NATS/1.0\r\nWp: origin 7\r\nOther: x\r\n\r\n"
    assert header_values(block) == {"Wp": "origin 7", "Other": "x"}
    assert header_status(block) is None
    assert header_status(b"NATS/1.0 503\r\n\r\n") == 503


# -- typed events -------------------------------------------------------------------------------


def test_a_message_reads_its_own_headers():
    no_responders, with_values, plain = EVENTS[5], EVENTS[4], EVENTS[2]
    assert no_responders.status == 503 and no_responders.values() == {}
    assert with_values.status is None and with_values.values() == {"Wp": "o 1"}
    assert plain.status is None and plain.values() == {}


def test_events_are_frozen_and_compare_by_value():
    message = Msg("a", 1, None, None, b"x")
    with pytest.raises(AttributeError):
        message.sid = 2  # type: ignore[misc]
    assert message == Msg("a", 1, None, None, b"x") != Msg("a", 2, None, None, b"x")
    assert Ping() == Ping() and Ping() != Pong()


def test_decode_reads_a_whole_buffer_and_refuses_one_cut_short():
    assert decode(STREAM) == EVENTS
    assert decode(b"") == []
    assert decode(bytearray(b"PING\r\n")) == [Ping()]
    with pytest.raises(TruncatedFrame, match="inside a control line") as cut_line:
        decode(b"PING\r\nPON")
    assert cut_line.value.offset == 6
    with pytest.raises(TruncatedFrame, match="inside a message's payload"):
        decode(b"MSG a 1 5\r\nhel")
    with pytest.raises(BadEncoding):
        decode("PING\r\n")  # type: ignore[arg-type]


def test_the_decoder_says_what_it_holds():
    decoder = Decoder()
    assert decoder.feed(b"MSG a 1 5\r\nhe") == []
    assert decoder.pending == 2 and decoder.inside_message
    assert decoder.feed(b"llo\r\n") == [Msg("a", 1, None, None, b"hello")]
    assert decoder.pending == 0 and not decoder.inside_message


def test_plus_ok_and_an_error_without_quotes():
    assert decode(b"+OK\r\n-ERR Unknown Protocol Operation\r\n") == [
        Ok(), Err("Unknown Protocol Operation")]


# -- errors and limits --------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "error", "says"), [
    (b"WHAT\r\n", UnknownType, "NATS operation b'WHAT' is none a server sends"),
    (b"\r\n", UnknownType, "NATS operation b''"),
    (b"HMSGX a 1 1 1\r\n", UnknownType, "b'HMSGX a 1 1 1'"),
    (b"MSG a\r\n", InvalidField, "NATS MSG line of 1 fields, not subject sid [reply] size"),
    (b"MSG a 1 2 3 4\r\n", InvalidField, "line of 5 fields"),
    (b"HMSG a 1 2\r\n", InvalidField, "not subject sid [reply] header-size size"),
    (b"MSG a b 5\r\n", InvalidField, "sid or sizes are not decimal integers"),
    (b"MSG a 1 -1\r\n", BadLength, "a negative sid or size"),
    (b"MSG a -1 1\r\n", BadLength, "a negative sid or size"),
    (b"HMSG a 1 9 5\r\n", BadLength, "a header size over the whole size"),
    (b"MSG \xff 1 1\r\nx\r\n", BadEncoding, "not UTF-8"),
    (b"MSG a 1 r\xff 1\r\nx\r\n", BadEncoding, "not UTF-8"),
    (b"MSG a 1 1\r\nxyz\r\n", InvalidField, "not followed by CRLF but by b'yz'"),
    (b"INFO [1]\r\n", BadJSON, "NATS INFO that is not a JSON object"),
    (b"INFO {\r\n", BadJSON, "NATS INFO"),
])
def test_each_error_says_what_is_wrong(data, error, says):
    with pytest.raises(error) as raised:
        Decoder().feed(data)
    assert says in str(raised.value)


def test_a_control_line_over_the_limit_is_refused_however_it_is_cut():
    line = b"MSG " + b"a" * 60 + b" 1 1\r\nx\r\n"  # a 68-byte control line
    assert Decoder(max_control_line=68).feed(line) == [Msg("a" * 60, 1, None, None, b"x")]
    for cut in (None, 10, 68, 69):
        decoder = Decoder(max_control_line=67)
        with pytest.raises(FrameTooLarge, match="longer than the decoder's max_control_line "
                                                "of 67"):
            if cut is None:
                decoder.feed(line)
            else:
                decoder.feed(line[:cut])
                decoder.feed(line[cut:])
    # Waiting for a line's end holds at most the limit and a CR.
    decoder = Decoder(max_control_line=68)
    assert decoder.feed(line[:69]) == []
    with pytest.raises(FrameTooLarge, match="not ended yet"):
        decoder.feed(b"z")


def test_a_message_over_max_payload_is_refused_before_its_payload_comes():
    decoder = Decoder(max_payload=10)
    assert decoder.feed(b"HMSG a 1 4 10\r\n") == []
    with pytest.raises(FrameTooLarge, match="11 bytes is over the decoder's max_payload of 10"):
        Decoder(max_payload=10).feed(b"MSG a 1 11\r\n")


# -- writing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("operation", "wire"), [
    (Connect({"verbose": False, "name": "w"}), b'CONNECT {"verbose":false,"name":"w"}\r\n'),
    (Pub("a.b", b"hi"), b"PUB a.b 2\r\nhi\r\n"),
    (Pub("a.b", b"hi", reply="_INBOX.1"), b"PUB a.b _INBOX.1 2\r\nhi\r\n"),
    (Pub("a", b"hi", headers=b"NATS/1.0\r\nX: 1\r\n\r\n"),
     b"HPUB a 18 20\r\nNATS/1.0\r\nX: 1\r\n\r\nhi\r\n"),
    (Pub("a", b"", "r", b"NATS/1.0\r\n\r\n"), b"HPUB a r 12 12\r\nNATS/1.0\r\n\r\n\r\n"),
    (Sub("a.*", 7), b"SUB a.* 7\r\n"),
    (Sub("work", 8, queue="workers"), b"SUB work workers 8\r\n"),
    (Unsub(7), b"UNSUB 7\r\n"),
    (Ping(), PING_COMMAND),
    (Pong(), PONG_COMMAND),
    (Ok(), b"+OK\r\n"),
])
def test_each_operation_is_written_as_nats_says(operation, wire):
    assert encode(operation) == wire


def test_the_publish_path_writes_what_encode_writes():
    for pub in (Pub("a.b", b"x"), Pub("a.b", b"x", "r.1"), Pub("a", b"y", None, headers_block({}))):
        assert encode_pub(pub.subject, pub.payload, pub.reply, pub.headers) == encode(pub)


def test_every_server_event_reads_back():
    assert b"".join(map(encode, EVENTS)) == STREAM


@pytest.mark.parametrize("subject", ["", "a b", "a\r\nPUB x 1", "a\tb", "a\x00"])
def test_a_subject_that_would_break_the_line_is_refused(subject):
    with pytest.raises(InvalidTopic, match="empty or holds a space or a control character"):
        encode_pub(subject, b"x")
    with pytest.raises(InvalidTopic):
        encode(Sub(subject, 1))
    with pytest.raises(InvalidTopic):
        encode(Pub("a", b"x", reply=subject))
    with pytest.raises(InvalidTopic):
        encode(Sub("a", 1, queue=subject))


@pytest.mark.parametrize(("operation", "says"), [
    (Sub("a", -1), "sid must be a non-negative int"),
    (Unsub("1"), "sid must be a non-negative int"),  # type: ignore[arg-type]
    (Pub("a", b"x", headers=b"X: 1\r\n\r\n"), "headers must be a block"),
    (Msg("a", 1, None, b"NATS/1.0\r\n", b""), "headers must be a block"),
    (Connect({"x": object()}), "cannot be written as JSON"),
    (Info({"x": float("nan")}), "cannot be written as JSON"),
    (Err("it's\r\n"), "would not be read back"),
    (Err(" padded"), "would not be read back"),
    (Pub(b"a", b"x"), "subject must be str"),  # type: ignore[arg-type]
])
def test_encode_refuses_what_could_not_be_read_back(operation, says):
    with pytest.raises(ProtocolError, match=says):
        encode(operation)


def test_encode_refuses_what_is_not_an_operation():
    with pytest.raises(TypeError, match="not a NATS operation"):
        encode(("PING",))  # type: ignore[arg-type]


def test_a_header_block_may_open_with_a_status():
    assert headers_block({}, 503) == b"NATS/1.0 503\r\n\r\n"
    block = headers_block({"A": "b"}, 408, "Request Timeout")
    assert block == b"NATS/1.0 408 Request Timeout\r\nA: b\r\n\r\n"
    assert header_status(block) == 408 and header_values(block) == {"A": "b"}
    assert decode(encode(Msg("_INBOX.1", 1, None, headers_block({}, 503), b"")))[0].status == 503
    for status in (99, 1000, "503"):
        with pytest.raises(InvalidField, match="three digits"):
            headers_block({}, status)  # type: ignore[arg-type]
    with pytest.raises(InvalidField, match="description"):
        headers_block({}, 503, "No\r\nResponders")


@pytest.mark.parametrize(("values", "says"), [
    ({"A B": "x"}, "header name 'A B'"),
    ({"A:B": "x"}, "holds a colon"),
    ({"": "x"}, "is empty"),
    ({"A": "x\r\nB: y"}, "value 'x\\\\r\\\\nB: y' holds a control character"),
])
def test_a_header_block_refuses_what_would_break_its_lines(values, says):
    with pytest.raises(InvalidField, match=says):
        headers_block(values)


# -- properties ---------------------------------------------------------------------------------

tokens = st.text("abcXYZ019_-*>$", min_size=1, max_size=8)
subjects = st.lists(tokens, min_size=1, max_size=4).map(".".join)
header_blocks = st.dictionaries(
    st.text("ABCxyz-", min_size=1, max_size=6), st.text("ab: 1", max_size=8), max_size=3,
).map(headers_block)
messages = st.builds(Msg, subjects, st.integers(0, 2**40), st.none() | subjects,
                     st.none() | header_blocks, st.binary(max_size=40))
server_events = st.one_of(
    messages,
    st.builds(Info, st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5),
                                    max_size=3)),
    st.just(Ping()), st.just(Pong()), st.just(Ok()),
    st.builds(Err, st.text("ab c'", min_size=1, max_size=10).map(lambda t: t.strip(" '"))
              .filter(bool)),
)


@given(st.lists(server_events, max_size=6), st.data())
def test_events_read_back_from_a_stream_cut_anywhere(events, data):
    stream = b"".join(map(encode, events))
    assert decode(stream) == events
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    decoder, read, start = Decoder(), [], 0
    for cut in [*cuts, len(stream)]:
        read += decoder.feed(stream[start:cut])
        start = cut
    assert read == events and decoder.pending == 0


@given(st.binary(max_size=200))
def test_any_bytes_decode_to_events_or_a_protocol_error(data):
    try:
        events = Decoder().feed(data)
    except ProtocolError:
        return
    assert all(isinstance(event, (Info, Msg, Ping, Pong, Ok, Err)) for event in events)
