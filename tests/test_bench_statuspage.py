"""The status page's benchmark and its load maker (bench/statuspage.py, bench/_connections.py).

The load maker opens the connections it says, each subscribed as its layout says, and stops
when told (stdin closed, SIGTERM), at its deadline, or when the broker goes; the benchmark runs
in --quick mode and prints its tables. No timing assertions: speed is the benchmark's business.
"""

from __future__ import annotations

import importlib.util
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
import pytest_twisted

from tests.admin.http import http
from tests.cluster.test_workers import WIREPROTO
from tests.support import sleep
from tests.test_cli import Child

BENCH = Path(__file__).resolve().parent.parent / "bench"
spec = importlib.util.spec_from_file_location("bench_connections", BENCH / "_connections.py")
loadmaker = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = loadmaker
spec.loader.exec_module(loadmaker)

CONNECTIONS = 40
TOPICS = 10


class Served:
    def __init__(self, child: Child) -> None:
        self.child = child
        self.base = next(m[1] for m in map(re.compile(r"wireproto: status page at (\S+)/").match,
                                           child.stdout) if m)
        self.targets = loadmaker.targets(child.stdout)


@pytest_twisted.async_yield_fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    config = tmp_path / "wireproto.toml"
    config.write_text(loadmaker.BROKER_CONFIG)
    child = Child(WIREPROTO, "serve", "--config", str(config))
    try:
        await child.line(re.compile(r"wireproto: ready"), 30)
        yield Served(child)
    finally:
        child.kill()


def load_maker(served: Served, *options: str) -> Child:
    return Child(sys.executable, str(BENCH / "_connections.py"), *served.targets,
                 "--connections", str(CONNECTIONS), "--topics", str(TOPICS), "--marked", "3",
                 "--pattern-every", "4", "--rate", "50", *options, hold_stdin=True)


async def ready(load: Child) -> dict:
    return orjson.loads((await load.line(re.compile(r"ready (\{.*\})$"), 60))[1])


async def sessions(served: Served) -> list[dict]:
    """Every session of the broker (a plain list before the API paged, then a page's items)."""
    answer = (await http(served.base, "/api/sessions?limit=1000")).json
    return answer["items"] if isinstance(answer, dict) else answer


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Ask `check()` every 0.1 s until it says True; fail after `timeout` seconds."""
    for _ in range(int(timeout / 0.1)):
        if await check():
            return
        await sleep(0.1)
    raise TimeoutError(f"condition not met within {timeout} s: {check}")


@pytest_twisted.ensureDeferred
async def test_every_connection_is_open_and_subscribed_as_its_layout_says(
    served: Served,
) -> None:
    load = load_maker(served)
    try:
        summary = await ready(load)
        assert summary["connections"] == CONNECTIONS and summary["marked"] == 3
        assert summary["by_kind"] == {"websmq+ws": 10, "websmq+length32": 10, "ubre+ws": 10,
                                      "ubre+lines": 10}
        assert summary["patterns"] == {"sensors/+": 2, "plant/#": 2, "#": 1}
        options = SimpleNamespace(**{name: summary[name]
                                     for name in ("topics", "marked", "pattern_every")})
        targets = [loadmaker.Target.parse(target) for target in served.targets]
        expected = sorted((targets[n % 4].kind, tuple(sorted(loadmaker.layout(n, targets,
                                                                              options))))
                          for n in range(CONNECTIONS))

        async def shown() -> list:
            return sorted((f"{s['protocol']}+{s['transport']}", tuple(sorted(s["subscriptions"])))
                          for s in await sessions(served))

        async def as_laid_out() -> bool:  # the last subscribes may be read after the ready line
            return await shown() == expected

        await until(as_laid_out)

        async def publishing() -> bool:  # connection 0, on the topics in turn
            return (await http(served.base, "/api/status")).json["broker"]["published"] > 5

        await until(publishing)
    finally:
        load.process.stdin.close()
    assert await load.exit_code(20) == 0, load.output()


@pytest.mark.parametrize("how", ["stdin", "sigterm"])
@pytest_twisted.ensureDeferred
async def test_the_load_maker_closes_its_connections_when_told(served: Served, how: str) -> None:
    load = load_maker(served)
    await ready(load)
    if how == "stdin":
        load.process.stdin.close()
    else:
        load.process.send_signal(signal.SIGTERM)
    assert await load.exit_code(20) == 0, load.output()

    async def none_left() -> bool:
        return not await sessions(served)

    await until(none_left)


@pytest_twisted.ensureDeferred
async def test_the_load_maker_stops_at_its_deadline_and_when_the_broker_goes(
    served: Served,
) -> None:
    late = load_maker(served, "--deadline", "3")
    await ready(late)
    assert await late.exit_code(20) == 3, late.output()
    assert "deadline of 3 s passed" in late.output()

    orphan = load_maker(served)
    await ready(orphan)
    served.child.process.send_signal(signal.SIGKILL)
    assert await orphan.exit_code(20) == 1, orphan.output()
    assert "closed" in orphan.output()


def test_the_benchmark_measures_the_api_and_the_page_in_quick_mode() -> None:
    import subprocess

    done = subprocess.run([sys.executable, str(BENCH / "statuspage.py"), "--quick"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("200 connections (50 ubre+lines, 50 ubre+ws, ")
               for line in lines), lines
    row = next(line for line in lines if line.startswith("/api/status "))
    assert re.search(r" \d+ / \d+ +[\d,]+ +\d+\.\d +\d+\.\d +-?\d+\.\d$", row), row
    page = "\n".join(lines)
    assert re.search(r"poll to painted +\d+ +\d+ +\d+", page) or "the page: not measured" in page
