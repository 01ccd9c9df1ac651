"""The HTTP side of WebSocket and Engine.IO listeners (wireproto.transports.http), attacked over
raw sockets: bodies are bounded before they are read, a request that drips is cut off at its
deadline, and pending requests are capped per address and in total."""

from __future__ import annotations

import json

import pytest_twisted

from tests.support import eventually, sleep, wait_for
from tests.transports.conftest import Echo, Recorder
from wireproto.transports import websocket_resource, websocket_site
from wireproto.transports.engineio import EngineIOOptions, engineio_resource
from wireproto.transports.http import HTTPLimits

HANDSHAKE = (
    b"GET /engine.io/?EIO=4&transport=polling HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
)


async def serve(net, limits=None, max_payload=1000, idle_timeout=10.0):
    engine = engineio_resource(net.factory(Recorder), EngineIOOptions(max_payload=max_payload))
    site = websocket_site(
        {"/engine.io/": engine, "/ws": websocket_resource(net.factory(Echo))},
        idle_timeout=idle_timeout, limits=limits,
    )
    port = await net.listen_tcp(site)
    return site, engine, port


async def session(net, port):
    client = await net.raw_connect(port)
    client.transport.write(HANDSHAKE)
    await wait_for(client.closed)
    body = client.received.split(b"\r\n\r\n", 1)[1]
    return json.loads(body[1:])["sid"]


async def post(net, port: int, sid: str, headers: str, body: bytes = b""):
    """A raw POST to the Engine.IO session `sid`, its `headers` lines given as they are."""
    client = await net.raw_connect(port)
    client.transport.write(
        f"POST /engine.io/?EIO=4&transport=polling&sid={sid} HTTP/1.1\r\nHost: x\r\n"
        f"{headers}\r\n".encode() + body
    )
    return client


def status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


@pytest_twisted.ensureDeferred
async def test_an_oversized_content_length_is_refused_before_any_of_the_body(net):
    site, engine, port = await serve(net)
    sid = await session(net, port)
    server = net.protocols[-1]
    client = await post(net, port, sid,
                        "Content-Type: text/plain\r\nContent-Length: 100000000000\r\n")
    # No body is sent: the answer cannot wait for it.
    await wait_for(client.closed, timeout=3)
    assert status(client.received) == 413
    await wait_for(server.lost)
    assert "over 1000 bytes" in str(server.reason.value)  # engine.io closes that session
    assert site.refusals["body_too_large"] == 1


@pytest_twisted.ensureDeferred
async def test_a_chunked_body_is_cut_off_as_soon_as_it_passes_the_limit(net):
    site, engine, port = await serve(net, max_payload=1000)
    sid = await session(net, port)
    client = await post(net, port, sid, "Transfer-Encoding: chunked\r\n")
    sent = 0
    while not client.received and sent < 100_000:
        client.transport.write(b"64\r\n" + b"4" + b"x" * 99 + b"\r\n")
        sent += 100
        await sleep(0.002)
    await wait_for(client.closed, timeout=3)
    assert status(client.received) == 413
    # Answered once the body passed 1000 bytes, with the client still sending.
    assert sent < 10_000
    assert site.refusals["body_too_large"] == 1


@pytest_twisted.ensureDeferred
async def test_a_body_within_the_limit_is_read(net):
    site, engine, port = await serve(net)
    sid = await session(net, port)
    server = net.protocols[-1]
    client = await post(net, port, sid, "Transfer-Encoding: chunked\r\nConnection: close\r\n",
                        b"6\r\n4hello\r\n0\r\n\r\n")
    await wait_for(client.closed)
    assert status(client.received) == 200
    assert await server.received(1) == [(b"hello", False)]


@pytest_twisted.ensureDeferred
async def test_a_path_that_takes_no_body_reads_none(net):
    site, engine, port = await serve(net)
    for target in (b"/ws", b"/elsewhere"):
        for framing in (b"Content-Length: 100000000000", b"Transfer-Encoding: chunked"):
            client = await net.raw_connect(port)
            client.transport.write(b"POST %s HTTP/1.1\r\nHost: x\r\n%s\r\n\r\n" % (target, framing))
            client.transport.write(b"x" * 65536)
            await wait_for(client.closed, timeout=3)
            assert status(client.received) in (404, 405, 426), client.received
    assert site.refusals["body_too_large"] == 0


@pytest_twisted.ensureDeferred
async def test_a_body_that_will_not_be_read_is_not_invited(net):
    site, engine, port = await serve(net)
    sid = await session(net, port)
    client = await post(net, port, sid, "Content-Length: 100000000000\r\nExpect: 100-continue\r\n")
    await wait_for(client.closed, timeout=3)
    assert b"100 Continue" not in client.received
    assert status(client.received) == 413


@pytest_twisted.ensureDeferred
async def test_a_request_that_drips_is_cut_off_at_its_deadline(net):
    # Each byte restarts the idle timer; the deadline counts from the first.
    site, engine, port = await serve(net, HTTPLimits(request_timeout=0.5), idle_timeout=5.0)
    client = await net.raw_connect(port)
    drip = b"GET /ws HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    for byte in drip:
        if client.closed.called:
            break
        client.transport.write(bytes([byte]))
        await sleep(0.05)
    assert client.closed.called
    assert status(client.received) == 408
    assert site.refusals["request_timeout"] == 1
    assert site.pending == 0


@pytest_twisted.ensureDeferred
async def test_pending_requests_are_capped_per_address(net):
    site, engine, port = await serve(net, HTTPLimits(max_pending_per_address=3))
    silent = [await net.raw_connect(port) for _ in range(3)]
    await eventually(lambda: site.pending == 3)
    refused = await net.raw_connect(port)
    await wait_for(refused.closed, timeout=3)
    assert status(refused.received) == 503
    assert site.refusals["too_many_pending"] == 1
    # A connection whose request has arrived is no longer pending: room for one more.
    silent[0].transport.write(HANDSHAKE)
    await wait_for(silent[0].closed)
    assert status(silent[0].received) == 200
    await eventually(lambda: site.pending == 2)
    admitted = await net.raw_connect(port)
    await sleep(0.2)
    assert not admitted.closed.called


@pytest_twisted.ensureDeferred
async def test_pending_requests_are_capped_in_total(net):
    site, engine, port = await serve(net, HTTPLimits(max_pending=2))
    for _ in range(2):
        await net.raw_connect(port)
    await eventually(lambda: site.pending == 2)
    refused = await net.raw_connect(port)
    await wait_for(refused.closed, timeout=3)
    assert status(refused.received) == 503


@pytest_twisted.ensureDeferred
async def test_addresses_that_fill_the_pending_slots_make_room_for_another(net):
    """Slow requests from four addresses fill every slot; a newcomer from a fifth takes the
    place of the oldest of the address with the most, and an address that holds as many as
    anyone waits its turn."""
    site, engine, port = await serve(net, HTTPLimits(max_pending_per_address=3, max_pending=8))
    dripping = {host: [await net.raw_connect(port, f"127.0.0.{host}") for _ in range(2)]
                for host in (2, 3, 4, 5)}
    await eventually(lambda: site.pending == 8)
    newcomer = await net.raw_connect(port, "127.0.0.9")
    await wait_for(dripping[2][0].closed, timeout=3)
    assert site.refusals["displaced"] == 1
    displaced = [c for clients in dripping.values() for c in clients if c.closed.called]
    assert len(displaced) == 1 and status(displaced[0].received) == 503
    assert displaced[0] is dripping[2][0]  # the oldest of the first with the most
    newcomer.transport.write(HANDSHAKE)
    await wait_for(newcomer.closed)
    assert status(newcomer.received) == 200
    # Every address now holds at most 2: one more from an address with 2 is refused.
    assert site.pending == 7
    await net.raw_connect(port, "127.0.0.10")
    await eventually(lambda: site.pending == 8)
    refused = await net.raw_connect(port, "127.0.0.3")
    await wait_for(refused.closed, timeout=3)
    assert status(refused.received) == 503 and site.refusals["too_many_pending"] == 1


@pytest_twisted.ensureDeferred
async def test_open_websockets_and_held_polls_are_not_pending(net):
    from tests.transports.test_websocket import client as ws_client

    site, engine, port = await serve(net, HTTPLimits(request_timeout=0.3))
    sid = await session(net, port)
    poll = await net.raw_connect(port)
    poll.transport.write(
        f"GET /engine.io/?EIO=4&transport=polling&sid={sid} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    )
    websocket = await ws_client(net, port)
    await eventually(lambda: site.pending == 0)
    await sleep(0.5)  # past the request deadline, both are still open
    assert not poll.closed.called
    websocket.transport.sendMessage(b"still here")
    assert await websocket.received(1) == [(b"still here", True)]


@pytest_twisted.ensureDeferred
async def test_kept_alive_connections_take_request_after_request(net):
    site, engine, port = await serve(net, HTTPLimits(request_timeout=0.3))
    client = await net.raw_connect(port)
    for _ in range(3):
        client.received = b""
        client.transport.write(b"GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n")
        await eventually(lambda: b"\r\n\r\n" in client.received)
        assert status(client.received) == 404
        await sleep(0.4)  # idle between requests: the deadline is the request's, not the idle's
    assert not client.closed.called
