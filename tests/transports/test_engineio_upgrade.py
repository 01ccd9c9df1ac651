"""An Engine.IO session's upgrade on real sockets, where it does not go straight through: a second
upgrade, a failed one and the next, a timeout, a close in the middle. (The state machine alone:
test_engineio_state.py; the upgrade that succeeds: test_engineio.py.)"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.error import ConnectionLost

from tests.support import eventually, wait_for
from tests.transports.conftest import Echo, Recorder
from tests.transports.test_engineio import EIO
from wireproto.transports import EngineIOOptions


@pytest_twisted.async_yield_fixture
async def eio(net):
    server = EIO(net)
    try:
        yield server
    finally:
        await server.close()


def upgrade_query(sid: str) -> str:
    return f"EIO=4&transport=websocket&sid={sid}"


@pytest_twisted.ensureDeferred
async def test_a_second_upgrade_while_one_is_under_way_is_refused(eio):
    await eio.start(Recorder)
    sid, _ = await eio.handshake()
    first = await eio.ws(upgrade_query(sid))
    with pytest.raises(ConnectionLost, match="WebSocket refused"):
        await eio.ws(upgrade_query(sid))
    first.send_text("2probe")
    assert await first.received(1) == ["3probe"]
    first.send_text("5")
    await eventually(lambda: eio.sessions[sid].transportName == "websocket")


@pytest_twisted.ensureDeferred
async def test_a_failed_upgrade_leaves_the_session_polling_and_free_to_upgrade_again(eio):
    await eio.start(Echo)
    sid, _ = await eio.handshake()
    first = await eio.ws(upgrade_query(sid))
    first.send_text("2probe")
    await first.received(1)
    first.sendClose()
    await wait_for(first.closed)
    await eventually(lambda: eio.sessions[sid].can_upgrade)
    # Held again: polls were answered at once only while the probed upgrade lasted.
    waiting = await eio.send("GET", eio.poll(sid))
    await eio.request("POST", eio.poll(sid), b"4still polling")
    assert (await eio.answer(waiting)).body == b"4still polling"
    second = await eio.ws(upgrade_query(sid))
    second.send_text("2probe")
    second.send_text("5")
    second.send_text("4up")
    assert await second.received(2) == ["3probe", "4up"]
    assert eio.sessions[sid].transportName == "websocket"


@pytest_twisted.ensureDeferred
async def test_an_upgrade_not_done_within_upgrade_timeout_closes_only_its_websocket(eio):
    await eio.start(Echo, EngineIOOptions(upgrade_timeout=0.2))
    sid, server = await eio.handshake()
    ws = await eio.ws(upgrade_query(sid))
    ws.send_text("2probe")
    await wait_for(ws.closed)
    assert (ws.frames, ws.close_code) == (["3probe"], 1000)
    assert server.connected
    assert eio.sessions[sid].transportName == "polling"
    await eio.request("POST", eio.poll(sid), b"4polling")
    assert (await eio.request("GET", eio.poll(sid))).body == b"4polling"


@pytest_twisted.ensureDeferred
async def test_closing_during_the_upgrade_closes_its_websocket_and_a_poll_takes_the_close(eio):
    await eio.start(Recorder)
    sid, server = await eio.handshake()
    ws = await eio.ws(upgrade_query(sid))
    ws.send_text("2probe")
    await ws.received(1)
    server.transport.loseConnection()
    await wait_for(server.lost)
    await wait_for(ws.closed)
    # The close packet is for the session's carrier, polling, not for the upgrading WebSocket.
    assert (ws.frames, ws.close_code) == (["3probe"], 1000)
    assert (await eio.request("GET", eio.poll(sid))).body == b"1"
    assert sid not in eio.sessions
