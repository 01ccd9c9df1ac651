"""What a case says of what a server sent is short, whatever the server sent."""

from __future__ import annotations

from wireproto.codecs import nydus
from wireproto.codecs.subble import EventError, MessageCode
from wireproto.conformance.bounded import bounded


def test_short_values_read_as_their_repr() -> None:
    for value in ("7", b"\x00a", 7, 2.5, None, True, [1, "x"], {"status": 404}):
        assert bounded(value) == repr(value)


def test_text_and_bytes_are_cut_and_say_how_much_is_left() -> None:
    assert bounded("x" * 1000) == repr("x" * 60) + "... and 940 more"
    assert bounded(b"\xe5" * (64 << 20)).endswith(f"... and {(64 << 20) - 60} more")
    assert len(bounded(b"\xe5" * (64 << 20))) < 300


def test_a_message_is_shown_field_by_field_each_cut() -> None:
    error = EventError(MessageCode.EVENT_FORBIDDEN, "m" * 100_000, b"r" * 100_000)
    shown = bounded(error)
    assert shown.startswith("EventError(code=")
    assert "... and 99940 more" in shown and len(shown) < 400
    huge = nydus.Error("a1", {"message": "x" * 100_000, "list": list(range(100_000))})
    assert len(bounded(huge)) < 400


def test_an_integer_too_long_to_write_is_described() -> None:
    assert bounded(10 ** 5000) == "an integer of 16610 bits"
