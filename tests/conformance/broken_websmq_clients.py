"""A WEBSMQ client for the client kit's tests: it follows the kit's driver contract with frames
of its own making, right in every way but the one fault it is given.

    python -m tests.conformance.broken_websmq_clients FAULT ADDRESS

`control` has no fault. Unlike wireproto's client it ignores a frame it cannot read (it does not
close), so the kit's information cases see the other answer. The others each break one thing
(FAULTS says what); a few attack the kit itself (a flood, a frame of 100 MB, hundreds of
connections, a connection that never closes).
"""

from __future__ import annotations

import os
import signal
import struct
import sys

from twisted.internet import reactor
from twisted.python.failure import Failure

from wireproto.codecs import websmq
from wireproto.errors import ProtocolError
from wireproto.transports.base import MessageProtocol
from wireproto.transports.connect import connect, is_websocket_address
from wireproto.transports.websocket import WebSocketOptions

IN, OUT, COMMAND, WILL = b"conformance/in", b"conformance/out", b"conformance/command", \
    b"conformance/will"

FAULTS = {
    "control": "no fault",
    "text-frames": "sends its frames as WebSocket text frames",
    "no-will": "never declares its will (wills are a client's choice: no fault, really)",
    "wrong-will": "declares its will with a payload other than the driver's",
    "publishes-will": "also publishes its will itself, as a Publish, on connecting",
    "subscribe-payload": "puts a payload in its Subscribe and Unsubscribe frames",
    "second-byte-length": "writes a topic's length in the header's second byte alone",
    "no-topic-check": "sends any topic it is given, its length cut to the header's 14 bits",
    "crash-on-unknown-type": "exits when the server sends a Subscribe or Unsubscribe frame",
    "crash-on-malformed": "exits on a frame it cannot read",
    "ignores-wills": "drops Last Will frames",
    "drops-empty": "drops publishes with an empty payload",
    "small-limit": "takes WebSocket messages of 64 KiB at most",
    "no-pong": "never answers a WebSocket ping",
    "no-close-reply": "drops the connection on the server's close frame, without answering it",
    "no-reconnect": "never connects again once its connection is lost",
    # Not a flaw: the driver contract lets a driver end when its connection is lost.
    "exits-on-close": "closes on a frame it cannot read, and ends (status 0) when its "
                      "connection is lost, for --run to start it again",
    "tight-loop": "connects again every 50 ms, however often it is dropped",
    "no-resubscribe": "on connecting again, neither declares its will nor subscribes",
    "flood": "publishes 1 MB frames without end once connected",
    "huge": "sends one frame of 100 MB once connected",
    "many-connections": "opens 300 connections at once",
    "never-closes": "never answers a close frame nor closes its connection",
    "freezes": "stops itself (SIGSTOP) when asked, after something hostile, if it still works",
}


def header(message_type: int, length: int, fault: str) -> bytes:
    if fault == "second-byte-length":
        return bytes([message_type << 6, length & 0xFF])
    return struct.pack("!H", message_type << 14 | (length & 0x3FFF))


class Client(MessageProtocol):
    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.fault = owner.fault
        self.subscribed: set[bytes] = set()

    def frame(self, message_type: int, topic: bytes, payload: bytes = b"") -> None:
        if message_type in (1, 2) and self.fault == "subscribe-payload":
            payload = b"payload"
        data = header(message_type, len(topic), self.fault) + topic + payload
        self.transport.sendMessage(data, self.fault != "text-frames")

    def connectionMade(self) -> None:
        transport = self.transport
        if self.fault == "no-pong":
            transport.sendPong = lambda *args, **kwargs: None
        if self.fault == "never-closes":
            transport.sendCloseFrame = lambda *args, **kwargs: None
            transport.dropConnection = lambda *args, **kwargs: None
        if self.fault == "no-close-reply":
            def drop(*args: object, isReply: bool = False, **kwargs: object) -> None:
                transport.dropConnection(abort=True)
            transport.sendCloseFrame = drop
        first = self.owner.connections == 0
        self.owner.connections += 1
        if self.fault == "no-resubscribe" and not first:
            return
        if self.fault == "wrong-will":
            self.frame(3, WILL, b"went")
        elif self.fault != "no-will":
            self.frame(3, WILL, b"gone")
        if self.fault == "publishes-will":
            self.frame(0, WILL, b"gone")
        for topic in (COMMAND, IN):
            self.subscribed.add(topic)
            self.frame(1, topic)
        if self.fault == "flood":
            self.flood()
        elif self.fault == "huge":
            self.frame(0, OUT, bytes(100_000_000))

    def flood(self) -> None:
        if self.connected:
            for _ in range(20):
                self.frame(0, OUT, bytes(1_000_000))
            reactor.callLater(0.01, self.flood)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        try:
            if not binary:
                raise ProtocolError("a text frame")
            message = websmq.decode(data)
        except ProtocolError:
            if self.fault == "crash-on-malformed":
                os._exit(3)
            if self.fault == "exits-on-close":
                self.transport.loseConnection()  # then ends, with status 0
            return  # ignored: the control keeps working
        if isinstance(message, websmq.Subscribe | websmq.Unsubscribe):
            if self.fault == "crash-on-unknown-type":
                os._exit(4)
            return
        if isinstance(message, websmq.LastWill) and self.fault == "ignores-wills":
            return
        topic = message.topic.encode()
        if topic not in self.subscribed:
            return
        if self.fault == "freezes" and message.payload.startswith(b"still-there"):
            os.kill(os.getpid(), signal.SIGSTOP)
        if topic == COMMAND:
            self.command(message.payload)
        elif message.payload or self.fault != "drops-empty":
            self.frame(0, OUT, message.payload)

    def command(self, payload: bytes) -> None:
        verb, _, rest = payload.partition(b" ")
        topic, _, body = rest.partition(b" ") if verb == b"publish" else (rest, b"", b"")
        if verb == b"close":
            self.transport.loseConnection()
            return
        if self.fault != "no-topic-check":
            try:
                websmq.validate_topic(topic.decode("ascii"))
            except (ProtocolError, UnicodeDecodeError) as error:
                self.frame(0, OUT, b"error: " + str(error).encode())
                return
        if verb == b"subscribe":
            self.subscribed.add(topic)
            self.frame(1, topic)
        elif verb == b"unsubscribe":
            self.subscribed.discard(topic)
            self.frame(2, topic)
        elif verb == b"publish":
            self.frame(0, topic, body)

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        self.owner.lost()


class Owner:
    """Connects, and connects again as the fault allows."""

    def __init__(self, fault: str, address: str) -> None:
        self.fault, self.address = fault, address
        self.connections = 0
        self.failures = 0

    def start(self) -> None:
        options = {}
        if is_websocket_address(self.address):
            limit = 65536 if self.fault == "small-limit" else 200_000_000
            options["websocket"] = WebSocketOptions(max_message_size=limit,
                                                    auto_ping_interval=None)
        count = 300 if self.fault == "many-connections" and self.connections == 0 else 1
        for _ in range(count):
            connect(reactor, self.address, lambda: Client(self), **options).addErrback(
                lambda _: self.lost())

    def lost(self) -> None:
        if self.fault == "no-reconnect":
            return
        if self.fault == "exits-on-close":
            reactor.stop()
            return
        delay = 0.05 if self.fault == "tight-loop" else min(0.5 * 2 ** self.failures, 30)
        self.failures += 1
        reactor.callLater(delay, self.start)


def main(argv: list[str]) -> None:
    fault, address = argv
    if fault not in FAULTS:
        raise SystemExit(f"no fault {fault!r}: one of {', '.join(FAULTS)}")
    Owner(fault, address).start()
    reactor.run()


if __name__ == "__main__":
    main(sys.argv[1:])
