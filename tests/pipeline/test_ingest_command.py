"""`wireproto ingest` as a user runs it, and as the world treats it: SIGKILL and Ctrl-C in the
middle of a batch, then a rerun, leave every message in the table once; a following ingest picks
up what the writer appends, keeps a second ingest (even while it is SIGSTOPped) off its table
and ends with Ctrl-C; bad input is one line before Spark starts.

The table is checked without Spark: the files its sink log lists, read with pyarrow, against
the captures decoded in this process (the data source's own decode)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.conftest import need_spark
from tests.support import need_module, starts_its_own_spark
from wireproto import capture
from wireproto.codecs import ubre, websmq

need_module("pyarrow", "pip install -e '.[spark]'")

import pyarrow.parquet as parquet  # noqa: E402

from wireproto.pipeline.rows import broker_of, decode_batch, projected_schema  # noqa: E402
from wireproto.pipeline.table import MARKER, marker_text  # noqa: E402

ENV = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
INGEST = [sys.executable, "-m", "wireproto", "ingest"]


def until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(interval)


def write_traffic(writer: capture.CaptureWriter, numbers: range) -> None:
    for number in numbers:
        frame = websmq.encode(websmq.Publish(f"plant/{number % 7}", b"%08d" % number))
        writer.message(1, "in", frame, True)
        writer.message(1, "out", capture.encode_batch([frame] * 4), True, batch=True)
        if number % 5 == 0:
            writer.message(2, "in", ubre.encode(ubre.Request(number, {"n": number},
                                                             name="add")), False)


def new_writer(directory: Path, broker: str, **options: Any) -> capture.CaptureWriter:
    writer = capture.CaptureWriter(directory, broker=broker, **options)
    writer.open_connection(1, "10.0.0.1:4000", "websmq", "length32")
    writer.open_connection(2, "10.0.0.2:4001", "ubre", "ws")
    return writer


def direct_keys(captures: Path) -> Counter[tuple[Any, ...]]:
    """(broker, file, offset, message_index) of each row the captures hold, decoded here."""
    keys: Counter[tuple[Any, ...]] = Counter()
    schema = projected_schema(["file", "offset", "message_index"])
    for path in capture.capture_files(captures, recursive=True):
        broker = broker_of(capture.read_header(path))
        name = str(path.resolve())
        start = None
        while True:
            batch = capture.read_batch(path, start_offset=start, max_records=8192)
            rows = decode_batch(name, batch, broker, schema).to_pydict()
            keys.update((broker, *row) for row in zip(rows["file"], rows["offset"],
                                                      rows["message_index"], strict=True))
            if batch.stop != "limit":
                break
            start = batch.end
    return keys


def logged_files(table: Path) -> set[Path]:
    """The data files the table's sink log lists."""
    files = set()
    log = table / "_spark_metadata"
    for entry in (log.iterdir() if log.is_dir() else ()):
        if entry.name.startswith("."):
            continue
        for line in entry.read_text().splitlines()[1:]:
            logged = json.loads(line)
            assert logged["action"] == "add"
            files.add(Path(urllib.parse.unquote(urllib.parse.urlparse(logged["path"]).path)))
    return files


def table_keys(table: Path) -> Counter[tuple[Any, ...]]:
    """The same keys, from the files the sink log lists: a reader through the log."""
    keys: Counter[tuple[Any, ...]] = Counter()
    for path in logged_files(table):
        broker = urllib.parse.unquote(path.parent.parent.name.removeprefix("broker="))
        rows = parquet.read_table(path, columns=["file", "offset", "message_index"]).to_pydict()
        keys.update((broker, *row) for row in zip(rows["file"], rows["offset"],
                                                  rows["message_index"], strict=True))
    return keys


def on_disk(table: Path) -> set[Path]:
    return set(table.rglob("part-*.parquet"))


def jvm_of(pid: int) -> int | None:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    for child in children:
        try:
            if "java" in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
                return int(child)
        except OSError:
            continue
    return None


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


class Run:
    """A `wireproto ingest` child, its stderr on a terminal (so the progress line is drawn)."""

    def __init__(self, *args: str) -> None:
        master, slave = pty.openpty()
        self.process = subprocess.Popen([*INGEST, *args], env=ENV, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=slave, text=True)
        os.close(slave)
        self.master = master
        self.seen = b""
        self.jvm: int | None = None

    def read(self) -> str:
        while select.select([self.master], [], [], 0.05)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.seen += chunk
        return self.seen.decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL, then wait until its JVM, which holds the table too, is gone."""
        self.process.kill()
        self.process.wait(30)
        if self.jvm is not None:
            until(lambda: gone(self.jvm), 60, "the killed ingest's JVM to end")
        os.close(self.master)

    def finish(self, timeout: float) -> tuple[int, str, str]:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            self.read()
        if self.process.poll() is None:
            self.process.kill()
            raise AssertionError(f"still running after {timeout} s:\n{self.read()}")
        text = self.read()
        os.close(self.master)
        return self.process.returncode, self.process.stdout.read(), text


@pytest.fixture
def big_capture(tmp_path: Path) -> Iterator[Path]:
    """Two brokers, several files each: a batch that takes Spark a while."""
    captures = tmp_path / "captures"
    for broker in ("edge-1", "edge-2"):
        with new_writer(captures / broker, broker, max_file_bytes=1 << 20) as writer:
            write_traffic(writer, range(25_000))
    yield captures


@starts_its_own_spark
@pytest.mark.timeout(1200)
def test_sigkill_and_ctrl_c_mid_batch_then_every_message_once(tmp_path: Path,
                                                               big_capture: Path) -> None:
    need_spark()
    captures, table = big_capture, tmp_path / "table"
    once = [str(captures), "--table", str(table), "--once", "--master", "local[2]"]
    checkpoint = table / "_checkpoint"

    # Killed while the first batch reads the captures: its offsets are logged, nothing else.
    run = Run(*once)
    run.jvm = until(lambda: jvm_of(run.process.pid), 120, "the JVM")
    until(lambda: (checkpoint / "offsets" / "0").exists(), 300, "batch 0 to be planned")
    run.kill()
    assert not logged_files(table)

    # Its JVM killed while the batch writes its files: they are in no log.
    run = Run(*once)
    run.jvm = until(lambda: jvm_of(run.process.pid), 120, "the JVM")
    until(lambda: on_disk(table) or run.process.poll() is not None, 300, "files being written")
    os.kill(run.jvm, signal.SIGKILL)
    run.kill()
    assert not (checkpoint / "commits" / "0").exists(), "the batch finished before the kill"
    assert on_disk(table) and not logged_files(table)

    # Ctrl-C in the middle of the batch: 130, quietly.
    run = Run(*once)
    until(lambda: re.search(r"a batch at \d+/\d+ tasks", run.read()), 300, "a batch at work")
    started = time.monotonic()
    run.process.send_signal(signal.SIGINT)
    status, stdout, stderr = run.finish(60)
    assert status == 130, stderr
    assert time.monotonic() - started < 30
    assert stdout == ""
    assert "Traceback" not in stderr and "py4j" not in stderr and "ERROR" not in stderr, stderr
    assert "wireproto ingest: 0 rows in 0 batches" in stderr  # the progress line was drawn

    # The JVM killed as soon as the batch's files are in the sink's log, before the batch's
    # commit if it can be.
    run = Run(*once)
    run.jvm = until(lambda: jvm_of(run.process.pid), 120, "the JVM")
    until(lambda: (table / "_spark_metadata" / "0").exists() or run.process.poll() is not None,
          300, "the sink's log of batch 0", interval=0.002)
    os.kill(run.jvm, signal.SIGKILL)
    run.kill()
    between = not (checkpoint / "commits" / "0").exists()

    # The last run finishes the work: every message once, and no file outside the log.
    status, stdout, stderr = Run(*once).finish(600)
    assert status == 0, stderr
    expected = direct_keys(captures)
    assert sum(expected.values()) > 100_000 and max(expected.values()) == 1
    ingested = table_keys(table)
    assert sum(ingested.values()) == sum(expected.values())  # the row count
    assert ingested == expected  # and each (broker, file, offset, message) once
    assert on_disk(table) == logged_files(table)
    assert re.fullmatch(rf"wireproto: ingested [\d,]+ rows in [01] batch(es)? into {table}\n",
                        stdout), stdout
    if not between:  # batch 0 was done: nothing was left
        assert stdout == f"wireproto: ingested 0 rows in 0 batches into {table}\n"
    print(f"killed between the sink's log and the commit: {between}")

    # More arrives; a rerun reads only that.
    with new_writer(captures / "edge-3", "edge-3") as writer:
        write_traffic(writer, range(100))
    status, stdout, stderr = Run(*once).finish(600)
    assert status == 0, stderr
    # 100 publishes in, 400 out in batches of 4, 20 UBRE requests, 2 opens.
    assert stdout == f"wireproto: ingested 522 rows in 1 batch into {table}\n"
    assert table_keys(table) == direct_keys(captures)


@starts_its_own_spark
@pytest.mark.timeout(600)
def test_a_following_ingest_keeps_its_table_and_ends_with_ctrl_c(tmp_path: Path) -> None:
    need_spark()
    captures, table = tmp_path / "captures", tmp_path / "table"
    writer = new_writer(captures, "site-1")
    write_traffic(writer, range(50))
    writer.flush()
    child = subprocess.Popen([*INGEST, str(captures), "--table", str(table), "--trigger", "1",
                              "--master", "local[2]"], env=ENV, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(child.stdout), daemon=True)
    reader.start()
    try:
        until(lambda: output, 180, "the following line")
        assert output == [f"wireproto: ingesting {captures} into {table} every 1 s; "
                          "Ctrl-C stops\n"]
        until(lambda: table_keys(table) == direct_keys(captures), 180, "the first rows")
        write_traffic(writer, range(50, 120))
        writer.close()
        until(lambda: table_keys(table) == direct_keys(captures), 180, "what was appended")

        # Stopped (SIGSTOP), it still holds its table: a second ingest is refused.
        jvm = jvm_of(child.pid)
        for pid in (child.pid, jvm):
            os.kill(pid, signal.SIGSTOP)
        try:
            second = subprocess.run([*INGEST, str(captures), "--table", str(table), "--once"],
                                    env=ENV, capture_output=True, text=True, timeout=120)
        finally:
            for pid in (jvm, child.pid):
                os.kill(pid, signal.SIGCONT)
        assert second.returncode == 2
        assert second.stderr == (f"wireproto ingest: {table} is being written by another "
                                 f"wireproto ingest (pid {child.pid}): one ingest writes a "
                                 "table at a time\n")

        started = time.monotonic()
        child.send_signal(signal.SIGINT)  # following: Ctrl-C is its normal end
        assert child.wait(60) == 0
        assert time.monotonic() - started < 30
        stderr = child.stderr.read()
        assert "Traceback" not in stderr and "py4j" not in stderr, stderr
    finally:
        if child.poll() is None:
            child.kill()
    assert table_keys(table) == direct_keys(captures)

    # Its captures vanish under it: the query fails, in one line, status 1.
    child = subprocess.Popen([*INGEST, str(captures), "--table", str(table), "--trigger", "1",
                              "--master", "local[2]"], env=ENV, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().endswith("Ctrl-C stops\n")
        captures.rename(tmp_path / "gone")
        assert child.wait(120) == 1
        lines = child.stderr.read().splitlines()  # progress lines, then the failure
        assert all(line.startswith("wireproto ingest: ") for line in lines), lines
        line = lines[-1]
        assert line.startswith("wireproto ingest: FileNotFoundError: wirecapture: no capture file "
                               f"or directory {str(captures)!r} (Spark's log: "), line
    finally:
        if child.poll() is None:
            child.kill()


def test_bad_input_is_one_line_before_spark_starts(tmp_path: Path) -> None:
    # No JVM can start here (JAVA_HOME points nowhere): every answer must come before Spark.
    env = {**ENV, "JAVA_HOME": str(tmp_path / "no-java")}
    captures = tmp_path / "captures"
    with new_writer(captures, "b") as writer:
        write_traffic(writer, range(3))
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "data.csv").write_text("a,b\n")
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / MARKER).write_text(marker_text().replace('"version": 1', '"version": 9'))
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    fresh = tmp_path / "fresh"

    def refused(*args: str) -> str:
        done = subprocess.run([*INGEST, *args], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stdout == ""
        (line,) = done.stderr.splitlines()
        return line

    prefix = "wireproto ingest: "
    assert refused(str(tmp_path / "nope"), "--table", str(fresh)) == \
        f"{prefix}no capture directory or file {str(tmp_path / 'nope')!r}"
    assert refused(str(captures), "--table", str(junk)) == \
        f"{prefix}{junk} is not a wireproto table (no {MARKER}; wireproto ingest writes one)"
    assert refused(str(captures), "--table", str(newer)).startswith(
        f"{prefix}{newer} is a version 9 wireproto table; this wireproto")
    assert refused(str(captures), "--table", str(a_file)) == f"{prefix}{a_file} is not a directory"
    assert refused(str(captures), "--table", str(fresh), "--once", "--trigger", "5") == \
        f"{prefix}--trigger goes without --once"
    assert refused(str(captures), "--table", str(fresh), "--trigger", "0") == \
        f"{prefix}--trigger 0: give a number of seconds above 0"
    assert refused(str(captures), "--table", str(fresh), "--staging", str(tmp_path / "s")) == \
        f"{prefix}--staging goes with a TABLE in object storage (s3://, gs://)"
    assert refused(str(captures), "--table", "s3://bucket/table", "--checkpoint",
                   "s3://bucket/cp").startswith(f"{prefix}--checkpoint 's3://bucket/cp': ")
    assert refused(str(captures), "--table", str(fresh), "--retention", "30 days") == \
        f"{prefix}--retention: '30 days' is not a duration such as 30d, 12h, 90m or 45s"
    assert refused(str(captures), "--table", str(fresh), "--retention", "0d").startswith(
        f"{prefix}--retention: '0d' is not a duration")
    assert not fresh.exists()  # nothing is made for a run refused
    assert sorted(os.listdir(junk)) == ["data.csv"]

    # A table another ingest holds (here a process holding its lock), after a wait.
    held = tmp_path / "held"
    held.mkdir()
    (held / MARKER).write_text(marker_text())
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, time\n"
         f"fd = os.open({str(held / '_wireproto_ingest.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX); os.pwrite(fd, b'%d\\n' % os.getpid(), 0)\n"
         "print('held', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert refused(str(captures), "--table", str(held)) == (
            f"{prefix}{held} is being written by another wireproto ingest (pid {holder.pid}): "
            "one ingest writes a table at a time")
    finally:
        holder.kill()
        holder.wait()

    # A table that cannot be written (immutable, as root cannot write it either).
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / MARKER).write_text(marker_text())
    if subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode == 0:
        try:
            assert refused(str(captures), "--table", str(locked)) == \
                f"{prefix}{locked}: Operation not permitted"
        finally:
            subprocess.run(["chattr", "-i", str(locked)], check=True)


def test_the_default_staging_copy_is_where_only_its_user_reaches(tmp_path: Path,
                                                                monkeypatch: Any) -> None:
    from wireproto.pipeline.ingest_command import default_staging

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "cache" / "wireproto").mkdir(parents=True, mode=0o755)
    staging = default_staging("s3://lake/messages/")
    assert staging == default_staging("s3://lake/messages")
    assert Path(staging).parent == tmp_path / "cache" / "wireproto" / "staging"
    assert default_staging("s3://lake/other") != staging
    # Not in the shared temporary directory, where another local user could make it first.
    for directory in (tmp_path / "cache" / "wireproto", Path(staging).parent):
        assert directory.stat().st_mode & 0o077 == 0, directory
