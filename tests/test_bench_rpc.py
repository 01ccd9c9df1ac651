"""The RPC benchmark does real round trips on every row, and says so in a well-formed table.

No timing assertions: speed is bench/rpc.py's business. This runs it with tiny counts.
"""

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
import pytest_twisted

from tests.support import wait_for

BENCH = Path(__file__).resolve().parent.parent / "bench" / "rpc.py"
spec = importlib.util.spec_from_file_location("bench_rpc", BENCH)
rpc = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = rpc  # dataclasses look their module up there
spec.loader.exec_module(rpc)

NUMBER = r"[\d,]+(?:\.\d+)?"


@pytest_twisted.ensureDeferred
async def test_every_row_does_every_round_trip_and_prints_a_table():
    cpus_before = os.sched_getaffinity(0)
    lines: list[str] = []
    options = rpc.parse_args(["--requests", "60", "--warmup", "5", "--rounds", "3",
                              "--payload-size", "100"])
    report = await wait_for(rpc.run(options, out=lines.append), timeout=60)

    assert os.sched_getaffinity(0) == cpus_before  # the placement is undone
    assert list(report.results) == [row.name for row in rpc.ROWS]
    for result in report.results.values():
        # run() raised BenchError had any reply been missing, late or not the one expected
        assert len(result.samples) == 60
        assert all(sample > 0 for sample in result.samples)
        assert result.seconds > 0 and result.server_cpu >= 0
    sizes = {name: result.request_size for name, result in report.results.items()}
    # the bare echo moves the very bytes of the binary UBRE request
    assert sizes["bare echo"] == sizes["ubre binary (raw client)"] == 7 + 1 + 100

    table = "\n".join(lines)
    assert lines == report.lines
    for name in report.results:
        row = next(line for line in lines if line.startswith(name + " "))
        cells = row[len(name):].split()
        assert len(cells) == 7, row
        assert all(re.fullmatch(NUMBER, cell) for cell in cells[:6]), row
        assert re.fullmatch(r"\d+\.\d\dx", cells[6]), row
    assert re.search(r"ubre binary \(raw client\): p50 \d+\.\d\dx bare echo \(goal at most"
                     r" 1\.5x\)  (ok|MISSED)", table)
    assert re.search(r"ubre binary \(UbreClient\): p50 \d+\.\d\dx bare echo \(goal at most"
                     r" 1\.25x\)  (ok|MISSED)", table)
    assert re.search(r"ubre json lines \(UbreClient\): p50 \d+\.\d\dx bare echo \(goal at"
                     r" most 1\.35x\)  (ok|MISSED)", table)
    assert "placement same-core" in table


@pytest_twisted.ensureDeferred
async def test_a_row_fails_when_its_replies_are_not_the_ones_its_server_gives():
    echo, ubre = rpc.start_server("echo"), rpc.start_server("ubre")
    body = rpc.body_of(16)
    # Each raw row pointed at the other row's server: the replies are well framed, but wrong.
    crossed = [
        rpc.RawCaller("echo expected", ubre.addresses["ubre over length32"], body, rpc._echoed),
        rpc.RawCaller("ubre expected", echo.addresses["echo over length32"], body,
                      rpc._ubre_success(body)),
    ]
    try:
        for caller in crossed:
            await caller.open()
            with pytest.raises(rpc.BenchError, match=rf"{caller.name}: reply 0 is b'"):
                await wait_for(caller.run(3, []), timeout=10)
            await caller.close()
    finally:
        echo.stop()
        ubre.stop()


def test_a_server_that_cannot_start_says_so():
    with pytest.raises(rpc.BenchError, match="the nonsense server did not start"):
        rpc.start_server("nonsense", timeout=10)


def test_options_are_checked():
    with pytest.raises(SystemExit):
        rpc.parse_args(["--rows", "no such row"])
    with pytest.raises(SystemExit):
        rpc.parse_args(["--requests", "0"])
    assert rpc.parse_args(["--requests", "3", "--rounds", "9"]).rounds == 3
