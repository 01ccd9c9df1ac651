"""bench/replay.py moves every captured message, in order, for each workload and each kind of
replay, and prints a row for each. No timing assertions: it runs in --quick mode."""

import importlib.util
import sys
from pathlib import Path

import pytest
import pytest_twisted

from tests.support import wait_for

BENCH = Path(__file__).resolve().parent.parent / "bench" / "replay.py"
spec = importlib.util.spec_from_file_location("bench_replay", BENCH)
replay = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = replay  # dataclasses look their module up there
spec.loader.exec_module(replay)


@pytest_twisted.ensureDeferred
async def test_every_row_moves_every_message_and_prints_a_table():
    lines: list[str] = []
    rows = await wait_for(replay.run(replay.parse_args(["--quick"]), out=lines.append),
                          timeout=240)
    assert [(row.workload, row.kind) for row in rows] == [
        (workload, kind) for workload in replay.WORKLOADS for kind in replay.KINDS]
    for row in rows:
        # judge() raised BenchError had any message been lost, added or out of order
        assert row.messages == len(replay.gaps(row.workload, 0.5, 40))
        assert row.recorded > 0 and row.achieved > 0
        assert any(line.split()[:3] == [row.workload, row.kind, str(row.messages)]
                   for line in lines), lines
    assert lines[-1].startswith("goal: pace within 10% at speed 1: worst ")


def test_a_lost_or_reordered_message_fails_the_run():
    times = [0, 10**8, 2 * 10**8]
    row = replay.Row("steady", "command")
    arrivals = [(0.0, b"0"), (0.1, b"2"), (0.2, b"1")]
    with pytest.raises(replay.BenchError, match="3 messages arrived, not the 3 recorded"):
        replay.judge(row, arrivals, times)
    with pytest.raises(replay.BenchError, match="2 messages arrived"):
        replay.judge(row, arrivals[:2], times)
    judged = replay.judge(row, [(0.0, b"0"), (0.1, b"1"), (0.2, b"2")], times)
    assert judged.messages == 3 and judged.pace == pytest.approx(1.0)
