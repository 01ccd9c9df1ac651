"""The Phyllo device kit against real devices on a serial line made of pty pairs (the
`null_modem` fixture: two pty pairs whose masters are joined, so each end is a real tty that a
serial port opens): the kit opens one end through the ``serial:`` endpoint, and the device, a
process of its own, the other.

- wireproto's own Phyllo stack (examples/conformance/phyllo_device_driver.py) passes every MUST
  on both stacks; every case's outcome is pinned.
- phyllo-python 0.2.0, the reference (tests/conformance/phyllo_python_device.py), runs case by
  case on both stacks, restarted when a case ended it, its outcome pinned per id.
- The broken devices of tests/conformance/broken_devices.py each fail the cases that catch them
  and no others.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.support import eventually
from wireproto.conformance.clientprocess import ClientProcess
from wireproto.conformance.kits import kit
from wireproto.conformance.model import Outcome
from wireproto.conformance.probe import Target
from wireproto.conformance.runner import CouldNotRun, run_cases

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "examples" / "conformance" / "phyllo_device_driver.py"
PHYLLO_PYTHON = Path(__file__).with_name("phyllo_python_device.py")
BROKEN_DEVICES = Path(__file__).with_name("broken_devices.py")
STACKS = ["minimal", "reduced"]

P, F, N, INFO = Outcome.PASS, Outcome.FAIL, Outcome.NON_STRICT, Outcome.INFORMATION
CATALOGUE = kit("phyllo", "device")
IDS = [case.id for case in CATALOGUE.cases]
BIG_CHUNK_CASES = {"phyllo.frame.largest", "phyllo.frame.over-limit",
                   "phyllo.frame.over-limit.dropped", "phyllo.resync.garbage",
                   "phyllo.resync.zeros-in-garbage"}
CRC_CASES = {"phyllo.crc.sent", "phyllo.crc.bad-dropped", "phyllo.crc.other-polynomial"}


def all_pass(stack: str) -> dict[str, Outcome]:
    """Every case passes; information cases and the CRC cases on minimal say information."""
    expected = {}
    for case in CATALOGUE.cases:
        information = case.level.value == "information" or (
            stack == "minimal" and case.id in CRC_CASES)
        expected[case.id] = INFO if information else P
    return expected


class Device:
    """A device process on one end of the line, started by its command."""

    def __init__(self, command: list[str], device_path: str) -> None:
        self.command = [part.replace("{path}", device_path) for part in command]
        self.device_path = device_path
        self.process: ClientProcess | None = None
        self.starts = 0

    async def start(self) -> None:
        import shlex

        self.process = ClientProcess(reactor, shlex.join(self.command), self.device_path)
        self.process.start()
        self.starts += 1
        process = self.process
        await eventually(lambda: "ready" in process.output() or not process.running,
                         timeout=30)
        assert process.running, f"the device did not start: {process.output()}"

    async def ensure(self) -> None:
        if self.process is None or not self.process.running:
            await self.start()

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop()


@pytest_twisted.async_yield_fixture
async def line(null_modem):
    """(the kit's serial address, a function that makes a Device on the other end)."""
    kit_path, device_path = null_modem
    devices: list[Device] = []

    def make(*command: str) -> Device:
        made = Device([sys.executable, *command], device_path)
        devices.append(made)
        return made

    try:
        yield f"serial:{kit_path}", make
    finally:
        for made in devices:
            await made.stop()


def outcomes(results) -> dict[str, Outcome]:
    return {result.case.id: result.outcome for result in results}


def explained(results) -> str:
    return "\n".join(f"{r.case.id}: {r.outcome} {r.reason}" for r in results
                     if r.outcome is not P)


async def run_each(device: Device, target: Target, ids: list[str] | None = None,
                   fresh: bool = False):
    """Each case on its own run (with its liveness check), the device restarted first when a
    case before it ended it (or before every case, `fresh`); a device that cannot be judged at
    all for a case fails it."""
    results = []
    for case in CATALOGUE.cases:
        if ids is not None and case.id not in ids:
            continue
        if fresh:
            await device.stop()
        await device.ensure()
        try:
            results += await run_cases(reactor, target, CATALOGUE, [case])
        except CouldNotRun as error:
            from wireproto.conformance.catalogue import CaseResult

            results.append(CaseResult(case, F, f"could not run: {error}"))
    return results


@pytest.mark.parametrize("stack", STACKS)
@pytest_twisted.ensureDeferred
async def test_wireproto_stack_passes_every_case(line, stack: str) -> None:
    address, make = line
    device = make(str(DRIVER), "serial:{path}", "--stack", stack)
    await device.start()
    results = await run_cases(reactor, Target("phyllo", address, stack=stack), CATALOGUE)
    assert outcomes(results) == all_pass(stack), explained(results)
    assert device.starts == 1 and device.process is not None and device.process.running
    # An Uno's buffers take 80 bytes: only the cases of limits and garbage send more.
    for result in results:
        if result.case.id in BIG_CHUNK_CASES:
            continue
        longest = max((len(piece) for exchange in result.exchanges
                       if exchange.direction == "sent" and exchange.data
                       for piece in exchange.data.split(b"\x00")), default=0)
        assert longest <= 80, (result.case.id, longest)


@pytest.fixture
def need_phyllo_python() -> None:
    """Skip locally, fail under CI, when phyllo-python cannot be imported."""
    from tests.phyllo.phyllo_python import phyllo_missing
    from tests.support import need_peer

    missing = phyllo_missing()
    need_peer(None if missing is None else f"{missing}; `make test` installs it",
              "the phyllo-python device kit tests")


# phyllo-python's outcomes, per stack, where they are not a pass (docs/conformance.md, "Phyllo
# devices: the driver and results", says why).
PHYLLO_PYTHON_RESULTS: dict[str, dict[str, Outcome]] = {"minimal": {}, "reduced": {}}


@pytest.mark.parametrize("stack", STACKS)
@pytest_twisted.ensureDeferred
async def test_phyllo_python_case_by_case(need_phyllo_python, line, stack: str) -> None:
    address, make = line
    device = make(str(PHYLLO_PYTHON), "{path}", "--stack", stack)
    results = await run_each(device, Target("phyllo", address, stack=stack))
    expected = {**all_pass(stack), **PHYLLO_PYTHON_RESULTS[stack]}
    print(explained(results))
    assert outcomes(results) == expected, explained(results)


# The cases each broken device runs: those that catch one fault or another, and some that none
# of them should fail.
BROKEN_CASES = [
    "phyllo.frame.cobs", "phyllo.datagram.well-formed", "phyllo.crc.sent",
    "phyllo.chunk.leading-delimiter", "phyllo.chunk.empty-ignored",
    "phyllo.frame.over-limit.dropped", "phyllo.frame.bad-cobs", "phyllo.datagram.bad-length",
    "phyllo.crc.bad-dropped", "phyllo.crc.other-polynomial", "phyllo.resync.noise",
    "phyllo.resync.partial-chunk", "phyllo.message.echo", "phyllo.message.layer-type",
    "phyllo.message.topic-length-sent", "phyllo.endpoint.ping-counts", "phyllo.endpoint.reply",
]
# fault -> (stack, the outcomes among BROKEN_CASES that are not a pass)
BROKEN: dict[str, tuple[str, dict[str, Outcome]]] = {
    "none": ("reduced", {}),
    "crash-on-garbage": ("reduced", {
        "phyllo.frame.bad-cobs": F, "phyllo.datagram.bad-length": F,
        "phyllo.crc.bad-dropped": F, "phyllo.resync.noise": F, "phyllo.resync.partial-chunk": F,
    }),
    "no-resync": ("reduced", {
        "phyllo.frame.bad-cobs": F, "phyllo.datagram.bad-length": F,
        "phyllo.crc.bad-dropped": F, "phyllo.resync.noise": F, "phyllo.resync.partial-chunk": F,
    }),
    "layer-types": ("reduced", {"phyllo.message.layer-type": F}),
    "no-crc-check": ("reduced", {"phyllo.crc.bad-dropped": F,
                                 "phyllo.crc.other-polynomial": N}),
    "no-leading-delimiter": ("reduced", {"phyllo.chunk.leading-delimiter": N}),
    "no-length-check": ("minimal", {"phyllo.datagram.bad-length": F}),
    "long-chunks": ("minimal", {"phyllo.frame.over-limit.dropped": N}),
    "ping-stuck": ("minimal", {"phyllo.endpoint.ping-counts": F}),
    "topic-nibble": ("minimal", {"phyllo.message.topic-length-sent": F}),
    # The 0x00 the device writes before each answer ends its text, which reads as a chunk: the
    # answer has no delimiter of its own before it.
    "debug-prints": ("reduced", {"phyllo.frame.cobs": F, "phyllo.chunk.leading-delimiter": N}),
}


@pytest.mark.parametrize("fault", sorted(BROKEN))
@pytest_twisted.ensureDeferred
async def test_broken_device_fails_the_cases_that_catch_it(line, fault: str) -> None:
    address, make = line
    stack, failing = BROKEN[fault]
    device = make(str(BROKEN_DEVICES), "{path}", "--stack", stack, "--fault", fault)
    results = await run_each(device, Target("phyllo", address, stack=stack), BROKEN_CASES,
                             fresh=fault in ("no-resync", "crash-on-garbage"))
    expected = {case: all_pass(stack)[case] for case in BROKEN_CASES} | failing
    print(explained(results))
    assert outcomes(results) == expected, explained(results)


@pytest.mark.parametrize(("fault", "said"), [
    ("wrong-crc", "CRC is 0x"),
    ("wrong-delimiter", "got nothing"),
])
@pytest_twisted.ensureDeferred
async def test_a_device_no_chunk_of_which_reads_cannot_be_judged(line, fault: str,
                                                                 said: str) -> None:
    """Every chunk unreadable (a wrong CRC, chunks ended by 0x0a): no case can run, and the
    reason says what the kit saw."""
    address, make = line
    device = make(str(BROKEN_DEVICES), "{path}", "--stack", "reduced", "--fault", fault)
    await device.start()
    with pytest.raises(CouldNotRun) as raised:
        await run_cases(reactor, Target("phyllo", address, stack="reduced"), CATALOGUE)
    assert "phyllo device does not serve" in str(raised.value)
    assert said in str(raised.value), str(raised.value)


def test_the_driver_in_the_docs_is_the_example() -> None:
    """docs/conformance.md shows the example driver's `device()` as it is."""
    import re

    page = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    section = page[page.index("## Phyllo devices: the driver and results"):]
    shown = section[section.index("def device("):section.index("    return link") + 15]
    example = re.sub(r"  # noqa: .*", "", DRIVER.read_text(encoding="utf-8"))
    assert shown in example


@pytest_twisted.ensureDeferred
async def test_a_flooding_device_neither_hangs_nor_exhausts_the_kit() -> None:
    """A device that writes without end (64 KiB runs without a 0x00, then thousands of tiny
    chunks) and answers nothing: each case ends within its timeout, what the kit keeps stays
    bounded, and a run stops as "could not run". The device writes straight into one pty pair
    (no relay in this process, whose buffers would grow), as fast as the kit reads."""
    import os
    import subprocess
    import time
    import tracemalloc
    import tty

    from wireproto.conformance.runner import run_case

    master, slave = os.openpty()
    tty.setraw(slave)
    flood = subprocess.Popen(
        [sys.executable, str(BROKEN_DEVICES), "-", "--stack", "minimal", "--fault", "flood"],
        stdin=master, stdout=master, stderr=subprocess.DEVNULL)
    try:
        target = Target("phyllo", f"serial:{os.ttyname(slave)}", stack="minimal")
        tracemalloc.start()
        started = time.monotonic()
        with pytest.raises(CouldNotRun):
            await run_cases(reactor, target, CATALOGUE)
        by_id = {case.id: case for case in CATALOGUE.cases}
        for case_id in ("phyllo.message.echo", "phyllo.resync.garbage", "phyllo.endpoint.ping"):
            result = await run_case(reactor, target, CATALOGUE, by_id[case_id], "flood")
            assert result.outcome is F, result.reason
            assert result.duration < by_id[case_id].timeout + 15, result
            assert len(result.exchanges) <= 500
        assert time.monotonic() - started < 90
        peak_mib = tracemalloc.get_traced_memory()[1] / 2**20
        # What a case keeps of a device's chunks is bounded (it kept every one: 9 MiB here,
        # and more the faster the machine reads).
        assert peak_mib < 4, f"the kit held up to {peak_mib:.1f} MiB"
    finally:
        tracemalloc.stop()
        flood.kill()
        flood.wait(10)
        os.close(master)
        os.close(slave)



def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("carrier", ["tcp", "websocket"])
@pytest_twisted.ensureDeferred
async def test_the_kit_reaches_a_device_over_tcp_and_websocket(line, carrier: str) -> None:
    """The same cases over a TCP stream (each connection a stack of its own) and a WebSocket
    (one binary message a chunk): wireproto's stack passes them; the cases that need bytes
    outside a chunk are information (not applicable) on a WebSocket."""
    _address, make = line
    port = free_port()
    websocket = carrier == "websocket"
    device = make(str(DRIVER), f"tcp:{port}:interface=127.0.0.1", "--stack", "reduced",
                  *(["--websocket"] if websocket else []))
    await device.start()
    address = (f"ws://127.0.0.1:{port}/phyllo" if websocket
               else f"tcp:host=127.0.0.1:port={port}")
    results = await run_cases(reactor, Target("phyllo", address, stack="reduced"), CATALOGUE)
    expected = all_pass("reduced")
    if websocket:
        expected |= dict.fromkeys(("phyllo.chunk.leading-delimiter", "phyllo.chunk.empty-ignored",
                                   "phyllo.chunk.split-writes", "phyllo.frame.over-limit",
                                   "phyllo.resync.partial-chunk", "phyllo.resync.garbage"), INFO)
    assert outcomes(results) == expected, explained(results)


@pytest_twisted.ensureDeferred
async def test_a_board_that_boots_as_its_port_opens_is_judged_once_it_is_back(line) -> None:
    """A correct device that reads nothing for its first 2 s (an Arduino resets when its port
    opens), started afresh for each case: every case waits for it, and passes."""
    address, make = line
    device = make(str(BROKEN_DEVICES), "{path}", "--stack", "reduced", "--fault", "boots-slowly")
    from wireproto.conformance.runner import run_case

    ids = ["phyllo.message.echo", "phyllo.crc.bad-dropped", "phyllo.endpoint.ping-counts"]
    target = Target("phyllo", address, stack="reduced")
    results = []
    for case in CATALOGUE.select(ids):
        await device.stop()
        await device.start()  # no liveness check before the case: the case itself waits
        results.append(await run_case(reactor, target, CATALOGUE, case, "boot"))
    assert outcomes(results) == dict.fromkeys(ids, P), explained(results)


@pytest_twisted.ensureDeferred
async def test_a_paused_device_fails_within_the_timeout_and_is_judged_again_once_resumed(
        line) -> None:
    """SIGSTOP the device: a case fails within its timeout, saying the device did not echo;
    SIGCONT: the next case passes on the same device."""
    import os
    import signal

    from wireproto.conformance.runner import run_case

    address, make = line
    device = make(str(DRIVER), "serial:{path}", "--stack", "minimal")
    await device.start()
    assert device.process is not None and device.process.pid is not None
    target = Target("phyllo", address, stack="minimal")
    (echo,) = CATALOGUE.select(["phyllo.message.echo"])
    os.kill(device.process.pid, signal.SIGSTOP)
    try:
        paused = await run_case(reactor, target, CATALOGUE, echo, "paused")
    finally:
        os.kill(device.process.pid, signal.SIGCONT)
    assert paused.outcome is F and "did not echo within 5 s" in paused.reason, paused.reason
    assert paused.duration < echo.timeout + 2
    resumed = await run_case(reactor, target, CATALOGUE, echo, "resumed")
    assert resumed.outcome is P, resumed.reason


def test_each_case_names_a_decision_that_docs_phyllo_has() -> None:
    from tests.test_doc_contents import anchor

    text = (ROOT / "docs" / "phyllo.md").read_text(encoding="utf-8")
    anchors = {anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    assert len(IDS) == len(set(IDS)) and all(case_id.startswith("phyllo.") for case_id in IDS)
    for case in CATALOGUE.cases:
        if case.decision:
            page, _, target = case.decision.partition("#")
            assert page == "docs/phyllo.md" and target in anchors, case.id
