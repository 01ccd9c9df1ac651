"""`wireproto ingest` into a table in object storage (a real S3 API server on 127.0.0.1), as a
user runs it: the credentials in the environment, never on the command line or in its output.
The table read back (`read_table`) holds what a direct read of the captures gives, each row
once, after a rerun with more captures, and after the server was paused (SIGSTOP) in the middle
of an ingest, and at its end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.conftest import BUCKET, need_spark
from tests.pipeline.test_ingest_command import ENV, INGEST, new_writer, until, write_traffic
from tests.support import starts_its_own_spark
from wireproto.pipeline.table import read_table

KEY = ("broker", "file", "offset", "message_index")
TABLE = f"s3://{BUCKET}/table"
SECRET = "wireproto-secret"


def command_env(s3: Any) -> dict[str, str]:
    return {**ENV, "AWS_ACCESS_KEY_ID": s3.options["s3.access_key"],
            "AWS_SECRET_ACCESS_KEY": s3.options["s3.secret_key"]}


def storage(s3: Any) -> list[str]:
    return ["--storage-option", f"s3.endpoint={s3.endpoint}",
            "--storage-option", f"s3.region={s3.options['s3.region']}"]


def direct(spark: Any, captures: Path) -> Counter[tuple[Any, ...]]:
    frame = spark.read.format("wirecapture").load(str(captures))
    return Counter(tuple(row) for row in frame.select(*KEY).collect())


def remote(spark: Any, s3: Any) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(row) for row in read_table(spark, TABLE, s3.options).select(*KEY)
                   .collect())


def remote_batches(s3: Any) -> list[int]:
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(f"{BUCKET}/table/_spark_metadata", allow_not_found=True)
    return sorted(int(info.base_name.split(".")[0])
                  for info in s3.filesystem().get_file_info(selector)
                  if info.base_name.split(".")[0].isdigit())


def ingest_once(captures: Path, s3: Any, staging: Path, *extra: str) -> str:
    done = subprocess.run([*INGEST, str(captures), "--table", TABLE, "--once", "--master",
                           "local[2]", "--staging", str(staging), *storage(s3), *extra],
                          env=command_env(s3), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


@starts_its_own_spark
@pytest.mark.timeout(1200)
def test_a_table_in_object_storage_through_the_command(tmp_path: Path, spark: Any,
                                                       s3: Any) -> None:
    need_spark()
    captures = tmp_path / "captures"
    with new_writer(captures / "edge-1", "edge-1") as writer:
        write_traffic(writer, range(2_000))
    staging = tmp_path / "staging"
    assert "ingested " in ingest_once(captures, s3, staging)
    first = direct(spark, captures)
    assert first and max(first.values()) == 1
    assert remote(spark, s3) == first

    # More captures: a second run, from another staging directory (as on another machine: it
    # resumes from the table's checkpoint), adds only them, with the retention's tidying.
    with new_writer(captures / "edge-2", "edge-2") as writer:
        write_traffic(writer, range(1_000))
    ingest_once(captures, s3, tmp_path / "elsewhere", "--retention", "30d")
    both = direct(spark, captures)
    assert len(both) > len(first)
    assert remote(spark, s3) == both

    out = tmp_path / "report"
    done = subprocess.run([sys_executable(), "-m", "wireproto", "analyze", "--table", TABLE,
                           "--out", str(out), "--master", "local[2]", *storage(s3)],
                          env=command_env(s3), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert any(out.iterdir())


def sys_executable() -> str:
    return INGEST[0]


class Following:
    """A following `wireproto ingest` child, its stderr gathered as it comes."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.process = subprocess.Popen([*INGEST, *args], env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)

    def read(self) -> str:
        return "".join(self.lines)


@starts_its_own_spark
@pytest.mark.timeout(1200)
def test_the_server_paused_mid_ingest_and_at_its_end_then_the_table_is_whole(
        tmp_path: Path, spark: Any, s3: Any) -> None:
    need_spark()
    captures = tmp_path / "captures"
    staging = tmp_path / "staging"
    writer = new_writer(captures / "edge-1", "edge-1")
    write_traffic(writer, range(500))
    writer.flush()
    ingest = Following(command_env(s3), str(captures), "--table", TABLE, "--trigger", "1",
                       "--master", "local[2]", "--staging", str(staging), *storage(s3))
    try:
        until(lambda: remote_batches(s3), 300, "the first micro-batch in the remote table")
        os.kill(s3.pid, signal.SIGSTOP)
        write_traffic(writer, range(500, 1_000))
        writer.flush()
        warning = "wireproto ingest: warning: could not upload to s3://fleet/table: "
        until(lambda: warning in ingest.read(), 300, "a warning about the upload", 0.5)
        os.kill(s3.pid, signal.SIGCONT)
        seen = max(remote_batches(s3))
        write_traffic(writer, range(1_000, 1_500))
        writer.flush()
        # The next micro-batch's sync uploads what the failed one left, and its own batch.
        until(lambda: max(remote_batches(s3)) > seen + 1, 300,
              "the micro-batches after the pause in the remote table", 0.5)

        # Paused again as the ingest ends: its last upload fails, in one line, status 1.
        write_traffic(writer, range(1_500, 2_000))
        writer.close()
        os.kill(s3.pid, signal.SIGSTOP)
        ingest.process.send_signal(signal.SIGINT)
        status = ingest.process.wait(300)
    finally:
        os.kill(s3.pid, signal.SIGCONT)
        if ingest.process.poll() is None:
            ingest.process.kill()
    ingest.reader.join(30)
    stdout, stderr = ingest.process.stdout.read(), ingest.read()
    assert status == 1, stderr
    problems = [line for line in stderr.splitlines() if line.startswith("wireproto ingest: ")
                and not re.match(r"wireproto ingest: [\d,]+ rows in ", line)]  # progress
    assert problems[-1].startswith("wireproto ingest: could not upload to s3://fleet/table: ")
    assert problems[-1].endswith(f"; the next ingest from {staging} does it")
    assert all(line.startswith(warning) for line in problems[:-1]) and problems[:-1], problems
    assert SECRET not in stdout + stderr and "Traceback" not in stderr

    # The next ingest from that staging directory uploads the rest first: the table is whole.
    ingest_once(captures, s3, staging)
    rows = remote(spark, s3)
    assert rows == direct(spark, captures)
    assert max(rows.values()) == 1
