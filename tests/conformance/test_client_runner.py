"""Running a client kit (wireproto.conformance.runner.run_client_cases) with a real client
process: a case that fails while the kit has stopped listening, or refuses connections, leaves
the next case a listener that takes the client; and the Listener, stopped, closes a connection
whose handshake ends after it. A client started by hand that backs off between cases is judged
case after case, one that goes away ends the run as could not run, with the cases judged so
far; a client started by --run that exits at once is said at once, not after --wait."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.support import eventually
from wireproto.conformance.catalogue import Catalogue
from wireproto.conformance.context import Context
from wireproto.conformance.listener import Listener
from wireproto.conformance.model import Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import ClientRun, CouldNotRun, run_client_cases

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


echoes = Catalogue("websmq", "WEBSMQ", "docs/websmq.md", mode="client")
echoes.liveness(hello)
for number in range(6):
    echoes.case(f"websmq.client.echo.n{number}", "The client says hello", section="x",
                timeout=2.0)(hello)


def by_hand(url: str, *flags: str) -> subprocess.Popen:
    """The sample client started by the user, reconnecting (with `flags`)."""
    return subprocess.Popen([sys.executable, "-m", "tests.conformance.sample_client",
                             "--forever", *flags],
                            env={**os.environ, "WIREPROTO_CONFORM_URL": url},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest_twisted.ensureDeferred
async def test_a_client_started_by_hand_that_backs_off_is_judged_case_after_case() -> None:
    """Its pauses grow to 8 s, past each case's 2 s: a case waits for it (up to --wait)
    before its own timeout starts (each case from the fourth failed for not connecting)."""
    listener = Listener(reactor, "ws://127.0.0.1:0/")
    await listener.start()
    client = by_hand(listener.url, "--backoff")
    try:
        run = ClientRun(reactor, listener, first_wait=30.0)
        results = await run_client_cases(run, Target("websmq", listener.url), echoes)
    finally:
        client.kill()
        client.wait()
        await listener.stop()
    assert {result.case.id: result.outcome for result in results} == {
        f"websmq.client.echo.n{number}": Outcome.PASS for number in range(6)}, \
        [result.reason for result in results]


@pytest_twisted.ensureDeferred
async def test_a_client_started_by_hand_that_goes_away_ends_the_run() -> None:
    listener = Listener(reactor, "ws://127.0.0.1:0/")
    await listener.start()
    client = by_hand(listener.url)
    heard: list = []

    def judged(result) -> None:
        heard.append(result)
        if len(heard) == 2:
            client.kill()

    try:
        run = ClientRun(reactor, listener, first_wait=3.0)
        with pytest.raises(CouldNotRun) as raised:
            await run_client_cases(run, Target("websmq", listener.url), echoes,
                                   on_result=judged)
    finally:
        client.kill()
        client.wait()
        await listener.stop()
    assert [result.outcome for result in heard] == [Outcome.PASS, Outcome.PASS]
    assert "did not connect again within 3 s (--wait) after 2 case(s)" in str(raised.value)


@pytest_twisted.ensureDeferred
async def test_a_client_that_exits_at_once_is_said_at_once() -> None:
    listener = Listener(reactor, "ws://127.0.0.1:0/")
    await listener.start()
    started = time.monotonic()
    try:
        run = ClientRun(reactor, listener, f"{sys.executable} -c 'print(4242)'",
                        first_wait=30.0)
        with pytest.raises(CouldNotRun) as raised:
            await run_client_cases(run, Target("websmq", listener.url), echoes)
    finally:
        await listener.stop()
    assert time.monotonic() - started < 10
    said = str(raised.value)
    assert "but the client exited with status 0" in said, said
    assert said.endswith("it wrote: 4242"), said
