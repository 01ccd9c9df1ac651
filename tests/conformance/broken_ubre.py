"""Small UBRE brokers for the kit's tests: `MiniBroker` does what the spec asks (and no more),
and each subclass below is wrong in one way, so that the kit can be shown to catch it.

They serve UBRE over wireproto's WebSocket transport (or a length32 stream) on 127.0.0.1 in the
test's reactor; the UBRE layer is written here from the codec alone, not from wireproto's
server, so that the kit is checked against a second, independent server.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.interfaces import IListeningPort
from twisted.python.failure import Failure

from wireproto.codecs import ubre
from wireproto.codecs.ubre import (
    NO_BODY,
    Fail,
    Message,
    Publish,
    Request,
    Subscribe,
    Success,
    Unsubscribe,
)
from wireproto.errors import ProtocolError
from wireproto.transports.base import MessageProtocol
from wireproto.transports.stream import StreamOptions, stream_server_factory
from wireproto.transports.websocket import WebSocketOptions
from wireproto.transports.websocket_http import websocket_resource, websocket_site


def _json_body(body: Any) -> Any:
    """A binary body for a JSON subscriber: its JSON value, else its text; None if neither."""
    if body is NO_BODY or body == b"":
        return NO_BODY
    try:
        return json.loads(body)
    except ValueError:
        pass
    try:
        return body.decode()
    except UnicodeDecodeError:
        return None


def _binary_body(body: Any) -> Any:
    if body is NO_BODY or isinstance(body, bytes):
        return body or NO_BODY
    return json.dumps(body, separators=(",", ":")).encode()


class MiniPeer(MessageProtocol):
    """One connection to a MiniBroker."""

    binary_format = False

    def __init__(self, broker: MiniBroker) -> None:
        self.broker = broker

    def connectionMade(self) -> None:
        self.broker.peers.add(self)

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        self.broker.peers.discard(self)
        for peers in self.broker.subscribers.values():
            peers.pop(self, None)

    def read(self, data: bytes, binary: bool) -> Message:
        return ubre.decode(data) if binary else ubre.decode_json(data)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        try:
            message = self.read(data, binary)
        except ProtocolError as error:
            self.refuse(error)
            return
        in_binary = not ubre.is_json(data)
        if isinstance(message, Publish):
            self.broker.deliver(self, message)
        elif isinstance(message, Subscribe):
            self.binary_format = in_binary
            self.broker.subscribers.setdefault(message.topic, {})[self] = None
        elif isinstance(message, Unsubscribe):
            self.unsubscribe(message.topic)
        elif isinstance(message, Request):
            self.answer(message, in_binary)

    def refuse(self, error: ProtocolError) -> None:
        self.transport.loseConnection(error)

    def unsubscribe(self, topic: str) -> None:
        self.broker.subscribers.get(topic, {}).pop(self, None)

    def answer(self, message: Request, in_binary: bool) -> None:
        self.send(Fail(message.id, b"NotFound" if in_binary else "NotFound"), in_binary)

    def send(self, message: Message, binary: bool) -> None:
        self.transport.sendMessage(ubre.encode(message, binary=binary), binary)

    def publish(self, message: Publish) -> None:
        """Send a publish in this connection's format."""
        if self.binary_format:
            body = message.body if message.streaming else _binary_body(message.body)
            self.send(Publish(message.topic, body, streaming=message.streaming), True)
            return
        body = _json_body(message.body) if isinstance(message.body, bytes) else message.body
        if body is None and isinstance(message.body, bytes):
            self.send(Publish(message.topic, message.body or NO_BODY), True)
        else:
            self.send(Publish(message.topic, body), False)


class MiniBroker:
    """A UBRE broker that does what the spec asks: exact topics, publishes to every other
    subscriber, each request answered once with a fail "NotFound" and its id, and a connection
    whose message cannot be read closed."""

    peer_class: type[MiniPeer] = MiniPeer

    def __init__(self) -> None:
        self.subscribers: dict[str, dict[MiniPeer, None]] = {}
        self.peers: set[MiniPeer] = set()
        self.port: IListeningPort | None = None

    def __call__(self) -> MiniPeer:
        return self.peer_class(self)

    def deliver(self, sender: MiniPeer, message: Publish) -> None:
        for peer in list(self.subscribers.get(message.topic, {})):
            if peer is not sender:
                try:
                    peer.publish(message)
                except ProtocolError:
                    pass  # a body this subscriber's format cannot carry (1e999 in JSON)

    async def listen(self, framing: str | None = None) -> str:
        """Listen on a free port: the address a client connects to."""
        if framing is None:
            factory: Any = websocket_site({"/ubre": websocket_resource(self,
                                                                       WebSocketOptions())})
        else:
            factory = stream_server_factory(self, StreamOptions(framing=framing))
        self.port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
        port = self.port.getHost().port
        return f"ws://127.0.0.1:{port}/ubre" if framing is None else f"tcp:127.0.0.1:{port}"

    def crash(self) -> None:
        """Stop serving at once, as a process that died would."""
        if self.port is not None:
            self.port.stopListening()
            self.port = None
        for peer in list(self.peers):
            peer.transport.abortConnection()

    async def stop(self) -> None:
        if self.port is not None:
            await self.port.stopListening()
            self.port = None
        for peer in list(self.peers):
            peer.transport.abortConnection()


# -- wrong in one way each ------------------------------------------------------------------


class WrongLengthPeer(MiniPeer):
    def send(self, message: Message, binary: bool) -> None:
        data = ubre.encode(message, binary=binary)
        if binary and isinstance(message, Publish) and not message.streaming:
            code, name_length, body_length = struct.unpack_from(">BHI", data)
            data = struct.pack(">BHI", code, name_length, body_length + 1) + data[7:]
        self.transport.sendMessage(data, binary)


class WrongLengths(MiniBroker):
    """Writes the body length of each binary publish one too many."""

    peer_class = WrongLengthPeer


class NoReplyPeer(MiniPeer):
    def answer(self, message: Request, in_binary: bool) -> None:
        pass


class NoReply(MiniBroker):
    """Never answers a request."""

    peer_class = NoReplyPeer


class StringIdPeer(MiniPeer):
    def answer(self, message: Request, in_binary: bool) -> None:
        self.send(Fail(str(message.id), b"NotFound" if in_binary else "NotFound"), in_binary)


class StringIds(MiniBroker):
    """Answers every request with its id as a string: 7 comes back as "7"."""

    peer_class = StringIdPeer


class TwiceReplyPeer(MiniPeer):
    def answer(self, message: Request, in_binary: bool) -> None:
        super().answer(message, in_binary)
        self.send(Success(message.id), in_binary)


class ReplyTwice(MiniBroker):
    """Answers every request twice: a fail, then a success."""

    peer_class = TwiceReplyPeer


# Two brokers the spec allows, though they do not do what ubre.js does: the kit must fail no
# MUST case of theirs.


class CatchAllPeer(MiniPeer):
    def answer(self, message: Request, in_binary: bool) -> None:
        self.send(Success(message.id, b"ok" if in_binary else "ok"), in_binary)


class CatchAll(MiniBroker):
    """Answers every request with a success, as a server whose handler takes any name would."""

    peer_class = CatchAllPeer


class SpecFormOnlyPeer(MiniPeer):
    def answer(self, message: Request, in_binary: bool) -> None:
        # The spec's request has no handler name: {"request": X, "id": Y} is a request whose
        # id is X, the "id" key one it does not know.
        request_id = message.id if message.name is None else message.name
        self.send(Fail(request_id, b"NotFound" if in_binary else "NotFound"), in_binary)


class SpecFormOnly(MiniBroker):
    """Knows only the spec's request form, not ubre.js's (a handler's name and an id)."""

    peer_class = SpecFormOnlyPeer


class ShortHeaderCrashPeer(MiniPeer):
    def read(self, data: bytes, binary: bool) -> Message:
        if binary and 0 < len(data) < ubre.HEADER_SIZE and data[:1] != b"{":
            self.broker.crash()
        return super().read(data, binary)


class CrashOnShortHeader(MiniBroker):
    """Dies on a binary message shorter than its header, as a server that reads the header
    unchecked would."""

    peer_class = ShortHeaderCrashPeer


class LenientPeer(MiniPeer):
    def read(self, data: bytes, binary: bool) -> Message:
        if binary and data[:1] == b"P" and len(data) >= ubre.HEADER_SIZE:
            _, name_length, _ = struct.unpack_from(">BHI", data)
            name = data[7:7 + name_length].decode("utf-8", "replace")
            return Publish(name, data[7 + name_length:] or NO_BODY)
        return super().read(data, binary)

    def refuse(self, error: ProtocolError) -> None:
        pass  # ignored: the sender never learns


class Lenient(MiniBroker):
    """Reads a binary publish's body as whatever follows its name, whatever the body length
    says, and ignores what it cannot read without closing."""

    peer_class = LenientPeer


class KeepsSubscriptionsPeer(MiniPeer):
    def unsubscribe(self, topic: str) -> None:
        pass


class IgnoresUnsubscribe(MiniBroker):
    """Takes unsubscribes without acting on them: publishes keep coming."""

    peer_class = KeepsSubscriptionsPeer


class FailTypoPeer(MiniPeer):
    def send(self, message: Message, binary: bool) -> None:
        data = ubre.encode(message, binary=binary)
        if binary and isinstance(message, Fail):
            data = b"c" + data[1:]  # the spec table's 0x63
        self.transport.sendMessage(data, binary)


class FailTypo(MiniBroker):
    """Writes binary fails with the spec table's 0x63 where 'f' is 0x66."""

    peer_class = FailTypoPeer


class MutePeer(MiniPeer):
    def answer(self, message: Request, in_binary: bool) -> None:
        pass

    def publish(self, message: Publish) -> None:
        if message.topic.endswith("/alive"):
            super().publish(message)


class Mute(MiniBroker):
    """Passes the kit's liveness check, then says nothing: no delivery, no answer."""

    peer_class = MutePeer


class NoReplyLenientPeer(NoReplyPeer):
    def refuse(self, error: ProtocolError) -> None:
        pass


class NoReplyIgnoresBadInput(MiniBroker):
    """Answers no request, and ignores what it cannot read: malformed messages can only be
    seen not acted on."""

    peer_class = NoReplyLenientPeer
