"""bench/last_values.py finds the same last values with 10 and with 100 000 kept topics, for every
kind of subscribe it times. No timing assertions: it runs in --quick mode."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "last_values.py"
spec = importlib.util.spec_from_file_location("bench_last_values", BENCH)
last_values = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = last_values
spec.loader.exec_module(last_values)


def test_every_subscribe_is_measured_with_both_counts_of_kept_topics():
    lines: list[str] = []
    best = last_values.run(last_values.parse_args(["--quick"]), out=lines.append)
    assert set(best) == set(last_values.ROWS)
    for figures in best.values():
        assert set(figures) == {10, 100_000}
        assert all(0 < value < float("inf") for value in figures.values())
    assert any(line.startswith("goal: literal first level, no match") for line in lines), lines


def test_a_subscribe_that_delivers_the_wrong_values_fails_the_run():
    broker = last_values.Broker(10)
    broker.check("sensors/7/+", ["sensors/7/t"])
    with pytest.raises(last_values.BenchError, match="not \\['sensors/8/t'\\]"):
        broker.check("sensors/7/+", ["sensors/8/t"])
