"""Every decoder, fed arbitrary text, gives a message or a ProtocolError and nothing else.

Text is what a peer sends in a WebSocket text frame. The text formats (UBRE JSON, nydus) read it;
the binary ones refuse it with a ProtocolError. A value that is neither text nor bytes is a
programming error, not bad input, and raises TypeError.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wireproto.codecs import nydus, phyllo, subble, ubre, websmq
from wireproto.errors import BadEncoding, ProtocolError

TEXT_DECODERS = {"ubre": ubre.decode, "nydus": nydus.decode}

BINARY_DECODERS = {
    "websmq": websmq.decode,
    "subble from a client": lambda data: subble.decode(data, sender="client"),
    "subble from a server": lambda data: subble.decode(data, sender="server"),
    "phyllo": phyllo.decode,
    "phyllo reduced": phyllo.REDUCED.decode,
    "phyllo chunk": phyllo.MINIMAL.decode_chunk,
    "phyllo frame": phyllo.decode_frame,
    "phyllo datagram": phyllo.decode_datagram,
    "phyllo validated datagram": phyllo.decode_validated_datagram,
    "phyllo message": phyllo.decode_message,
    "phyllo document": phyllo.decode_document,
    "phyllo splitter": lambda data: phyllo.ChunkSplitter().feed(data),
    "phyllo stack decoder": lambda data: phyllo.StackDecoder().feed(data),
}


@pytest.mark.parametrize("name", sorted(TEXT_DECODERS))
@given(text=st.text())
def test_text_formats_read_any_text_or_raise_protocol_error(name, text):
    try:
        TEXT_DECODERS[name](text)
    except ProtocolError:
        pass


@pytest.mark.parametrize("name", sorted(BINARY_DECODERS))
@given(text=st.text())
def test_binary_formats_refuse_any_text(name, text):
    with pytest.raises(BadEncoding, match="binary"):
        BINARY_DECODERS[name](text)


@pytest.mark.parametrize("name", sorted(BINARY_DECODERS) + sorted(TEXT_DECODERS))
@pytest.mark.parametrize("value", [None, 7, 1.5, ["list"]])
def test_values_that_are_not_data_are_a_type_error(name, value):
    decoder = {**BINARY_DECODERS, **TEXT_DECODERS}[name]
    with pytest.raises(TypeError):
        decoder(value)


class Text(str):
    pass


class Data(bytes):
    pass


@pytest.mark.parametrize("name", sorted(TEXT_DECODERS))
def test_text_formats_read_a_str_subclass_as_text(name):
    assert TEXT_DECODERS[name](Text('{"success":1}' if name == "ubre" else "2$a|1"))


@pytest.mark.parametrize("name", sorted(BINARY_DECODERS) + sorted(TEXT_DECODERS))
def test_every_decoder_reads_a_bytes_subclass_as_bytes(name):
    decoder = {**BINARY_DECODERS, **TEXT_DECODERS}[name]
    try:
        decoder(Data(b"\x00\x01a"))
    except ProtocolError:
        pass
