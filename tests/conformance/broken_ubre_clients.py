"""Small UBRE clients for the client kit's tests: each runs the kit's driver contract in JSON
over wireproto's WebSocket transport, written here from the codec alone (not from wireproto's
client), and each flaw makes it wrong in one way, so that the kit can be shown to catch it.

    python tests/conformance/broken_ubre_clients.py FLAW URL

FLAW is "none" (a client that does it all right) or one of FLAWS.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any

from twisted.internet import defer, reactor
from twisted.python.failure import Failure

from wireproto.codecs import ubre
from wireproto.codecs.ubre import NO_BODY, Fail, Publish, Request, Success
from wireproto.transports.base import MessageProtocol
from wireproto.transports.connect import connect
from wireproto.transports.websocket import WebSocketOptions

FLAWS = {
    "crash-on-unknown": "exits (status 3) on a JSON object with no type key it knows",
    "hang-on-invalid": "stops reading (its connection open) after JSON it cannot parse",
    "same-ids": "gives every request the id 1",
    "string-reply-ids": "answers a request with its id as a string (\"7\" for 7)",
    "binary-frames": "sends its JSON in binary frames",
    "no-reconnect": "exits when its connection closes",
    "tight-loop": "reconnects at once, again and again, with no pause",
    "fixed-delay": "reconnects after 1 s, always the same",
    "no-resubscribe": "subscribes on its first connection only",
    "no-pong": "does not answer WebSocket pings",
    "flood": "publishes 64 KiB on conformance/noise without end, as fast as it can",
    "huge": "sends a 100 MB publish once it has subscribed",
    "connect-storm": "opens 300 more connections at once, and never closes them",
    # Not a flaw: the spec's own reading of a request, which a kit must not fail.
    "heartbeat-pongs": "sends an unasked WebSocket pong every 20 ms, and one just before each "
                       "answer to a ping, as a heartbeat (RFC 6455 lets it)",
    "spec-dialect": "reads every request in the spec's form, the value of \"request\" being "
                    "its id, and answers it with the request's body",
}
NOISE = b'{"publish":"conformance/noise","body":"' + b"n" * 65536 + b'"}'

IN, ASK, LEAVE = "conformance/in", "conformance/ask", "conformance/leave"


class Driver(MessageProtocol):
    def __init__(self, client: Client) -> None:
        self.client = client
        self.hung = False

    def connectionMade(self) -> None:
        flaw = self.client.flaw
        if flaw == "no-pong":
            # Autobahn answers a ping in onPing; this one says nothing.
            self.transport.onPing = lambda payload: None  # type: ignore[attr-defined]
        if flaw == "heartbeat-pongs":
            self.heartbeat()
            # and one just before each answer to a ping, where a heartbeat may fall
            answer = self.transport.onPing  # type: ignore[attr-defined]

            def beat_then_answer(payload: bytes) -> None:
                self.transport.sendPong(b"beat")  # type: ignore[attr-defined]
                answer(payload)

            self.transport.onPing = beat_then_answer  # type: ignore[attr-defined]
        if self.client.connections == 0 or flaw != "no-resubscribe":
            for topic in (IN, ASK, LEAVE):
                self.write({"subscribe": topic})
        self.client.connections += 1
        self.client.protocol = self
        if flaw == "flood":
            self.noise()
        elif flaw == "huge":
            body = b"h" * (100 * 1024 * 1024)
            self.transport.sendMessage(b'{"publish":"conformance/noise","body":"' + body + b'"}',
                                       False)
        elif flaw == "connect-storm" and self.client.connections == 1:
            for _ in range(300):
                connect(reactor, self.client.url, MessageProtocol)

    def heartbeat(self) -> None:
        if self.connected:
            self.transport.sendPong(b"beat")  # type: ignore[attr-defined]
            reactor.callLater(0.02, self.heartbeat)

    def noise(self) -> None:
        if self.transport is None or not self.connected:
            return
        for _ in range(20):
            self.transport.sendMessage(NOISE, False)
        reactor.callLater(0.001, self.noise)

    def write(self, value: dict[str, Any]) -> None:
        data = json.dumps(value, separators=(",", ":")).encode()
        self.transport.sendMessage(data, self.client.flaw == "binary-frames")

    def messageReceived(self, data: bytes, binary: bool) -> None:
        if self.hung:
            return
        try:
            value = json.loads(data)
        except ValueError:
            if self.client.flaw == "hang-on-invalid":
                self.hung = True
            return
        if not isinstance(value, dict):
            return
        try:
            message = ubre.decode(data)
        except Exception:  # noqa: BLE001 - what it cannot read, it passes over
            if self.client.flaw == "crash-on-unknown" and not any(
                    key in value for key in ("subscribe", "unsubscribe", "publish", "request",
                                             "success", "fail")):
                os._exit(3)
            return
        self.handle(message)

    def handle(self, message: Any) -> None:
        client = self.client
        if isinstance(message, Publish) and message.topic in client.subscribed:
            if message.topic == IN:
                self.write({"publish": "conformance/out", **_body(message.body)})
            elif message.topic == ASK:
                request_id = 1 if client.flaw == "same-ids" else next(client.ids)
                client.waiting[json.dumps(request_id)] = True
                self.write({"request": "echo", "id": request_id, **_body(message.body)})
            elif message.topic == LEAVE and IN in client.subscribed:
                client.subscribed.discard(IN)
                self.write({"unsubscribe": IN})
            elif message.topic == LEAVE:
                client.subscribed.add(IN)
                self.write({"subscribe": IN})
        elif isinstance(message, Request) and client.flaw == "spec-dialect":
            request_id = message.id if message.name is None else message.name
            self.write({"success": request_id, **_body(message.body)})
        elif isinstance(message, Request) and message.name is not None:
            request_id: Any = message.id
            if client.flaw == "string-reply-ids":
                request_id = str(request_id)
            if message.name == "echo":
                self.write({"success": request_id, **_body(message.body)})
            elif message.name == "fail":
                self.write({"fail": request_id, **_body(message.body)})
            else:
                self.write({"fail": request_id, "body": "NotFound"})
        elif isinstance(message, (Success, Fail)):
            if client.waiting.pop(json.dumps(message.id), None):
                topic = "conformance/answer" if isinstance(message, Success) \
                    else "conformance/failed"
                self.write({"publish": topic, **_body(message.body)})

    def connectionLost(self, reason: Failure) -> None:
        self.client.protocol = None
        self.client.lost()


def _body(body: Any) -> dict[str, Any]:
    return {} if body is NO_BODY else {"body": body}


class Client:
    def __init__(self, url: str, flaw: str) -> None:
        self.url = url
        self.flaw = flaw
        self.connections = 0
        self.failures = 0
        self.ids = itertools.count(1)
        self.waiting: dict[str, bool] = {}
        self.subscribed = {IN, ASK, LEAVE}
        self.protocol: Driver | None = None
        self.done: defer.Deferred[None] = defer.Deferred()

    def start(self) -> None:
        options = WebSocketOptions(auto_ping_interval=None, auto_ping_timeout=None,
                                   max_message_size=64 * 1024 * 1024)
        attempt = connect(reactor, self.url, lambda: Driver(self), websocket=options)
        attempt.addCallbacks(self.connected, self.failed)

    def connected(self, _: object) -> None:
        self.failures = 0

    def failed(self, _: Failure) -> None:
        self.failures += 1
        self.again()

    def lost(self) -> None:
        if self.flaw == "no-reconnect":
            reactor.stop()
            return
        self.subscribed = {IN, ASK, LEAVE}
        self.again()

    def again(self) -> None:
        if self.flaw == "tight-loop":
            delay = 0.0
        elif self.flaw == "fixed-delay":
            delay = 1.0
        else:
            delay = min(0.3 * 2 ** self.failures, 5.0)
        reactor.callLater(delay, self.start)


def main() -> None:
    flaw, url = sys.argv[1], sys.argv[2]
    if flaw != "none" and flaw not in FLAWS:
        raise SystemExit(f"no flaw {flaw!r}: one of {', '.join(FLAWS)}")
    Client(url, flaw).start()
    reactor.run()


if __name__ == "__main__":
    main()
