"""The SubbleSocket kit's cases on the handshake and versions (the spec's "Handshake",
"Handshake Request", "Handshake Response", "Client ID" and "Handshake codes")."""

from __future__ import annotations

from wireproto.codecs.subble import (
    PROTOCOL_VERSION,
    HandshakeRequest,
    MessageCode,
    ProduceEvent,
    Version,
    encode,
)
from wireproto.conformance.bounded import bounded
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed, Level
from wireproto.conformance.subble.common import (
    ACCEPTED,
    DECIDED,
    DECIDED_HOST,
    HANDSHAKE_DOC,
    MSGPACK,
    REFUSALS,
    client_name,
    handshake,
    kit,
    name,
    next_event,
    not_accepted,
    produce,
    request_handshake,
)

HANDSHAKE = "Handshake"
REQUEST = "Handshake Request"
RESPONSE = "Handshake Response"
CLIENT_ID = "Client ID"
CODES = "Handshake codes"


@kit.liveness
async def alive(ctx: Context) -> None:
    """A subscriber and a producer handshake; the producer's event reaches the subscriber."""
    event_type = name(ctx, "alive")
    subscriber = await handshake(ctx, subscribe=(event_type,))
    producer = await handshake(ctx, produce=(event_type,))
    produce(producer, event_type, b"\xc3")
    event = await next_event(subscriber.probe, "the event produced by the other connection")
    if event.event_type != event_type or event.payload != b"\xc3":
        raise ctx.fail(f"the subscriber got an event of type {bounded(event.event_type)} with "
                       f"payload {bounded(event.payload)}, not {event_type!r} with b'\\xc3'")


@kit.case("subble.handshake.client-id",
          "A handshake with a client ID is accepted with 2 or 3 and a response that reads",
          section=RESPONSE)
async def client_id(ctx: Context) -> str:
    client = await handshake(ctx)
    return (f"accepted with {int(client.response.code)} "
            f"{bounded(client.response.message)}")


@kit.case("subble.handshake.new-client-id",
          "A handshake with an empty client ID gets 3 and a new ID, or is refused with 11",
          section=CLIENT_ID)
async def new_client_id(ctx: Context) -> str:
    probe, response = await request_handshake(ctx, HandshakeRequest(client_id=""))
    if response.code == MessageCode.NEW_CLIENTS_NOT_ALLOWED:
        return "refused with 11: this server does not create client IDs"
    if response.code != MessageCode.OK_NEW_CLIENT_ID:
        raise ctx.fail(f"answered {int(response.code)} {bounded(response.message)}, where 3 "
                       "with the new ID (or 11) fits")
    if not response.message:
        raise ctx.fail("answered 3 with an empty message: the new client ID is missing")
    return f"new client ID {bounded(response.message)}"


@kit.case("subble.handshake.new-ids-differ",
          "Two handshakes with empty client IDs get different IDs",
          section=CLIENT_ID)
async def new_ids_differ(ctx: Context) -> str | None:
    ids = []
    for _ in range(2):
        _, response = await request_handshake(ctx, HandshakeRequest(client_id=""))
        if response.code == MessageCode.NEW_CLIENTS_NOT_ALLOWED:
            return "refused with 11: this server does not create client IDs"
        if response.code != MessageCode.OK_NEW_CLIENT_ID:
            raise ctx.fail(f"answered {int(response.code)} {bounded(response.message)}, not 3")
        ids.append(response.message)
    if ids[0] == ids[1]:
        raise ctx.fail(f"both connections got the client ID {bounded(ids[0])}")
    return None


@kit.case("subble.handshake.request-data",
          "The handshake response carries the request's request data back",
          section=RESPONSE)
async def request_data(ctx: Context) -> None:
    data = b"\x00req\xffdata\x01"
    client = await handshake(ctx, request_data=data)
    if client.response.request_data != data:
        raise ctx.fail("the response's request data is "
                       f"{client.response.request_data[:32].hex()}, "
                       f"not {data.hex()}")


@kit.case("subble.handshake.code-2-message",
          "What an accepted handshake with a client ID says in its response's message",
          section=RESPONSE, level=Level.INFORMATION, decision=DECIDED_HOST)
async def code_2_message(ctx: Context) -> str:
    client_id = client_name(ctx)
    client = await handshake(ctx, client_id=client_id)
    return (f"code {int(client.response.code)}, message {bounded(client.response.message)} "
            f"(the ID sent was {client_id!r})")


@kit.case("subble.handshake.empty-lists",
          "A handshake with empty subscribe and produce lists is accepted",
          section=REQUEST)
async def empty_lists(ctx: Context) -> None:
    await handshake(ctx)


@kit.case("subble.handshake.silent-before",
          "A connection that has not sent its handshake gets nothing",
          section=HANDSHAKE)
async def silent_before(ctx: Context) -> None:
    probe = await ctx.connect()
    await probe.silent(1.0, "nothing before the handshake")


@kit.case("subble.handshake.separator",
          "A separator of two UTF-8 characters splits the subscribe list",
          section=REQUEST)
async def separator(ctx: Context) -> None:
    first, second = name(ctx, "sep-a"), name(ctx, "sep-b")
    subscriber = await handshake(ctx, subscribe=(first, second), separator="¦|")
    producer = await handshake(ctx, produce=(second,))
    produce(producer, second, b"\x01")
    event = await next_event(subscriber.probe, "the event of the list's second name")
    if event.event_type != second:
        raise ctx.fail(f"got an event of type {bounded(event.event_type)}, not {second!r}")


@kit.case("subble.handshake.empty-names",
          "Empty names between separators (a;;b;) are ignored and the others subscribed",
          section=REQUEST, level=Level.SHOULD, decision=DECIDED)
async def empty_names(ctx: Context) -> None:
    first, second = name(ctx, "a"), name(ctx, "b")
    data = bytearray(encode(HandshakeRequest(client_id=client_name(ctx))))
    # Rebuild the subscribe list field by hand: the codec refuses to write empty names.
    listed = f";{first};;{second};".encode()
    empty_list = (0).to_bytes(4, "little")
    head = bytes(data[: len(data) - 8])
    message = head + len(listed).to_bytes(4, "little") + listed + empty_list
    probe, response = await request_handshake(ctx, message)
    if response.code not in ACCEPTED:
        raise ctx.fail(f"refused with {int(response.code)} {bounded(response.message)}")
    await ctx.sleep(0.1)
    producer = await handshake(ctx, produce=(second,))
    produce(producer, second, b"\x02")
    event = await next_event(probe, "the event of the second name")
    if event.event_type != second:
        raise ctx.fail(f"got an event of type {bounded(event.event_type)}, not {second!r}")


@kit.case("subble.handshake.second-request",
          "A second handshake request on a connection is not accepted",
          section=CLIENT_ID, level=Level.SHOULD, harmful=True, decision=DECIDED_HOST)
async def second_request(ctx: Context) -> str:
    client = await handshake(ctx)
    client.probe.send(encode(HandshakeRequest(client_id=client_name(ctx))))
    return await not_accepted(client.probe, "a second handshake request")


@kit.case("subble.handshake.produce-first",
          "A produce request before the handshake is not acted on",
          section=HANDSHAKE, harmful=True, decision=DECIDED_HOST)
async def produce_first(ctx: Context) -> str:
    event_type = name(ctx, "early")
    subscriber = await handshake(ctx, subscribe=(event_type,))
    early = await ctx.connect()
    early.send(encode(ProduceEvent(client_name(ctx), MSGPACK, event_type, b"\xc0")))
    said = await not_accepted(early, "a produce request before the handshake",
                              handshaken=False)
    await subscriber.probe.silent(0.3, "no event from a connection without a handshake")
    return said


@kit.case("subble.handshake.same-client-id",
          "What a second connection with a connected client's ID gets",
          section=CLIENT_ID, level=Level.INFORMATION, decision=HANDSHAKE_DOC)
async def same_client_id(ctx: Context) -> str:
    first = await handshake(ctx)
    probe, response = await request_handshake(ctx, HandshakeRequest(client_id=first.client_id))
    said = f"the second got {int(response.code)} {bounded(response.message)}"
    if response.code in ACCEPTED:
        try:
            closed = await first.probe.closed(1.0)
            said += f"; the first was closed ({closed.described})"
        except CaseFailed:  # still open: that is what it does
            said += "; the first stayed open"
    return said


# -- versions ---------------------------------------------------------------------------------

async def version_refused(ctx: Context, version: Version) -> str:
    data = b"ver\x00"
    probe, response = await request_handshake(
        ctx, HandshakeRequest(version, client_name(ctx), request_data=data))
    if response.code in ACCEPTED:
        raise ctx.fail(f"version {version} was accepted with {int(response.code)}")
    if response.code not in REFUSALS:
        raise ctx.fail(f"answered {int(response.code)}, not a refusal")
    if response.request_data != data:
        raise ctx.fail(f"the refusal's request data is {response.request_data[:32].hex()}, "
                       f"not {data.hex()}")
    return f"refused with {int(response.code)} {bounded(response.message)}"


async def version_accepted(ctx: Context, version: Version) -> str:
    client = await handshake(ctx, version=version)
    return f"accepted with {int(client.response.code)}"


@kit.case("subble.version.same", "A client at 1.0.0 is accepted", section=REQUEST)
async def version_same(ctx: Context) -> str:
    return await version_accepted(ctx, PROTOCOL_VERSION)


@kit.case("subble.version.newer-patch", "A client at 1.0.5 is accepted",
          section=REQUEST, level=Level.SHOULD, decision=DECIDED)
async def version_patch(ctx: Context) -> str:
    return await version_accepted(ctx, Version(1, 0, 5))


@kit.case("subble.version.newer-minor", "A client at 1.3.0 is accepted",
          section=REQUEST, level=Level.SHOULD, decision=DECIDED)
async def version_minor(ctx: Context) -> str:
    return await version_accepted(ctx, Version(1, 3, 0))


@kit.case("subble.version.next-major",
          "A client at 2.0.0 is refused with a NOT OK code and its request data",
          section=REQUEST, harmful=True)
async def version_major(ctx: Context) -> str:
    return await version_refused(ctx, Version(2, 0, 0))


@kit.case("subble.version.before-1",
          "A client at 0.9.0 is refused with a NOT OK code and its request data",
          section=REQUEST, level=Level.SHOULD, harmful=True, decision=DECIDED)
async def version_zero(ctx: Context) -> str:
    return await version_refused(ctx, Version(0, 9, 0))


@kit.case("subble.version.refusal-code",
          "An unsupported version is refused with 25 (unknown handshake error)",
          section=CODES, level=Level.SHOULD, harmful=True, decision=DECIDED)
async def version_code(ctx: Context) -> str:
    said = await version_refused(ctx, Version(9, 9, 9))
    if not said.startswith("refused with 25"):
        raise ctx.fail(said + ", where 25 is the spec's code for a reason it does not name")
    return said


@kit.case("subble.version.then-nothing",
          "After a refused handshake, a produce request is not acted on",
          section=HANDSHAKE, harmful=True, decision=DECIDED_HOST)
async def version_then_nothing(ctx: Context) -> str:
    event_type = name(ctx, "after-refusal")
    subscriber = await handshake(ctx, subscribe=(event_type,))
    probe, response = await request_handshake(
        ctx, HandshakeRequest(Version(2, 0, 0), client_name(ctx), produce=(event_type,)))
    if response.code in ACCEPTED:
        raise ctx.fail(f"version 2.0.0 was accepted with {int(response.code)}")
    if probe.closed_as is not None:
        return f"refused with {int(response.code)}, then closed ({probe.closed_as.described})"
    probe.send(encode(ProduceEvent("", MSGPACK, event_type, b"\xc0")))
    said = await not_accepted(probe, "a produce after a refused handshake", handshaken=False)
    await subscriber.probe.silent(0.3, "no event from a refused connection")
    return f"refused with {int(response.code)}; then {said}"


@kit.case("subble.version.refusal-closes",
          "Whether the server closes the connection after refusing a handshake",
          section=RESPONSE, level=Level.INFORMATION, harmful=True, decision=DECIDED_HOST)
async def refusal_closes(ctx: Context) -> str:
    probe, response = await request_handshake(
        ctx, HandshakeRequest(Version(2, 0, 0), client_name(ctx)))
    if response.code in ACCEPTED:
        raise ctx.fail(f"version 2.0.0 was accepted with {int(response.code)}")
    try:
        closed = await probe.closed(1.0)
    except CaseFailed:  # still open: that is the answer
        return "no: the connection stayed open"
    return f"yes: closed ({closed.described})"
