"""The Wp header codec: the header blocks a broker process forwards with, byte for byte, read
back; the encodings carried ahead of the payload; and every malformed header refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wireproto.codecs import wpheader
from wireproto.codecs.nats import headers_block
from wireproto.codecs.wpheader import (
    Carried,
    HeaderWriter,
    WpHeader,
    carry,
    decode,
    encode,
    read,
    split,
)
from wireproto.errors import (
    BadEncoding,
    BadLength,
    InvalidField,
    ProtocolError,
    TruncatedFrame,
)

# What a process forwards with, as docs/cluster.md and the link have always written it.
VECTORS = [
    (WpHeader("host:41/0a1b2c3d", 1, False, "websmq"),
     b"NATS/1.0\r\nWp: host:41/0a1b2c3d 1 - websmq\r\n\r\n"),
    (WpHeader("host:41/0a1b2c3d", 72, True, ""),
     b"NATS/1.0\r\nWp: host:41/0a1b2c3d 72 w -\r\n\r\n"),
    (WpHeader("n/1", 3, False, "subble", (Carried("subble", 57, True),)),
     b"NATS/1.0\r\nWp: n/1 3 - subble subble:57:b\r\n\r\n"),
    (WpHeader("n/1", 4, True, "ubre", (Carried("subble", 5, True), Carried("json", 0, False))),
     b"NATS/1.0\r\nWp: n/1 4 w ubre subble:5:b json:0:t\r\n\r\n"),
]


@pytest.mark.parametrize(("header", "block"), VECTORS)
def test_a_header_is_written_and_read_back(header, block):
    assert encode(header) == block
    assert decode(block) == header
    assert read(block) == (header.origin, header.sequence, header.will, header.protocol,
                           header.carried)


@pytest.mark.parametrize(("header", "block"), VECTORS)
def test_the_writer_writes_what_encode_writes(header, block):
    writer = HeaderWriter(header.origin)
    encodings = {carried.name: (b"x" * carried.length, carried.binary)
                 for carried in header.carried}
    for _ in range(2):  # the second time from what the writer made once
        assert writer.write(header.sequence, header.will, header.protocol, encodings) == block


def test_a_block_without_the_line_has_no_header():
    for block in (b"NATS/1.0\r\n\r\n", headers_block({"Wp-Status": "busy"}),
                  headers_block({"Wp-Gone": "1"}), b"NATS/1.0 503\r\n\r\n"):
        assert decode(block) is None and read(block) is None


def test_a_later_versions_line_is_refused_not_taken_for_a_plain_publish():
    """A later version names its line Wp2, Wp3...: a process that cannot read it must not
    deliver the message as if it carried no header (no duplicate dropped, no will)."""
    for block in (headers_block({"Wp2": "o 9 - websmq x"}),
                  headers_block({"Other": "x", "Wp17": "anything at all"})):
        with pytest.raises(wpheader.UnknownVersion, match="later version than 1"):
            read(block)
        with pytest.raises(wpheader.UnknownVersion):
            decode(block)
    assert issubclass(wpheader.UnknownVersion, ProtocolError)
    # The version 1 line is still read when another version's line is beside it.
    both = headers_block({"Wp": "o 9 - websmq", "Wp2": "o 9 - websmq x"})
    assert decode(both) == WpHeader("o", 9, False, "websmq")


def test_the_line_is_found_among_other_headers():
    block = headers_block({"Nats-Msg-Id": "7", "Wp": "o 9 - websmq", "Other": "x"})
    assert decode(block) == WpHeader("o", 9, False, "websmq")


def test_the_encodings_come_first_in_the_payload():
    encodings = {"subble": (b"EVENT", True), "json": (b"{}", False)}
    payload = carry(encodings, b"payload")
    assert payload == b"EVENT{}payload"
    header = decode(HeaderWriter("o").write(1, False, "subble", encodings))
    assert split(header.carried, payload) == (encodings, b"payload")
    assert split((), b"payload") == ({}, b"payload")


@pytest.mark.parametrize(("block", "error", "says"), [
    (b"NATS/1.0\r\nWp: o 1 -", TruncatedFrame, "not ended by CRLF"),
    (b"NATS/1.0\r\nWp: o 1\r\n\r\n", InvalidField, "not ORIGIN SEQUENCE WILL PROTOCOL"),
    (b"NATS/1.0\r\nWp: o 1 -\r\n\r\n", InvalidField, "with no protocol"),
    (b"NATS/1.0\r\nWp:  1 - p\r\n\r\n", InvalidField, "not ORIGIN SEQUENCE"),
    (b"NATS/1.0\r\nWp: o x - p\r\n\r\n", InvalidField, "a decimal integer"),
    (b"NATS/1.0\r\nWp: o -1 - p\r\n\r\n", InvalidField, "a decimal integer"),
    (b"NATS/1.0\r\nWp: o " + b"9" * 20 + b" - p\r\n\r\n", InvalidField, "at most 19 digits"),
    (b"NATS/1.0\r\nWp: o 1 x p\r\n\r\n", InvalidField, "neither w nor -"),
    (b"NATS/1.0\r\nWp: o 1 - p s:1\r\n\r\n", InvalidField, "is not NAME:LENGTH:b"),
    (b"NATS/1.0\r\nWp: o 1 - p s:1:x\r\n\r\n", InvalidField, "is not NAME:LENGTH:b"),
    (b"NATS/1.0\r\nWp: o 1 - p :1:b\r\n\r\n", InvalidField, "is not NAME:LENGTH:b"),
    (b"NATS/1.0\r\nWp: o 1 - p s:" + b"9" * 20 + b":b\r\n\r\n", InvalidField, "19 digits"),
    (b"NATS/1.0\r\nWp: \xff 1 - p\r\n\r\n", BadEncoding, "origin is not UTF-8"),
    (b"NATS/1.0\r\nWp: o 1 - \xff\r\n\r\n", BadEncoding, "not UTF-8"),
    (b"NATS/1.0\r\nWp: o 1 - p \xff:1:b\r\n\r\n", BadEncoding, "not UTF-8"),
])
def test_a_malformed_header_says_what_is_wrong(block, error, says):
    with pytest.raises(error, match=says):
        decode(block)


def test_encodings_longer_than_the_payload_are_refused():
    header = decode(b"NATS/1.0\r\nWp: o 1 - p s:10:b\r\n\r\n")
    with pytest.raises(BadLength, match="more than the 3 bytes of the payload"):
        split(header.carried, b"abc")


@pytest.mark.parametrize(("header", "says"), [
    (WpHeader("", 1), "origin '' is empty"),
    (WpHeader("a b", 1), "holds a space"),
    (WpHeader("a\r\n", 1), "control character"),
    (WpHeader("o", -1), "sequence must be a non-negative int"),
    (WpHeader("o", 1, protocol="-"), "would be read back as no protocol"),
    (WpHeader("o", 1, protocol="web smq"), "protocol 'web smq'"),
    (WpHeader("o", 1, carried=(Carried("a:b", 1, True),)), "holds a colon"),
    (WpHeader("o", 1, carried=(Carried("a", -1, True),)), "length must be a non-negative int"),
])
def test_encode_refuses_what_could_not_be_read_back(header, says):
    with pytest.raises(InvalidField, match=says):
        encode(header)


def test_the_writer_refuses_an_origin_or_protocol_that_would_break_the_line():
    with pytest.raises(InvalidField, match="origin"):
        HeaderWriter("node 1/ab")
    with pytest.raises(InvalidField, match="protocol"):
        HeaderWriter("o").write(1, False, "a b")
    with pytest.raises(InvalidField, match="colon"):
        HeaderWriter("o").write(1, False, "p", {"a:b": (b"", True)})


def test_what_is_read_once_is_remembered_within_bounds():
    for number in range(wpheader._CACHE_SIZE + 10):
        assert read(b"NATS/1.0\r\nWp: o%d 1 - p%d\r\n\r\n" % (number, number))[3] == f"p{number}"
    assert len(wpheader._known) <= wpheader._CACHE_SIZE
    # Read again, from what is remembered: the sequence number is each message's own, and one
    # that is not a number is refused as the first time.
    assert read(b"NATS/1.0\r\nWp: o5 77 - p5\r\n\r\n") == ("o5", 77, False, "p5", ())
    assert read(b"NATS/1.0\r\nWp: o5 77 - p5\r\n\r\n") == ("o5", 77, False, "p5", ())
    assert read(b"NATS/1.0\r\nWp: o5 78 - p5\r\n\r\n")[1] == 78
    for sequence in (b"x7", b"", b"1" * 20, b"-1"):
        with pytest.raises(InvalidField, match="SEQUENCE"):
            read(b"NATS/1.0\r\nWp: o5 %s - p5\r\n\r\n" % sequence)
    # A long line is read, not kept: what is kept stays small whatever another process sends.
    wpheader._known.clear()
    long = b"NATS/1.0\r\nWp: %s 1 - p\r\n\r\n" % (b"o" * 100_000)
    assert read(long)[0] == "o" * 100_000
    assert not wpheader._known


# -- properties ---------------------------------------------------------------------------------

fields = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp", "Cf", "Co",
                                                     "Cn")), min_size=1, max_size=10)
headers = st.builds(
    WpHeader, fields, st.integers(0, 2**63 - 1), st.booleans(),
    st.just("") | fields.filter(lambda protocol: protocol != "-"),
    st.lists(st.builds(Carried, fields.filter(lambda name: ":" not in name),
                       st.integers(0, 100), st.booleans()), max_size=3).map(tuple),
)


@given(headers)
def test_every_header_reads_back(header):
    block = encode(header)
    assert decode(block) == header
    assert decode(headers_block({"Before": "x"})[:-2] + block[10:]) == header


@given(st.dictionaries(fields.filter(lambda name: ":" not in name),
                       st.tuples(st.binary(max_size=20), st.booleans()), max_size=3),
       st.binary(max_size=20))
def test_carried_encodings_are_split_off_again(encodings, payload):
    header = decode(HeaderWriter("o").write(5, False, "p", encodings))
    assert split(header.carried, carry(encodings, payload)) == (encodings, payload)


@given(st.binary(max_size=120))
def test_any_block_decodes_to_a_header_none_or_a_protocol_error(block):
    try:
        decode(b"NATS/1.0\r\nWp: " + block)
    except ProtocolError:
        pass
