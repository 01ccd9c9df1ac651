"""The message interface between transport adapters and spec protocols.

A transport adapter turns some byte carrier (a WebSocket, a framed TCP/TLS/unix stream, a serial
port) into whole messages. A spec protocol (WEBSMQ, UBRE, ...) sees only `IMessageTransport` and
never knows which adapter it sits on. Names follow Twisted's own `IProtocol`/`ITransport`.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IConsumer, IPushProducer
from twisted.python.failure import Failure
from zope.interface import Attribute, Interface, implementer

from wireproto.errors import ProtocolError

__all__ = [
    "IMessageTransport",
    "ILengthPrefixedFrames",
    "IFrameObserver",
    "IMessageProtocol",
    "MessageProtocol",
    "ByteTransportDelegate",
    "close_reason",
]


class IMessageTransport(IConsumer, IPushProducer):
    """Carries whole messages to one peer.

    As an `IConsumer`, `registerProducer` goes to the byte transport underneath, so a full socket
    buffer pauses whoever feeds this transport. As an `IPushProducer`, pausing stops reading
    from the peer.
    """

    kind = Attribute("Short name of the carrier: 'ws', 'tcp', 'ssl', 'unix' or 'serial'.")
    prepareKey = Attribute(
        "Hashable. Transports with equal keys accept each other's prepareMessage results."
    )
    maxMessageSize = Attribute(
        "The largest message, in bytes, this connection takes; sending a larger one fails."
    )
    textOnly = Attribute(
        "True if every message must be text without a line break (the lines framing): a "
        "protocol with a text and a binary format can use only its text one."
    )

    def sendMessage(data: bytes, binary: bool = True) -> None:
        """Send one message. `binary` matters only where the carrier marks it (WebSocket)."""

    def prepareMessage(data: bytes, binary: bool = True) -> Any:
        """Frame a message once so it can be sent to many peers with `sendPrepared`."""

    def sendPrepared(prepared: Any) -> None:
        """Send a result of `prepareMessage` from a transport with the same `prepareKey`."""

    def loseConnection(error: ProtocolError | None = None) -> None:
        """Close cleanly. With `error`, tell the peer why where the carrier can."""

    def abortConnection() -> None:
        """Close at once, dropping whatever is still buffered."""

    def getPeer() -> Any:
        """The peer's address, as the byte transport reports it."""

    def getHost() -> Any:
        """This side's address."""


class IFrameObserver(Interface):
    """Sees the frames an `ILengthPrefixedFrames` transport receives, as they came, and the
    frames it writes, as it writes them."""

    def readStarting() -> None:
        """A read is about to be handled: the messages it holds are delivered next."""

    def framesReceived(frames: bytes) -> None:
        """The whole frames that read delivered, as received: each a 4-byte big-endian length
        and the message."""

    def framesSent(frames: bytes) -> None:
        """Whole frames just written to the connection, as written (one frame, or what a read's
        handling gathered): what was handed over but never written is not told."""


class ILengthPrefixedFrames(IMessageTransport):
    """A message transport whose frames, both ways, are a 4-byte big-endian length and then the
    message (the length32 framing). Its prepared messages are such frames, and an observer can
    see the frames it receives without their being cut apart and joined again: what capture
    files store is the same layout."""

    def observeFrames(observer: IFrameObserver) -> None:
        """From now on, tell `observer` of each read, of the whole frames it delivered, and of
        the frames written."""


class IMessageProtocol(Interface):
    """A spec protocol over whole messages."""

    def makeConnection(transport: IMessageTransport) -> None:
        """Attach the transport and call `connectionMade`."""

    def connectionMade() -> None:
        """The transport is ready; messages may be sent."""

    def messageReceived(data: bytes, binary: bool) -> None:
        """One whole message arrived. `binary` is False only for WebSocket text frames and for
        text framings (lines)."""

    def connectionLost(reason: Failure) -> None:
        """The connection is gone, cleanly or not."""


@implementer(IMessageProtocol)
class MessageProtocol:
    """Base class for spec protocols, in the manner of `twisted.internet.protocol.Protocol`."""

    transport: IMessageTransport | None = None
    connected = False

    def makeConnection(self, transport: IMessageTransport) -> None:
        self.transport = transport
        self.connected = True
        self.connectionMade()

    def connectionMade(self) -> None:
        pass

    def messageReceived(self, data: bytes, binary: bool) -> None:
        pass

    def connectionLost(self, reason: Failure) -> None:
        self.connected = False


class ByteTransportDelegate:
    """The part of IMessageTransport every adapter passes straight to its byte transport
    (`self.transport`): addresses, producers, and pausing the peer's reads."""

    transport: Any
    # A producer (a connection's session) is registered with the byte transport through this.
    _producing = False

    def getPeer(self) -> Any:
        return self.transport.getPeer()

    def getHost(self) -> Any:
        return self.transport.getHost()

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self.transport.registerProducer(producer, streaming)
        self._producing = True

    def unregisterProducer(self) -> None:
        self._producing = False
        self.transport.unregisterProducer()

    def release_producer(self) -> None:
        """Let go of the producer of a connection on its way out: nothing more is produced
        for it, and TLS closes only once no producer is registered."""
        if self._producing:
            self.unregisterProducer()

    def pauseProducing(self) -> None:
        self.transport.pauseProducing()

    def resumeProducing(self) -> None:
        self.transport.resumeProducing()

    def stopProducing(self) -> None:
        self.transport.stopProducing()


# RFC 6455 allows 123 bytes of UTF-8 in a close reason.
MAX_CLOSE_REASON = 123


def close_reason(error: ProtocolError, limit: int = MAX_CLOSE_REASON) -> str:
    """`error`'s message cut to `limit` UTF-8 bytes, on a character boundary."""
    text = str(error)
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode("utf-8", "ignore") + "..."


def go_away(transport: IMessageTransport) -> None:
    """Close `transport` cleanly because this side is shutting down. A transport whose carrier
    has a word for it offers ``goAway()`` (a WebSocket closes with 1001, going away); others
    are closed with ``loseConnection()``."""
    going = getattr(transport, "goAway", None)
    if going is not None:
        going()
    else:
        transport.loseConnection()
