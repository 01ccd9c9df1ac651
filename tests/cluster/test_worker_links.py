"""Under `wireproto serve --workers 2`, a link to a device (`--phyllo`, `--attach`, a fleet) is
opened by one process, worker 0: two processes reading one serial port would each get part of
its bytes. Its presence reaches subscribers on every worker (docs/cluster.md, "Links to
devices")."""

from __future__ import annotations

import json
import os
import signal
import struct
import time

import pytest_twisted
from twisted.internet import protocol, reactor

from tests.brokers import LOCAL
from tests.cluster.test_workers import holding, start_supervised, stop_supervised, workers_of
from tests.support import eventually, sleep, wait_for
from wireproto.codecs import websmq
from wireproto.devices.standin import COMMON_BOARDS, StandInPorts


def holders(device: str, pids: list[int]) -> list[int]:
    """Which of `pids` have `device` open."""
    return holding({device}, pids)


@pytest_twisted.ensureDeferred
async def test_worker_0_alone_opens_the_links_and_every_worker_keeps_their_presence():
    boards = StandInPorts()
    try:
        phyllo = boards.plug(**COMMON_BOARDS["uno"], serial_number="1")
        attached = boards.plug(**COMMON_BOARDS["pico"], serial_number="2")
        running = await start_supervised(
            "--listen", f"websmq+length32@tcp:0:{LOCAL}",
            "--phyllo", f"dev1@serial:{phyllo.device}",
            "--attach", f"websmq@serial:{attached.device}")
        try:
            pids = running.pids
            await eventually(lambda: holders(phyllo.device, pids)
                             and holders(attached.device, pids), timeout=20)
            started = time.monotonic()
            while time.monotonic() - started < 3:  # long enough for a second worker's retry
                assert len(holders(phyllo.device, pids)) == 1, running.child.output()
                assert len(holders(attached.device, pids)) == 1, running.child.output()
                await sleep(0.2)
            assert holders(phyllo.device, pids) == holders(attached.device, pids) == [pids[0]]
            for pid in pids:  # a later subscriber on either worker gets the kept presence
                client, _ = await running.client_on(pid)
                seen: list = []
                client.subscribe("$devices/dev1", seen.append)
                await eventually(lambda seen=seen: seen, timeout=15)
                presence = json.loads(seen[-1].payload)
                assert presence["online"] is True and presence["port"] == phyllo.device
                await wait_for(client.disconnect())
            # Worker 0 killed outright: its port is let go, and the worker started in its
            # place opens it again, alone.
            os.kill(pids[0], signal.SIGKILL)
            supervisor = running.child.process.pid
            restarted = await eventually(
                lambda: [pid for pid in workers_of(supervisor) if pid not in pids], 20)
            await eventually(lambda: holders(phyllo.device, [*restarted, pids[1]]) == restarted
                             and holders(attached.device, [*restarted, pids[1]]) == restarted,
                             timeout=20)
        finally:
            await stop_supervised(running.child)
    finally:
        boards.close()


class _Board(protocol.Protocol):
    """A board that says hello (numbered) as soon as its link opens."""

    def connectionMade(self) -> None:
        self.factory.opened += 1
        frame = websmq.encode(websmq.Publish("board/hello", b"%d" % self.factory.opened))
        self.transport.write(struct.pack(">I", len(frame)) + frame)


@pytest_twisted.ensureDeferred
async def test_what_a_board_says_as_worker_0_opens_its_link_again_reaches_worker_1():
    # Worker 0 started again used to open its links before it had reached NATS: the board's
    # hello reached worker 0's subscribers alone (docs/cluster.md, "Links to devices").
    factory = protocol.ServerFactory.forProtocol(_Board)
    factory.opened = 0
    board = reactor.listenTCP(0, factory, interface="127.0.0.1")
    try:
        running = await start_supervised(
            "--listen", f"websmq+length32@tcp:0:{LOCAL}",
            "--attach", f"websmq+length32@tcp:127.0.0.1:{board.getHost().port}")
        try:
            pids = running.pids
            await eventually(lambda: factory.opened == 1, timeout=20)
            client, _ = await running.client_on(pids[1])
            heard: list = []
            client.subscribe("board/hello", heard.append)
            await sleep(1.0)  # its subscription known to worker 0 through NATS
            os.kill(pids[0], signal.SIGKILL)
            await eventually(lambda: factory.opened == 2, timeout=30)
            await eventually(lambda: heard, timeout=10)
            assert [message.payload for message in heard] == [b"2"]
            await wait_for(client.disconnect())
        finally:
            await stop_supervised(running.child)
    finally:
        await wait_for(board.stopListening())
