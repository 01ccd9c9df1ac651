"""The client kits' listening side (wireproto.conformance.listener) with real sockets on
127.0.0.1 and wireproto's own client: each kind of address, port 0's URL, pause and resume on
the same port, refusing, the limit on connections no case took, and a hostile client flooding
connections or bytes, which must leave the kit bounded and still taking a good client."""

from __future__ import annotations

import os
import re
import socket
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.error import ConnectionRefusedError

from tests.support import eventually, failure_of, wait_for
from wireproto.conformance import listener as listening
from wireproto.conformance.listener import HELD_LIMIT, Listener, listening_endpoint
from wireproto.conformance.model import CaseFailed
from wireproto.conformance.probe import QUEUE_LIMIT, Recorder
from wireproto.transports.base import MessageProtocol
from wireproto.transports.connect import connect


class Hello(MessageProtocol):
    """A client that says hello once connected, and keeps what it is sent."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.lost = False

    def connectionMade(self) -> None:
        self.transport.sendMessage(b"hello", True)

    def messageReceived(self, data: bytes, binary: bool) -> None:
        self.got.append(data)

    def connectionLost(self, reason: Any = None) -> None:
        self.lost = True


async def dial(url: str, **options: Any) -> Hello:
    return await wait_for(connect(reactor, url, Hello, **options), timeout=10)


async def started(address: str, **options: Any) -> Listener:
    listener = Listener(reactor, address, **options)
    await listener.start()
    return listener


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize(("address", "framing", "shape"), [
    ("ws://127.0.0.1:0/some/path", None, r"ws://127\.0\.0\.1:\d+/some/path"),
    ("ws+unix://{tmp}/kit.sock:/websmq", None, r"ws\+unix://.*/kit\.sock:/websmq"),
    ("tcp:0:interface=127.0.0.1", "length32", r"tcp:127\.0\.0\.1:\d+"),
    ("unix:{tmp}/kit.sock", "cobs", r"unix:.*/kit\.sock"),
    ("wss://127.0.0.1:0/tls", None, r"wss://127\.0\.0\.1:\d+/tls"),
    ("ssl:0:interface=127.0.0.1", "lines", r"ssl:127\.0\.0\.1:\d+"),
])
@pytest_twisted.ensureDeferred
async def test_each_kind_of_address_takes_a_client(tmp_path, tls_files, address, framing,
                                                   shape) -> None:
    tls = address.startswith(("wss", "ssl"))
    listener = await started(address.format(tmp=tmp_path), framing=framing,
                             certfile=tls_files.cert if tls else None,
                             keyfile=tls_files.key if tls else None)
    try:
        url = listener.url
        assert re.fullmatch(shape, url), url
        if ":0" not in address:
            assert ":0/" not in url and not url.endswith(":0")
        options: dict[str, Any] = {"framing": framing} if framing else {}
        if tls:
            options["insecure"] = True
        client = await dial(url, **options)
        probe = await listener.accept(Recorder(), timeout=5)
        assert (await probe.receive(what="hello")).data == b"hello"
        probe.send(b"welcome")
        await eventually(lambda: client.got == [b"welcome"], timeout=5)
    finally:
        await listener.stop()


def test_addresses_it_cannot_listen_on_say_why() -> None:
    with pytest.raises(ValueError, match="needs the kit's certificate and key"):
        listening_endpoint("wss://127.0.0.1:0/")
    with pytest.raises(ValueError, match="needs the kit's certificate and key"):
        listening_endpoint("ssl:0:interface=127.0.0.1")  # wss:// and ssl: alike
    with pytest.raises(ValueError, match="its scheme is not ws"):
        listening_endpoint("gopher://127.0.0.1:0/")
    with pytest.raises(ValueError, match="a ws:// or http:// URL, or a tcp:"):
        listening_endpoint("serial:/dev/ttyS0")
    assert listening_endpoint("ssl:0:interface=127.0.0.1", "c.pem", "k.pem") == (
        "ssl:0:interface=127.0.0.1:certKey=c.pem:privateKey=k.pem", "stream")
    assert listening_endpoint("ssl:0:privateKey=mine.pem", "c.pem")[0] == \
        "ssl:0:privateKey=mine.pem"  # the user's own keys are kept


@pytest.mark.parametrize("address", ["wss://127.0.0.1:0/", "ssl:0:interface=127.0.0.1"])
@pytest_twisted.ensureDeferred
async def test_a_certificate_it_cannot_read_is_said_as_a_usage_error(tmp_path, address) -> None:
    """A ValueError naming --cert and --key (the command's exit 2), where OpenSSL's own error
    went out as it was (exit 1, the status of a failed MUST)."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("garbage\n")
    with pytest.raises(ValueError, match=r"the certificate and key \(--cert, --key"):
        await Listener(reactor, address, certfile=str(garbage)).start()


@pytest_twisted.ensureDeferred
async def test_pause_and_resume_listen_on_the_same_port() -> None:
    listener = await started("ws://127.0.0.1:0/")
    try:
        url, port = listener.url, listener.bound_port
        first = await dial(url)
        await listener.pause()
        failure = await failure_of(connect(reactor, url, Hello), timeout=10)
        assert isinstance(failure, ConnectionRefusedError), failure
        assert not first.lost  # what was connected stays
        await listener.resume()
        assert listener.bound_port == port and listener.url == url
        await dial(url)
        assert len(listener.attempts) == 2  # the refused one never reached the kit
        assert len(listener.held) == 2
    finally:
        await listener.stop()


@pytest_twisted.ensureDeferred
async def test_refusing_closes_each_new_connection_and_counts_it() -> None:
    listener = await started("tcp:0:interface=127.0.0.1", framing="length32")
    try:
        listener.refusing = True
        clients = [await dial(listener.url) for _ in range(3)]
        await eventually(lambda: all(client.lost for client in clients), timeout=10)
        assert listener.refused == 3 and len(listener.attempts) == 3 and listener.held == []
        assert listener.attempts == sorted(listener.attempts)
        listener.refusing = False
        await dial(listener.url)
        probe = await listener.accept(Recorder(), timeout=5)
        assert (await probe.receive()).data == b"hello"
    finally:
        await listener.stop()


@pytest_twisted.ensureDeferred
async def test_accept_waits_then_fails_and_skips_closed_connections() -> None:
    listener = await started("ws://127.0.0.1:0/")
    try:
        with pytest.raises(CaseFailed, match=r"expected the client to reconnect within 0.3 s; "
                                             "no connection came"):
            await listener.accept(Recorder(), 0.3, "the client to reconnect")
        silent = await wait_for(connect(reactor, listener.url, MessageProtocol), timeout=10)
        await eventually(lambda: listener.held, timeout=5)
        silent.transport.loseConnection()
        await eventually(lambda: not listener.held[0].is_open, timeout=5)
        await dial(listener.url)
        recorder = Recorder()
        probe = await listener.accept(recorder, 5)
        assert (await probe.receive()).data == b"hello"
        notes = [exchange.text for exchange in recorder.exchanges]
        assert "this connection closed before the case took it" in notes
    finally:
        await listener.stop()


@pytest_twisted.ensureDeferred
async def test_a_client_flooding_connections_leaves_the_kit_bounded() -> None:
    listener = await started("ws://127.0.0.1:0/")
    try:
        before = open_descriptors()
        flood = [await dial(listener.url) for _ in range(120)]
        await eventually(lambda: len(listener.attempts) == 120, timeout=30)
        assert len(listener.held) == HELD_LIMIT
        # The kit closed all but the newest it holds.
        await eventually(lambda: sum(client.lost for client in flood) == 120 - HELD_LIMIT,
                         timeout=30)
        assert all(client.lost for client in flood[:-HELD_LIMIT])
        # Raw sockets that never finish the WebSocket handshake.
        raw = [socket.create_connection(("127.0.0.1", listener.bound_port)) for _ in range(50)]
        for sock in raw:
            sock.close()
        for client in flood:
            client.transport.loseConnection()
        assert listener.drop_held() == HELD_LIMIT
        await eventually(lambda: open_descriptors() <= before + 4, timeout=30)
        good = await dial(listener.url)
        probe = await listener.accept(Recorder(), 5)
        assert (await probe.receive()).data == b"hello"
        probe.send(b"still here")
        await eventually(lambda: good.got == [b"still here"], timeout=5)
    finally:
        await listener.stop()


@pytest_twisted.ensureDeferred
async def test_connections_no_case_took_hold_few_bytes_all_together(monkeypatch) -> None:
    monkeypatch.setattr(listening, "HELD_BYTES", 200_000)
    listener = await started("tcp:0:interface=127.0.0.1", framing="length32")
    try:
        senders = [await dial(listener.url) for _ in range(4)]
        await eventually(lambda: len(listener.held) == 4, timeout=10)
        for sender in senders:
            for _ in range(3):
                sender.transport.sendMessage(b"x" * 30_000, True)
        # 4 x 90 kB unread: over 200 kB, the connections that brought more were aborted.
        await eventually(lambda: sum(sender.lost for sender in senders) >= 2, timeout=10)
        assert sum(probe.queued_bytes for probe in listener.held) <= 200_000
        assert not all(sender.lost for sender in senders)
        await dial(listener.url)  # the kit still takes a client
        await eventually(lambda: len(listener.attempts) == 5)
    finally:
        await listener.stop()


@pytest_twisted.ensureDeferred
async def test_the_attempts_kept_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(listening, "ATTEMPTS_KEPT", 10)
    listener = await started("tcp:0:interface=127.0.0.1", framing="length32")
    try:
        listener.refusing = True
        for _ in range(25):
            await dial(listener.url)
        await eventually(lambda: listener.refused == 25, timeout=10)
        assert 10 <= len(listener.attempts) <= 20
        assert listener.attempts == sorted(listener.attempts)
    finally:
        await listener.stop()


@pytest_twisted.ensureDeferred
async def test_a_client_flooding_a_case_is_aborted_and_named_so() -> None:
    listener = await started("tcp:0:interface=127.0.0.1", framing="length32")
    try:
        client = await dial(listener.url)
        recorder = Recorder()
        await listener.accept(recorder, 5)
        for number in range(QUEUE_LIMIT + 5):
            client.transport.sendMessage(b"%d" % number, True)
        await eventually(lambda: client.lost, timeout=10)
        notes = [exchange.text for exchange in recorder.exchanges if exchange.text]
        assert any(note.startswith(f"the client sent more than {QUEUE_LIMIT} messages")
                   for note in notes), notes
    finally:
        await listener.stop()
