"""What the SubbleSocket client kit's cases share: the catalogue, the driver contract's event
types, the kit's side of a handshake, events sent and the client's produce requests read back
(always with wireproto's codec, docs/subblesocket.md "On the wire"), and the check that a client
survived what a case sent it."""

from __future__ import annotations

import secrets
import struct
import time
from dataclasses import dataclass

from wireproto.codecs.subble import (
    ClientMessage,
    Event,
    HandshakeRequest,
    HandshakeResponse,
    MessageCode,
    ProduceEvent,
    SerializationFormat,
    decode,
    encode,
    pack_payload,
    unpack_payload,
)
from wireproto.conformance.bounded import bounded
from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.listener import ClientProbe
from wireproto.conformance.model import CaseFailed
from wireproto.conformance.probe import Probe, Received, shown
from wireproto.errors import ProtocolError

__all__ = [
    "DECIDED", "DECIDED_HOST", "allowed", "ERROR", "IN", "JSON", "MSGPACK", "OUT", "TRANSPORTS",
    "Session", "answer_produce", "client_message", "echo", "event_bytes", "greet", "kit",
    "le32", "next_produce", "read_handshake", "send_event", "still_works", "value_of", "welcome",
]

kit = Catalogue("subble", "SubbleSocket 1.0.0", "docs/subblesocket.md", mode="client")

# The driver contract (docs/conformance.md, "SubbleSocket clients: the driver and results"):
# the client subscribes to IN, echoes every event it gets by producing on OUT, and reports each
# event error it gets for a produce by producing on ERROR.
IN = "conformance/in"
OUT = "conformance/out"
ERROR = "conformance/error"

DECIDED = "docs/subblesocket.md#what-we-decided"
DECIDED_HOST = "docs/subblesocket.md#what-we-decided-for-the-host-and-the-client"
TRANSPORTS = "docs/subblesocket.md#transports"

MSGPACK = SerializationFormat.MSGPACK
JSON = SerializationFormat.JSON

# How long the kit waits for the client's answer to an event (its echo, a produce request).
ECHO_WAIT = 3.0


def allowed(ctx: Context, wanted: float, reserve: float) -> float:
    """How long a case may wait for something: `wanted`, or less when --timeout gave the case
    less time than that and `reserve` for the rest of its work."""
    return max(0.5, min(wanted, ctx.timeout - reserve))


def le32(value: int) -> bytes:
    return struct.pack("<i", value)


def now_ms() -> int:
    return int(time.time() * 1000)


def client_message(message: Received) -> ClientMessage:
    """What the client sent, read with wireproto's codec; CaseFailed when it does not read."""
    if not message.binary:
        raise CaseFailed(f"the client sent a text message, but SubbleSocket is binary: "
                         f"{shown(message)}")
    try:
        return decode(message.data, sender="client")
    except ProtocolError as error:
        raise CaseFailed(f"the client sent a message that is not SubbleSocket ({error}): "
                         f"{shown(message)}") from None


async def read_handshake(probe: Probe, timeout: float = ECHO_WAIT) -> HandshakeRequest:
    """The client's first message, which must be a handshake request."""
    message = client_message(await probe.receive(timeout, "the client's handshake request"))
    if type(message) is not HandshakeRequest:
        raise CaseFailed(f"the client's first message is a produce request (27) of type "
                         f"{bounded(message.event_type)}, not a handshake request (1)")
    return message


@dataclass
class Session:
    """A client's connection whose handshake the kit answered."""

    probe: ClientProbe
    request: HandshakeRequest
    client_id: str  # the ID the kit gave it (3), or confirmed (2)


def new_id() -> str:
    return f"conformance-{secrets.token_hex(6)}"


async def greet(ctx: Context, code: int | None = None, message: str | None = None,
                probe: ClientProbe | None = None) -> Session:
    """Take the client's next connection (unless given one), read its handshake request and
    accept it (`welcome`)."""
    if probe is None:
        probe = await ctx.accept()
    return welcome(probe, await read_handshake(probe), code, message)


def welcome(probe: ClientProbe, request: HandshakeRequest, code: int | None = None,
            message: str | None = None) -> Session:
    """Answer `request` as a host does: 3 with a new client ID for an empty one, else 2 with
    an empty message; or with `code` and `message`. The request data is echoed. A case that
    read a handshake answers it even when it judged only the request, so that a client started
    by hand does not count an unanswered handshake as a failed attempt, and wait longer and
    longer before its next connection."""
    if code is None:
        code = MessageCode.OK if request.client_id else MessageCode.OK_NEW_CLIENT_ID
    if message is None:
        message = new_id() if code == MessageCode.OK_NEW_CLIENT_ID else ""
    probe.send(encode(HandshakeResponse(MessageCode(code), message, request.request_data)))
    client_id = message if code == MessageCode.OK_NEW_CLIENT_ID else (message or
                                                                      request.client_id)
    return Session(probe, request, client_id)


def event_bytes(payload: bytes, format: int = MSGPACK, *, event_type: str = IN,
                code: int = MessageCode.SERVER_EVENT, guid: str | None = None,
                source: str = "conformance", datetime_ms: int | None = None,
                request_data: bytes = b"") -> bytes:
    return encode(Event(MessageCode(code), format, now_ms() if datetime_ms is None
                        else datetime_ms, event_type, guid or secrets.token_hex(8), source,
                        payload, request_data))


def send_event(session: Session, value: object, format: int = MSGPACK, *,
               event_type: str = IN, guid: str | None = None, source: str = "conformance",
               datetime_ms: int | None = None, request_data: bytes = b"") -> bytes:
    """Send an event of `value` packed in `format` (to IN unless `event_type` says); the
    payload's bytes."""
    payload = pack_payload(value, format)
    session.probe.send(event_bytes(payload, format, event_type=event_type, guid=guid,
                                   source=source, datetime_ms=datetime_ms,
                                   request_data=request_data))
    return payload


def answer_produce(session: Session, produce: ProduceEvent) -> None:
    """Answer a produce request as a host does: the event echoed back (27), request data and
    all."""
    if not session.probe.is_open:
        return
    session.probe.send(encode(Event(MessageCode.CLIENT_EVENT, produce.format, now_ms(),
                                    produce.event_type, secrets.token_hex(8), session.client_id,
                                    produce.payload, produce.request_data)))


async def next_produce(session: Session, what: str, timeout: float = ECHO_WAIT,
                       answer: bool = True) -> ProduceEvent:
    """The client's next message, which must be a produce request; answered as a host does
    unless `answer` is False."""
    message = client_message(await session.probe.receive(timeout, what))
    if type(message) is not ProduceEvent:
        raise CaseFailed(f"expected {what}, got another handshake request (1) on a connection "
                         "already accepted")
    if answer:
        answer_produce(session, message)
    return message


def value_of(produce: ProduceEvent) -> object:
    """The produce's payload as its format says; CaseFailed when it does not read."""
    try:
        return unpack_payload(produce.payload, produce.format)
    except ProtocolError as error:
        raise CaseFailed(f"the client produced a payload that is not what its format "
                         f"{int(produce.format)} says ({error}): "
                         f"{bounded(produce.payload)}") from None


async def echo(session: Session, value: object, format: int = MSGPACK,
               what: str = "the client's echo", *, guid: str | None = None,
               source: str = "conformance", datetime_ms: int | None = None,
               request_data: bytes = b"") -> ProduceEvent:
    """Send `value` in an event and read the client's echo of it: a produce on OUT in the same
    format with the same value."""
    send_event(session, value, format, guid=guid, source=source, datetime_ms=datetime_ms,
               request_data=request_data)
    produce = await next_produce(session, f"{what} (a produce request of type {OUT!r})")
    check_echo(produce, value, format)
    return produce


def check_echo(produce: ProduceEvent, value: object, format: int) -> None:
    if produce.event_type != OUT:
        raise CaseFailed(f"the client produced an event of type {bounded(produce.event_type)}, "
                         f"where the driver echoes on {OUT!r}")
    if produce.format != format:
        raise CaseFailed(f"the client echoed a format {int(format)} event in format "
                         f"{int(produce.format)}")
    got = value_of(produce)
    if got != value or type(got) is not type(value):
        raise CaseFailed(f"the client echoed {bounded(got)}, not {bounded(value)}")


async def still_works(ctx: Context, session: Session, what: str,
                      wait: float = ECHO_WAIT) -> str:
    """After `what` was sent: the client either still echoes an event on the same connection,
    or has closed it; CaseFailed when its process crashed (with --run), or when it neither
    answers nor closes. Returns which, for the case's reason."""
    probe = session.probe
    if probe.is_open:
        token = secrets.token_hex(4)
        try:
            payload = pack_payload({"still": token}, MSGPACK)
            probe.send(event_bytes(payload))
        except CaseFailed:
            pass  # closed as the kit sent: judged below
        deadline = ctx.reactor.seconds() + wait
        while probe.is_open or probe.received:
            left = deadline - ctx.reactor.seconds()
            if left <= 0:
                break
            try:
                received = await probe.receive(left, "the echo")
            except CaseFailed:
                continue
            try:
                message = decode(received.data, sender="client")
            except ProtocolError:
                continue
            if type(message) is ProduceEvent:
                answer_produce(session, message)
                try:
                    if message.event_type == OUT and value_of(message) == {"still": token}:
                        await alive_process(ctx, what)
                        return f"it kept working after {what}"
                except CaseFailed:
                    continue
        if probe.is_open:
            raise CaseFailed(f"after {what} the client neither echoed a valid event within "
                             f"{wait:g} s nor closed the connection")
    await alive_process(ctx, what, closed=True)
    said = probe.closed_as.described if probe.closed_as is not None else "closed"
    return f"it closed the connection after {what} ({said})"


async def alive_process(ctx: Context, what: str, closed: bool = False) -> None:
    """With --run: CaseFailed when the client's process ended with an error (a crash); a
    client that closed may exit with status 0 (--run starts the next one)."""
    client = ctx.client
    if client is None:
        return
    if closed:
        await client.ended(0.5)
    if client.status is not None and client.status != 0:
        raise CaseFailed(f"the client {client.described()} after {what}")
