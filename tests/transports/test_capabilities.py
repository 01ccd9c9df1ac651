"""What a transport tells the protocol on it: its size limit, and whether it carries only text."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ServerEndpoint

from tests.support import eventually, wait_for
from wireproto.transports.base import MessageProtocol
from wireproto.transports.connect import connect
from wireproto.transports.stream import StreamOptions, stream_server_factory
from wireproto.transports.websocket import WebSocketOptions
from wireproto.transports.websocket_http import websocket_resource, websocket_site


@pytest.mark.parametrize(
    ("way", "text_only"),
    [("ws", False), ("length32", False), ("cobs", False), ("lines", True)],
)
@pytest_twisted.ensureDeferred
async def test_max_message_size_and_text_only_on_both_ends(way: str, text_only: bool) -> None:
    server_sides: list[MessageProtocol] = []

    def server_protocol() -> MessageProtocol:
        server_sides.append(MessageProtocol())
        return server_sides[-1]

    if way == "ws":
        factory = websocket_site(
            {"/x": websocket_resource(server_protocol, WebSocketOptions(max_message_size=5000))}
        )
    else:
        factory = stream_server_factory(
            server_protocol, StreamOptions(framing=way, max_message_size=5000)
        )
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
    number = port.getHost().port
    try:
        if way == "ws":
            client = await wait_for(connect(
                reactor, f"ws://127.0.0.1:{number}/x", MessageProtocol,
                websocket=WebSocketOptions(max_message_size=6000),
            ))
        else:
            client = await wait_for(connect(
                reactor, f"tcp:host=127.0.0.1:port={number}", MessageProtocol,
                stream=StreamOptions(framing=way, max_message_size=6000),
            ))
        await eventually(lambda: server_sides)
        server = server_sides[0]
        assert (server.transport.maxMessageSize, client.transport.maxMessageSize) == (5000, 6000)
        assert server.transport.textOnly is client.transport.textOnly is text_only
        client.transport.loseConnection()
        await eventually(lambda: not server.connected)
    finally:
        await port.stopListening()
