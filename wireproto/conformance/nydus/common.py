"""The nydus kit's catalogue and what its cases share: an Engine.IO session on a WebSocket that
has had its open packet and its WELCOME, nydus messages sent and read as Engine.IO message
packets, and the checks for an answer and for a session's end."""

from __future__ import annotations

from wireproto.codecs import engineio, nydus
from wireproto.conformance.bounded import bounded
from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.engineio import EngineIOSocket, open_socket
from wireproto.conformance.model import CaseFailed
from wireproto.errors import ProtocolError

__all__ = ["DECIDED", "ENGINEIO", "ENGINEIO_DIFFERS", "SERVER", "kit", "answer", "ended",
           "invoke", "no_answer", "not_answered", "nowhere", "read_nydus", "send_nydus",
           "session", "take_welcome"]

kit = Catalogue("nydus", "nydus-protocol 3.0.0 over Engine.IO 4", "docs/nydus.md")

# Where docs/nydus.md settles what the specs leave open.
DECIDED = "docs/nydus.md#what-we-decided"
ENGINEIO = "docs/nydus.md#engineio-4"
ENGINEIO_DIFFERS = "docs/nydus.md#where-it-differs-from-engineio"
SERVER = "docs/nydus.md#the-server-wireprotos-nydus-server"


def nowhere(ctx: Context, name: str = "nowhere") -> str:
    """A path no server has a route for: this run's own."""
    return "/" + ctx.topic(name)


async def session(ctx: Context, *, strict: bool = False) -> EngineIOSocket:
    """An Engine.IO session on a WebSocket of its own, past its open packet and the nydus
    WELCOME (see `take_welcome`)."""
    socket = await open_socket(ctx)
    await socket.open_packet()
    packet = await socket.packet(what="the nydus WELCOME")
    if packet.type is not engineio.PacketType.MESSAGE or not isinstance(packet.data, str):
        raise CaseFailed(f"expected the nydus WELCOME, got Engine.IO packet type "
                         f"{int(packet.type)} {str(packet.data)[:60]!r}")
    take_welcome(ctx, packet.data, strict)
    return socket


def take_welcome(ctx: Context, text: str, strict: bool = False) -> None:
    """Take `text` as the session's WELCOME. One that is not 0|3 fails a `strict` case
    (nydus.welcome.version); others note it and go on, so that one flaw does not fail them
    all. A first message that is no WELCOME at all fails every case."""
    if text == "0|3":
        return
    if not text.startswith("0"):
        raise CaseFailed(f"expected the nydus WELCOME first, got {text[:60]!r}")
    if strict:
        raise CaseFailed(f"expected the WELCOME 0|3, got {text[:60]!r}")
    ctx.note(f"the WELCOME is {text[:60]!r}, not 0|3 (nydus.welcome.version fails it)")


def send_nydus(socket: EngineIOSocket, text: str) -> None:
    """One nydus string as an Engine.IO message packet (``4`` and the text)."""
    socket.send_packet("4" + text)


def invoke(socket: EngineIOSocket, id_: str, path: str, data: object = nydus.NO_DATA) -> None:
    send_nydus(socket, nydus.encode(nydus.Invoke(id_, path, data)))


async def read_nydus(socket: EngineIOSocket, what: str = "a nydus message",
                     timeout: float | None = None, publishes: bool = False) -> nydus.Message:
    """The next nydus message (noops skipped, and PUBLISHes unless `publishes`: the spec lets a
    server over-publish); CaseFailed when the session ends first, another packet comes, or the
    message does not parse."""
    while True:
        message = await _next_nydus(socket, what, timeout)
        if publishes or not isinstance(message, nydus.Publish):
            return message


async def no_answer(socket: EngineIOSocket, seconds: float, what: str) -> None:
    """CaseFailed if anything but a PUBLISH (which a server may send at any time) comes within
    `seconds`."""
    try:
        got = await read_nydus(socket, what, timeout=seconds)
    except CaseFailed as failed:
        if "got nothing" in str(failed):
            return
        raise
    raise CaseFailed(f"expected {what}, got {bounded(got)}")


async def _next_nydus(socket: EngineIOSocket, what: str,
                      timeout: float | None) -> nydus.Message:
    while True:
        packet = await socket.packet(timeout, what)
        if packet.type is engineio.PacketType.NOOP:
            continue
        if packet.type is engineio.PacketType.CLOSE:
            raise CaseFailed(f"expected {what}, but the server closed the session "
                             "(close packet 1)")
        if packet.type is not engineio.PacketType.MESSAGE:
            raise CaseFailed(f"expected {what}, got Engine.IO packet type {int(packet.type)}"
                             f" {str(packet.data)[:60]!r}")
        if not isinstance(packet.data, str):
            raise CaseFailed(f"expected {what}, got a binary message: nydus messages are text")
        try:
            return nydus.decode(packet.data)
        except ProtocolError as error:
            raise CaseFailed(f"expected {what}, got {packet.data[:60]!r}, which is no nydus "
                             f"message ({error})") from None


async def answer(socket: EngineIOSocket, id_: str,
                 timeout: float | None = None) -> nydus.Result | nydus.Error:
    """The RESULT or ERROR answering the INVOKE `id_`; anything else first fails."""
    message = await read_nydus(socket, f"the answer to INVOKE {id_}", timeout)
    if not isinstance(message, (nydus.Result, nydus.Error)):
        raise CaseFailed(f"expected a RESULT or ERROR with id {id_}, got {bounded(message)}")
    if message.id != id_:
        raise CaseFailed(f"expected the answer to INVOKE {id_}, got one with id "
                         f"{bounded(message.id)}")
    return message


async def ended(socket: EngineIOSocket, what: str, timeout: float = 2.0) -> str:
    """Check that the server ends the session without sending a message first: a close packet,
    or the WebSocket closed. Says how it ended."""
    deadline = socket.reactor.seconds() + timeout
    while True:
        if socket.received:
            packet = await socket.packet(what="the end of the session")
            if packet.type is engineio.PacketType.CLOSE:
                return "close packet 1"
            if packet.type is engineio.PacketType.NOOP or _is_publish(packet):
                continue
            raise CaseFailed(f"expected the server to end the session after {what}, got "
                             f"packet type {int(packet.type)} {str(packet.data)[:60]!r}")
        if socket.closed_as is not None:
            closed = socket.closed_as
            return (f"closed with code {closed.code}" if closed.code is not None
                    else f"closed ({closed.text})")
        if not await socket._change(deadline):  # a message or the close, or the deadline
            raise CaseFailed(f"expected the server to end the session after {what}; it "
                             f"stayed open {timeout:g} s")


async def not_answered(socket: EngineIOSocket, what: str, wait: float = 0.6,
                       error_for: str | None = None) -> str:
    """Check that the server sends no message after `what` within `wait` seconds: it may end
    the session or keep it. Says which it did. With `error_for`, an ERROR for that id is no
    answer as if the message were valid: the spec asks a server to answer an INVOKE of an
    invalid path with one."""
    deadline = socket.reactor.seconds() + wait
    while True:
        if socket.received:
            packet = await socket.packet(what=f"what follows {what}")
            if packet.type is engineio.PacketType.CLOSE:
                return "not answered: the session ended (close packet 1)"
            if packet.type in (engineio.PacketType.NOOP, engineio.PacketType.PING) \
                    or _is_publish(packet):
                continue
            refused = _error_for(packet, error_for)
            if refused is not None:
                return f"refused with an ERROR for its id ({refused})"
            raise CaseFailed(f"it was answered: Engine.IO packet type {int(packet.type)} "
                             f"{str(packet.data)[:60]!r}")
        if socket.closed_as is not None:
            closed = socket.closed_as
            return "not answered: the session ended " + (
                f"(closed with code {closed.code})" if closed.code is not None
                else f"({closed.text})")
        if not await socket._change(deadline):  # a message or the close, or the deadline
            return f"not answered within {wait:g} s; the session stayed open"


def _error_for(packet: engineio.Packet, id_: str | None) -> str | None:
    """The status of `packet` when it is a nydus ERROR for `id_`, else None."""
    if id_ is None or packet.type is not engineio.PacketType.MESSAGE \
            or not isinstance(packet.data, str):
        return None
    try:
        message = nydus.decode(packet.data)
    except ProtocolError:
        return None
    if not isinstance(message, nydus.Error) or message.id != id_:
        return None
    data = message.data
    status = data.get("status") if isinstance(data, dict) else None
    return f"status {status}" if status is not None else "an ERROR"


def _is_publish(packet: engineio.Packet) -> bool:
    """A nydus PUBLISH, which a server may send whenever it likes."""
    return packet.type is engineio.PacketType.MESSAGE and isinstance(packet.data, str) \
        and packet.data.startswith("4")
