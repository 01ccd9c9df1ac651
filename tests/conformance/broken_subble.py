"""Small SubbleSocket hosts on length32 TCP, for the kit's tests: `MiniHost()` follows
docs/subblesocket.md in what the kit checks, and `MiniHost(flaw)` is wrong in one way, so that
the tests can show the kit reports exactly the cases that flaw breaks.

The flaws:

- ``wrong-handshake-code``: an empty client ID is answered 2 with an empty message, not 3 with
  a new ID.
- ``any-version``: every version is accepted (2.0.0 and 0.9.0 too).
- ``response-lengths``: handshake responses write their message's length big-endian.
- ``error-lengths``: event errors count the request data into the message's length.
- ``no-event-error``: an event of an undeclared type is dropped without a 51.
- ``delivers-undeclared``: an event of an undeclared type is delivered like any other.
- ``echo-as-26``: the producer's own event comes back with code 26, not 27.
- ``stale-datetime``: events are dated 0 (1970).
- ``ignores-bad-input``: a message that does not decode is ignored; the connection stays open.
- ``crash``: a message that does not decode stops the whole server (it stops listening and
  drops every connection), as a server that dies on bad input would.
- ``mute``: connections are accepted and nothing is ever answered.
"""

from __future__ import annotations

import struct
import time
import uuid
from typing import Any

from twisted.internet import reactor
from twisted.internet.protocol import Factory
from twisted.protocols.basic import Int32StringReceiver

from wireproto.codecs.subble import (
    Event,
    EventError,
    HandshakeRequest,
    HandshakeResponse,
    MessageCode,
    ProduceEvent,
    decode,
    encode,
    supports_version,
)
from wireproto.errors import ProtocolError

FLAWS = ("wrong-handshake-code", "any-version", "response-lengths", "error-lengths",
         "no-event-error", "delivers-undeclared", "echo-as-26", "stale-datetime",
         "ignores-bad-input", "crash", "mute", "rehandshake")

MAX_MESSAGE = 1_048_576


class MiniConnection(Int32StringReceiver):
    MAX_LENGTH = MAX_MESSAGE
    factory: MiniHost

    def __init__(self) -> None:
        self.client_id: str | None = None
        self.subscribe: set[str] = set()
        self.produce: set[str] = set()
        self.ignoring = False

    def connectionMade(self) -> None:
        self.factory.connections.add(self)

    def connectionLost(self, reason: Any = None) -> None:
        self.factory.connections.discard(self)
        if self.client_id is not None and self.factory.clients.get(self.client_id) is self:
            del self.factory.clients[self.client_id]

    def lengthLimitExceeded(self, length: int) -> None:
        self.transport.abortConnection()

    def send(self, data: bytes) -> None:
        self.sendString(data)

    def stringReceived(self, data: bytes) -> None:
        flaw = self.factory.flaw
        if flaw == "mute" or self.ignoring:
            return
        try:
            message = decode(data, sender="client")
        except ProtocolError:
            if flaw == "crash":
                self.factory.crash()
            elif flaw == "ignores-bad-input":
                self.ignoring = True
            else:
                self.transport.loseConnection()
            return
        if type(message) is HandshakeRequest:
            if self.client_id is not None and flaw == "rehandshake":
                # The spec allows it: a client handshakes again on its connection.
                if self.factory.clients.get(self.client_id) is self:
                    del self.factory.clients[self.client_id]
                self.handshake(message)
            elif self.client_id is not None:
                self.transport.loseConnection()
            else:
                self.handshake(message)
        elif self.client_id is None:
            self.transport.loseConnection()
        else:
            assert type(message) is ProduceEvent
            self.create(message)

    def respond(self, code: MessageCode, message: str, echo: bytes) -> None:
        data = encode(HandshakeResponse(code, message, echo))
        if self.factory.flaw == "response-lengths":
            data = data[:1] + struct.pack(">i", len(message.encode())) + data[5:]
        self.send(data)

    def handshake(self, request: HandshakeRequest) -> None:
        flaw = self.factory.flaw
        if flaw != "any-version" and not supports_version(request.version):
            self.respond(MessageCode.UNKNOWN_HANDSHAKE_ERROR,
                         f"unsupported version {request.version}", request.request_data)
            self.transport.loseConnection()
            return
        if request.client_id:
            code, client_id, said = MessageCode.OK, request.client_id, ""
        elif flaw == "wrong-handshake-code":
            code, client_id, said = MessageCode.OK, str(uuid.uuid4()), ""
        else:
            code, client_id = MessageCode.OK_NEW_CLIENT_ID, str(uuid.uuid4())
            said = client_id
        older = self.factory.clients.get(client_id)
        if older is not None:
            older.transport.loseConnection()
        self.factory.clients[client_id] = self
        self.client_id = client_id
        self.subscribe = set(request.subscribe)
        self.produce = set(request.produce)
        self.respond(code, said, request.request_data)

    def error(self, code: MessageCode, message: str, echo: bytes) -> None:
        data = encode(EventError(code, message, echo))
        if self.factory.flaw == "error-lengths":
            data = data[:1] + struct.pack("<i", len(data) - 5) + data[5:]
        self.send(data)

    def create(self, request: ProduceEvent) -> None:
        flaw = self.factory.flaw
        echo = request.request_data
        if request.client_id != self.client_id:
            self.error(MessageCode.EVENT_NOT_DECLARED, "not this connection's client ID", echo)
            return
        if request.event_type not in self.produce and flaw != "delivers-undeclared":
            if flaw != "no-event-error":
                self.error(MessageCode.EVENT_NOT_DECLARED,
                           f"event type {request.event_type!r} is not declared", echo)
            return
        if request.format not in (0, 1) and not 51 <= request.format <= 255:
            self.error(MessageCode.UNKNOWN_SERVER_ERROR, "reserved format", echo)
            return
        when = 0 if flaw == "stale-datetime" else int(time.time() * 1000)
        event = encode(Event(MessageCode.SERVER_EVENT, request.format, when,
                             request.event_type, str(uuid.uuid4()), request.client_id,
                             request.payload))
        own = event + echo if flaw == "echo-as-26" else b"\x1b" + event[1:] + echo
        if len(own) > MAX_MESSAGE:
            self.error(MessageCode.UNKNOWN_SERVER_ERROR, "too large to send back", echo)
            return
        for connection in list(self.factory.connections):
            if connection is not self and request.event_type in connection.subscribe:
                connection.send(event)
        self.send(own)


class MiniHost(Factory):
    """A SubbleSocket host with one `flaw` (None: none); `listen()` starts it on 127.0.0.1 and
    returns its address for the kit."""

    protocol = MiniConnection

    def __init__(self, flaw: str | None = None) -> None:
        if flaw is not None and flaw not in FLAWS:
            raise ValueError(f"no such flaw: {flaw}")
        self.flaw = flaw
        self.connections: set[MiniConnection] = set()
        self.clients: dict[str, MiniConnection] = {}
        self.port: Any = None
        self.crashed = False

    def listen(self) -> str:
        self.port = reactor.listenTCP(0, self, interface="127.0.0.1")
        return f"tcp:host=127.0.0.1:port={self.port.getHost().port}"

    def crash(self) -> None:
        """Stop serving at once, as a process that died would."""
        self.crashed = True
        self.port.stopListening()
        for connection in list(self.connections):
            connection.transport.abortConnection()

    async def stop(self) -> None:
        for connection in list(self.connections):
            connection.transport.abortConnection()
        if self.port is not None and not self.crashed:
            await self.port.stopListening()
