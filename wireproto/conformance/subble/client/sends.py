"""The SubbleSocket client kit's cases on what a client sends: its handshake request, how it
takes the handshake response (the client ID, refusals), and its produce requests in each
serialization format (the spec's "Handshake", "Client ID", "Produce events", "Serialization")."""

from __future__ import annotations

import secrets

from wireproto.codecs.subble import (
    PROTOCOL_VERSION,
    EventError,
    HandshakeRequest,
    HandshakeResponse,
    MessageCode,
    ProduceEvent,
    encode,
    pack_payload,
)
from wireproto.conformance.bounded import bounded
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level, NotApplicable
from wireproto.conformance.subble.client.common import (
    DECIDED,
    DECIDED_HOST,
    ERROR,
    IN,
    JSON,
    MSGPACK,
    OUT,
    TRANSPORTS,
    Session,
    allowed,
    answer_produce,
    client_message,
    echo,
    event_bytes,
    greet,
    kit,
    new_id,
    next_produce,
    read_handshake,
    send_event,
    still_works,
    value_of,
    welcome,
)

HANDSHAKE = "Handshake"
REQUEST = "Handshake Request"
RESPONSE = "Handshake Response"
CLIENT_ID = "Client ID"
CODES = "Handshake codes"
PRODUCE = "Produce events"
SERIALIZATION = "Serialization"


@kit.liveness
async def alive(ctx: Context) -> None:
    """The client connects, handshakes, and echoes a msgpack event."""
    session = await greet(ctx)
    await echo(session, {"alive": secrets.token_hex(4)}, what="the echo of a msgpack event")


# -- the handshake request ------------------------------------------------------------------

@kit.case("subble.client.handshake.first",
          "The client's first message is a handshake request (1) that reads as the spec lays "
          "it out", section=REQUEST)
async def first(ctx: Context) -> str:
    probe = await ctx.accept()
    request = await read_handshake(probe)
    welcome(probe, request)
    return f"version {request.version.major}.{request.version.minor}.{request.version.patch}"


@kit.case("subble.client.handshake.binary",
          "Over WebSocket the handshake request is a binary frame", section=REQUEST,
          decision=TRANSPORTS)
async def binary(ctx: Context) -> None:
    if not ctx.target.over_websocket:
        raise NotApplicable("a framed stream has no text frames")
    probe = await ctx.accept()
    received = await probe.receive(what="the client's handshake request")
    if not received.binary:
        raise ctx.fail("the handshake request came in a text frame: SubbleSocket is binary")
    request = client_message(received)
    if type(request) is HandshakeRequest:
        welcome(probe, request)


@kit.case("subble.client.handshake.version",
          "The handshake request names a version 1.x.y, the major version of SubbleSocket 1.0.0",
          section=REQUEST, decision=DECIDED)
async def version(ctx: Context) -> str:
    probe = await ctx.accept()
    request = await read_handshake(probe)
    welcome(probe, request)
    if request.version.major != PROTOCOL_VERSION.major:
        raise ctx.fail(f"the client asked for version {request.version.major}."
                       f"{request.version.minor}.{request.version.patch}")
    return f"{request.version.major}.{request.version.minor}.{request.version.patch}"


@kit.case("subble.client.handshake.lists",
          f"The handshake subscribes to {IN} and declares {OUT} and {ERROR} as produced, as "
          "the driver asks", section=REQUEST)
async def lists(ctx: Context) -> None:
    probe = await ctx.accept()
    request = await read_handshake(probe)
    welcome(probe, request)
    if IN not in request.subscribe:
        raise ctx.fail(f"the subscribe list is {bounded(list(request.subscribe))}, without "
                       f"{IN!r}")
    missing = [name for name in (OUT, ERROR) if name not in request.produce]
    if missing:
        raise ctx.fail(f"the produce list is {bounded(list(request.produce))}, without "
                       f"{', '.join(missing)}")


@kit.case("subble.client.handshake.fields",
          "What the handshake request carries: its client ID, separator and request data",
          section=REQUEST, level=Level.INFORMATION)
async def fields(ctx: Context) -> str:
    probe = await ctx.accept()
    request = await read_handshake(probe)
    welcome(probe, request)
    return (f"client ID {bounded(request.client_id)}, separator {request.separator!r}, "
            f"request data {bounded(request.request_data)}")


@kit.case("subble.client.handshake.waits",
          "The client sends nothing else before the handshake response", section=HANDSHAKE,
          level=Level.SHOULD)
async def waits(ctx: Context) -> None:
    probe = await ctx.accept()
    request = await read_handshake(probe)
    await probe.silent(1.0, "nothing until the handshake response")
    welcome(probe, request)


@kit.case("subble.client.handshake.new-id-used",
          "After a 3 (new client ID), the client's produce requests carry that ID",
          section=CLIENT_ID)
async def new_id_used(ctx: Context) -> str:
    session = await greet(ctx, MessageCode.OK_NEW_CLIENT_ID)
    produce = await echo(session, "whose id")
    if produce.client_id != session.client_id:
        raise ctx.fail(f"the produce carries client ID {bounded(produce.client_id)}, not "
                       f"{session.client_id!r}, the one the 3 gave")
    return f"the handshake sent {bounded(session.request.client_id)}"


@kit.case("subble.client.handshake.code-2-id",
          "After a 2 whose message names a client ID, which ID the client produces under",
          section=CODES, level=Level.INFORMATION, decision=DECIDED_HOST)
async def code_2_id(ctx: Context) -> str:
    named = new_id()
    session = await greet(ctx, MessageCode.OK, named)
    send_event(session, "whose id")
    try:
        produce = await next_produce(session, "the client's echo")
    except CaseFailed as error:
        return f"no echo: {error}"
    if produce.client_id == named:
        return "the ID the 2 named"
    return f"{bounded(produce.client_id)} (the 2 named {named!r})"


@kit.case("subble.client.handshake.code-2-empty",
          "What the client does with a 2 with no ID when it sent none", section=CODES,
          level=Level.INFORMATION, decision=DECIDED_HOST)
async def code_2_empty(ctx: Context) -> str:
    probe = await ctx.accept()
    request = await read_handshake(probe)
    if request.client_id:
        raise NotApplicable(f"the client sent the client ID {bounded(request.client_id)}")
    session = Session(probe, request, "")
    probe.send(encode(HandshakeResponse(MessageCode.OK, "", request.request_data)))
    return await still_works(ctx, session, "a 2 that gives no client ID")


@kit.case("subble.client.handshake.no-response",
          "When no handshake response comes, whether and when the client gives up",
          section=HANDSHAKE, level=Level.INFORMATION, timeout=16.0)
async def no_response(ctx: Context) -> str:
    probe = await ctx.accept()
    await read_handshake(probe)
    started = ctx.reactor.seconds()
    wait = allowed(ctx, 12.0, 3.0)
    try:
        await probe.closed(wait, "the client to give up")
    except CaseFailed:
        return f"it waited {wait:g} s and more with the connection open"
    return f"it closed the connection after {ctx.reactor.seconds() - started:.1f} s"


@kit.case("subble.client.handshake.unknown-code",
          "A handshake response with a code the spec does not define (5) does not crash the "
          "client", section=CODES)
async def unknown_code(ctx: Context) -> str:
    probe = await ctx.accept()
    request = await read_handshake(probe)
    # 5 is in the handshake codes' range, defined by no version: the codec will not write it.
    probe.send(b"\x05" + b"\x00\x00\x00\x00")
    session = Session(probe, request, "")
    send_event(session, "after code 5")
    try:
        message = client_message(await probe.receive(1.0, "nothing"))
    except CaseFailed:
        return await still_works(ctx, session, "a handshake response with code 5")
    if type(message) is ProduceEvent:
        raise ctx.fail("the client took code 5 for an acceptance: it produced an event")
    return "it sent another handshake request"


# -- produce requests -------------------------------------------------------------------------

@kit.case("subble.client.produce.reads",
          f"The echo is a produce request (27) on {OUT} that reads as the spec lays it out",
          section=PRODUCE)
async def produce_reads(ctx: Context) -> None:
    session = await greet(ctx)
    send_event(session, {"n": 1})
    produce = await next_produce(session, "the client's echo")
    if produce.event_type != OUT:
        raise ctx.fail(f"the produce's event type is {bounded(produce.event_type)}, not {OUT}")


@kit.case("subble.client.produce.msgpack-map",
          "A msgpack map is echoed in msgpack with the same value", section=SERIALIZATION)
async def msgpack_map(ctx: Context) -> None:
    session = await greet(ctx)
    await echo(session, {"temperature": 21, "unit": "C", "ok": True})


@kit.case("subble.client.produce.msgpack-types",
          "msgpack nil, booleans, integers, floats, strings, arrays and nested maps are echoed "
          "with the same values", section=SERIALIZATION)
async def msgpack_types(ctx: Context) -> None:
    session = await greet(ctx)
    value: dict[str, object] = {
        "nil": None, "t": True, "f": False,
        "ints": [0, 1, -1, 127, 128, -33, 65535, 2**31 - 1, -(2**31)],
        "float": 1.5, "neg": -0.25, "s": "", "nested": {"a": [[]]},
    }
    await echo(session, value)


@kit.case("subble.client.produce.msgpack-int64",
          "msgpack integers beyond 53 bits (2**63 - 1, -2**63, 2**64 - 1) are echoed exactly",
          section=SERIALIZATION, level=Level.SHOULD)
async def msgpack_int64(ctx: Context) -> None:
    session = await greet(ctx)
    await echo(session, [2**63 - 1, -(2**63), 2**64 - 1, 2**53 + 1])


@kit.case("subble.client.produce.msgpack-bin",
          "A msgpack bin is echoed as a bin, not turned into a string", section=SERIALIZATION,
          level=Level.SHOULD, decision=DECIDED)
async def msgpack_bin(ctx: Context) -> None:
    session = await greet(ctx)
    await echo(session, {"raw": b"\x00\xff\x10abc"})


@kit.case("subble.client.produce.unicode",
          "Text beyond ASCII (é, ☃, an emoji) is echoed unchanged: every text is UTF-8",
          section="Encoding")
async def unicode(ctx: Context) -> None:
    session = await greet(ctx)
    await echo(session, {"café": "☃ snow 😀", "ключ": "значение"})


@kit.case("subble.client.produce.json",
          "A JSON event is echoed in JSON with the same value", section=SERIALIZATION,
          level=Level.SHOULD)
async def json_event(ctx: Context) -> None:
    session = await greet(ctx)
    await echo(session, {"on": True, "list": [1, 2.5, "x", None], "text": "é"}, JSON)


@kit.case("subble.client.produce.request-data",
          "What request data the client puts in its produce requests, and whether it differs "
          "from one to the next", section=PRODUCE, level=Level.INFORMATION)
async def request_data(ctx: Context) -> str:
    session = await greet(ctx)
    first = await echo(session, 1)
    second = await echo(session, 2)
    same = "the same" if first.request_data == second.request_data else "different"
    return (f"{bounded(first.request_data)} then {bounded(second.request_data)} ({same})")


@kit.case("subble.client.produce.burst",
          "50 events sent at once are each echoed", section=PRODUCE, level=Level.SHOULD,
          timeout=10.0)
async def burst(ctx: Context) -> str:
    session = await greet(ctx)
    for number in range(50):
        send_event(session, {"n": number})
    seen: list[int] = []
    for _ in range(50):
        produce = await next_produce(session, f"the echo of event {len(seen) + 1} of 50", 5.0)
        value = value_of(produce)
        if isinstance(value, dict) and isinstance(value.get("n"), int):
            seen.append(value["n"])
    if sorted(seen) != list(range(50)):
        raise ctx.fail(f"the echoes were of {bounded(sorted(seen))}")
    return "in order" if seen == list(range(50)) else "all, out of order"


@kit.case("subble.client.produce.implementor-format",
          "An event in an implementor's format (200) does not crash the client; what it does "
          "with it", section=SERIALIZATION)
async def implementor_format(ctx: Context) -> str:
    session = await greet(ctx)
    payload = b"\x01\x02 not msgpack"
    session.probe.send(event_bytes(payload, 200))
    try:
        message = client_message(await session.probe.receive(2.0, "the echo"))
    except CaseFailed:
        return await still_works(ctx, session, "an event in format 200")
    if type(message) is not ProduceEvent:
        raise ctx.fail("the client sent another handshake request")
    answer_produce(session, message)
    if int(message.format) == 200 and message.payload == payload:
        said = "it echoed it in format 200 with the same bytes"
    else:
        said = (f"it echoed it in format {int(message.format)} with "
                f"{bounded(message.payload)}")
    return f"{said}; " + await still_works(ctx, session, "an event in format 200")


# -- answers to a produce ---------------------------------------------------------------------

ERRORS = "Error Handling"


def _error_case(code: int) -> None:
    @kit.case(f"subble.client.error.{code}-reported",
              f"An event error {code} answering a produce reaches the application with its "
              f"code and message (the driver produces it on {ERROR})", section=ERRORS,
              level=Level.SHOULD)
    async def reported(ctx: Context) -> str:
        session = await greet(ctx)
        send_event(session, {"refuse": code})
        produce = await next_produce(session, "the client's echo", answer=False)
        text = f"refused by the kit ({code})"
        session.probe.send(encode_error(code, text, produce.request_data))
        report = await next_produce(session, f"the client's report on {ERROR}")
        if report.event_type != ERROR:
            raise ctx.fail(f"the client produced on {bounded(report.event_type)}, not {ERROR}")
        value = value_of(report)
        if not isinstance(value, dict) or value.get("code") != code or \
                value.get("message") != text:
            raise ctx.fail(f"the report says {bounded(value)}, not code {code} and the "
                           f"message {text!r}")
        return f"request data {bounded(produce.request_data)}"


def encode_error(code: int, message: str, request_data: bytes) -> bytes:
    return encode(EventError(MessageCode(code), message, request_data))


for _code in (51, 52):
    _error_case(_code)


@kit.case("subble.client.error.unsolicited",
          "An event error whose request data matches no produce is not taken for a produce's: "
          "the spec does not promise the next message answers the last request",
          section="Overview", level=Level.SHOULD)
async def unsolicited(ctx: Context) -> str:
    session = await greet(ctx)
    send_event(session, {"slow": 1})
    produce = await next_produce(session, "the client's echo", answer=False)
    other = produce.request_data + b"-not-yours" if produce.request_data else b"not-yours"
    session.probe.send(encode_error(51, "an error for no one", other))
    try:
        report = await next_produce(session, "nothing", 1.0)
    except CaseFailed:
        answer_produce(session, produce)
        return await still_works(ctx, session, "an event error for no produce")
    if report.event_type == ERROR:
        raise ctx.fail("the client took an event error with other request data "
                       f"({bounded(other)}) for its produce's")
    return "it produced something else"


@kit.case("subble.client.error.empty",
          "An event error with an empty message and no request data does not crash the client",
          section=ERRORS)
async def empty_error(ctx: Context) -> str:
    session = await greet(ctx)
    session.probe.send(encode_error(52, "", b""))
    return await still_works(ctx, session, "an empty event error")


@kit.case("subble.client.error.unsolicited-echo",
          "What the client does with a 27 (its own event, echoed) that answers no produce",
          section="Events Codes", level=Level.INFORMATION)
async def unsolicited_echo(ctx: Context) -> str:
    session = await greet(ctx)
    payload = pack_payload({"echo": "for no one"}, MSGPACK)
    session.probe.send(event_bytes(payload, code=MessageCode.CLIENT_EVENT,
                                   request_data=b"no-such-request"))
    try:
        produce = await next_produce(session, "nothing", 1.0)
    except CaseFailed:
        return "ignored it; " + await still_works(ctx, session, "an unsolicited 27")
    return f"it took it for an event and produced on {bounded(produce.event_type)}"


__all__ = ["Session", "alive"]
