"""The SubbleSocket client kit's cases on what a server may send a client: events of every
shape (request data, empty fields, extreme dates, the largest message), and input no client may
crash on (truncated or lying lengths, bad UTF-8, reserved formats, unknown codes, text frames).
A client must survive each: keep working, or close the connection cleanly."""

from __future__ import annotations

import secrets

from wireproto.codecs.subble import (
    HandshakeResponse,
    MessageCode,
    ProduceEvent,
    encode,
    pack_payload,
)
from wireproto.conformance.bounded import bounded
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level, NotApplicable
from wireproto.conformance.probe import PROBE_MAX_MESSAGE
from wireproto.conformance.subble.client.common import (
    DECIDED,
    DECIDED_HOST,
    IN,
    MSGPACK,
    TRANSPORTS,
    Session,
    answer_produce,
    client_message,
    echo,
    event_bytes,
    greet,
    kit,
    le32,
    next_produce,
    read_handshake,
    send_event,
    still_works,
    value_of,
)
from wireproto.transports.websocket import WebSocketServerAdapter

EVENTS = "Events"


# -- events -----------------------------------------------------------------------------------

@kit.case("subble.client.event.request-data",
          "An event's request data after the payload is not taken for part of the payload",
          section=EVENTS)
async def request_data(ctx: Context) -> None:
    session = await greet(ctx)
    await echo(session, {"tail": "follows"}, request_data=b"\x00\x01request data")


@kit.case("subble.client.event.empty-fields",
          "An event with an empty GUID and an empty source name is read and echoed",
          section=EVENTS, level=Level.SHOULD)
async def empty_fields(ctx: Context) -> None:
    session = await greet(ctx)
    await echo(session, "empty guid", guid="-", source="")
    await echo(session, "empty source", guid="", source="")


@kit.case("subble.client.event.datetime-epoch",
          "An event dated 1970-01-01T00:00:00Z (0 ms) is read and echoed", section=EVENTS,
          decision=DECIDED)
async def datetime_epoch(ctx: Context) -> None:
    session = await greet(ctx)
    await echo(session, "at the epoch", datetime_ms=0)


@kit.case("subble.client.event.datetime-extreme",
          "Events dated at the ends of int64 and before 1970 do not crash the client; whether "
          "it still delivers them", section=EVENTS, decision=DECIDED)
async def datetime_extreme(ctx: Context) -> str:
    session = await greet(ctx)
    delivered = []
    for when in (-1, 2**63 - 1, -(2**63)):
        send_event(session, {"at": when}, datetime_ms=when)
        try:
            produce = await next_produce(session, "the echo", 1.0)
        except CaseFailed:
            if not session.probe.is_open:
                break
            continue
        delivered.append(when)
        del produce
    said = (f"delivered the events dated {', '.join(map(str, delivered))} ms"
            if delivered else "delivered none")
    return f"{said}; " + await still_works(ctx, session, "extreme dates")


@kit.case("subble.client.event.unsubscribed",
          "What the client does with an event of a type it did not subscribe to",
          section=EVENTS, level=Level.INFORMATION)
async def unsubscribed(ctx: Context) -> str:
    session = await greet(ctx)
    send_event(session, "not subscribed", event_type=f"conformance/other-{secrets.token_hex(2)}")
    try:
        await next_produce(session, "nothing", 1.0)
    except CaseFailed:
        return "dropped it; " + await still_works(ctx, session, "an unsubscribed event")
    return "delivered it to the application, which echoed it"


GUID = "g" * 16


def sized_event(size: int) -> tuple[bytes, bytes]:
    """An event of exactly `size` bytes whose payload is a msgpack bin, and the bin's bytes;
    ValueError when no event is that small, or its echo would be too large for the kit."""
    if size > PROBE_MAX_MESSAGE:
        # Its echo would be over what the kit takes in one message.
        raise ValueError(f"the kit judges limits up to {PROBE_MAX_MESSAGE} bytes")
    room = size - len(event_bytes(b"", guid=GUID))
    # The largest bin that fits, by msgpack's three bin headers; request data fills the rest.
    for header, least, most in ((5, 65536, 2**32 - 1), (3, 256, 65535), (2, 0, 255)):
        length = min(room - header, most)
        if length >= least:
            value = secrets.token_bytes(length)
            padding = bytes(room - header - length)
            return event_bytes(pack_payload(value, MSGPACK), guid=GUID,
                               request_data=padding), value
    raise ValueError(f"an event of a msgpack bin takes more than {size} bytes")


@kit.case("subble.client.event.largest",
          "An event as large as the client's limit (the kit's --max-message-size, 1 MiB by "
          "default) is echoed whole", section=EVENTS, level=Level.SHOULD, timeout=10.0)
async def largest(ctx: Context) -> None:
    size = ctx.target.max_message_size
    try:
        message, value = sized_event(size)
    except ValueError as error:
        raise NotApplicable(str(error)) from None
    session = await greet(ctx)
    session.probe.send(message)
    produce = await next_produce(session, f"the echo of an event of {size} bytes", 8.0)
    if value_of(produce) != value:
        raise ctx.fail(f"the echo's payload is {len(produce.payload)} bytes, not the "
                       f"{len(value)} of the bin sent")


@kit.case("subble.client.event.over-limit",
          "An event one byte over the client's limit does not crash it", section=EVENTS,
          timeout=10.0)
async def over_limit(ctx: Context) -> str:
    size = ctx.target.max_message_size + 1
    try:
        message, _ = sized_event(size)
    except ValueError as error:
        raise NotApplicable(str(error)) from None
    session = await greet(ctx)
    session.probe.send(message)
    try:
        produce = await next_produce(session, "nothing", 2.0)
        said = f"it answered it ({bounded(produce.event_type)}); "
    except CaseFailed:
        said = ""
    return said + await still_works(ctx, session, f"an event of {size} bytes")


# -- malformed input --------------------------------------------------------------------------

def _field(data: bytes) -> bytes:
    return le32(len(data)) + data


_HEAD = b"\x1a\x00" + (0).to_bytes(8, "little")  # a server event, msgpack, at the epoch

MALFORMED = {
    "truncated": ("an event cut short in its date", b"\x1a\x00\x01\x02\x03"),
    "length-past-end": ("an event whose type length (1000) runs past the message",
                        _HEAD + le32(1000) + b"conf"),
    "length-negative": ("an event whose type length is -1",
                        _HEAD + le32(-1) + _field(b"g") + _field(b"s") + _field(b"\xc0")),
    "length-huge": ("an event whose payload length is 2147483647",
                    _HEAD + _field(IN.encode()) + _field(b"g") + _field(b"s") +
                    le32(2**31 - 1) + b"\xc0"),
    "bad-utf8": ("an event whose type is not UTF-8",
                 _HEAD + _field(b"\xff\xfe") + _field(b"g") + _field(b"s") + _field(b"\xc0")),
    "reserved-format": ("an event in the reserved serialization format 7",
                        b"\x1a\x07" + _HEAD[2:] + _field(IN.encode()) + _field(b"g") +
                        _field(b"s") + _field(b"\xc0")),
    "bad-msgpack": ("an event whose msgpack payload does not read (0xc1 is never used)",
                    _HEAD + _field(IN.encode()) + _field(b"g") + _field(b"s") +
                    _field(b"\xc1")),
    "bad-json": ("an event whose JSON payload does not read",
                 b"\x1a\x01" + _HEAD[2:] + _field(IN.encode()) + _field(b"g") +
                 _field(b"s") + _field(b"{nope")),
    "empty": ("an empty message", b""),
    "unknown-code": ("a message with code 200, one of the spec's 'other codes'",
                     b"\xc8" + b"\x00" * 12),
    "handshake-request": ("a handshake request (1), a client's message", b"\x01\x01\x00\x00" +
                          _field(b"") + b"\x01;" + le32(0) + le32(0)),
}


def _malformed_case(key: str, what: str, data: bytes) -> None:
    @kit.case(f"subble.client.malformed.{key}",
              f"The client survives {what}: it keeps working or closes the connection",
              section=EVENTS if key not in ("unknown-code", "handshake-request")
              else "Subble Codes",
              decision=DECIDED)
    async def malformed(ctx: Context) -> str:
        session = await greet(ctx)
        session.probe.send(data)
        return await still_works(ctx, session, what)


for _key, (_what, _data) in MALFORMED.items():
    _malformed_case(_key, _what, _data)


@kit.case("subble.client.malformed.bad-payload-kept",
          "A well-formed event whose payload does not read is dropped, and the connection kept",
          section=EVENTS, level=Level.SHOULD, decision=DECIDED_HOST)
async def bad_payload_kept(ctx: Context) -> str:
    session = await greet(ctx)
    session.probe.send(MALFORMED["bad-msgpack"][1])
    said = await still_works(ctx, session, "a payload that does not read")
    if not session.probe.is_open:
        raise ctx.fail(said)
    return said


@kit.case("subble.client.malformed.text-frame",
          "The client survives a text WebSocket frame: it keeps working or closes the "
          "connection", section=EVENTS, decision=TRANSPORTS)
async def text_frame(ctx: Context) -> str:
    if not ctx.target.over_websocket:
        raise NotApplicable("a framed stream has no text frames")
    session = await greet(ctx)
    session.probe.send(b'{"event": "conformance/in"}', binary=False)
    return await still_works(ctx, session, "a text frame")


@kit.case("subble.client.malformed.second-response",
          "The client survives a second handshake response after the handshake",
          section="Handshake Response")
async def second_response(ctx: Context) -> str:
    session = await greet(ctx)
    session.probe.send(encode(HandshakeResponse(MessageCode.OK, "", b"")))
    return await still_works(ctx, session, "a second handshake response")


@kit.case("subble.client.malformed.event-first",
          "An event sent before the handshake response is not echoed: the client produces "
          "nothing until it is accepted", section="Handshake", level=Level.SHOULD)
async def event_first(ctx: Context) -> str:
    probe = await ctx.accept()
    request = await read_handshake(probe)
    session = Session(probe, request, "")
    send_event(session, "too early")
    try:
        message = client_message(await probe.receive(1.0, "nothing"))
    except CaseFailed:
        return await still_works(ctx, session, "an event before the handshake response") \
            if not probe.is_open else "it waited (the connection stayed open)"
    if type(message) is ProduceEvent:
        answer_produce(session, message)
        raise ctx.fail("the client echoed an event that came before its handshake was "
                       "accepted")
    return "it sent another handshake request"


# -- WebSocket --------------------------------------------------------------------------------

@kit.case("subble.client.websocket.ping",
          "The client answers a WebSocket ping with a pong carrying the same data (RFC 6455, "
          "5.5.2)", section="RFC 6455 5.5.2", decision=TRANSPORTS)
async def ping(ctx: Context) -> str:
    if not ctx.target.over_websocket:
        raise NotApplicable("a framed stream has no pings")
    session = await greet(ctx)
    transport = session.probe.transport
    if not isinstance(transport, WebSocketServerAdapter):
        raise NotApplicable("the connection is not a WebSocket")
    data = secrets.token_hex(8).encode()
    pongs = await session.probe.ping(data)
    if not pongs:
        raise ctx.fail("no pong within 3 s")
    if data not in pongs:  # a pong may also come unasked, as a heartbeat
        raise ctx.fail(f"no pong carries {data!r}: {', '.join(bounded(p) for p in pongs[:3])}")
    return await still_works(ctx, session, "a ping")
