"""Phyllo device cases for the pub-sub message link (payload types, topics, the topic-length
byte, layer messages), the document types, and the endpoints the driver answers (``echo``,
``ping``/``pong``, ``reply``): the spec's "Pub-Sub Message Link", "Pub-Sub Document Link",
"Endpoint" and docs/phyllo.md's "What we decided"."""

from __future__ import annotations

from wireproto.codecs.phyllo import Document, PubSubMessage, message_from_document, serialize
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level
from wireproto.conformance.phyllo.support import (
    as_document,
    case,
    described,
    open_line,
    same_payload,
)

DECIDED = "docs/phyllo.md#what-we-decided"
ENDPOINTS = "docs/phyllo.md#documents-endpoints-and-the-router"
MESSAGE_LINK = "Pub-Sub Message Link"
DOCUMENT_LINK = "Pub-Sub Document Link"
ENDPOINT = "Endpoint"


# --- The pub-sub message link ------------------------------------------------------------------


@case("phyllo.message.echo", "A byte-buffer message (type 0x10) on 'echo' comes back "
      "with the same type, topic and payload", section=MESSAGE_LINK)
async def message_echo(ctx: Context) -> None:
    line = await open_line(ctx)
    await line.echo(PubSubMessage(0x10, b"echo", line.token()))


@case("phyllo.message.payload-bytes",
      "A payload of zeros, high bytes and a byte of each eighth value comes back unchanged",
      section=MESSAGE_LINK)
async def message_bytes(ctx: Context) -> None:
    line = await open_line(ctx)
    payload = line.token() + b"\x00\x00\x01\xfe\xff" + bytes(range(0, 256, 8)) + b"\x00"
    await line.echo(PubSubMessage(0x10, b"echo", payload))


@case("phyllo.message.empty-payload",
      "A message with an empty payload on a topic of its own is echoed", section=MESSAGE_LINK,
      decision=DECIDED)
async def message_empty(ctx: Context) -> None:
    line = await open_line(ctx)
    topic = b"echo" + line.token()[:6]
    await line.echo(PubSubMessage(0x10, topic, b""))


@case("phyllo.message.payload-types",
      "Messages of payload types 0x11, 0x40 and 0xff come back with their type unchanged",
      section=MESSAGE_LINK)
async def message_types(ctx: Context) -> None:
    line = await open_line(ctx)
    for payload_type in (0x11, 0x40, 0xFF):
        body = b"\x11\x00" if payload_type == 0x40 else b""
        message = PubSubMessage(payload_type, b"echo", body + line.token())
        await line.echo(message, f"the echo of a message of type 0x{payload_type:02x}")


@case("phyllo.message.layer-type",
      "A pub-sub message of a type below 0x10 (the layer's own) is not handed to the "
      "application, so not echoed", section=MESSAGE_LINK, decision=DECIDED)
async def message_layer_type(ctx: Context) -> None:
    line = await open_line(ctx)
    for payload_type in (0x05, 0x00, 0x0F):
        message = PubSubMessage(payload_type, b"echo", line.token())
        line.send(message, f"a message of type 0x{payload_type:02x}")
        await line.quiet(same_payload(message), f"a message of type 0x{payload_type:02x}",
                         0.5)
    await line.alive()


@case("phyllo.message.topic-longest",
      "A topic of 15 bytes, the most the topic length holds, comes back whole",
      section=MESSAGE_LINK)
async def topic_longest(ctx: Context) -> None:
    line = await open_line(ctx)
    topic = (b"echo-" + line.token())[:15].ljust(15, b"~")
    await line.echo(PubSubMessage(0x10, topic, line.token()))


@case("phyllo.message.topic-utf8",
      "A topic of UTF-8 text beyond ASCII comes back byte for byte", section=MESSAGE_LINK)
async def topic_utf8(ctx: Context) -> None:
    line = await open_line(ctx)
    await line.echo(PubSubMessage(0x10, "echo-\u00e9\u00e8".encode(), line.token()))


@case("phyllo.message.topic-other",
      "A message on a topic the device does not answer ('ecko') gets no answer",
      section=ENDPOINT, level=Level.SHOULD, decision=ENDPOINTS)
async def topic_other(ctx: Context) -> None:
    line = await open_line(ctx)
    message = PubSubMessage(0x10, b"ecko", line.token())
    line.send(message, "a message on 'ecko'")
    await line.quiet(lambda got: got.payload == message.payload, "a message on 'ecko'")


@case("phyllo.message.topic-length-sent",
      "The device writes the topic-length byte with its upper nibble zero",
      section=MESSAGE_LINK, decision=DECIDED)
async def topic_length_sent(ctx: Context) -> None:
    line = await open_line(ctx)
    answer = await line.echo(PubSubMessage(0x10, b"echo", line.token()))
    if answer.topic_byte is not None and answer.topic_byte & 0xF0:
        raise CaseFailed(f"the topic-length byte is 0x{answer.topic_byte:02x}")


@case("phyllo.message.topic-length-reserved",
      "A topic-length byte with its reserved upper nibble set is read by its low 4 bits",
      section=MESSAGE_LINK, level=Level.INFORMATION, decision=DECIDED)
async def topic_length_reserved(ctx: Context) -> str:
    line = await open_line(ctx)
    token = line.token()
    line.write(line.frame(line.datagram(bytes([0x10, 0xF4]) + b"echo" + token)),
               "a message whose topic-length byte is 0xf4")
    await line.answer(lambda got: got.payload.endswith(token),
                      "the echo of a message whose topic-length byte is 0xf4")
    return "the device masked the upper nibble and echoed the message"


@case("phyllo.message.truncated",
      "A pub-sub message shorter than its topic length says is dropped, and the device "
      "still echoes", section=MESSAGE_LINK, decision=DECIDED, harmful=True)
async def message_truncated(ctx: Context) -> None:
    line = await open_line(ctx)
    line.write(line.frame(line.datagram(bytes([0x10, 0x0F]) + b"echo")),
               "a message whose topic length is 15 with 4 topic bytes")
    line.write(line.frame(line.datagram(bytes([0x10]))), "a message of one byte")
    await line.alive("the echo of a good message sent after truncated ones")


# --- Documents --------------------------------------------------------------------------------


@case("phyllo.document.msgpack",
      "A msgpack document (format 0x11, schemaless) on 'echo' comes back with its format, "
      "schema and body", section=DOCUMENT_LINK, decision=DECIDED)
async def document_msgpack(ctx: Context) -> None:
    line = await open_line(ctx)
    value = {"n": line.token().decode(), "list": [1, -2, 3.5], "bin": b"\x00\xff", "none": None}
    message = message_from_document("echo", serialize(value))
    found = await line.echo(message, "the echo of a msgpack document")
    assert found.message is not None
    document = as_document(found.message)
    if document != as_document(message):
        raise CaseFailed(f"the document came back as {document!r}")


@case("phyllo.document.schema",
      "A document's schema byte (0x11, string8) comes back unchanged",
      section=DOCUMENT_LINK, decision=DECIDED)
async def document_schema(ctx: Context) -> None:
    line = await open_line(ctx)
    message = message_from_document("echo", serialize(line.token().decode(), schema=0x11))
    await line.echo(message, "the echo of a document of schema 0x11")


@case("phyllo.document.formats",
      "Documents of the other formats the spec names (CBOR 0x12, JSON 0x50) are echoed as "
      "they came", section=DOCUMENT_LINK, level=Level.SHOULD, decision=DECIDED)
async def document_formats(ctx: Context) -> None:
    line = await open_line(ctx)
    token = line.token().decode()
    cbor = Document(0x12, 0x00, b"\x66" + token.encode()[:6].ljust(6, b"~"))
    json = Document(0x50, 0x00, b'"' + token.encode() + b'"')
    for document in (cbor, json):
        await line.echo(message_from_document("echo", document),
                        f"the echo of a document of format 0x{document.format:02x}")


@case("phyllo.document.unreadable",
      "A document whose msgpack body cannot be read (on 'ping') does not stop the device",
      section=DOCUMENT_LINK, harmful=True)
async def document_unreadable(ctx: Context) -> None:
    line = await open_line(ctx)
    line.send(message_from_document("ping", Document(0x11, 0x00, b"\xc1\xdb\xff")),
              "a document of unreadable msgpack on 'ping'")
    line.send(PubSubMessage(0x10, b"ping", b"not a document"), "a byte buffer on 'ping'")
    await line.alive("the echo of a message sent after unreadable documents")


# --- Endpoints --------------------------------------------------------------------------------


@case("phyllo.endpoint.ping",
      "A document on 'ping' is answered with a document on 'pong' holding a count",
      section=ENDPOINT, decision=ENDPOINTS)
async def endpoint_ping(ctx: Context) -> None:
    line = await open_line(ctx)
    await line.ping()


@case("phyllo.endpoint.ping-counts",
      "Each ping's count is one more than the one before", section=ENDPOINT,
      decision=ENDPOINTS)
async def endpoint_ping_counts(ctx: Context) -> None:
    line = await open_line(ctx)
    first = await line.ping()
    second = await line.ping()
    if second != first + 1:
        raise CaseFailed(f"two pings one after the other were answered with {first} and "
                         f"{second}")


@case("phyllo.endpoint.reply",
      "A document on 'reply' is answered with the document \"hello!\" on 'reply'",
      section=ENDPOINT, decision=ENDPOINTS)
async def endpoint_reply(ctx: Context) -> None:
    from wireproto.codecs.phyllo import deserialize

    line = await open_line(ctx)
    line.send_document("reply", line.token().decode(), "a document on 'reply'")
    found = await line.answer(lambda got: got.topic == b"reply" and got.payload_type == 0x40,
                              "a document on 'reply'")
    assert found.message is not None
    document = as_document(found.message)
    try:
        value = deserialize(document)
    except (ValueError, Exception) as error:  # noqa: BLE001 - the device's bytes
        raise CaseFailed(f"the reply {described(found.message)} is unreadable: {error}") \
            from None
    if value != "hello!":
        raise CaseFailed(f"the reply holds {value!r}, not 'hello!'")


@case("phyllo.endpoint.unsolicited",
      "What the device sends unasked within 2 s of the line opening",
      section=ENDPOINT, level=Level.INFORMATION)
async def endpoint_unsolicited(ctx: Context) -> str:
    line = await open_line(ctx, settle=False)
    await line.quiet(lambda got: False, "nothing", 2.0)
    if not line.seen:
        return "the device sent nothing unasked"
    shown = "; ".join(answer.shown() for answer in line.seen.first)
    return f"the device sent {len(line.seen)} chunks unasked: {shown}"
