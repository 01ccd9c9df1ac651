"""bench/cluster.py delivers every message through one process, through --workers 2 and
through two processes given half the clients each, answers every latency probe and RPC
across NATS, and judges its three goals. No timing assertions: it runs in --quick mode."""

import importlib.util
import sys
from pathlib import Path

import pytest_twisted

from tests.cluster.conftest import _need_nats_server
from tests.support import wait_for

BENCH = Path(__file__).resolve().parent.parent / "bench" / "cluster.py"
spec = importlib.util.spec_from_file_location("bench_cluster", BENCH)
cluster = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = cluster
spec.loader.exec_module(cluster)


@pytest_twisted.ensureDeferred
async def test_every_system_delivers_and_every_figure_is_measured():
    _need_nats_server()
    lines: list[str] = []
    results = await wait_for(cluster.run(cluster.parse_args(["--quick"]), out=lines.append),
                             timeout=120)
    assert set(results["throughput"]) == {"1 process", "--workers 2", "2 processes, even"}, lines
    assert all(rate > 0 for rate in results["throughput"].values())
    assert set(results["latency"]) == {"publish, same process", "publish, across NATS",
                                       "RPC, same process", "RPC, across NATS"}
    assert any(line.startswith("--workers 2 / 1 process:") for line in lines)
    # The three goals, each judged and printed in the same run.
    assert set(results["goals"]) == {"throughput", "cpu", "latency"}
    for key, (what, _, _) in cluster.GOALS.items():
        measured, met = results["goals"][key]
        assert measured > 0
        assert [line for line in lines if line.startswith(what)
                and line.endswith("met" if met else "MISSED")], (key, lines)
