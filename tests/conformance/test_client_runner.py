"""Running a client kit (wireproto.conformance.runner.run_client_cases) with a real client
process: a case that fails while the kit has stopped listening, or refuses connections, leaves
the next case a listener that takes the client; and the Listener, stopped, closes a connection
whose handshake ends after it."""

from __future__ import annotations

import os
import socket
import sys

import pytest_twisted
from twisted.internet import reactor

from tests.support import eventually
from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.listener import Listener
from wireproto.conformance.model import Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import ClientRun, run_client_cases

kit = Catalogue("websmq", "WEBSMQ", "docs/websmq.md", mode="client")


async def hello(ctx: Context) -> None:
    probe = await ctx.accept()
    if (await probe.receive(what="hello")).data != b"hello":
        raise ctx.fail("no hello")


kit.liveness(hello)


@kit.case("websmq.client.left.paused", "A case that fails while the kit is away",
          section="x", timeout=1.0)
async def paused(ctx: Context) -> None:
    assert ctx.listener is not None
    await hello(ctx)
    await ctx.listener.pause()
    await ctx.sleep(5)  # past the case's timeout: no resume


@kit.case("websmq.client.left.refusing", "A case that fails while refusing", section="x",
          timeout=1.0)
async def refusing(ctx: Context) -> None:
    assert ctx.listener is not None
    await hello(ctx)
    ctx.listener.refusing = True
    await ctx.sleep(5)


@kit.case("websmq.client.left.after", "The next case takes the client", section="x")
async def after(ctx: Context) -> None:
    await hello(ctx)


@pytest_twisted.ensureDeferred
async def test_a_case_that_failed_away_leaves_the_next_a_listener() -> None:
    listener = Listener(reactor, "ws://127.0.0.1:0/")
    await listener.start()
    try:
        run = ClientRun(reactor, listener, f"{sys.executable} -m tests.conformance.sample_client")
        results = await run_client_cases(run, Target("websmq", listener.url), kit)
    finally:
        await listener.stop()
    assert [(result.case.id, result.outcome) for result in results] == [
        ("websmq.client.left.paused", Outcome.FAIL),
        ("websmq.client.left.refusing", Outcome.FAIL),
        ("websmq.client.left.after", Outcome.PASS)], [r.reason for r in results]
    assert "no outcome within the case's 1 s" in results[0].reason


@pytest_twisted.ensureDeferred
async def test_a_handshake_that_ends_after_stop_is_closed() -> None:
    listener = Listener(reactor, "ws://127.0.0.1:0/")
    await listener.start()
    port = listener.bound_port
    before = len(open_descriptors())
    late = socket.create_connection(("127.0.0.1", port))
    late.settimeout(10)
    # this socket, and the kit's end of it once accepted
    await eventually(lambda: len(open_descriptors()) >= before + 2, timeout=10)
    await listener.stop()
    late.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"Sec-WebSocket-Version: 13\r\n\r\n")
    closed = False
    while not closed:
        try:
            closed = not await deferred_recv(late)  # the 101, maybe, then the end
        except TimeoutError:
            break  # still open after 10 s: the kit holds it
        except OSError:
            closed = True  # reset
    late.close()
    assert closed, "the kit kept a connection that arrived after it stopped"
    assert listener.held == []


def open_descriptors() -> list[str]:
    return os.listdir("/proc/self/fd")


async def deferred_recv(sock: socket.socket) -> bytes:
    from twisted.internet import threads

    return await threads.deferToThread(sock.recv, 65536)
