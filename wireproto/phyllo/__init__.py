"""Phyllo pub-sub as asynchronous, composable layers (docs/phyllo.md, "The layers";
the bytes are in its "What we decided").

Each layer wraps the one below it, in the spirit of `twisted.protocols.policies.ProtocolWrapper`,
and offers the service interface of its spec (`base.Layer`): `send(unit)`, `has_receive()` and
`receive()` over a bounded queue, an `on_receive` callback, and `next_receive()`, a Deferred.
The layers do no byte work of their own: they join the sans-IO codec in
`wireproto.codecs.phyllo`. From the carrier up:

- chunked stream (0x12): `ChunkedStream`, a Twisted Protocol on a byte stream (serial port,
  TCP, pty); hands up chunks. `MessageChunks` is the same layer on an `IMessageTransport` where
  one message is one chunk (WebSocket binary).
- frame (0x20): `FrameLayer`; hands up the COBS-decoded payload.
- datagram (0x21): `DatagramLayer`; validated datagram (0x22): `ValidatedDatagramLayer`, CRC
  checked. Each hands up the payload of the one type it carries.
- pub-sub message (0x60): `MessageLink`; hands up `PubSubMessage`s. No topic filter here.
- pub-sub document (0x40): `DocumentLink`; hands up `PubSubDocument`s (msgpack 0x11 and JSON
  0x50 read; CBOR 0x12 carried as bytes).
- `Endpoint`: a topic filter, exact or by prefix; `EndpointHandler` and
  `SingleEndpointHandler`; `Router`, which gives each document to its subscribed handlers.

Composing is building one layer on another; the presets do nothing else::

    link = MessageLink(ValidatedDatagramLayer(DatagramLayer(FrameLayer(ChunkedStream()))))
    router = Router(DocumentLink(reduced_stack()))        # the same, from the preset
    temp = Endpoint(router, "temp")                       # several endpoints share a router
    router.subscribe(SingleEndpointHandler("led", on_receive=print))
    documents = await connect_stack(SerialEndpoint(reactor, "/dev/ttyACM0"),
                                    lambda: DocumentLink(minimal_stack()))
    print(await documents.next_receive())

A datagram layer carries the type of the layer that wraps it (0x22 under a validated datagram,
0x60 under a message link) unless given `carries=`. Payload types below 0x10 are the layers' own
messages: counted (`layer_messages`), offered to `on_layer_message`, never handed up.

A unit that a layer cannot decode (bad CRC, bad length, bad COBS, over-long chunk, unreadable
document) is dropped, counted on that layer (`Counters`: `crc_errors`, `framing_errors`,
`type_errors`, `decode_errors`; `dropped` is for a full queue) and logged; the layers above never
see it, and the stream resyncs at the next 0x00 delimiter.

Not here: the standard stack's reliable buffer (0x23, Go-Back-N with a window of 8). It is
optional (docs/phyllo.md) and no reference peer needs it; `build_stack("standard")` says so.
"""

from wireproto.codecs.phyllo.codes import TypeCode
from wireproto.codecs.phyllo.document import Document, Format, Schema
from wireproto.codecs.phyllo.message import PubSubMessage

from .base import DEFAULT_MAX_QUEUE, Counters, Layer, LayerBase, error_counter
from .links import (
    ChunkedStream,
    DatagramLayer,
    FrameLayer,
    MessageChunks,
    ValidatedDatagramLayer,
)
from .presets import (
    PRESETS,
    StackFactory,
    build_stack,
    connect_stack,
    minimal_stack,
    reduced_stack,
)
from .pubsub import DocumentLink, MessageLink, PubSubDocument, topic_bytes
from .routing import Endpoint, EndpointHandler, Router, SingleEndpointHandler, TopicFilter

__all__ = [
    "DEFAULT_MAX_QUEUE",
    "PRESETS",
    "ChunkedStream",
    "Counters",
    "DatagramLayer",
    "Document",
    "DocumentLink",
    "Endpoint",
    "EndpointHandler",
    "Format",
    "FrameLayer",
    "Layer",
    "LayerBase",
    "MessageChunks",
    "MessageLink",
    "PubSubDocument",
    "PubSubMessage",
    "Router",
    "Schema",
    "SingleEndpointHandler",
    "StackFactory",
    "TopicFilter",
    "TypeCode",
    "ValidatedDatagramLayer",
    "build_stack",
    "connect_stack",
    "error_counter",
    "minimal_stack",
    "reduced_stack",
    "topic_bytes",
]
