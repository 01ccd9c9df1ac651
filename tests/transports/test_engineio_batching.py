"""An Engine.IO read is one read of the fast path (wireproto.speedups): the messages of one
POST, or of one read of its WebSocket, cost each connection they are written to one write, in
order, on both fast paths."""

from __future__ import annotations

import pytest
import pytest_twisted

from tests.support import eventually
from tests.transports.conftest import Recorder
from tests.transports.test_engineio import EIO
from wireproto import speedups

pytestmark = pytest.mark.usefixtures("fast_path")

COUNT = 50


class Forwarder(Recorder):
    """Writes each message it receives to one outbox, as the hub writes to a subscriber's."""

    writes: list[bytes] = []
    outbox: speedups.Outbox | None = None

    def messageReceived(self, data: bytes, binary: bool) -> None:
        super().messageReceived(data, binary)
        assert Forwarder.outbox is not None
        Forwarder.outbox.write(data + b";")


@pytest_twisted.async_yield_fixture
async def forwarding(net):
    Forwarder.writes = []
    Forwarder.outbox = speedups.Outbox(Forwarder.writes.append)
    server = EIO(net)
    try:
        await server.start(Forwarder)
        yield server
    finally:
        Forwarder.outbox = None
        await server.close()


def expected() -> bytes:
    return b"".join(b"m%d;" % number for number in range(COUNT))


@pytest_twisted.ensureDeferred
async def test_the_messages_of_one_post_cost_each_connection_one_write(forwarding):
    sid, _ = await forwarding.handshake()
    body = "\x1e".join(f"4m{number}" for number in range(COUNT)).encode()
    answer = await forwarding.request("POST", forwarding.poll(sid), body)
    assert answer.status == 200
    assert Forwarder.writes == [expected()]


@pytest_twisted.ensureDeferred
async def test_the_messages_of_one_websocket_read_cost_each_connection_one_write(forwarding):
    ws = await forwarding.ws("EIO=4&transport=websocket")
    await ws.received(1)  # the open packet
    for number in range(COUNT):  # one turn of this test: one write, read in few reads
        ws.send_text(f"4m{number}")
    await eventually(lambda: b"".join(Forwarder.writes) == expected())
    # Without the batch, one write per message.
    assert len(Forwarder.writes) < COUNT / 4, len(Forwarder.writes)
