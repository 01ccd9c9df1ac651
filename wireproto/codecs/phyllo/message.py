"""Phyllo pub-sub message (type 0x60): a payload on a named topic.

    payload type u8 | topic length u8 | topic (0-15 bytes) | payload

The topic length is the low 4 bits of its byte; the upper 4 are reserved, so they are sent as
zero and ignored (masked) on receipt. A topic is a byte sequence, usually UTF-8 text such as
`echo`; `str` topics are accepted and stored as their UTF-8 bytes. A payload type below 0x10
marks the message link's own message (see `is_layer_message`), which carries no application data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from wireproto.codecs.serialization import binary, unchecked_constructor
from wireproto.errors import InvalidField, InvalidTopic, TruncatedFrame

__all__ = [
    "MAX_TOPIC_LENGTH", "PubSubMessage", "decode_message", "encode_message", "topic_bytes",
]

MAX_TOPIC_LENGTH = 15


@dataclass(frozen=True, slots=True)
class PubSubMessage:
    payload_type: int
    topic: bytes
    payload: bytes

    def __post_init__(self) -> None:
        topic = self.topic
        if type(topic) is not bytes:
            topic = topic_bytes(topic)
            object.__setattr__(self, "topic", topic)
        if len(topic) > MAX_TOPIC_LENGTH:
            raise InvalidTopic(
                f"Phyllo topic {topic!r} is {len(topic)} bytes: at most {MAX_TOPIC_LENGTH} fit"
            )


def topic_bytes(topic: str | bytes | bytearray | memoryview) -> bytes:
    """A message's topic as bytes: str as UTF-8; raises InvalidTopic for what cannot be one."""
    if type(topic) is bytes:
        return topic
    if isinstance(topic, str):
        try:
            return topic.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidTopic(f"Phyllo topic {topic!r} cannot be written as UTF-8: {e}") from None
    if isinstance(topic, (bytearray, memoryview)):
        return bytes(topic)
    raise InvalidTopic(f"Phyllo topic must be bytes or str, not {type(topic).__name__}")


_HEADER = struct.Struct(">BB")
# decode_message masks the topic length to 4 bits, so its topic needs no __post_init__ check.
_build_message = unchecked_constructor(PubSubMessage)


def encode_message(message: PubSubMessage) -> bytes:
    return _pack_message(message.payload_type, message.topic, message.payload)


def _pack_message(payload_type: int, topic: bytes, payload: bytes) -> bytes:
    try:
        header = _HEADER.pack(payload_type, len(topic))
    except struct.error:
        raise InvalidField(
            f"Phyllo pub-sub message payload type {payload_type!r} is not a byte (0-255)"
        ) from None
    return b"".join((header, topic, payload))


def decode_message(data: bytes) -> PubSubMessage:
    if type(data) is not bytes:
        data = binary(data, "Phyllo pub-sub message")
    size = len(data)
    if size < 2:
        raise TruncatedFrame(
            f"Phyllo pub-sub message of {size} byte{'' if size == 1 else 's'}: "
            "the header (payload type and topic length) needs 2"
        )
    topic_end = 2 + (data[1] & 0x0F)
    if topic_end > size:
        raise TruncatedFrame(
            f"Phyllo pub-sub message topic length is {topic_end - 2} but only {size - 2} "
            "bytes follow the header",
            offset=1,
        )
    return _build_message(data[0], data[2:topic_end], data[topic_end:])
