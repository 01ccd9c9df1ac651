"""The status page at 2,000 connections: what one poll of ``/api/status`` costs (bytes, time,
the broker's CPU) and how long the page takes to show it in headless Chromium, side by side.

    .venv/bin/python bench/statuspage.py [--connections N] [--topics M] [--polls P]
                                         [--seconds S] [--quick] [--markdown]

A real broker (`wireproto serve` on 127.0.0.1: WEBSMQ over WebSocket and over length32, UBRE over
WebSocket and over lines), and N connections to it from one load maker process
(bench/_connections.py), subscribed to M topics, some of them to patterns, while one of them
publishes 20 messages a second.

1. **The API.** Each query in turn (A B C A B C ...), P times, one request at a time: the bytes of
   the answer, its wall clock time at the client (p50, p95), and the broker's CPU per request
   (its CPU time from /proc over the requests, less what it spends with the load alone over as
   long). The queries: `/api/status` as the broker answers it without parameters, and, when the
   broker pages its lists (its answer has "pages"), as the page asks for it (`?limit=50`), then
   with a filter and a sort.
2. **The page.** Debian's Chromium (Playwright), the page at / for S seconds, polling once a
   second as it does. Per update: from the page's fetch of /api/status to the first change of
   its document after the answer ("poll to DOM", a MutationObserver: the page's script), and to
   the frame painted after that change ("poll to painted", requestAnimationFrame then a task:
   style, layout and paint too); the page's own measure "wireproto-update" when it records one;
   the share of the time its main thread spent in long tasks (over 50 ms); ten clicks on the
   page's title, from the input event to the next frame painted; the bytes of each poll's
   answer (resource timing); the page's height and its count of elements.

`--markdown` prints the tables as docs/performance.md has them ("The status page at 2,000
connections"). Every wait is bounded, and the load maker stops itself at a deadline. A run whose
broker does not show every connection, or whose page shows no update, fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:  # for bench/'s shared harness
    sys.path.append(str(BENCH))
import _connections as connections  # noqa: E402
import _harness as harness  # noqa: E402
from _harness import BenchError  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = 50
CHROMIUM = os.environ.get("WIREPROTO_CHROMIUM", "/usr/bin/chromium")
# As tests/browser/conftest.py launches it: no network, no display, as root.
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--disable-dev-shm-usage"]
PAGE_AT = re.compile(r"^wireproto: status page at (?P<base>http://[^/\s]+)/")


# -- the broker and its load ---------------------------------------------------------------------


class Child:
    """A process whose output lines are read by a thread, so waiting for one is bounded."""

    def __init__(self, name: str, command: list[str], *, stdin: Any = subprocess.DEVNULL) -> None:
        self.name = name
        self.process = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, cwd=BENCH.parent)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, name=f"{name} output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.process.pid

    def line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next(filter(None, map(pattern.match, list(self.lines))), None)
            if found is not None:
                return found
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        said = "\n    ".join(self.lines[-30:]) or "(nothing)"
        raise BenchError(f"{self.name}: no {pattern.pattern!r} line within {timeout:g} s "
                         f"(exit status {self.process.poll()}); it said:\n    {said}")

    def stop(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()  # the load maker stops when its stdin closes
        elif self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


@dataclass
class Running:
    broker: Child
    base: str  # http://127.0.0.1:PORT
    load: dict[str, Any] = field(default_factory=dict)  # the load maker's ready line


def wireproto_command() -> list[str]:
    """The `wireproto` script beside this Python (as a user runs it), else ``python -m``."""
    script = Path(sys.executable).parent / "wireproto"
    return [str(script)] if script.exists() else [sys.executable, "-m", "wireproto"]


@contextmanager
def loaded_broker(options: argparse.Namespace) -> Iterator[Running]:
    """A `wireproto serve` with `options.connections` connections from the load maker."""
    # The broker inherits the limit; each connection is one file on either side.
    connections.raise_open_files(options.connections + 256)
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-status-")))
        config = folder / "wireproto.toml"
        config.write_text(connections.BROKER_CONFIG)
        broker = Child("wireproto serve", [*wireproto_command(), "serve", "--config", str(config)])
        stack.callback(broker.stop)
        broker.line(re.compile(r"^wireproto: ready"), 30)
        targets = connections.targets(broker.lines)
        base = next(m["base"] for m in map(PAGE_AT.match, broker.lines) if m)
        load = Child("load maker", [
            sys.executable, str(BENCH / "_connections.py"), *targets,
            "--connections", str(options.connections), "--topics", str(options.topics),
            "--rate", str(options.rate), "--deadline", str(options.deadline)],
            stdin=subprocess.PIPE)
        stack.callback(load.stop)
        ready = load.line(re.compile(r"^ready (?P<summary>\{.*\})$"), 180)
        running = Running(broker, base, json.loads(ready["summary"]))
        wait_for_sessions(running.base, options.connections, timeout=60)
        yield running


def get(base: str, path: str) -> tuple[bytes, float]:
    """The body of GET `path`, and the seconds it took."""
    request = urllib.request.Request(base + path, headers={"x-wireproto-page": "1"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    return body, time.perf_counter() - started


def session_count(status: dict[str, Any]) -> int:
    """Every session of the broker: the paged total, or the whole list."""
    if "pages" in status:
        return int(status["pages"]["sessions"]["total"])
    return len(status["sessions"])


def wait_for_sessions(base: str, count: int, timeout: float) -> None:
    deadline, seen = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        seen = session_count(json.loads(get(base, "/api/status")[0]))
        if seen == count:
            return
        time.sleep(0.5)
    raise BenchError(f"the broker shows {seen} sessions, not {count}, after {timeout:g} s")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as file:
        fields = file.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


# -- 1. the API -----------------------------------------------------------------------------------


@dataclass
class Query:
    name: str
    path: str
    rows: str = ""  # what the answer held, "sessions / topics"
    sizes: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    cpu: float = 0.0  # the broker's CPU seconds over all its requests


def queries(running: Running, paged: bool) -> list[Query]:
    found = [Query("status, no parameters", "/api/status")]
    if paged:
        found += [
            Query(f"status, the page's ?limit={PAGE_SIZE}", f"/api/status?limit={PAGE_SIZE}"),
            Query("... and a filter (q=needle)",
                  f"/api/status?limit={PAGE_SIZE}&sessions.q=needle&topics.q=needle"),
            Query("... and a sort (-received)",
                  f"/api/status?limit={PAGE_SIZE}&sessions.sort=-received&topics.sort=-rate"),
        ]
    return found


def check(query: Query, status: dict[str, Any], running: Running) -> None:
    """The answer shows every connection, and a page the rows it should."""
    connections = running.load["connections"]
    if session_count(status) != connections:
        raise BenchError(f"{query.path}: {session_count(status)} sessions, not {connections}")
    sessions, topics = len(status["sessions"]), len(status["topics"])
    if "pages" in status:
        page = status["pages"]["sessions"]
        if "q=needle" in query.path and page["matched"] != running.load["marked"]:
            raise BenchError(f"{query.path}: {page['matched']} sessions match, not "
                             f"{running.load['marked']}")
        if sessions != min(page["limit"], page["matched"]):
            raise BenchError(f"{query.path}: {sessions} rows of a page of {page['limit']}")
    elif topics < running.load["topics"]:
        raise BenchError(f"{query.path}: {topics} topics, not at least {running.load['topics']}")
    query.rows = f"{sessions:,} / {topics:,}"


def measure_api(running: Running, polls: int, out: Callable[[str], Any]) -> list[Query]:
    first = json.loads(get(running.base, f"/api/status?limit={PAGE_SIZE}")[0])
    shown = queries(running, paged="pages" in first)
    if "pages" not in first:
        out(f"/api/status?limit={PAGE_SIZE}: not paged (no \"pages\" in the answer): only the "
            "plain status is measured")
    pid = running.broker.pid
    # The broker's CPU with the load alone, a second a second, to take from each request's.
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(2.0)
    idle_share = (cpu_seconds(pid) - before) / (time.monotonic() - started)
    for query in shown:  # once each, untimed: the checks, and every path warm
        body, _ = get(running.base, query.path)
        check(query, json.loads(body), running)
    for _ in range(polls):
        for query in shown:
            before = cpu_seconds(pid)
            body, seconds = get(running.base, query.path)
            query.cpu += cpu_seconds(pid) - before - idle_share * seconds
            query.sizes.append(len(body))
            query.seconds.append(seconds)
    return shown


# -- 2. the page ----------------------------------------------------------------------------------

# Set up in the page before its own script runs (Playwright's init script, which the page's
# CSP does not apply to): the times of each poll of /api/status, of the page's first change
# after its answer, and of the frame painted after that; the clicks; the long tasks; the
# page's own "wireproto-update" measures, kept even if the page clears them.
INSTRUMENT = """
(() => {
  const seen = { updates: [], clicks: [], longTasks: [], measures: [] };
  window.__wireprotoBench = seen;
  let waiting = null;
  const painted = (record, name) =>
    requestAnimationFrame(() => setTimeout(() => { record[name] = performance.now(); }, 0));
  const changes = new MutationObserver(() => {
    if (!waiting || waiting.answered === undefined) return;
    const update = waiting;
    waiting = null;
    update.changed = performance.now();
    painted(update, "painted");
  });
  const realFetch = window.fetch.bind(window);
  window.fetch = async (input, init) => {
    const url = String(input instanceof Request ? input.url : input);
    if (!url.includes("/api/status")) return realFetch(input, init);
    const update = { start: performance.now(), url };
    seen.updates.push(update);
    waiting = update;
    const response = await realFetch(input, init);
    update.answered = performance.now();
    return response;
  };
  addEventListener("DOMContentLoaded", () => changes.observe(document.documentElement,
    { subtree: true, childList: true, characterData: true, attributes: true }));
  addEventListener("pointerdown", (event) => {
    const click = { input: event.timeStamp, handled: performance.now() };
    seen.clicks.push(click);
    painted(click, "painted");
  }, true);
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) seen.longTasks.push(entry.duration);
  }).observe({ type: "longtask", buffered: true });
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      if (entry.name === "wireproto-update") seen.measures.push(entry.duration);
    }
  }).observe({ type: "measure", buffered: true });
})();
"""

COLLECT = """
(started) => {
  const seen = window.__wireprotoBench;
  const polls = performance.getEntriesByType("resource")
    .filter((entry) => entry.name.includes("/api/status") && entry.startTime >= started);
  return {
    updates: seen.updates.filter((u) => u.start >= started && u.painted !== undefined)
      .map((u) => [u.changed - u.start, u.painted - u.start, u.url]),
    clicks: seen.clicks.filter((c) => c.painted !== undefined)
      .map((c) => [c.handled - c.input, c.painted - c.input]),
    longTasks: seen.longTasks,
    measures: seen.measures,
    pollBytes: polls.map((entry) => entry.decodedBodySize),
    height: document.documentElement.scrollHeight,
    elements: document.getElementsByTagName("*").length,
    now: performance.now(),
  };
}
"""


@dataclass
class PageFigures:
    updates: list[tuple[float, float]]  # ms: poll to DOM, poll to painted
    measures: list[float]  # ms, the page's own "wireproto-update"
    clicks: list[tuple[float, float]]  # ms: input to handled, input to painted
    busy: float  # the share of the window in long tasks
    poll_bytes: list[int]
    poll_url: str
    height: int
    elements: int
    seconds: float


def measure_page(running: Running, seconds: float, clicks: int) -> PageFigures:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=LAUNCH_ARGS)
        try:
            page = chromium.new_context(viewport={"width": 1100, "height": 900}).new_page()
            page.set_default_timeout(30_000)
            page.add_init_script(INSTRUMENT)
            page.goto(running.base + "/")
            page.wait_for_selector("#broker:not([hidden])")
            # Every connection shown (in the count, thousands separators aside).
            page.wait_for_function(
                "(count) => document.body.innerText.replace(/[,\\u202f\\u00a0 ]/g, '')"
                ".includes(count)", arg=str(running.load["connections"]))
            page.evaluate("() => performance.setResourceTimingBufferSize(10000)")
            started = page.evaluate("() => performance.now()")
            box = page.locator("h1").first.bounding_box()
            if box is None:
                raise BenchError("the page has no title to click")
            # Clicks spread over the window, at moments unrelated to the polls.
            pause = seconds / (clicks + 1)
            for _ in range(clicks):
                page.wait_for_timeout(pause * 1000)
                page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.wait_for_timeout(pause * 1000)
            seen = page.evaluate(COLLECT, started)
        finally:
            chromium.close()
    window = (seen["now"] - started) / 1000
    if len(seen["updates"]) < max(2, int(window / 3)):
        raise BenchError(f"the page showed {len(seen['updates'])} updates in {window:.0f} s")
    return PageFigures(
        updates=[(changed, painted) for changed, painted, _ in seen["updates"]],
        measures=seen["measures"], clicks=[tuple(click) for click in seen["clicks"]],
        busy=sum(seen["longTasks"]) / 1000 / window, poll_bytes=seen["pollBytes"],
        poll_url=seen["updates"][-1][2].split("/api/", 1)[1], height=seen["height"],
        elements=seen["elements"], seconds=window)


# -- the report -----------------------------------------------------------------------------------


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def report(running: Running, shown: list[Query], page: PageFigures | None, why_no_page: str,
           options: argparse.Namespace, out: Callable[[str], Any]) -> None:
    load = running.load
    kinds = ", ".join(f"{count:,} {kind}" for kind, count in sorted(load["by_kind"].items()))
    patterns = ", ".join(f"{count} {name}" for name, count in sorted(load["patterns"].items()))
    table = options.markdown
    out(f"{load['connections']:,} connections ({kinds}); {load['topics']:,} topics, "
        f"patterns {patterns}; {load['rate']:g} publishes a second; opened in "
        f"{load['seconds']:.1f} s; load average {os.getloadavg()[0]:.2f} on "
        f"{os.cpu_count()} CPUs")
    out("")
    head = ("query", "rows (sessions / topics)", "bytes", "p50 ms", "p95 ms", "broker CPU ms")
    rows = [(q.path, q.rows, f"{statistics.median(q.sizes):,.0f}",
             f"{statistics.median(q.seconds) * 1e3:.1f}",
             f"{percentile(q.seconds, 0.95) * 1e3:.1f}",
             f"{q.cpu / len(q.seconds) * 1e3:.1f}") for q in shown]
    _table(head, rows, table, out)
    out("")
    if page is None:
        out(f"the page: not measured ({why_no_page})")
        return
    def spread(values: list[float]) -> tuple[str, str, str]:
        if not values:
            return "-", "-", "-"
        return (f"{statistics.median(values):.0f}", f"{percentile(values, 0.95):.0f}",
                f"{max(values):.0f}")

    head = ("the page in Chromium", "p50 ms", "p95 ms", "max ms")
    rows = [
        ("poll to DOM updated", *spread([u[0] for u in page.updates])),
        ("poll to painted", *spread([u[1] for u in page.updates])),
        ("wireproto-update (the page's own)", *spread(page.measures)),
        ("click to painted", *spread([c[1] for c in page.clicks])),
    ]
    _table(head, rows, table, out)
    bytes_per_poll = statistics.median(page.poll_bytes) if page.poll_bytes else 0
    out("")
    out(f"{len(page.updates)} updates in {page.seconds:.0f} s, polling /api/{page.poll_url}: "
        f"{bytes_per_poll:,.0f} bytes a poll; main thread in long tasks {page.busy:.0%} of the "
        f"time; the page {page.height:,} px tall, {page.elements:,} elements"
        + ("" if page.measures else "; the page records no \"wireproto-update\""))


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]], markdown: bool,
           out: Callable[[str], Any]) -> None:
    if markdown:
        out("| " + " | ".join(head) + " |")
        out("|---" + "|---:" * (len(head) - 1) + "|")
        for row in rows:
            out(f"| `{row[0]}` | " + " | ".join(row[1:]) + " |"
                if row[0].startswith("/") else "| " + " | ".join(row) + " |")
        return
    widths = [max(len(str(row[i])) for row in (head, *rows)) for i in range(len(head))]
    for row in (head, *rows):
        out(f"{row[0]:<{widths[0]}}  " + "  ".join(
            f"{cell:>{width}}" for cell, width in zip(row[1:], widths[1:], strict=True)))


def run(options: argparse.Namespace, out: Callable[[str], Any] = print) -> dict[str, Any]:
    with loaded_broker(options) as running:
        shown = measure_api(running, options.polls, out)
        page, why = None, ""
        try:
            import playwright  # noqa: F401
        except ImportError:
            why = "pip install playwright (make test installs it)"
        if not why and not os.path.exists(CHROMIUM):
            why = f"{CHROMIUM} is missing: apt-get install chromium (make chromium)"
        if not why:
            page = measure_page(running, options.seconds, options.clicks)
        report(running, shown, page, why, options, out)
        return {"load": running.load, "queries": shown, "page": page}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=20.0,
                        help="publishes a second among the connections (default 20)")
    parser.add_argument("--polls", type=int, default=30, help="requests of each query")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="how long the page is watched (default 20)")
    parser.add_argument("--clicks", type=int, default=10)
    parser.add_argument("--markdown", action="store_true",
                        help="print the tables as docs/performance.md has them")
    parser.add_argument("--quick", action="store_true",
                        help="200 connections, 100 topics, a short look (for the tests)")
    options = parser.parse_args(argv)
    if options.quick:
        options.connections, options.topics = 200, 100
        options.polls, options.seconds, options.clicks = 3, 4.0, 2
    # The load maker's own bound: everything here is bounded well within it.
    options.deadline = 300 + options.polls * 4 + options.seconds
    return options


def main(argv: list[str] | None = None) -> int:
    return harness.main("statuspage.py", run, parse_args(argv), reactor=False)


if __name__ == "__main__":
    sys.exit(main())
