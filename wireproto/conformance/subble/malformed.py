"""The SubbleSocket kit's cases on input no server may act on: every kind of message
wireproto's codec rejects (docs/subblesocket.md, "What we decided", Errors), text frames,
framing past the limit, and abrupt closes. Each is harmful: afterwards the kit checks that the
server still serves."""

from __future__ import annotations

import struct

from wireproto.codecs.subble import HandshakeRequest, encode
from wireproto.conformance.context import Context
from wireproto.conformance.model import Level
from wireproto.conformance.subble.common import (
    DECIDED,
    DECIDED_HOST,
    handshake,
    kit,
    name,
    next_event,
    not_accepted,
    produce,
)

HANDSHAKE_REQUEST = "Handshake Request"
CODES = "Subble Codes"  # a code no one sends, or only a server
PRODUCE = "Produce events"


def le32(value: int) -> bytes:
    return struct.pack("<i", value)


def field(data: bytes) -> bytes:
    return le32(len(data)) + data


HEAD = b"\x01\x01\x00\x00"  # code 1, version 1.0.0

# Handshake requests the codec rejects, each with what is wrong with it.
BAD_HANDSHAKES = {
    "handshake-short": (b"\x01\x01\x00", "three bytes: the version is cut short"),
    "handshake-client-id-truncated": (HEAD + le32(40) + b"abc",
                                      "a client ID length of 40 with 3 bytes after it"),
    "handshake-client-id-negative": (HEAD + le32(-1) + b"\x01;" + le32(0) + le32(0),
                                     "a client ID length of -1"),
    "handshake-client-id-huge": (HEAD + le32(0x7FFFFFFF) + b"abc",
                                 "a client ID length of 2147483647 with 3 bytes after it"),
    "handshake-no-separator": (HEAD + field(b"id"),
                               "a message that ends after the client ID"),
    "handshake-empty-separator": (HEAD + field(b"id") + b"\x00" + le32(0) + le32(0),
                                  "an empty value separator"),
    "handshake-separator-truncated": (HEAD + field(b"id") + b"\x05;;",
                                      "a separator length of 5 with 2 bytes after it"),
    "handshake-list-negative": (HEAD + field(b"id") + b"\x01;" + le32(-1),
                                "a subscribe list length of -1"),
    "handshake-no-produce-list": (HEAD + field(b"id") + b"\x01;" + field(b"a"),
                                  "a message that ends after the subscribe list"),
    "handshake-client-id-utf8": (HEAD + field(b"\xc3\x28") + b"\x01;" + le32(0) + le32(0),
                                 "a client ID that is not UTF-8"),
    "handshake-separator-utf8": (HEAD + field(b"id") + b"\x01\xff" + le32(0) + le32(0),
                                 "a separator that is not UTF-8"),
    "handshake-list-utf8": (HEAD + field(b"id") + b"\x01;" + field(b"a\xed\xa0\x80")
                            + le32(0), "a subscribe list that is not UTF-8 (a surrogate)"),
    "empty": (b"", "an empty message"),
    "unknown-code": (b"\x63\x01\x00\x00", "code 99, which no one sends"),
    "server-code": (b"\x1a" + b"\x00" * 9, "code 26, which only a server sends"),
}


# The spec gives the separator a length and no more: that it is one UTF-8 character or more
# is wireproto's reading (a SHOULD).
SEPARATOR_READINGS = {"handshake-empty-separator", "handshake-separator-utf8"}


def _handshake_case(case_name: str, data: bytes, what: str) -> None:
    @kit.case(f"subble.malformed.{case_name}",
              f"A first message with {what} is not accepted",
              section=CODES if case_name.endswith("code") else HANDSHAKE_REQUEST,
              level=Level.SHOULD if case_name in SEPARATOR_READINGS else Level.MUST,
              harmful=True, decision=DECIDED)
    async def body(ctx: Context) -> str:
        probe = await ctx.connect()
        probe.send(data)
        return await not_accepted(probe, what, handshaken=False)


for _name, (_data, _what) in BAD_HANDSHAKES.items():
    _handshake_case(_name, _data, _what)


def bad_produces(client_id: bytes, event_type: bytes) -> dict[str, tuple[bytes, str]]:
    """Produce requests the codec rejects, from a handshaken client that may produce
    `event_type`."""
    start = b"\x1b" + field(client_id) + b"\x00"
    return {
        "produce-short": (b"\x1b\x01\x00", "a client ID length cut short"),
        "produce-no-format": (b"\x1b" + field(client_id),
                              "a message that ends after the client ID"),
        "produce-type-truncated": (start + le32(len(event_type) + 9) + event_type,
                                   "an event type length past the end"),
        "produce-type-negative": (start + le32(-2), "an event type length of -2"),
        "produce-payload-truncated": (start + field(event_type) + le32(1000) + b"\xc0",
                                      "a payload length of 1000 with 1 byte after it"),
        "produce-payload-huge": (start + field(event_type) + le32(0x7FFFFFFF) + b"\xc0",
                                 "a payload length of 2147483647 with 1 byte after it"),
        "produce-type-utf8": (start + field(b"\xff" + event_type) + field(b"\xc0"),
                              "an event type that is not UTF-8"),
        "produce-client-id-utf8": (b"\x1b" + field(b"\xe2\x82") + b"\x00" + field(event_type)
                                   + field(b"\xc0"), "a client ID that is not UTF-8"),
        "produce-unknown-code": (b"\x64" + field(client_id), "code 100 after the handshake"),
        "produce-server-code": (b"\x33" + field(b"error"),
                                "code 51, which only a server sends, after the handshake"),
    }


def _produce_case(case_name: str, what: str) -> None:
    @kit.case(f"subble.malformed.{case_name}",
              f"A produce request with {what} is not acted on",
              section=CODES if case_name.endswith("code") else PRODUCE, harmful=True,
              decision=DECIDED)
    async def body(ctx: Context) -> str:
        event_type = name(ctx, "malformed")
        client = await handshake(ctx, subscribe=(event_type,), produce=(event_type,))
        data, _ = bad_produces(client.client_id.encode(), event_type.encode())[case_name]
        client.probe.send(data)
        return await not_accepted(client.probe, what)


for _name, (_, _what) in bad_produces(b"id", b"t").items():
    _produce_case(_name, _what)


@kit.case("subble.malformed.reported",
          "A malformed handshake request is answered: the connection closed or refused",
          section=HANDSHAKE_REQUEST, level=Level.SHOULD, harmful=True, decision=DECIDED_HOST)
async def reported(ctx: Context) -> str:
    probe = await ctx.connect()
    probe.send(HEAD + le32(40) + b"abc")
    said = await not_accepted(probe, "a truncated handshake request", 2.0, handshaken=False)
    if "ignored" in said:
        raise ctx.fail(said)
    return said


@kit.case("subble.malformed.text-frame",
          "A text WebSocket message is not SubbleSocket and is not acted on",
          section="Serialization", harmful=True, decision=DECIDED_HOST)
async def text_frame(ctx: Context) -> str:
    event_type = name(ctx, "text")
    client = await handshake(ctx, subscribe=(event_type,), produce=(event_type,))
    if "://" not in ctx.target.address:
        return "not a WebSocket: nothing to check"
    text = encode(HandshakeRequest(client_id="text"))
    client.probe.send(b"\x1b" + text[1:], binary=False)
    return await not_accepted(client.probe, "a text message")


@kit.case("subble.framing.over-limit",
          "A stream frame that announces more than the message limit closes that connection",
          section="Request data", level=Level.SHOULD, harmful=True, decision=DECIDED)
async def over_limit(ctx: Context) -> str:
    client = await handshake(ctx)
    if "://" in ctx.target.address:
        return "a WebSocket: the message limit is the one-over case's"
    client.probe.send_raw(struct.pack(">I", ctx.target.max_message_size + 1) + b"\x1b",
                          "a frame header over the limit")
    closed = await client.probe.closed(2.0, "the server to close a frame over its limit")
    return f"closed ({closed.text})"


@kit.case("subble.close.abrupt",
          "A subscriber that drops its connection does not stop events reaching the others",
          section="Events", harmful=True)
async def abrupt(ctx: Context) -> None:
    event_type = name(ctx, "abrupt")
    gone = await handshake(ctx, subscribe=(event_type,))
    stays = await handshake(ctx, subscribe=(event_type,))
    producer = await handshake(ctx, produce=(event_type,))
    gone.probe.abort()
    await ctx.sleep(0.1)
    produce(producer, event_type, b"\x05")
    event = await next_event(stays.probe, "the event after another subscriber left")
    if event.payload != b"\x05":
        raise ctx.fail(f"got payload {event.payload[:32].hex()}, not 05")


@kit.case("subble.close.mid-message",
          "A connection closed in the middle of a stream frame does not harm the server",
          section="Request data", harmful=True, decision=DECIDED)
async def mid_message(ctx: Context) -> str:
    client = await handshake(ctx)
    if "://" in ctx.target.address:
        return "a WebSocket: not checked"
    client.probe.send_raw(struct.pack(">I", 100) + b"\x1b\x01", "half a frame")
    await ctx.sleep(0.1)
    client.probe.abort()
    return "aborted after half a frame"
