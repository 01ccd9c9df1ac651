"""The private nats-server of `wireproto serve --workers 2` is kept running by its supervisor:
killed (SIGKILL) or stopped (SIGSTOP), it is started again on the same port with the same data
and key, and cross-worker delivery resumes, in order and never twice; a port taken meanwhile is
tried again until it is free; and a supervisor stopped meanwhile leaves no nats-server behind.
Real processes: the supervisor, its two workers and nats-server."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import LoopingCall

from tests.brokers import LOCAL
from tests.cluster.test_membership import nats_port, private_nats
from tests.cluster.test_workers import (
    Supervised,
    start_supervised,
    stop_supervised,
    workers_of,
)
from tests.support import eventually, sleep, wait_for

# Within this many seconds of a SIGKILL of the private nats-server, messages cross again.
RESUMED_AFTER_KILL = 5.0
# And of a SIGSTOP: HUNG_AFTER (5 s) without an answer, then as after a kill.
RESUMED_AFTER_STOP = 12.0


class Stream:
    """Sequence-numbered publishes every 10 ms by `publisher` (on one worker), received by
    `subscriber` (on the other), each with the time it was sent or arrived."""

    def __init__(self, publisher, subscriber, supervised: Supervised) -> None:
        self.publisher = publisher
        self.supervised = supervised
        self.sent: list[float] = []
        self.received: list[tuple[int, float]] = []
        subscriber.subscribe("seq", lambda message: self.received.append(
            (int(message.payload), reactor.seconds())))
        self._loop = LoopingCall(self._publish)

    def _publish(self) -> None:
        try:
            self.publisher.publish("seq", b"%d" % len(self.sent))
        except ConnectionError:  # the test is over, and its clients gone
            self._loop.stop()
            return
        self.sent.append(reactor.seconds())

    def start(self) -> None:
        self._loop.start(0.01)

    async def finish(self) -> None:
        """Stop publishing, and wait for the last one sent to arrive."""
        self._loop.stop()
        last = len(self.sent) - 1
        try:
            await eventually(lambda: self.received and self.received[-1][0] == last, timeout=15)
        except TimeoutError:
            raise AssertionError(f"the last of {last + 1} messages did not arrive\n"
                                 f"{self.account()}") from None

    def account(self) -> str:
        """What arrived, what did not, and what the supervisor and its workers said of NATS:
        enough to tell a message lost from one late, and why."""
        numbers = [number for number, _ in self.received]
        arrived = set(numbers)
        missing = [number for number in range(len(self.sent)) if number not in arrived]
        runs: list[list[int]] = []
        for number in missing:
            if runs and runs[-1][1] == number - 1:
                runs[-1][1] = number
            else:
                runs.append([number, number])
        said = [line for line in self.supervised.child.stderr
                if "NATS" in line or "nats" in line or "lease" in line][-40:]
        return (f"sent {len(self.sent)}, arrived {len(numbers)} (the last: {numbers[-5:]}), "
                f"missing {[tuple(run) for run in runs]}\n" + "\n".join(said))

    def resumed(self, since: float) -> tuple[int, float] | None:
        """The first message sent after `since` that arrived, and how long after `since`."""
        for number, arrived in self.received:
            if self.sent[number] >= since:
                return number, arrived - since
        return None

    def check_order(self, resumed_at: int) -> None:
        """Every message arrived in order, once; from `resumed_at` on, every one arrived."""
        numbers = [number for number, _ in self.received]
        assert numbers == sorted(set(numbers)), f"reordered or duplicated\n{self.account()}"
        tail = numbers[numbers.index(resumed_at):]
        assert tail == list(range(resumed_at, len(self.sent))), \
            f"lost after the resumption at {resumed_at}\n{self.account()}"


async def streaming(supervised: Supervised) -> tuple[Stream, list]:
    """A Stream from worker B to worker A, once it flows."""
    first, second = supervised.pids
    subscriber, _ = await supervised.client_on(first)
    publisher, _ = await supervised.client_on(second)
    stream = Stream(publisher, subscriber, supervised)
    await sleep(0.5)  # the subscription reaches worker A's hub, and its interest NATS
    stream.start()
    await eventually(lambda: stream.received, timeout=10)
    return stream, [subscriber, publisher]


def supervisor_said(supervised: Supervised, pattern: str) -> list[str]:
    return [line for line in supervised.child.stderr if re.search(pattern, line)]


def alive(pid: int) -> bool:
    """`pid` is a process that has not ended (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def nats_servers_in(directory: Path) -> list[int]:
    """Every nats-server running with its config in `directory`, whoever its parent."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if b"nats-server" in command and str(directory).encode() in command and alive(
                int(entry)):
            found.append(int(entry))
    return found


async def restarted(supervised: Supervised, old: int, timeout: float) -> int:
    """The pid of the nats-server that followed `old`."""
    supervisor = supervised.child.process.pid

    def other() -> int | None:
        try:
            pid, _ = private_nats(supervisor)
        except AssertionError:
            return None
        return pid if pid != old and alive(pid) else None

    return await eventually(other, timeout=timeout)


def take_port(port: int, timeout: float = 2.0) -> socket.socket:
    """Listen on `port` as soon as it is free (within `timeout`), as another program would."""
    deadline = time.monotonic() + timeout
    while True:
        taker = socket.socket()
        taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taker.bind(("127.0.0.1", port))
            taker.listen()
            return taker
        except OSError:
            taker.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)


@pytest_twisted.ensureDeferred
async def test_a_killed_private_nats_server_is_started_again_and_delivery_resumes():
    supervised = await start_supervised("--listen", f"websmq+length32@tcp:0:{LOCAL}")
    try:
        supervisor = supervised.child.process.pid
        old, directory = private_nats(supervisor)
        port = nats_port(directory)
        stream, clients = await streaming(supervised)
        killed = reactor.seconds()
        os.kill(old, signal.SIGKILL)
        await eventually(lambda: stream.resumed(killed), timeout=30)
        resumed_at, after = stream.resumed(killed)
        assert after <= RESUMED_AFTER_KILL, f"delivery resumed {after:.1f} s after the kill"
        await sleep(1.0)
        await stream.finish()
        stream.check_order(resumed_at)

        new = await restarted(supervised, old, 5)
        # Where it was: the same port and directory, so the same data and key.
        assert private_nats(supervisor) == (new, directory)
        assert nats_port(directory) == port
        (said,) = supervisor_said(supervised, rf"the private nats-server \(pid {old}\)")
        assert re.search(rf"was killed by SIGKILL after [\d.]+ s; starting it again on "
                         rf"nats://127\.0\.0\.1:{port} in 0\.[15] s", said), said
        for client in clients:
            await wait_for(client.disconnect())
    finally:
        await stop_supervised(supervised.child)
    assert not directory.exists()


@pytest_twisted.ensureDeferred
async def test_a_stopped_private_nats_server_is_killed_and_started_again():
    supervised = await start_supervised("--listen", f"websmq+length32@tcp:0:{LOCAL}")
    old = None
    try:
        old, directory = private_nats(supervised.child.process.pid)
        stream, clients = await streaming(supervised)
        stopped = reactor.seconds()
        os.kill(old, signal.SIGSTOP)
        await eventually(lambda: stream.resumed(stopped), timeout=40)
        resumed_at, after = stream.resumed(stopped)
        assert after <= RESUMED_AFTER_STOP, f"delivery resumed {after:.1f} s after the stop"
        await sleep(1.0)
        await stream.finish()
        stream.check_order(resumed_at)

        await restarted(supervised, old, 5)
        # The stopped one was killed, not left holding the port or the store.
        await eventually(lambda: not alive(old), timeout=5)
        assert len(nats_servers_in(directory)) == 1
        (hung,) = supervisor_said(supervised, rf"nats-server \(pid {old}\) has answered no PING")
        assert re.search(r"for [\d.]+ s; killing it to start it again", hung), hung
        for client in clients:
            await wait_for(client.disconnect())
    finally:
        if old is not None and alive(old):
            os.kill(old, signal.SIGCONT)
            os.kill(old, signal.SIGKILL)
        await stop_supervised(supervised.child)


@pytest_twisted.ensureDeferred
async def test_a_port_taken_meanwhile_is_tried_again_until_it_is_free():
    supervised = await start_supervised("--verbose",
                                        "--listen", f"websmq+length32@tcp:0:{LOCAL}")
    try:
        old, directory = private_nats(supervised.child.process.pid)
        port = nats_port(directory)
        stream, clients = await streaming(supervised)
        os.kill(old, signal.SIGKILL)
        taker = take_port(port)
        try:
            failed = r"could not start again on nats://127\.0\.0\.1:\d+: it exited with status 1"
            await eventually(lambda: len(supervisor_said(supervised, failed)) >= 2, timeout=15)
            said = supervisor_said(supervised, failed)
            assert all("address already in use" in line for line in said), said
            pauses = [float(re.search(r"trying again in ([\d.]+) s", line).group(1))
                      for line in said]
            assert pauses[1] == 2 * pauses[0], said  # it grows
            assert supervised.child.process.poll() is None  # still supervising
            freed = reactor.seconds()
        finally:
            taker.close()
        await eventually(lambda: stream.resumed(freed), timeout=30)
        resumed_at, _ = stream.resumed(freed)
        await stream.finish()
        stream.check_order(resumed_at)
        assert supervisor_said(
            supervised, rf"the private nats-server is running again on nats://127\.0\.0\.1:"
                        rf"{port} \(pid \d+\)")
        for client in clients:
            await wait_for(client.disconnect())
    finally:
        await stop_supervised(supervised.child)


@pytest.mark.parametrize("port_taken", [True, False], ids=["waiting", "starting"])
@pytest_twisted.ensureDeferred
async def test_a_supervisor_stopped_while_restarting_its_nats_server_leaves_none(port_taken):
    supervised = await start_supervised("--listen", f"websmq+length32@tcp:0:{LOCAL}")
    taker = None
    try:
        supervisor = supervised.child.process.pid
        old, directory = private_nats(supervisor)
        port = nats_port(directory)
        os.kill(old, signal.SIGKILL)
        if port_taken:
            # Stopped while it waits to try again.
            taker = take_port(port)
            await eventually(lambda: supervisor_said(supervised, "could not start again"),
                             timeout=15)
        else:
            # Stopped as it starts it again (or just before, or just after).
            await eventually(lambda: supervisor_said(supervised, "starting it again"),
                             timeout=15)
        await stop_supervised(supervised.child)
        assert nats_servers_in(directory) == []
        assert not directory.exists()
        assert workers_of(supervisor) == []
    finally:
        if taker is not None:
            taker.close()
        await stop_supervised(supervised.child)


RETAINING = """
[hub]
retain = ["sensors/#"]
[[listen]]
protocol = "websmq"
transport = "length32"
endpoint = "tcp:0:interface=127.0.0.1"
"""


@pytest_twisted.ensureDeferred
async def test_last_values_outlive_a_restart_of_the_private_nats_server(tmp_path):
    config = tmp_path / "wireproto.toml"
    config.write_text(RETAINING)
    supervised = await start_supervised("--config", str(config))
    try:
        supervisor = supervised.child.process.pid
        old, _ = private_nats(supervisor)
        publisher, _ = await supervised.client_on(supervised.pids[1])
        publisher.publish("sensors/t", b"22")
        await sleep(1.0)  # into the bucket
        await wait_for(publisher.disconnect())
        os.kill(old, signal.SIGKILL)
        await restarted(supervised, old, 15)
        # Both workers start again, with nothing but what the bucket kept.
        before = list(supervised.pids)
        for pid in before:
            os.kill(pid, signal.SIGKILL)
        supervised.pids = await eventually(
            lambda: (lambda new: new if len(new) == 2 else None)(
                [pid for pid in workers_of(supervisor) if pid not in before]), timeout=30)

        async def last_value() -> list:
            client, _ = await supervised.client_on(within=30)
            received: list = []
            client.subscribe("sensors/t", received.append)
            try:
                await eventually(lambda: received, timeout=2)
            except TimeoutError:
                pass
            await wait_for(client.disconnect())
            return [message.payload for message in received]

        for _ in range(10):  # a worker just ready may still be reading the bucket
            payloads = await last_value()
            if payloads:
                break
        assert payloads == [b"22"]
    finally:
        await stop_supervised(supervised.child)
