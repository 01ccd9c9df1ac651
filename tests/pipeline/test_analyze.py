"""`wireproto analyze` end to end: a real broker with capture on, driven with known counts of
WEBSMQ publishes, UBRE requests, nydus invokes, SubbleSocket produces and malformed frames; then
the batch jobs on Spark local[2], their Parquet tables read back and checked exactly, and the
report with its PNGs."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest
import pytest_twisted
from twisted.internet import protocol as tx_protocol
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint

from tests.pipeline.conftest import need_spark
from tests.support import eventually, failure_of, starts_its_own_spark, wait_for
from tests.test_capture_broker import LOCAL, start
from wireproto import capture
from wireproto.codecs import ubre, websmq
from wireproto.config import CaptureSettings, Config, UbreSettings, parse_listen
from wireproto.hub import describe_address
from wireproto.protocols.nydus.client import connect as nydus_connect
from wireproto.protocols.rpc import RequestFailed
from wireproto.protocols.subble.client import connect as subble_connect
from wireproto.protocols.ubre.client import connect as ubre_connect
from wireproto.protocols.websmq.client import connect as websmq_connect

TEMP, ENV = "plant/temp", "plant/env"
TEMP_PUBLISHES, ENV_PUBLISHES = 15, 10
ADDS, DIVS, DIV_FAILS = 8, 4, 2
INVOKES = 8
PRODUCES, SUBBLE_EVENT = 6, "reading"
MALFORMED_CLIENTS = 3
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class RawClient(tx_protocol.Protocol):
    """A length32 peer that sends whatever bytes it is given."""

    def __init__(self) -> None:
        self.closed = False

    def connectionLost(self, reason: Any) -> None:
        self.closed = True


def divide(body: Any, peer: Any) -> Any:
    if body["b"] == 0:
        raise RequestFailed({"message": "division by zero"})
    return body["a"] / body["b"]


async def drive_broker(directory: Path) -> dict[str, Any]:
    """Run a capturing broker, drive the known traffic, stop it; returns the malformed peers."""
    config = Config(
        listeners=tuple(parse_listen(spec) for spec in (
            f"websmq+ws@tcp:0:{LOCAL}", f"websmq+length32@tcp:0:{LOCAL}",
            f"ubre+ws@tcp:0:{LOCAL}", f"nydus+engineio@tcp:0:{LOCAL}",
            f"subble+length32@tcp:0:{LOCAL}",
        )),
        ubre=UbreSettings(announce_topics=False),  # no announcements: exact counts
        capture=CaptureSettings(directory=str(directory), flush_interval=0.05),
    )
    service, (ws, tcp, ubre_url, nydus_url, subble_url) = await start(config)
    clients: list[Any] = []
    malformed_peers: list[str] = []
    try:
        service.server("ubre").handle("add", lambda body, peer: body["a"] + body["b"])
        service.server("ubre").handle("div", divide)
        service.server("nydus").register_route("/echo", lambda call: call.body)

        subscribers = [await wait_for(websmq_connect(reactor, ws)) for _ in range(2)]
        clients += subscribers
        inboxes: list[list[Any]] = [[], []]
        subscribers[0].subscribe(TEMP, inboxes[0].append)
        subscribers[0].subscribe(ENV, inboxes[0].append)
        subscribers[1].subscribe(TEMP, inboxes[1].append)
        await eventually(lambda: len(service.hub.subscribers(TEMP)) == 2
                         and service.hub.subscribers(ENV))
        publisher = await wait_for(websmq_connect(reactor, tcp))
        clients.append(publisher)
        for number in range(TEMP_PUBLISHES):
            publisher.publish(TEMP, b"%d.5" % number)  # JSON numbers
        for number in range(ENV_PUBLISHES):  # msgpack maps; the bool is not a reading
            publisher.publish(ENV, msgpack.packb(
                {"hum": number * 2, "ok": True, "loc": {"x": 1.25}}))
        await eventually(lambda: len(inboxes[0]) == TEMP_PUBLISHES + ENV_PUBLISHES
                         and len(inboxes[1]) == TEMP_PUBLISHES)

        rpc = await wait_for(ubre_connect(reactor, ubre_url))
        for number in range(ADDS):
            assert await wait_for(rpc.request("add", {"a": number, "b": 1})) == number + 1
        for number in range(DIVS):
            call = rpc.request("div", {"a": 6, "b": 0 if number < DIV_FAILS else 3})
            if number < DIV_FAILS:
                assert isinstance(await failure_of(call), RequestFailed)
            else:
                assert await wait_for(call) == 2
        await wait_for(rpc.close())

        nydus = await wait_for(nydus_connect(reactor, nydus_url))
        for number in range(INVOKES):
            assert await wait_for(nydus.invoke("/echo", {"n": number})) == {"n": number}
        await wait_for(nydus.close())

        # SubbleSocket: each produce is answered by the producer's own event, its echo; a
        # second client subscribed to the event type gets it as a server event.
        heard: list[Any] = []
        listener = await wait_for(subble_connect(reactor, subble_url, subscribe=[SUBBLE_EVENT],
                                                 on_event=heard.append))
        producer = await wait_for(subble_connect(reactor, subble_url,
                                                 produce=[SUBBLE_EVENT]))
        for number in range(PRODUCES):
            await wait_for(producer.produce(SUBBLE_EVENT, {"n": number}))
        await eventually(lambda: len(heard) == PRODUCES)
        await wait_for(producer.close())
        await wait_for(listener.close())

        host, port = tcp.split(":")[1], int(tcp.split(":")[2])
        for _ in range(MALFORMED_CLIENTS):  # one malformed frame each: the broker closes it
            raw = await wait_for(_connect_raw(host, port))
            malformed_peers.append(describe_address(raw.transport.getHost()))
            raw.transport.write(struct.pack(">I", 3) + b"\x00\x07a")  # topic runs past the end
            await eventually(lambda raw=raw: raw.closed)
    finally:
        for client in clients:
            await wait_for(client.disconnect())
        await wait_for(service.stopService(), timeout=10)
    return {"malformed_peers": malformed_peers}


async def _connect_raw(host: str, port: int) -> RawClient:
    endpoint = TCP4ClientEndpoint(reactor, host, port)
    return await endpoint.connect(tx_protocol.Factory.forProtocol(RawClient))


def table(spark: Any, out: Path, name: str) -> list[Any]:
    return spark.read.parquet(str(out / name)).collect()


@pytest.mark.timeout(240)
@pytest_twisted.ensureDeferred
async def test_analyze_a_real_broker_capture(tmp_path: Path, spark: Any) -> None:
    from wireproto.pipeline.analyze import analyze

    directory = tmp_path / "capture"
    driven = await drive_broker(directory)
    out = tmp_path / "out"
    summary = analyze(spark, str(directory), str(out))

    # Every row, by protocol and kind, in the summary and in messages/ (partitioned).
    expected_counts = {
        "websmq": {"open": 6, "in": 3 + TEMP_PUBLISHES + ENV_PUBLISHES + MALFORMED_CLIENTS,
                   "out": 2 * TEMP_PUBLISHES + ENV_PUBLISHES, "close": 6},
        "ubre": {"open": 1, "in": ADDS + DIVS, "out": ADDS + DIVS, "close": 1},
        "nydus": {"open": 1, "in": INVOKES, "out": 1 + INVOKES, "close": 1},  # WELCOME + results
        # Two handshakes; each produce echoed to the producer and sent to the listener.
        "subble": {"open": 2, "in": 2 + PRODUCES, "out": 2 + 2 * PRODUCES, "close": 2},
    }
    assert summary.counts == expected_counts
    assert summary.messages == sum(sum(kinds.values()) for kinds in expected_counts.values())
    messages = spark.read.parquet(str(out / "messages"))
    counted = Counter((row.protocol, row.kind) for row in
                      messages.groupBy("protocol", "kind").count().collect()
                      for _ in range(row["count"]))
    assert counted == Counter({(protocol, kind): count for protocol, kinds in
                               expected_counts.items() for kind, count in kinds.items()})
    assert {path.name.split("=")[0] for path in (out / "messages").iterdir()
            if path.is_dir()} == {"protocol"}
    assert all(path.name.startswith("date=") for path in (out / "messages").glob("*/*")
               if path.is_dir())
    assert "data" in messages.columns and "date" in messages.columns

    # Topic rates.
    rates = {(row.protocol, row.topic, row.direction): row for row in
             table(spark, out, "topic_rates")}
    assert {key: row.messages for key, row in rates.items()} == {
        ("websmq", TEMP, "in"): TEMP_PUBLISHES + 2, ("websmq", TEMP, "out"): 2 * TEMP_PUBLISHES,
        ("websmq", ENV, "in"): ENV_PUBLISHES + 1, ("websmq", ENV, "out"): ENV_PUBLISHES,
        ("ubre", "add", "in"): ADDS, ("ubre", "div", "in"): DIVS,
        ("nydus", "/echo", "in"): INVOKES,
        ("subble", SUBBLE_EVENT, "in"): PRODUCES, ("subble", SUBBLE_EVENT, "out"): 2 * PRODUCES,
    }
    temp_in = rates[("websmq", TEMP, "in")]
    assert temp_in.bytes_total == 10 * 3 + 5 * 4 and temp_in.bytes_max == 4
    assert temp_in.messages_per_second == pytest.approx(
        temp_in.messages / summary.span_seconds)

    # RPC latency: every request paired, none unpaired.
    pairs = table(spark, out, "rpc_latency")
    assert Counter((row.protocol, row.route, row.outcome) for row in pairs) == {
        ("ubre", "add", "success"): ADDS, ("ubre", "div", "success"): DIVS - DIV_FAILS,
        ("ubre", "div", "fail"): DIV_FAILS, ("nydus", "/echo", "result"): INVOKES,
        ("subble", SUBBLE_EVENT, "event"): PRODUCES,
    }
    assert all(row.latency_ms > 0 and row.answered >= row.requested for row in pairs), [
        (row.protocol, row.requested, row.answered, row.latency_ms) for row in pairs
        if not (row.latency_ms > 0 and row.answered >= row.requested)]
    latency = {(row.protocol, row.route): row for row in table(spark, out, "rpc_latency_summary")}
    assert {key: (row.requests, row.paired, row.ok, row.fail, row.timeout, row.unpaired)
            for key, row in latency.items()} == {
        ("ubre", "add"): (ADDS, ADDS, ADDS, 0, 0, 0),
        ("ubre", "div"): (DIVS, DIVS, DIVS - DIV_FAILS, DIV_FAILS, 0, 0),
        ("nydus", "/echo"): (INVOKES, INVOKES, INVOKES, 0, 0, 0),
        ("subble", SUBBLE_EVENT): (PRODUCES, PRODUCES, PRODUCES, 0, 0, 0),
    }
    for row in latency.values():
        assert 0 < row.p50_ms <= row.p95_ms <= row.p99_ms <= row.max_ms
    assert summary.paired == {"ubre": ADDS + DIVS, "nydus": INVOKES, "subble": PRODUCES}
    assert summary.unpaired == {"ubre": 0, "nydus": 0, "subble": 0}

    # Malformed: one per raw client, with its peer.
    bad = table(spark, out, "malformed")
    assert sorted((row.protocol, row.transport, row.peer, row.malformed) for row in bad) == sorted(
        ("websmq", "length32", peer, 1) for peer in driven["malformed_peers"])
    assert all(row.example_error.startswith("TruncatedFrame: ") for row in bad)
    assert summary.malformed == MALFORMED_CLIENTS

    # Windows: the readings clients published, once each (not once per subscriber). The run
    # may straddle a minute, so windows are added up per field.
    per_field: dict[tuple[str, str], list[Any]] = {}
    for row in table(spark, out, "windows"):
        assert row.window_end > row.window_start
        per_field.setdefault((row.topic, row.field), []).append(row)
    assert set(per_field) == {(TEMP, "value"), (ENV, "hum"), (ENV, "loc.x"), (SUBBLE_EVENT, "n")}

    def totals(key: tuple[str, str]) -> tuple[int, float, float, float]:
        rows = per_field[key]
        count = sum(row["count"] for row in rows)
        mean = sum(row["mean"] * row["count"] for row in rows) / count
        return count, min(row["min"] for row in rows), mean, max(row["max"] for row in rows)

    assert totals((TEMP, "value")) == (TEMP_PUBLISHES, 0.5, pytest.approx(7.5), 14.5)
    assert totals((ENV, "hum")) == (ENV_PUBLISHES, 0.0, pytest.approx(9.0), 18.0)
    assert totals((ENV, "loc.x")) == (ENV_PUBLISHES, 1.25, pytest.approx(1.25), 1.25)
    assert totals((SUBBLE_EVENT, "n")) == (PRODUCES, 0.0, pytest.approx(2.5), 5.0)

    # The report links PNGs that exist.
    report = (out / "report.md").read_text(encoding="utf-8")
    assert summary.report == str(out / "report.md")
    for name in ("rate.png", "latency.png"):
        assert f"]({name})" in report
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    assert f"| ubre | div | {DIVS} | {DIVS - DIV_FAILS} | {DIV_FAILS} | 0 | 0 |" in report
    assert TEMP in report and driven["malformed_peers"][0] in report
    # Malformed messages' connections as a person reads them: the run's mark and a number.
    assert len(re.findall(r"\| websmq \| length32 \| [0-9a-f]{8}#\d+ \|", report)) == \
        MALFORMED_CLIENTS


def small_capture(directory: Path) -> None:
    """A few messages written with CaptureWriter: a WEBSMQ publish and a UBRE request."""
    writer = capture.CaptureWriter(directory)
    writer.open_connection(1, "127.0.0.1:4000", "websmq", "length32")
    writer.message(1, "in", websmq.encode(websmq.Publish("t", b"1.5")), True)
    writer.open_connection(2, "127.0.0.1:4001", "ubre", "ws")
    writer.message(2, "in", ubre.encode(ubre.Request(1, {"a": 1}, name="add")), False)
    writer.message(2, "out", ubre.encode(ubre.Success(1, 2)), False)
    # A route whose every call fails: no latency to show, one failure.
    writer.message(2, "in", ubre.encode(ubre.Request(2, {}, name="boom")), False)
    writer.message(2, "out", ubre.encode(ubre.Fail(2, {"message": "no"})), False)
    writer.close_connection(1)
    writer.close_connection(2)
    writer.close()


def run_cli(*args: str, timeout: float = 200, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    return subprocess.run([sys.executable, "-m", "wireproto", "analyze", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


@starts_its_own_spark
@pytest.mark.timeout(240)
def test_the_analyze_command(tmp_path: Path) -> None:
    need_spark()  # the command starts its own
    directory = tmp_path / "capture"
    small_capture(directory)
    # A directory that holds a user's file and an older run's outputs: with --overwrite, the
    # outputs are replaced and the rest is left alone.
    out = tmp_path / "reports" / "out"
    (out / "messages").mkdir(parents=True)
    (out / "messages" / "part-00000-old.snappy.parquet").write_bytes(b"an older run's rows")
    (out / "report.md").write_text("an older report")
    (out / "notes.txt").write_text("mine")
    done = run_cli(str(directory), "--out", os.path.join("reports", "out"), "--overwrite",
                   "--master", "local[2]", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wireproto: ubre requests: 2 paired, 0 unpaired" in done.stdout.splitlines()
    assert f"wireproto: report: {os.path.join('reports', 'out', 'report.md')}" in \
        done.stdout.splitlines()
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "| ubre | boom | 1 | 0 | 1 | 0 | 0 | - | - | - | - |" in report
    # Only wireproto's own lines: no JVM or log4j output, no progress bar on a pipe.
    assert all(line.startswith("wireproto") for line in done.stdout.splitlines()), done.stdout
    assert all(line.startswith("wireproto analyze") for line in done.stderr.splitlines()), \
        done.stderr
    for name in ("messages", "topic_rates", "rpc_latency", "rpc_latency_summary", "malformed",
                 "windows"):
        assert (out / name).is_dir(), name
    assert (out / "report.md").is_file() and (out / "rate.png").is_file()
    assert (out / "notes.txt").read_text() == "mine"
    assert not (out / "messages" / "part-00000-old.snappy.parquet").exists()
    assert not [name for name in os.listdir(out) if name.startswith(".")]  # no staging left
    # The report's links lead to its tables and plots from where the report is.
    links = re.findall(r"\]\(([^)]+)\)", report)
    assert len(links) >= 10, report
    for link in links:
        assert (out / link).exists(), link


def test_analyze_usage_errors(tmp_path: Path) -> None:
    missing = run_cli(str(tmp_path / "nope"), "--out", str(tmp_path / "out"), timeout=60)
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        f"wireproto analyze: no capture directory or file {str(tmp_path / 'nope')!r}"]
    no_out = run_cli(str(tmp_path), timeout=60)
    assert no_out.returncode == 2 and len(no_out.stderr.splitlines()) == 1
    assert "--out" in no_out.stderr
    alone = run_cli(str(tmp_path), "--out", str(tmp_path / "o"), "--available-now", timeout=60)
    assert alone.returncode == 2
    assert alone.stderr == "wireproto analyze: --checkpoint and --available-now go with --follow\n"
    bad_hub = run_cli(str(tmp_path), "--out", str(tmp_path / "o"), "--follow", "--hub",
                      "ws://127.0.0.1:8765/websmq", timeout=60)
    assert bad_hub.returncode == 2
    assert bad_hub.stderr.startswith("wireproto analyze: --hub: hub 'ws://127.0.0.1:8765/websmq': "
                                     "give the endpoint of a WEBSMQ length32 listener")
    assert len(bad_hub.stderr.splitlines()) == 1


def test_connection_ids_read_as_the_run_mark_and_a_number() -> None:
    from wireproto.capture.wrapper import BrokerCapture
    from wireproto.pipeline.report import connection_name

    assert connection_name((0x5E1F03A2 << 32) + 17) == "5e1f03a2#17"
    assert connection_name(5) == "#5"
    # What a broker's ids look like.
    first = BrokerCapture("unused", broker="edge-1").next_id()
    assert re.fullmatch(r"[0-9a-f]{8}#1", connection_name(first))


def test_inputs_are_checked_before_spark_starts(tmp_path: Path) -> None:
    # No JVM can start here (JAVA_HOME points nowhere): every answer must come before Spark.
    junk = tmp_path / "junk.wpcap"
    junk.write_bytes(b"not a capture at all")
    named_like_one = tmp_path / "dir"
    named_like_one.mkdir()
    (named_like_one / "wirecapture-20261124T000000-000001.wpcap").write_bytes(b"\0" * 64)
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java")}
    for captures, cause in [
        (junk, f"{junk}: not a capture file"),
        (named_like_one, "wirecapture-20261124T000000-000001.wpcap: not a capture file"),
        (empty, f"no capture files in {str(empty)!r}"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "wireproto", "analyze", str(captures), "--out", str(out)],
            env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith("wireproto analyze: ") and cause in line, line
        assert not out.exists()


STOPPED_WITHIN = 20.0  # seconds from Ctrl-C to the exit: loose, for a loaded machine


class OnATerminal:
    """`wireproto analyze` of a capture of `records` WEBSMQ publishes, its stderr on a terminal
    (so the progress line is redrawn every half second) and its stdout a pipe."""

    def __init__(self, tmp_path: Path, records: int) -> None:
        import pty

        directory = tmp_path / "capture"
        writer = capture.CaptureWriter(directory)
        writer.open_connection(1, "127.0.0.1:4000", "websmq", "length32")
        frame = websmq.encode(websmq.Publish("t", b"1.5"))
        for _ in range(records):
            writer.message(1, "in", frame, True)
        writer.close_connection(1)
        writer.close()
        self.out = tmp_path / "out"
        self.master, slave = pty.openpty()
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        self.child = subprocess.Popen(
            [sys.executable, "-m", "wireproto", "analyze", str(directory), "--out",
             str(self.out), "--master", "local[2]"],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        self.seen = b""

    def read(self, wait: float = 0.5) -> bool:
        """What the terminal shows within `wait` s; False once it is closed."""
        import select

        if select.select([self.master], [], [], wait)[0]:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                return False
            self.seen += chunk
            return bool(chunk)
        return True

    def stop(self) -> float:
        """Ctrl-C, and the seconds until the command exits (130, quietly, nothing in --out)."""
        import signal
        import time

        sent = time.monotonic()
        self.child.send_signal(signal.SIGINT)
        assert self.child.wait(timeout=120) == 130
        took = time.monotonic() - sent
        while self.read():
            pass
        text = self.seen.decode(errors="replace")
        assert "Traceback" not in text and "py4j" not in text and "ERROR" not in text, text
        assert self.child.stdout is not None and self.child.stdout.read() == b""
        assert not self.out.exists()  # nothing is left of a stopped run
        return took

    def close(self) -> None:
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        os.close(self.master)


def descendants(pid: int) -> list[str]:
    """The command lines of `pid`'s descendants (the JVM, its Python workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    lines, stack = [], list(children.get(pid, ()))
    while stack:
        child = stack.pop()
        try:
            with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                lines.append(cmdline.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
        stack.extend(children.get(child, ()))
    return lines


@starts_its_own_spark
@pytest.mark.timeout(300)
def test_ctrl_c_while_the_capture_is_read_stops_it_quietly_with_130(tmp_path: Path) -> None:
    import time

    need_spark()
    run = OnATerminal(tmp_path, 300_000)
    try:
        # The progress line tells the bytes read while the read's tasks run, not only once
        # one has finished.
        deadline = time.monotonic() + 180
        read = re.compile(rb"reading 1 capture file, 0/\d+ tasks, ([\d.]+) (B|kB|MB) of ")
        while not any(float(found[0]) > 0 for found in read.findall(run.seen)):
            assert run.read() and time.monotonic() < deadline, run.seen[-2000:]
        assert run.stop() <= STOPPED_WITHIN
    finally:
        run.close()


@starts_its_own_spark
@pytest.mark.timeout(300)
def test_ctrl_c_while_no_job_runs_stops_it_within_seconds(tmp_path: Path) -> None:
    """Ctrl-C while the driver plans the read (the data source's Python workers at work, no
    Spark job running): nothing was there to cancel, and the jobs after it all ran."""
    import time

    need_spark()
    run = OnATerminal(tmp_path, 600_000)
    try:
        deadline = time.monotonic() + 180
        while not any("pyspark.sql.worker.create_data_source" in line
                      for line in descendants(run.child.pid)):
            assert run.child.poll() is None and time.monotonic() < deadline, run.seen[-2000:]
            run.read(0.05)
        assert b"reading" not in run.seen  # no job yet
        assert run.stop() <= STOPPED_WITHIN
    finally:
        run.close()


def test_the_latency_axis_reads_in_plain_milliseconds() -> None:
    from wireproto.pipeline.report import plain_ticks

    assert [plain_ticks(value) for value in (0.01, 0.1, 1.0, 10.0, 1000.0, 100000.0)] == [
        "0.01", "0.1", "1", "10", "1000", "100000"]
