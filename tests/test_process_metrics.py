"""The process metrics (prometheus_client's process collector) and ``wireproto_build_info`` of a
real `wireproto serve`, one process and ``--workers 2``: scraped at the URL its banner prints,
parsed with prometheus_client's parser, and checked against each process's own /proc."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.web.client import Agent

from tests.brokers import LOCAL
from tests.support import sleep, wait_for
from tests.test_cli import Child
from tests.test_metrics import BodyReader, Scrape, scrape
from wireproto import __version__

WIREPROTO = os.path.join(os.path.dirname(sys.executable), "wireproto")
PAGE_LINE = re.compile(r"^wireproto: status page at (http://\S+/), metrics at (http://\S+)$")

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"),
                                reason="the process collector reads /proc")


def started_at(pid: int) -> float:
    """When `pid` started, in seconds since the epoch, as /proc says."""
    with open("/proc/stat") as stat:
        boot = next(float(line.split()[1]) for line in stat if line.startswith("btime "))
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return boot + float(fields[19]) / os.sysconf("SC_CLK_TCK")


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def check_process(page: Scrape, pid: int, **labels: str) -> None:
    """The process metrics labelled `labels` are `pid`'s."""
    assert page.value("process_start_time_seconds", **labels) == pytest.approx(
        started_at(pid), abs=0.02)
    # Descriptors come and go with connections; the supervisor holds far fewer than a worker.
    assert abs(page.value("process_open_fds", **labels) - open_descriptors(pid)) <= 6
    assert page.value("process_max_fds", **labels) >= 256
    assert page.value("process_resident_memory_bytes", **labels) > 10_000_000
    assert page.value("process_virtual_memory_bytes", **labels) > page.value(
        "process_resident_memory_bytes", **labels)
    assert page.value("process_cpu_seconds_total", **labels) > 0


async def stop(child: Child) -> None:
    if child.process.poll() is None:
        child.process.send_signal(signal.SIGTERM)
    assert await child.exit_code(30) == 0, child.output()


async def check_status_page(url: str, kind: str = "text/html") -> None:
    """`url` answers 200 with a body of type `kind` (the status page, by default)."""
    response = await wait_for(Agent(reactor).request(b"GET", url.encode()))
    reader = BodyReader()
    response.deliverBody(reader)
    body = await wait_for(reader.done)
    assert response.code == 200, url
    assert kind in response.headers.getRawHeaders(b"content-type")[0].decode(), url
    assert body and (kind != "text/html" or b"<html" in body.lower())


@pytest_twisted.ensureDeferred
async def test_one_process_serves_its_own_process_metrics_and_version() -> None:
    child = Child(WIREPROTO, "serve", "--listen", f"websmq+ws@tcp:0:{LOCAL}",
                  "--listen", f"websmq+length32@tcp:0:{LOCAL}")
    try:
        urls = await child.line(PAGE_LINE, 60)
        await child.line(re.compile(r"^wireproto: ready; Ctrl-C stops$"))
        await check_status_page(urls.group(1))
        page = await scrape(urls.group(2), "")
        assert page.status == 200, page.text
        check_process(page, child.process.pid)
        assert page.value("wireproto_build_info", version=__version__) == 1
        assert page.families["process_cpu_seconds"].type == "counter"
        assert page.families["process_resident_memory_bytes"].type == "gauge"
        assert page.families["wireproto_build_info"].type == "gauge"
        assert all("worker" not in labels for labels in page.labels("process_open_fds"))
    finally:
        await stop(child)


@pytest.mark.timeout(180)
@pytest_twisted.ensureDeferred
async def test_each_worker_and_the_supervisor_have_their_own_process_metrics() -> None:
    from tests.cluster.conftest import _need_nats_server

    _need_nats_server()
    child = Child(WIREPROTO, "serve", "--workers", "2", "--listen", f"websmq+ws@tcp:0:{LOCAL}")
    try:
        urls = await child.line(PAGE_LINE, 60)
        pids = await child.line(re.compile(r"^wireproto: 2 workers, pids (\d+) (\d+)$"))
        await child.line(re.compile(r"^wireproto: ready; Ctrl-C stops$"))
        workers = {f"{os.uname().nodename}/worker{index}": int(pid)
                   for index, pid in enumerate(pids.groups())}
        supervisor = f"{os.uname().nodename}/supervisor"
        await check_status_page(urls.group(1))
        deadline = time.monotonic() + 30
        while True:  # until each worker hears the other, and answers the scrape
            page = await scrape(urls.group(2), "")
            found = {labels["worker"] for labels in page.labels("process_start_time_seconds")}
            if found == {*workers, supervisor}:
                break
            assert time.monotonic() < deadline, page.text
            await sleep(0.2)
        for name, pid in [*workers.items(), (supervisor, child.process.pid)]:
            check_process(page, pid, worker=name)
        # Sums where they mean something; none for start times and limits.
        for name in ("process_resident_memory_bytes", "process_open_fds",
                     "process_cpu_seconds_total"):
            each = sum(page.value(name, worker=worker) for worker in [*workers, supervisor])
            assert page.value(name, worker="total") == pytest.approx(each)
        for name in ("process_start_time_seconds", "process_max_fds", "wireproto_build_info"):
            assert "total" not in {labels["worker"] for labels in page.labels(name)}
        # The supervisor's version too (the one it runs, which a worker it restarted after an
        # upgrade on disk may not): a worker serves it, as its process metrics.
        assert {labels["worker"]: labels["version"] for labels in page.labels(
            "wireproto_build_info")} == dict.fromkeys([*workers, supervisor], __version__)
        # A process's own scrape has its own, unlabelled.
        own = await scrape(urls.group(2), "?scope=process")
        started = own.value("process_start_time_seconds")
        assert any(started == pytest.approx(started_at(pid), abs=0.02)
                   for pid in workers.values())
    finally:
        await stop(child)
