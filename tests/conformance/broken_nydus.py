"""Deliberately broken nydus servers for the kit's tests: wireproto's Engine.IO 4 transport with
a small nydus server of its own on top, each wrong in one way (`FLAWS`), on 127.0.0.1."""

from __future__ import annotations

import re
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.interfaces import IListeningPort

from tests.support import wait_for
from wireproto.codecs import nydus
from wireproto.errors import ProtocolError
from wireproto.transports.base import MessageProtocol
from wireproto.transports.engineio import EngineIOOptions
from wireproto.transports.engineio.server import EngineIOResource, EngineIOServer
from wireproto.transports.websocket_http import websocket_site

FLAWS = {
    "wrong-welcome": "greets with 0|2, a WELCOME for protocol version 2",
    "cuts-ids": "answers with the id cut to 16 characters",
    "answers-twice": "answers every INVOKE twice",
    "no-status": "answers an unknown path with an ERROR without a status",
    "keeps-malformed": "neither answers nor closes on a message that does not parse (as the "
                       "spec allows: a disconnect is only usual)",
    "answers-malformed": "answers a message that does not parse with an ERROR, and keeps it",
    "refuses-invalid-invokes": "answers an INVOKE that does not parse but whose id it can read "
                               "with an ERROR 400 for that id, as the spec asks for an invalid "
                               "path; closes on anything else that does not parse",
    "crashes-on-escape": "stops serving on a path with a malformed escape, as the real server",
    "bad-open-packet": "leaves maxPayload out of the polling handshake's open packet",
    "unknown-sid-ok": "answers a poll or POST with a sid it never gave with 200 and a noop",
    "over-publishes": "sends a PUBLISH after every answer, to a client that asked for none (the "
                      "spec allows it)",
    "short-paths": "ends a session whose INVOKE has a path over 256 characters (the spec sets no "
                   "limit, nor forbids one)",
    "takes-over-max-payload": "announces a maxPayload a tenth of what it takes on polling (the "
                              "spec says nothing of a POST over it)",
}
NOT_FOUND = {"message": "Not Found", "status": 404}


class BrokenNydus(MessageProtocol):
    def __init__(self, server: BrokenServer) -> None:
        self.server = server

    def connectionMade(self) -> None:
        self.server.connections.append(self)
        if self.server.flaw == "wrong-welcome":
            assert self.transport is not None
            self.transport.sendMessage(b"0|2", False)
        else:
            self.say(nydus.Welcome())

    def say(self, message: nydus.Message) -> None:
        assert self.transport is not None
        self.transport.sendMessage(nydus.encode(message).encode(), False)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        flaw = self.server.flaw
        try:
            message = nydus.decode(data)
        except ProtocolError:
            if flaw == "keeps-malformed":
                return
            if flaw == "answers-malformed":
                self.say(nydus.Error("malformed", {"message": "Bad Request", "status": 400}))
                return
            readable = re.match(rb"1\$([A-Za-z0-9-]{1,32})~", data)
            if flaw == "refuses-invalid-invokes" and readable:
                self.say(nydus.Error(readable.group(1).decode(),
                                     {"message": "Bad Request", "status": 400}))
                return
            if flaw == "crashes-on-escape" and b"%" in data:
                self.server.crash()
                return
            assert self.transport is not None
            self.transport.loseConnection()
            return
        if not isinstance(message, nydus.Invoke):
            return
        if flaw == "short-paths" and len(message.path) > 256:
            assert self.transport is not None
            self.transport.loseConnection()
            return
        id_ = message.id[:16] if flaw == "cuts-ids" else message.id
        body = {"message": "Not Found"} if flaw == "no-status" else NOT_FOUND
        for _ in range(2 if flaw == "answers-twice" else 1):
            self.say(nydus.Error(id_, body))
        if flaw == "over-publishes":
            self.say(nydus.Publish("/news", {"headline": "over-published"}))


class FlawedResource(EngineIOResource):
    """engine.io's resource, with the Engine.IO flaws."""

    flaw = ""

    def render(self, request: Any) -> Any:
        args = request.args
        sid = (args.get(b"sid") or [b""])[0].decode()
        if self.flaw == "unknown-sid-ok" and sid and sid not in self.engine.sessions:
            request.setResponseCode(200)
            return b"6"
        if self.flaw == "bad-open-packet" and not sid and request.method == b"GET":
            write = request.write
            request.write = lambda data: write(data.replace(b'"maxPayload":', b'"xaxPayload":'))
        if self.flaw == "takes-over-max-payload" and not sid and request.method == b"GET":
            write = request.write
            request.write = lambda data: write(re.sub(  # as long, for the Content-Length
                rb'"maxPayload":(\d+)',
                lambda m: (b'"maxPayload":%d' % (int(m[1]) // 10)).ljust(len(m[0])), data))
        return super().render(request)


class BrokenServer:
    def __init__(self, flaw: str) -> None:
        if flaw not in FLAWS:
            raise ValueError(flaw)
        self.flaw = flaw
        self.connections: list[BrokenNydus] = []
        options = EngineIOOptions(ping_interval=1.0, ping_timeout=1.0)
        resource = FlawedResource(EngineIOServer(lambda: BrokenNydus(self), options, reactor,
                                                 None, None))
        resource.flaw = flaw
        self.site = websocket_site({"/engine.io/": resource})
        self.port: IListeningPort | None = None

    async def start(self) -> str:
        endpoint = TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1")
        self.port = await wait_for(endpoint.listen(self.site))
        return f"http://127.0.0.1:{self.port.getHost().port}/engine.io/"

    def crash(self) -> None:
        """Stop serving as a crashed process does: no more connections, every one dropped."""
        if self.port is not None:
            self.port.stopListening()
            self.port = None
        for connection in self.connections:
            if connection.transport is not None:
                connection.transport.abortConnection()

    async def stop(self) -> None:
        if self.port is not None:
            await wait_for(defer.maybeDeferred(self.port.stopListening))
        self.crash()
