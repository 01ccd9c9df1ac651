from wireproto import errors


def test_every_error_is_a_protocol_error_and_a_value_error():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.ProtocolError)
        assert issubclass(cls, ValueError)


def test_error_keeps_message_and_offset():
    e = errors.TruncatedFrame("WEBSMQ frame of 1 byte: the header needs 2", offset=1)
    assert e.message == str(e) == "WEBSMQ frame of 1 byte: the header needs 2"
    assert e.offset == 1
