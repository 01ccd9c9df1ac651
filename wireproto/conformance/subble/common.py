"""What the SubbleSocket kit's cases share: the catalogue, handshaken connections, and the
judging of what a server sends, always by decoding with wireproto's codec
(wireproto.codecs.subble, docs/subblesocket.md "On the wire")."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from wireproto.codecs.subble import (
    HANDSHAKE_RESPONSE_CODES,
    PROTOCOL_VERSION,
    Event,
    EventError,
    HandshakeRequest,
    HandshakeResponse,
    MessageCode,
    ProduceEvent,
    SerializationFormat,
    ServerMessage,
    Version,
    decode,
    encode,
)
from wireproto.conformance.bounded import bounded
from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.model import CaseFailed
from wireproto.conformance.probe import Probe, Received, shown
from wireproto.errors import ProtocolError

__all__ = [
    "ACCEPTED", "DECIDED", "DECIDED_HOST", "EVENTS_DOC", "HANDSHAKE_DOC", "MSGPACK", "JSON",
    "REFUSALS", "Client", "kit", "name", "client_name", "handshake", "request_handshake", "produce",
    "server_message", "next_message", "next_event", "not_accepted",
    "GUID_ROOM", "event_size",
]

kit = Catalogue("subble", "SubbleSocket 1.0.0", "docs/subblesocket.md")

# Where wireproto decided what the spec leaves open (headings of docs/subblesocket.md).
DECIDED = "docs/subblesocket.md#what-we-decided"
DECIDED_HOST = "docs/subblesocket.md#what-we-decided-for-the-host-and-the-client"
HANDSHAKE_DOC = "docs/subblesocket.md#the-handshake"
EVENTS_DOC = "docs/subblesocket.md#events"

MSGPACK = SerializationFormat.MSGPACK
JSON = SerializationFormat.JSON

ACCEPTED = frozenset({MessageCode.OK, MessageCode.OK_NEW_CLIENT_ID})
# The spec's "NOT OK" handshake codes.
REFUSALS = HANDSHAKE_RESPONSE_CODES - ACCEPTED

# Room the limit cases leave for the GUID a server makes (a uuid4 as text is 36 bytes).
GUID_ROOM = 64


def name(ctx: Context, what: str) -> str:
    """A name of this run alone (an event type or a client ID), unique at each call, so that no
    case sees another's events."""
    return ctx.topic(f"{what}-{secrets.token_hex(3)}")


def client_name(ctx: Context) -> str:
    """A client ID for the case's next connection: the same few IDs in every case of a run
    (`PREFIX/RUN/client-N` for its Nth connection), so that a server that limits how many new
    IDs an address may bring a minute does not refuse the run's later cases."""
    return ctx.topic(f"client-{len(ctx.probes) + 1}")


def server_message(message: Received) -> ServerMessage:
    """What the server sent, read with wireproto's codec; CaseFailed when it does not read."""
    if not message.binary:
        raise CaseFailed(f"the server sent a text message, but SubbleSocket is binary: "
                         f"{shown(message)}")
    try:
        return decode(message.data, sender="server")
    except ProtocolError as error:
        raise CaseFailed(f"the server sent a message that is not SubbleSocket ({error}): "
                         f"{shown(message)}") from None


async def next_message(probe: Probe, what: str, timeout: float | None = None) -> ServerMessage:
    return server_message(await probe.receive(timeout, what))


async def next_event(probe: Probe, what: str = "an event",
                     timeout: float | None = None) -> Event:
    """The next message, which must be an event (26 or 27)."""
    message = await next_message(probe, what, timeout)
    if type(message) is not Event:
        raise CaseFailed(f"expected {what}, got {describe(message)}")
    return message


def describe(message: ServerMessage) -> str:
    if type(message) is Event:
        return (f"an event ({int(message.code)}) of type {bounded(message.event_type)} from "
                f"{bounded(message.source)}")
    if type(message) is EventError:
        return f"event error {int(message.code)} {bounded(message.message)}"
    assert type(message) is HandshakeResponse
    return f"handshake response {int(message.code)} {bounded(message.message)}"


@dataclass
class Client:
    """A connection whose handshake the server accepted."""

    probe: Probe
    client_id: str
    response: HandshakeResponse


async def request_handshake(ctx: Context, request: HandshakeRequest | bytes,
                            probe: Probe | None = None) -> tuple[Probe, HandshakeResponse]:
    """Open a connection (unless given one), send `request` and read the server's answer,
    which must be a handshake response."""
    if probe is None:
        probe = await ctx.connect()
    probe.send(request if isinstance(request, bytes) else encode(request))
    message = await next_message(probe, "the handshake response")
    if type(message) is not HandshakeResponse:
        raise CaseFailed(f"expected the handshake response, got {describe(message)}")
    return probe, message


async def handshake(ctx: Context, *, subscribe: tuple[str, ...] = (),
                    produce: tuple[str, ...] = (), client_id: str | None = None,
                    separator: str = ";", request_data: bytes = b"",
                    version: Version = PROTOCOL_VERSION) -> Client:
    """A new connection, handshaken: accepted with 2 (the ID it sent) or 3 (a new ID). The ID
    is one of this run's own unless given ("" asks the server for one)."""
    if client_id is None:
        client_id = client_name(ctx)
    request = HandshakeRequest(version, client_id, separator, subscribe, produce, request_data)
    probe, response = await request_handshake(ctx, request)
    if response.code not in ACCEPTED:
        raise CaseFailed(f"the handshake of {client_id!r} was refused with "
                         f"{int(response.code)} {bounded(response.message)}")
    if response.code == MessageCode.OK_NEW_CLIENT_ID:
        if not response.message:
            raise CaseFailed("the handshake was answered 3 (new client ID) with no ID in the "
                             "message")
        client_id = response.message
    if subscribe:
        # Let the server take the subscriptions in before anyone produces.
        await ctx.sleep(0.1)
    return Client(probe, client_id, response)


def produce(client: Client, event_type: str, payload: bytes, format: int = MSGPACK,
            request_data: bytes = b"", client_id: str | None = None) -> ProduceEvent:
    request = ProduceEvent(client.client_id if client_id is None else client_id, format,
                           event_type, payload, request_data)
    client.probe.send(encode(request))
    return request


async def not_accepted(probe: Probe, what: str, window: float = 0.5,
                       handshaken: bool = True) -> str:
    """Judge a server's answer to input it must not act on: a close, an error (51/52, or a
    refusal code before the handshake) or silence for `window` seconds are each fine; an event,
    or an accepting handshake response, is CaseFailed. Returns what the server did."""
    deadline = time.monotonic() + window
    while True:
        left = deadline - time.monotonic()
        if probe.closed_as is not None and not probe.received:
            return f"the server closed the connection ({probe.closed_as.described})"
        if left <= 0:
            return "the server ignored it (no answer, the connection stayed open)"
        try:
            received = await probe.receive(left, what)
        except CaseFailed:
            continue  # closed, or the window ended: said above
        message = server_message(received)
        if type(message) is Event:
            raise CaseFailed(f"the server acted on {what}: it sent {describe(message)}")
        if type(message) is HandshakeResponse and message.code in ACCEPTED:
            if not handshaken:
                raise CaseFailed(f"the server accepted {what} with {int(message.code)}")
            raise CaseFailed(f"the server answered {what} with handshake response "
                             f"{int(message.code)}")
        if type(message) is EventError or message.code in REFUSALS:
            return f"the server answered {describe(message)}"


def event_size(event_type: str, guid: int, source: str, payload: int,
               request_data: int = 0) -> int:
    """The bytes of an event with fields of these sizes (`guid`, `payload` and `request_data`
    given as lengths)."""
    return (1 + 1 + 8 + 4 + len(event_type.encode()) + 4 + guid + 4 + len(source.encode())
            + 4 + payload + request_data)


def now_ms() -> int:
    return int(time.time() * 1000)
