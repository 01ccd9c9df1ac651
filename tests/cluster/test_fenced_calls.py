"""Calls across processes under faults (docs/cluster.md, "Calls"): the process that takes calls
is fenced, goes on under a new identity, then dies. The caller is a broker in this test's
reactor; the one that takes the calls is a real child process (hanging_broker.py) on a real
nats-server."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest_twisted

from tests.cluster.test_call_failures import HANGING_BROKER, unavailable
from tests.cluster.test_calls import broker_on, ubre_client
from tests.support import eventually, failure_of, sleep, wait_for
from tests.test_cli import Child

HEARTBEAT, LEASE = 0.2, 1.0


@pytest_twisted.ensureDeferred
async def test_calls_to_a_process_fenced_once_fail_as_unavailable_when_it_dies(broker, nats):
    """Fixed: a process that was fenced (paused past its lease) goes on under a new identity,
    but still acknowledges the calls it takes in the name of its former one
    (`RemoteCalls._taken` is made once, from the first origin). The caller forgot that identity
    at the fenced process's goodbye for it, so when the process is killed its calls are never
    failed as unavailable: they wait for call_timeout (60 s here, 30 s by default) instead of
    failing a lease after its death."""
    caller, at_caller = await broker_on(broker, nats, call_timeout=60.0)
    child = Child(sys.executable, str(HANGING_BROKER), nats.url, str(HEARTBEAT), str(LEASE))
    ubre = None
    try:
        former = (await child.line(re.compile(r"origin (\S+)"), 30)).group(1)
        await child.line(re.compile("ready"), 30)
        await wait_for(caller.cluster.client.flush())
        ubre = await ubre_client(at_caller["ubre"])
        # Paused past its lease: on waking it is fenced, and the caller hears its new identity.
        os.kill(child.process.pid, signal.SIGSTOP)
        try:
            await sleep(3 * LEASE)
        finally:
            os.kill(child.process.pid, signal.SIGCONT)
        roster = caller.cluster.roster
        # Waking, noticing the lost lease and rejoining take longer on a loaded machine.
        await eventually(lambda: roster.members() and former not in roster.members(),
                         timeout=30)
        await sleep(1.0)
        hanging = [ubre.request("hang", index, timeout=120) for index in range(3)]
        await eventually(lambda: child.stdout.count("taken") == 3, timeout=30)
        await sleep(0.5)
        taken = {origin: caller.cluster.calls.taken_by(origin)
                 for origin in [former, *roster.members()]}
        print(f"calls taken, as the caller knows: {taken}")
        os.kill(child.process.pid, signal.SIGKILL)
        killed = time.monotonic()
        # A lease and a heartbeat, with room for a loaded machine; call_timeout is 60 s.
        errors = [await failure_of(d, 15 if index == 0 else 1)
                  for index, d in enumerate(hanging)]
        print(f"{time.monotonic() - killed:.1f} s after the kill: {unavailable(errors)}")
        assert unavailable(errors) == ["ubre Unavailable"] * 3
    finally:
        child.kill()
        if ubre is not None:
            await wait_for(ubre.close())
