"""Under `wireproto serve --workers 2`, a link to a device (`--phyllo`, `--attach`, a fleet) is
opened by one process, worker 0: two processes reading one serial port would each get part of
its bytes. Its presence reaches subscribers on every worker (docs/cluster.md, "Links to
devices")."""

from __future__ import annotations

import json
import os
import time

import pytest_twisted

from tests.brokers import LOCAL
from tests.cluster.test_workers import start_supervised, stop_supervised
from tests.support import eventually, sleep, wait_for
from wireproto.devices.standin import COMMON_BOARDS, StandInPorts


def holders(device: str, pids: list[int]) -> list[int]:
    """Which of `pids` have `device` open."""
    found = []
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        for descriptor in descriptors:
            try:
                if os.readlink(f"/proc/{pid}/fd/{descriptor}") == device:
                    found.append(pid)
                    break
            except OSError:
                continue
    return found


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
        finally:
            await stop_supervised(running.child)
    finally:
        boards.close()
