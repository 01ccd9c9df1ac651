"""The pub-sub message link (0x60) and the pub-sub document link (0x40) as wrappers.

docs/phyllo.md describes both links ("Message model") and their bytes ("What we decided");
`wireproto.codecs.phyllo` encodes and decodes them.

- `MessageLink` hands up `PubSubMessage`s: payload type, topic and payload. A message whose
  payload type is below 0x10 is the link's own and is never handed up. It filters no topics:
  that is the endpoint's job.
- `DocumentLink` wraps a message link and hands up `PubSubDocument`s: the topic, the document
  (format, schema, body) and its value. msgpack (0x11) and JSON (0x50) bodies are read as they
  arrive, so a body that does not parse is dropped here (a decode error) and never reaches the
  application. CBOR (0x12) is carried with its body as bytes and `value` None: no CBOR library
  is a dependency. Any other format, or a message that is not a document, is a type error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from wireproto.codecs.phyllo.codes import LAYER_TYPE_LIMIT, TypeCode, type_name
from wireproto.codecs.phyllo.document import (
    Document,
    Format,
    Schema,
    decode_document,
    deserialize,
    message_from_document,
    serialize,
)
from wireproto.codecs.phyllo.message import PubSubMessage, decode_message, encode_message
from wireproto.codecs.phyllo.message import topic_bytes as message_topic
from wireproto.errors import InvalidTopic, ProtocolError, UnknownType

from .base import DEFAULT_MAX_QUEUE, Layer, LayerBase

__all__ = ["DocumentLink", "MessageLink", "PubSubDocument", "SendsValues", "topic_bytes"]


def topic_bytes(topic: bytes | str) -> bytes:
    """A topic as the bytes on the wire: str topics are UTF-8."""
    if isinstance(topic, str):
        try:
            return topic.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidTopic(f"Phyllo topic {topic!r} cannot be written as UTF-8: {e}") from None
    if isinstance(topic, (bytes, bytearray, memoryview)):
        return bytes(topic)
    raise InvalidTopic(f"Phyllo topic must be bytes or str, not {type(topic).__name__}")


@dataclass(frozen=True, slots=True)
class PubSubDocument:
    """A document on a topic, the unit of the document link and everything above it.

    `value` is the body read (msgpack, JSON) when the document was received or built with
    `of()`; it is None for CBOR, whose body stays in `document.body`.
    """

    topic: bytes
    document: Document
    value: Any = None

    def __post_init__(self) -> None:
        if type(self.topic) is not bytes:
            object.__setattr__(self, "topic", topic_bytes(self.topic))

    @classmethod
    def of(
        cls,
        topic: bytes | str,
        value: Any,
        *,
        format: int = Format.MSGPACK,
        schema: int = Schema.SCHEMALESS,
    ) -> PubSubDocument:
        """`value` serialized in `format` (msgpack or JSON), on `topic`."""
        return cls(topic_bytes(topic), serialize(value, format, schema), value)


class MessageLink(Layer[PubSubMessage]):
    """The pub-sub message link (0x60): byte buffers on named topics."""

    name: ClassVar[str] = "message link"
    type_code: ClassVar[int] = TypeCode.PUBSUB

    def __init__(self, below: LayerBase, *, max_queue: int = DEFAULT_MAX_QUEUE) -> None:
        self.on_layer_message: Callable[[PubSubMessage], object] | None = None
        super().__init__(below, max_queue=max_queue)

    def below_received(self, data: bytes) -> None:
        try:
            message = decode_message(data)
        except ProtocolError as error:
            self._reject(error)
            return
        if message.payload_type < LAYER_TYPE_LIMIT:
            self._layer_message(message)
        else:
            self._deliver(message)

    def send(self, message: PubSubMessage) -> None:
        self.send_below(encode_message(message))

    def send_payload(
        self, topic: bytes | str, payload: bytes, payload_type: int = TypeCode.BYTES_BUFFER
    ) -> None:
        """Send a byte buffer on `topic` (payload type 0x10 unless told otherwise)."""
        self.send(PubSubMessage(payload_type, message_topic(topic), payload))


_READABLE = (Format.MSGPACK, Format.JSON)


class SendsValues:
    """`send_value(topic, value)` for a layer whose `send` takes a `PubSubDocument`."""

    def send(self, document: PubSubDocument) -> None:
        raise NotImplementedError

    def send_value(
        self,
        topic: bytes | str,
        value: Any,
        *,
        format: int = Format.MSGPACK,
        schema: int = Schema.SCHEMALESS,
    ) -> None:
        """Serialize `value` (msgpack unless told otherwise) and send it on `topic`."""
        self.send(PubSubDocument.of(topic, value, format=format, schema=schema))


class DocumentLink(SendsValues, Layer[PubSubDocument]):
    """The pub-sub document link (0x40): structured data on named topics, over a message link."""

    name: ClassVar[str] = "document link"
    type_code: ClassVar[int] = TypeCode.DOCUMENT

    def below_received(self, message: PubSubMessage) -> None:
        if message.payload_type != TypeCode.DOCUMENT:
            self._reject(
                UnknownType(
                    f"Phyllo message on topic {message.topic!r} carries payload type "
                    f"{type_name(message.payload_type)}, not a document (0x40)"
                )
            )
            return
        try:
            document = decode_document(message.payload)
        except ProtocolError as error:
            self._reject(error)
            return
        value = None
        if document.format in _READABLE:
            try:
                value = deserialize(document)
            except ProtocolError as error:
                self._reject(error, "decode_errors")
                return
        elif document.format != Format.CBOR:
            self._reject(
                UnknownType(
                    f"Phyllo document on topic {message.topic!r} has format "
                    f"0x{document.format:02x}: wireproto carries msgpack 0x11, CBOR 0x12 and "
                    "JSON 0x50"
                )
            )
            return
        self._deliver(PubSubDocument(message.topic, document, value))

    def send(self, document: PubSubDocument) -> None:
        self.send_below(message_from_document(document.topic, document.document))
