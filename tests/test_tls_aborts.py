"""A broker closing TLS connections for malformed input logs no traceback, then or later.

The WebSocket server's close waits a while for its close frame to flush before it aborts the
connection: that delayed abort fired on TLS connections already gone and logged a critical
"while handling timed call" traceback (over plain TCP the late abort does nothing)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.logger import LogLevel, formatEvent, globalLogPublisher

from tests.brokers import LOCAL, Broker
from tests.support import eventually, sleep, wait_for
from tests.transports.conftest import Recorder
from wireproto.transports.connect import connect
from wireproto.transports.websocket import REFUSAL_FLUSH

# What each listener's protocol refuses, and closes the connection for.
MALFORMED = {
    "websmq+ws": b"\x01",  # a WEBSMQ frame of 1 byte: the header needs 2
    "ubre+ws": b"X",  # neither JSON nor a binary UBRE type
    "websmq+length32": struct.pack(">I", 3) + b"\xf0\x00\x00",  # no such WEBSMQ type
}


@pytest.fixture
def troubles():
    """Every critical or error event, and every event carrying a failure, logged meanwhile."""
    seen: list[dict[str, Any]] = []

    def observe(event: dict[str, Any]) -> None:
        level = event.get("log_level")
        if "log_failure" in event or level in (LogLevel.error, LogLevel.critical):
            seen.append(event)

    globalLogPublisher.addObserver(observe)
    try:
        yield seen
    finally:
        globalLogPublisher.removeObserver(observe)


def described(events: list[dict[str, Any]]) -> list[str]:
    return [f"{formatEvent(e)}\n{e['log_failure'].getTraceback() if 'log_failure' in e else ''}"
            for e in events]


@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest.mark.parametrize("listener", sorted(MALFORMED))
@pytest_twisted.ensureDeferred
async def test_closing_a_tls_connection_for_malformed_input_logs_no_traceback(
    broker: Broker, tls_files: Any, troubles: list[dict[str, Any]], listener: str
) -> None:
    tls = f"ssl:0:{LOCAL}:privateKey={tls_files.key}:certKey={tls_files.cert}"
    service, bound = await broker.start(f"{listener}@{tls}")
    peer = await wait_for(connect(reactor, bound[0].address, Recorder,
                                  cafile=str(tls_files.cert)))
    (session,) = await eventually(lambda: list(service.hub.sessions))
    peer.transport.sendMessage(MALFORMED[listener], True)
    await wait_for(peer.lost, timeout=10)
    await eventually(lambda: not service.hub.sessions, timeout=10)
    # Any abort the broker put off was due by now.
    await sleep(REFUSAL_FLUSH + 0.5)
    assert described(troubles) == []
    # An abort that comes late, on either end, does nothing, as it does over TCP.
    session.transport.abortConnection()
    peer.transport.abortConnection()
    await sleep(0)
    assert described(troubles) == []
