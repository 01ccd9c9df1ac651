"""connect(): address forms, default framing, and clear failures (refused, bad address, failed
handshake, untrusted certificate)."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import CancelledError
from twisted.internet.error import ConnectionLost, ConnectionRefusedError

from tests.support import eventually, wait_for
from tests.transports.conftest import Echo, Net, Recorder
from wireproto.errors import FrameTooLarge
from wireproto.transports import (
    HandshakeFailed,
    StreamOptions,
    WebSocketOptions,
    connect,
    stream_server_factory,
    websocket_resource,
    websocket_site,
)


async def closed_port(net: Net) -> int:
    """A port number nothing listens on any more."""
    port = await net.listen(stream_server_factory(Echo))
    number = port.getHost().port
    net.ports.remove(port)
    await wait_for(port.stopListening())
    return number


@pytest.mark.parametrize("scheme", ["ws", "tcp"])
@pytest_twisted.ensureDeferred
async def test_refused_connection_fails_the_deferred(net, scheme):
    port = await closed_port(net)
    address = {
        "ws": f"ws://127.0.0.1:{port}/ws",
        "tcp": f"tcp:host=127.0.0.1:port={port}",
    }[scheme]
    with pytest.raises(ConnectionRefusedError):
        await wait_for(connect(reactor, address, net.factory(Recorder)))


def test_bad_addresses_and_misplaced_options_raise_at_once():
    with pytest.raises(ValueError, match="cannot connect to 'bogus:thing'.*Use ws://"):
        connect(reactor, "bogus:thing", Recorder)
    with pytest.raises(ValueError, match="cannot connect to 'ws://host:port/x'"):
        connect(reactor, "ws://host:port/x", Recorder)
    with pytest.raises(ValueError, match="framing and stream do not apply"):
        connect(reactor, "ws://127.0.0.1:9/x", Recorder, framing="cobs")
    with pytest.raises(ValueError, match="context_factory is for wss://"):
        connect(reactor, "tcp:host=127.0.0.1:port=9", Recorder, context_factory=object())
    with pytest.raises(ValueError, match="unknown stream framing"):
        connect(reactor, "tcp:host=127.0.0.1:port=9", Recorder, framing="xml")


@pytest_twisted.ensureDeferred
async def test_websocket_handshake_with_a_non_websocket_server_fails_clearly(net):
    port = await net.listen_tcp(stream_server_factory(net.factory(Recorder)))
    with pytest.raises(HandshakeFailed) as caught:
        await wait_for(connect(reactor, f"ws://127.0.0.1:{port}/ws", net.factory(Recorder)))
    assert f"ws://127.0.0.1:{port}/ws" in str(caught.value)


@pytest_twisted.ensureDeferred
async def test_unanswered_handshake_times_out_or_can_be_cancelled(net):
    # A lines server takes the HTTP request as lines of text and never answers it.
    silent = stream_server_factory(net.factory(Recorder), StreamOptions(framing="lines"))
    port = await net.listen_tcp(silent)
    address = f"ws://127.0.0.1:{port}/ws"
    quick = WebSocketOptions(open_handshake_timeout=0.2)
    with pytest.raises(HandshakeFailed, match="opening handshake timeout"):
        await wait_for(connect(reactor, address, net.factory(Recorder), websocket=quick))

    opening = connect(reactor, address, net.factory(Recorder))
    # Autobahn's timers round to whole seconds, so the first one may not have got this far.
    await eventually(lambda: len(net.protocols) == 2 and net.protocols[-1].messages)
    silent_end = net.protocols[-1]
    opening.cancel()
    with pytest.raises(CancelledError):
        await wait_for(opening)
    # Cancelling dropped the connection: the silent server sees both connections go.
    for server in net.protocols:
        await wait_for(server.lost)
    assert silent_end.messages[0] == (b"GET /ws HTTP/1.1", False)


@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_wss_verifies_the_server_certificate_by_default(net, tls_files):
    site = websocket_site({"/ws": websocket_resource(net.factory(Echo))})
    description = f"ssl:0:interface=127.0.0.1:privateKey={tls_files.key}:certKey={tls_files.cert}"
    port = (await net.listen(site, description)).getHost().port
    with pytest.raises(HandshakeFailed, match="certificate verify failed"):
        await wait_for(connect(reactor, f"wss://127.0.0.1:{port}/ws", net.factory(Recorder)))
    assert not [p for p in net.protocols if type(p) is Echo]


@pytest_twisted.ensureDeferred
async def test_stream_defaults_to_length32_and_client_side_limits_apply(net):
    port = await net.listen_tcp(stream_server_factory(net.factory(Echo)))
    address = f"tcp:host=127.0.0.1:port={port}"
    peer = await wait_for(connect(reactor, address, net.factory(Recorder)))
    assert peer.transport.prepareKey == ("stream", "length32")
    small = await wait_for(
        connect(reactor, address, net.factory(Recorder), stream=StreamOptions(max_message_size=10))
    )
    small.transport.sendMessage(b"0123456789")
    await small.received(1)
    # The echo of an 11-byte message is too large for this client: it closes, not the server.
    small.transport.sendMessage(b"0123456789!")
    await wait_for(small.lost)
    assert small.reason.check(ConnectionLost)
    assert "over the limit of 10 bytes" in str(small.reason.value)
    peer.transport.sendMessage(b"fine")
    assert await peer.received(1) == [(b"fine", True)]


class Doubler(Echo):
    def messageReceived(self, data: bytes, binary: bool) -> None:
        self.transport.sendMessage(data * 2, binary)


@pytest_twisted.ensureDeferred
async def test_websocket_client_side_limit_closes_with_1009(net):
    port = await net.listen_tcp(websocket_site({"/ws": websocket_resource(net.factory(Doubler))}))
    peer = await wait_for(
        connect(
            reactor,
            f"ws://127.0.0.1:{port}/ws",
            net.factory(Recorder),
            websocket=WebSocketOptions(max_message_size=10),
        )
    )
    with pytest.raises(FrameTooLarge, match="11 bytes is over .* limit of 10 bytes"):
        peer.transport.sendMessage(b"0123456789!")
    peer.transport.sendMessage(b"01234")
    assert await peer.received(1) == [(b"0123401234", True)]
    # The server's answer to this one is over the client's limit.
    peer.transport.sendMessage(b"012345")
    await wait_for(peer.lost)
    assert peer.transport.closeCode == 1009
    assert len(peer.messages) == 1


@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_ssl_endpoints_verify_the_server_unless_told_not_to(net, tls_files):
    # Twisted's ssl: client string without hostname= verified nothing.
    description = f"ssl:0:interface=127.0.0.1:privateKey={tls_files.key}:certKey={tls_files.cert}"
    port = (await net.listen(stream_server_factory(Echo), description)).getHost().port
    address = f"ssl:host=127.0.0.1:port={port}"

    async def echoed(**options) -> bytes:
        client = await wait_for(connect(reactor, address + options.pop("suffix", ""),
                                        net.factory(Recorder), **options))
        client.transport.sendMessage(b"hello")
        return (await client.received(1))[0][0]

    # Its own, self-signed certificate: the TLS handshake fails, nothing is delivered.
    refused = await wait_for(connect(reactor, address, net.factory(Recorder)))
    refused.transport.sendMessage(b"hello")
    await wait_for(refused.lost)
    assert "certificate verify failed" in str(refused.reason.value)
    assert refused.messages == []
    assert await echoed(cafile=str(tls_files.cert)) == b"hello"
    assert await echoed(suffix=f":hostname=localhost:caCertsDir={tls_files.ca_dir}") == b"hello"
    assert await echoed(suffix=":verify=no") == b"hello"
    assert await echoed(insecure=True) == b"hello"
    with pytest.raises(ValueError, match="use verify=yes or verify=no"):
        connect(reactor, address + ":verify=maybe", Recorder)


@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_wss_takes_a_ca_file_or_insecure_and_handshake_headers(net, tls_files):
    seen: list[bytes | None] = []

    class Headers(Echo):
        def connectionMade(self) -> None:
            seen.append(self.transport.http_headers.get("x-token"))

    site = websocket_site({"/ws": websocket_resource(net.factory(Headers))})
    description = f"ssl:0:interface=127.0.0.1:privateKey={tls_files.key}:certKey={tls_files.cert}"
    port = (await net.listen(site, description)).getHost().port
    url = f"wss://localhost:{port}/ws"
    await wait_for(connect(reactor, url, net.factory(Recorder), cafile=str(tls_files.cert),
                           headers={"X-Token": "t1"}))
    await wait_for(connect(reactor, url, net.factory(Recorder), insecure=True))
    await eventually(lambda: len(seen) == 2)
    assert seen == ["t1", None]
    with pytest.raises(ValueError, match="TLS options are for wss://"):
        connect(reactor, "ws://127.0.0.1:9/x", Recorder, insecure=True)
