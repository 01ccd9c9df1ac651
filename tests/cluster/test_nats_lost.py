"""What the NATS client says and counts when it loses its server, against a real nats-server
killed (SIGKILL), paused (SIGSTOP), made to refuse it (-ERR) or shutting down: each loss is
logged as lost with its cause, and `reconnects` counts the connections made again, not the ones
lost."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_twisted
from twisted.internet import reactor
from twisted.logger import LogLevel, formatEvent

from tests.support import eventually, free_port, sleep, wait_for
from tests.test_log_events import logged, named
from wireproto.cluster.client import NatsClient, NatsOptions
from wireproto.supervisor.natsserver import NatsServer, write_private

CLOSED = "the server closed the connection without an error"
BROKE = "the connection broke: reset, or cut without a clean close"


@pytest_twisted.async_yield_fixture
async def events() -> AsyncIterator[list[dict]]:
    with logged() as captured:
        yield captured


class Clients:
    def __init__(self) -> None:
        self.made: list[NatsClient] = []

    def start(self, *servers: str, **options) -> NatsClient:
        client = NatsClient(reactor, NatsOptions(servers=servers, **options))
        self.made.append(client)
        client.start()
        return client


@pytest_twisted.async_yield_fixture
async def clients() -> AsyncIterator[Clients]:
    made = Clients()
    try:
        yield made
    finally:
        for client in made.made:
            await wait_for(client.stop())


def lost(events: list[dict]) -> list[dict]:
    return named(events, "cluster_disconnected")


def assert_logged_as_lost(event: dict, why: str | tuple[str, ...]) -> None:
    assert event["log_level"] is LogLevel.warn
    text = formatEvent(event)
    assert text.startswith("lost NATS server nats://127.0.0.1:"), text
    assert "cleanly" not in text
    assert event["why"] in ((why,) if isinstance(why, str) else why), text


@pytest_twisted.ensureDeferred
async def test_a_killed_server_is_lost_and_one_restart_is_one_reconnect(nats, clients, events):
    client = clients.start(nats.url, reconnect_wait=0.05)
    await wait_for(client.when_ready(), 10)
    nats.stop(kill=True)
    await eventually(lambda: lost(events), timeout=10)
    # The kernel closes a killed process's sockets: a FIN, or a reset if it left bytes unread.
    assert_logged_as_lost(lost(events)[0], (CLOSED, BROKE))
    await sleep(0.5)
    assert client.reconnects == 0  # lost, not connected again (yet)
    nats.start()
    await eventually(lambda: client.connected, timeout=15)
    assert client.reconnects == 1
    first, again = named(events, "cluster_connected")
    assert first["away"] is None and "again" not in formatEvent(first)
    assert again["away"] >= 0.5
    assert re.fullmatch(r"connected to NATS server nats://127\.0\.0\.1:\d+ again, after "
                        r"\d+\.\d s without one", formatEvent(again))
    await wait_for(client.stop())
    assert client.reconnects == 1  # stopping is no reconnect either
    assert len(lost(events)) == 1  # nor is it logged as lost


@pytest_twisted.ensureDeferred
async def test_a_first_connection_after_failed_attempts_is_no_reconnect(nats, clients, events):
    client = clients.start(f"nats://127.0.0.1:{free_port()}", nats.url)
    await wait_for(client.when_ready(), 10)
    assert client._reconnector.failed_attempts == 0 and client.last_error
    (connected,) = named(events, "cluster_connected")
    assert "again" not in formatEvent(connected)
    assert client.reconnects == 0


@pytest_twisted.ensureDeferred
async def test_a_server_killed_with_bytes_unread_resets_the_connection(nats, clients, events):
    client = clients.start(nats.url)
    await wait_for(client.when_ready(), 10)
    os.kill(nats.process.pid, signal.SIGSTOP)
    try:
        for _ in range(32):
            client.publish("unread", b"x" * 65536)
        await sleep(0.5)  # into the stopped server's socket, which it never reads
    finally:
        nats.stop(kill=True)
    await eventually(lambda: lost(events), timeout=10)
    assert_logged_as_lost(lost(events)[0], BROKE)


@pytest_twisted.ensureDeferred
async def test_a_paused_server_is_lost_for_its_unanswered_pings(nats, clients, events):
    client = clients.start(nats.url, ping_interval=0.2, max_pings_out=2, reconnect_wait=0.05)
    await wait_for(client.when_ready(), 10)
    os.kill(nats.process.pid, signal.SIGSTOP)
    try:
        await eventually(lambda: lost(events), timeout=10)
    finally:
        os.kill(nats.process.pid, signal.SIGCONT)
    assert_logged_as_lost(lost(events)[0], "no answer to 2 PINGs in 0.4 s")
    await eventually(lambda: client.connected, timeout=15)
    assert client.reconnects == 1


@pytest_twisted.ensureDeferred
async def test_an_err_the_server_closes_after_is_the_cause_and_one_it_does_not_is_not(
        tmp_path, clients, events):
    from tests.cluster.conftest import _need_nats_server

    _need_nats_server()
    users = 'authorization {{ users = [ {{user: "broker", password: "{password}", ' \
            'permissions: {{publish: {{deny: ["forbidden"]}}}}}} ] }}'
    server = NatsServer(directory=str(tmp_path / "nats"),
                        extra_config=users.format(password="one")).start()
    try:
        client = clients.start(server.url, user="broker", password="one")
        await wait_for(client.when_ready(), 10)
        client.publish("forbidden", b"x")
        await eventually(lambda: named(events, "cluster_server_error"), timeout=10)
        await wait_for(client.flush())  # the server keeps the connection after that one
        assert client.connected and not lost(events)
        # The server's users change under it (SIGHUP rereads its config): it closes the
        # connection of a user that is no longer.
        server.extra_config = users.format(password="two")
        write_private(Path(server.directory or "") / "nats.conf", server.config_text().encode())
        assert server.process is not None
        server.process.send_signal(signal.SIGHUP)
        await eventually(lambda: lost(events), timeout=10)
        assert_logged_as_lost(lost(events)[0], "the server closed the connection after -ERR "
                                               "'Authorization Violation'")
    finally:
        server.stop()


@pytest_twisted.ensureDeferred
async def test_a_tls_failure_is_said_to_be_one(tmp_path, tls_files, clients, events):
    from tests.cluster.conftest import _need_nats_server

    _need_nats_server()
    server = NatsServer(directory=str(tmp_path / "nats"), extra_config=(
        f'tls {{ cert_file: "{tls_files.cert}", key_file: "{tls_files.key}" }}')).start()
    try:
        url = server.url.replace("nats://", "tls://").replace("127.0.0.1", "localhost")
        client = clients.start(url)  # without the CA that signed the server's certificate
        # Only this client's attempts: a client of an earlier test may still be logging.
        mine = f"tls://localhost:{server.port}"
        await eventually(lambda: named(events, "cluster_unreachable", server=mine), timeout=10)
        (unreachable,) = named(events, "cluster_unreachable", server=mine)
        assert unreachable["why"].startswith("TLS error: "), unreachable["why"]
        assert "certificate verify failed" in unreachable["why"]
        assert not client.connected
    finally:
        server.stop()


@pytest_twisted.ensureDeferred
async def test_a_server_in_lame_duck_mode_is_said_to_be_shutting_down(tmp_path, clients, events):
    from tests.cluster.conftest import _need_nats_server

    _need_nats_server()
    # Its shortest lame duck: the server closes its last client after about 10 s.
    server = NatsServer(directory=str(tmp_path / "nats"), extra_config=(
        'lame_duck_duration: "30s"\nlame_duck_grace_period: "0s"')).start()
    try:
        client = clients.start(server.url)
        await wait_for(client.when_ready(), 10)
        assert server.process is not None
        server.process.send_signal(signal.SIGUSR2)  # lame duck mode
        await eventually(lambda: lost(events), timeout=40, interval=0.1)
        assert_logged_as_lost(
            lost(events)[0],
            "the server closed the connection: it was shutting down (lame duck mode)")
    finally:
        server.stop(kill=True)
