"""A small SubbleSocket client written apart from wireproto's client (on the codec and the
transports alone), following the client kit's driver contract, with one flaw at a time, for
tests/conformance/test_subble_client_kit.py: ``python broken_subble_clients.py FLAW URL``.

With the flaw ``none`` it is a correct client and passes every MUST of the kit; each other flaw
breaks one thing a SubbleSocket client does (FLAWS says which), and the test checks that the kit
catches exactly that.
"""

from __future__ import annotations

import os
import random
import secrets
import struct
import sys

import msgpack
from twisted.internet import reactor
from twisted.python.failure import Failure

from wireproto.codecs.subble import (
    PROTOCOL_VERSION,
    Event,
    EventError,
    HandshakeRequest,
    HandshakeResponse,
    MessageCode,
    ProduceEvent,
    Version,
    decode,
    encode,
    pack_payload,
    unpack_payload,
)
from wireproto.errors import ProtocolError
from wireproto.transports.base import MessageProtocol
from wireproto.transports.connect import connect

FLAWS = {
    "none": "a correct client",
    "wrong-version": "asks for version 2.0.0",
    "old-id": "keeps producing under the empty ID it sent, not the one a 3 gave it",
    "crash-unknown": "exits with status 1 on a message it cannot read",
    "crash-payload": "exits with status 1 on a payload that does not read",
    "no-pong": "does not answer WebSocket pings",
    "no-reconnect": "exits when its connection is lost",
    "tight-loop": "reconnects at once, after a refusal too",
    "next-error": "takes every event error for its oldest produce's, whatever its request data",
    "acts-refused": "goes on after any handshake response, a refusal too",
    "bin-as-str": "echoes a msgpack bin as a msgpack string",
    "flood": "answers its second event with 2000 produce requests of 64 KiB",
    "huge": "answers its second event with a message of 100 MiB (length32 only)",
}

IN, OUT, ERROR = "conformance/in", "conformance/out", "conformance/error"


class State:
    client_id = ""
    failures = 0
    stopped = False


def produce(connection: Mini, event_type: str, payload: bytes, format: int) -> None:
    request_data = secrets.token_hex(6).encode()
    connection.pending[request_data] = event_type
    connection.transport.sendMessage(encode(ProduceEvent(
        "" if FLAW == "old-id" else State.client_id, format, event_type, payload,
        request_data)), True)


class Mini(MessageProtocol):
    def connectionMade(self) -> None:
        self.accepted = False
        self.events = 0
        self.pending: dict[bytes, str] = {}
        version = Version(2, 0, 0) if FLAW == "wrong-version" else PROTOCOL_VERSION
        self.transport.sendMessage(encode(HandshakeRequest(
            version, State.client_id, ";", (IN,), (OUT, ERROR))), True)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        try:
            message = decode(data, sender="server")
        except ProtocolError as error:
            if FLAW == "crash-unknown":
                print(f"cannot read: {error}", flush=True)
                os._exit(1)
            self.transport.loseConnection(error)
            return
        if type(message) is HandshakeResponse:
            self.response(message)
        elif not self.accepted:
            self.transport.loseConnection()
        elif type(message) is Event:
            self.event(message)
        elif type(message) is EventError:
            self.error(message)

    def response(self, message: HandshakeResponse) -> None:
        if self.accepted:
            self.transport.loseConnection()
            return
        if message.code in (MessageCode.OK, MessageCode.OK_NEW_CLIENT_ID) or \
                FLAW == "acts-refused":
            self.accepted = True
            State.failures = 0
            if message.code == MessageCode.OK_NEW_CLIENT_ID or message.message:
                State.client_id = message.message
            return
        print(f"refused: {int(message.code)} {message.message}", flush=True)
        if FLAW != "tight-loop":
            State.stopped = True
        self.transport.loseConnection()

    def event(self, message: Event) -> None:
        if message.code == MessageCode.CLIENT_EVENT:
            self.pending.pop(message.request_data, None)
            return
        payload = message.payload
        if message.format in (0, 1):
            try:
                value = unpack_payload(payload, message.format)
            except ProtocolError:
                if FLAW == "crash-payload":
                    os._exit(1)
                return
            if FLAW == "bin-as-str" and message.format == 0:
                payload = msgpack.packb(value, use_bin_type=False)
            else:
                payload = pack_payload(value, message.format)
        self.events += 1
        if FLAW == "flood" and self.events == 2:
            for _ in range(2000):
                produce(self, OUT, b"\xc4" * 65536, 200)
        if FLAW == "huge" and self.events == 2:
            # Under the framing, past the client's own size check: a length32 frame of 100 MiB.
            size = 100 * 1024 * 1024
            self.transport.transport.write(struct.pack(">I", size) + bytes(size))
            return
        produce(self, OUT, payload, message.format)

    def error(self, message: EventError) -> None:
        if FLAW == "next-error" and self.pending:
            self.pending.pop(next(iter(self.pending)))
        elif self.pending.pop(message.request_data, None) is None:
            return
        produce(self, ERROR, pack_payload({"code": int(message.code),
                                           "message": message.message}, 1), 1)

    def connectionLost(self, reason: Failure) -> None:
        super().connectionLost(reason)
        lost()


def lost() -> None:
    if FLAW == "no-reconnect" or State.stopped:
        if reactor.running:
            reactor.stop()
        return
    delay = 0.0 if FLAW == "tight-loop" else min(0.5 * 2 ** State.failures, 4.0)
    State.failures += 1
    reactor.callLater(delay * (1 + random.random() / 10), start)


def start() -> None:
    d = connect(reactor, URL, Mini)
    d.addErrback(lambda _: lost())


if __name__ == "__main__":
    FLAW, URL = sys.argv[1], sys.argv[2]
    if FLAW not in FLAWS:
        sys.exit(f"no flaw {FLAW!r}: one of {', '.join(FLAWS)}")
    if FLAW == "no-pong":
        from wireproto.transports.websocket import WebSocketClientAdapter

        WebSocketClientAdapter.sendPong = lambda self, payload=None: None
    start()
    reactor.run()
