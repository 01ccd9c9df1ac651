"""The SubbleSocket kit's cases on events: producing them, their delivery and echo, their
fields, serialization formats, sizes, and the event errors 51 and 52 (the spec's "Events",
"Produce events", "Serialization", "Error Handling" and "Events Codes")."""

from __future__ import annotations

import json

from wireproto.codecs.subble import Event, EventError, MessageCode
from wireproto.conformance.bounded import bounded
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level
from wireproto.conformance.subble.common import (
    DECIDED,
    DECIDED_HOST,
    EVENTS_DOC,
    GUID_ROOM,
    JSON,
    MSGPACK,
    Client,
    describe,
    event_size,
    handshake,
    kit,
    name,
    next_event,
    next_message,
    not_accepted,
    now_ms,
    produce,
)

EVENTS = "Events"
PRODUCE = "Produce events"
SERIALIZATION = "Serialization"
ERRORS = "Error Handling"
EVENT_CODES = "Events Codes"


async def pair(ctx: Context, what: str) -> tuple[str, Client, Client]:
    """An event type of its own, a connection subscribed to it and one that produces it."""
    event_type = name(ctx, what)
    subscriber = await handshake(ctx, subscribe=(event_type,))
    producer = await handshake(ctx, produce=(event_type,))
    return event_type, subscriber, producer


async def echo_of(producer: Client, what: str = "the echo of the produced event") -> Event:
    """The producer's own event back (skipping nothing: it must come first or alone)."""
    event = await next_event(producer.probe, what)
    if event.code != MessageCode.CLIENT_EVENT:
        raise CaseFailed(f"the producer's event came back with code {int(event.code)}, not 27")
    return event


def same_event(event: Event, event_type: str, source: str, payload: bytes, format: int) -> None:
    if event.event_type != event_type:
        raise CaseFailed(f"the event's type is {bounded(event.event_type)}, not {event_type!r}")
    if event.source != source:
        raise CaseFailed(f"the event's source is {bounded(event.source)}, not the producer's "
                         f"client ID {source!r}")
    if event.format != format:
        raise CaseFailed(f"the event's serialization format is {int(event.format)}, "
                         f"not {int(format)}")
    if event.payload != payload:
        raise CaseFailed(f"the event's payload is {len(event.payload)} bytes "
                         f"{event.payload[:32].hex()}, not {len(payload)} bytes "
                         f"{payload[:32].hex()}")


def field(data: bytes) -> bytes:
    """A "4 + N" field."""
    return len(data).to_bytes(4, "little") + data


# -- produce and deliver ----------------------------------------------------------------------

@kit.case("subble.produce.delivered",
          "A produced event reaches a subscriber as 26 with its type, source, format and payload",
          section=EVENTS)
async def delivered(ctx: Context) -> None:
    event_type, subscriber, producer = await pair(ctx, "delivered")
    payload = b"\x82\xa1a\x01\xa1b\xc3"  # {"a": 1, "b": true}
    produce(producer, event_type, payload)
    event = await next_event(subscriber.probe, "the produced event")
    if event.code != MessageCode.SERVER_EVENT:
        raise ctx.fail(f"another client's event came with code {int(event.code)}, not 26")
    same_event(event, event_type, producer.client_id, payload, MSGPACK)


@kit.case("subble.produce.echo",
          "The producer gets its event back as 27 with its request data",
          section=PRODUCE)
async def echo(ctx: Context) -> None:
    event_type = name(ctx, "echo")
    producer = await handshake(ctx, produce=(event_type,))
    produce(producer, event_type, b"\x2a", request_data=b"r\x00\xff1")
    event = await echo_of(producer)
    same_event(event, event_type, producer.client_id, b"\x2a", MSGPACK)
    if event.request_data != b"r\x00\xff1":
        raise ctx.fail(f"the echo's request data is {event.request_data[:32].hex()}, not 7200ff31")


@kit.case("subble.produce.echo-once",
          "A producer subscribed to its own type gets its event once, as 27",
          section=EVENT_CODES, level=Level.INFORMATION, decision=DECIDED_HOST)
async def echo_once(ctx: Context) -> str:
    event_type = name(ctx, "once")
    producer = await handshake(ctx, subscribe=(event_type,), produce=(event_type,))
    produce(producer, event_type, b"\x01", request_data=b"q")
    codes = [int((await next_event(producer.probe, "the producer's own event")).code)]
    try:
        codes.append(int((await next_event(producer.probe, "a second copy", 0.5)).code))
    except CaseFailed:
        pass
    if codes == [27]:
        return "once, as 27"
    return "codes " + ", ".join(map(str, codes))


@kit.case("subble.produce.request-data-only-producer",
          "Subscribers get another's event without its request data",
          section=EVENTS, level=Level.SHOULD, decision=DECIDED_HOST)
async def request_data_only_producer(ctx: Context) -> None:
    event_type, subscriber, producer = await pair(ctx, "rd")
    produce(producer, event_type, b"\x01", request_data=b"mine")
    event = await next_event(subscriber.probe, "the produced event")
    if event.request_data:
        raise ctx.fail(f"the subscriber's copy carries request data {bounded(event.request_data)}")


@kit.case("subble.produce.fan-out", "Every subscriber of a type gets its event",
          section=EVENTS)
async def fan_out(ctx: Context) -> None:
    event_type, first, producer = await pair(ctx, "fan")
    second = await handshake(ctx, subscribe=(event_type,))
    produce(producer, event_type, b"\x07")
    for subscriber in (first, second):
        event = await next_event(subscriber.probe, "the produced event")
        same_event(event, event_type, producer.client_id, b"\x07", MSGPACK)


@kit.case("subble.produce.not-subscribed",
          "A connection that did not subscribe to a type gets none of its events",
          section=EVENTS)
async def not_subscribed(ctx: Context) -> None:
    event_type, subscriber, producer = await pair(ctx, "mine")
    other = await handshake(ctx, subscribe=(name(ctx, "other"),))
    produce(producer, event_type, b"\x01")
    await next_event(subscriber.probe, "the produced event")
    await other.probe.silent(0.3, "no event of a type it did not subscribe to")


@kit.case("subble.produce.case-sensitive",
          "Event types are case-sensitive: a subscriber of T gets no event of t",
          section="Case sensitive")
async def case_sensitive(ctx: Context) -> None:
    event_type = name(ctx, "Case")
    subscriber = await handshake(ctx, subscribe=(event_type.upper(),))
    producer = await handshake(ctx, produce=(event_type.lower(),))
    produce(producer, event_type.lower(), b"\x01")
    await echo_of(producer)
    await subscriber.probe.silent(0.3, "no event of a type differing in case")


@kit.case("subble.produce.exact-type",
          "A subscriber of a type gets no event of a longer type that starts with it",
          section=EVENTS, decision=DECIDED)
async def exact_type(ctx: Context) -> None:
    event_type = name(ctx, "exact")
    subscriber = await handshake(ctx, subscribe=(event_type,))
    producer = await handshake(ctx, produce=(event_type + "x",))
    produce(producer, event_type + "x", b"\x01")
    await echo_of(producer)
    await subscriber.probe.silent(0.3, "no event of another type")


@kit.case("subble.produce.utf8-type",
          "An event type of non-ASCII UTF-8 is delivered exactly",
          section="Encoding")
async def utf8_type(ctx: Context) -> None:
    event_type, subscriber, producer = await pair(ctx, "température-€-😀")
    produce(producer, event_type, b"\x01")
    event = await next_event(subscriber.probe, "the produced event")
    same_event(event, event_type, producer.client_id, b"\x01", MSGPACK)


@kit.case("subble.produce.order",
          "A producer's events reach a subscriber in the order they were produced",
          section=EVENTS, level=Level.SHOULD)
async def order(ctx: Context) -> None:
    event_type, subscriber, producer = await pair(ctx, "order")
    for number in range(20):
        produce(producer, event_type, bytes([number]))
    got = [(await next_event(subscriber.probe, f"event {n + 1} of 20")).payload[0]
           for n in range(20)]
    if got != list(range(20)):
        raise ctx.fail(f"the events came in the order {got}")


@kit.case("subble.produce.empty-payload",
          "An event whose payload is an empty msgpack bin is delivered",
          section=PRODUCE)
async def empty_payload(ctx: Context) -> None:
    event_type, subscriber, producer = await pair(ctx, "empty")
    produce(producer, event_type, b"\xc4\x00")
    event = await next_event(subscriber.probe, "the produced event")
    same_event(event, event_type, producer.client_id, b"\xc4\x00", MSGPACK)


def bin32(size: int) -> bytes:
    """A msgpack bin whose encoding is `size` bytes (at least 5)."""
    return b"\xc6" + (size - 5).to_bytes(4, "big") + b"\x5a" * (size - 5)


@kit.case("subble.produce.largest",
          "An event as large as the message limit allows (room left for the GUID) is delivered "
          "and echoed whole",
          section=PRODUCE, timeout=8.0)
async def largest(ctx: Context) -> None:
    event_type, subscriber, producer = await pair(ctx, "largest")
    room = ctx.target.max_message_size - event_size(event_type, GUID_ROOM, producer.client_id, 0)
    if room < 5:
        raise ctx.fail(f"a limit of {ctx.target.max_message_size} bytes leaves no room for "
                       "an event's payload")
    payload = bin32(room)
    produce(producer, event_type, payload)
    event = await next_event(subscriber.probe, "the largest event", 5.0)
    same_event(event, event_type, producer.client_id, payload, MSGPACK)
    same_event(await echo_of(producer), event_type, producer.client_id, payload, MSGPACK)


@kit.case("subble.produce.one-over",
          "A produce request one byte over the message limit closes that connection or is "
          "refused, and is not delivered",
          section=PRODUCE, level=Level.SHOULD, harmful=True, timeout=8.0)
async def one_over(ctx: Context) -> str:
    event_type, subscriber, producer = await pair(ctx, "over")
    head = 1 + 4 + len(producer.client_id.encode()) + 1 + 4 + len(event_type.encode()) + 4
    over = ctx.target.max_message_size + 1 - head
    if over < 5:
        raise ctx.fail(f"a limit of {ctx.target.max_message_size} bytes is smaller than a "
                       "produce request's fields")
    produce(producer, event_type, bin32(over))
    said = await not_accepted(producer.probe, "a message over the limit", 2.0)
    await subscriber.probe.silent(0.3, "no event from a message over the limit")
    return said


# -- event fields -----------------------------------------------------------------------------

@kit.case("subble.event.guid", "An event has a GUID, the same in the echo and in every copy",
          section=EVENTS)
async def guid(ctx: Context) -> str:
    event_type, subscriber, producer = await pair(ctx, "guid")
    produce(producer, event_type, b"\x01")
    copy = await next_event(subscriber.probe, "the produced event")
    echoed = await echo_of(producer)
    if not copy.guid:
        raise ctx.fail("the event's GUID is empty")
    if copy.guid != echoed.guid:
        raise ctx.fail(f"the subscriber's GUID {bounded(copy.guid)} is not the echo's "
                       f"{bounded(echoed.guid)}")
    return f"GUID {bounded(copy.guid)}"


@kit.case("subble.event.guids-differ", "Two events get different GUIDs", section=EVENTS)
async def guids_differ(ctx: Context) -> None:
    event_type, subscriber, producer = await pair(ctx, "guids")
    produce(producer, event_type, b"\x01")
    produce(producer, event_type, b"\x02")
    first = await next_event(subscriber.probe, "the first event")
    second = await next_event(subscriber.probe, "the second event")
    if first.guid == second.guid:
        raise ctx.fail(f"both events have the GUID {bounded(first.guid)}")


# The spec says Unix epoch time without a unit, and nothing of how near the tester's clock it
# is: seconds or milliseconds of now is wireproto's reading, so a SHOULD.
@kit.case("subble.event.datetime",
          "An event's date time is the Unix epoch time of now (seconds or milliseconds)",
          section=EVENTS, level=Level.SHOULD, decision=DECIDED)
async def datetime_now(ctx: Context) -> str:
    event_type, subscriber, producer = await pair(ctx, "time")
    before = now_ms()
    produce(producer, event_type, b"\x01")
    event = await next_event(subscriber.probe, "the produced event")
    after = now_ms()
    unit = datetime_unit(event.datetime_ms, before, after)
    if unit is None:
        raise ctx.fail(f"the date time {event.datetime_ms} (int64 little-endian) is not within "
                       f"5 minutes of now ({before} ms) in milliseconds or seconds")
    return f"{event.datetime_ms} ({unit})"


def datetime_unit(value: int, before: int, after: int) -> str | None:
    slack = 5 * 60 * 1000  # clocks differ
    if before - slack <= value <= after + slack:
        return "milliseconds"
    if (before - slack) // 1000 <= value <= (after + slack) // 1000:
        return "seconds"
    return None


@kit.case("subble.event.datetime-unit",
          "The unit of an event's date time (wireproto: milliseconds)",
          section=EVENTS, level=Level.INFORMATION, decision=DECIDED)
async def datetime_of_event(ctx: Context) -> str:
    event_type, subscriber, producer = await pair(ctx, "unit")
    before = now_ms()
    produce(producer, event_type, b"\x01")
    event = await next_event(subscriber.probe, "the produced event")
    return datetime_unit(event.datetime_ms, before, now_ms()) or f"unknown ({event.datetime_ms})"


# -- serialization formats --------------------------------------------------------------------

@kit.case("subble.format.json", "A JSON payload is delivered with format 1 and its value",
          section=SERIALIZATION, level=Level.SHOULD)
async def json_payload(ctx: Context) -> str | None:
    event_type, subscriber, producer = await pair(ctx, "json")
    payload = b'{"on": true, "n": [1, 2.5, "\xc3\xa9"]}'
    produce(producer, event_type, payload, JSON)
    event = await next_message(subscriber.probe, "the produced event")
    if type(event) is not Event:
        raise ctx.fail(f"expected the event, got {describe(event)}")
    if event.format != JSON:
        raise ctx.fail(f"the event's format is {int(event.format)}, not 1 (JSON)")
    try:
        value = json.loads(event.payload)
    except ValueError:
        raise ctx.fail(f"the payload is not JSON: {event.payload[:60]!r}") from None
    if value != json.loads(payload):
        raise ctx.fail(f"the payload is {bounded(event.payload)}, not {payload!r}")
    return None if event.payload == payload else f"re-serialized as {bounded(event.payload)}"


@kit.case("subble.format.implementor",
          "What a produce in an implementor's format (200) gets",
          section=SERIALIZATION, level=Level.INFORMATION)
async def implementor(ctx: Context) -> str:
    event_type, subscriber, producer = await pair(ctx, "own-format")
    produce(producer, event_type, b"\x00opaque\xff", 200)
    message = await next_message(producer.probe, "the echo or an error")
    return describe(message)


@kit.case("subble.format.reserved",
          "A produce in a reserved serialization format (7) is not delivered",
          section=SERIALIZATION, harmful=True)
async def reserved(ctx: Context) -> str:
    event_type, subscriber, producer = await pair(ctx, "reserved")
    # Written by hand: the codec refuses to write a reserved format.
    producer.probe.send(b"\x1b" + field(producer.client_id.encode()) + b"\x07"
                        + field(event_type.encode()) + field(b"\xc0"))
    said = await not_accepted(producer.probe, "a reserved serialization format")
    await subscriber.probe.silent(0.3, "no event in a reserved format")
    return said


async def refused_payload(ctx: Context, format: int, payload: bytes) -> str:
    event_type, subscriber, producer = await pair(ctx, "invalid")
    produce(producer, event_type, payload, format, request_data=b"bad")
    message = await next_message(producer.probe, "the echo or an error")
    if type(message) is EventError:
        return f"refused with {describe(message)}"
    return f"delivered ({describe(message)})"


@kit.case("subble.format.invalid-msgpack",
          "What a payload that is not msgpack, sent as msgpack, gets (wireproto: 52)",
          section=SERIALIZATION, level=Level.INFORMATION, decision=DECIDED_HOST)
async def invalid_msgpack(ctx: Context) -> str:
    return await refused_payload(ctx, MSGPACK, b"\xc1")


@kit.case("subble.format.invalid-json",
          "What a payload that is not JSON, sent as JSON, gets (wireproto: 52)",
          section=SERIALIZATION, level=Level.INFORMATION, decision=DECIDED_HOST)
async def invalid_json(ctx: Context) -> str:
    return await refused_payload(ctx, JSON, b"{not json")


# -- event errors -----------------------------------------------------------------------------

@kit.case("subble.error.undeclared-not-delivered",
          "An event of a type not in the producer's produce list is not delivered",
          section=EVENT_CODES, harmful=True)
async def undeclared_not_delivered(ctx: Context) -> str:
    event_type = name(ctx, "undeclared")
    subscriber = await handshake(ctx, subscribe=(event_type,))
    producer = await handshake(ctx, produce=(name(ctx, "declared"),))
    produce(producer, event_type, b"\x01", request_data=b"u")
    said = await not_accepted(producer.probe, "an undeclared event type")
    await subscriber.probe.silent(0.3, "no event of an undeclared type")
    return said


@kit.case("subble.error.undeclared-51",
          "An event of a type not in the produce list is answered 51 with its request data",
          section=ERRORS, level=Level.SHOULD)
async def undeclared_51(ctx: Context) -> str:
    producer = await handshake(ctx, produce=(name(ctx, "declared"),))
    produce(producer, name(ctx, "undeclared"), b"\x01", request_data=b"u\x00\xff")
    message = await next_message(producer.probe, "event error 51")
    if type(message) is not EventError or message.code != MessageCode.EVENT_NOT_DECLARED:
        raise ctx.fail(f"expected event error 51, got {describe(message)}")
    if message.request_data != b"u\x00\xff":
        raise ctx.fail(f"the error's request data is {message.request_data[:32].hex()}, "
                       "not 7500ff")
    return f"51 {bounded(message.message)}"


@kit.case("subble.error.connection-stays",
          "After an event error the connection goes on: a declared event is echoed",
          section=ERRORS, level=Level.SHOULD, decision=DECIDED_HOST)
async def connection_stays(ctx: Context) -> None:
    event_type = name(ctx, "declared")
    producer = await handshake(ctx, produce=(event_type,))
    produce(producer, name(ctx, "undeclared"), b"\x01", request_data=b"1")
    produce(producer, event_type, b"\x02", request_data=b"2")
    while True:
        message = await next_message(producer.probe, "the echo of the declared event")
        if type(message) is Event:
            if message.request_data != b"2":
                raise ctx.fail(f"got {describe(message)} with request data "
                               f"{bounded(message.request_data)}")
            return


@kit.case("subble.error.other-client-id",
          "A produce request under another client's ID is refused and not delivered",
          section="Client ID", level=Level.SHOULD, harmful=True, decision=EVENTS_DOC)
async def other_client_id(ctx: Context) -> str:
    event_type, subscriber, producer = await pair(ctx, "impostor")
    victim = await handshake(ctx)
    produce(producer, event_type, b"\x01", client_id=victim.client_id)
    said = await not_accepted(producer.probe, "a produce under another client's ID")
    await subscriber.probe.silent(0.3, "no event under another client's ID")
    return said
