"""Capture files in object storage, read by the `wirecapture` source through pyarrow's S3
filesystem, against a real S3 API server on 127.0.0.1 (moto in server mode)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.pipeline.conftest import BUCKET, S3Server, need_spark
from tests.support import eventually, starts_its_own_spark
from wireproto import capture
from wireproto.codecs import websmq


def write_capture(directory: Path, broker: str, topics: list[str]) -> list[Path]:
    with capture.CaptureWriter(directory, broker=broker, max_file_bytes=4096) as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "ws")
        for topic in topics:
            writer.message(1, "in", websmq.encode(websmq.Publish(topic, b"x" * 100)), True)
    return capture.capture_files(directory)


def load(spark: Any, location: str, s3: S3Server) -> Any:
    return spark.read.format("wirecapture").options(**s3.options).load(location)


def test_a_batch_read_from_s3_gives_the_rows_of_a_local_read(tmp_path: Path, spark: Any,
                                                             s3: S3Server) -> None:
    files = write_capture(tmp_path / "edge-1", "edge-1", [f"t/{n % 5}" for n in range(120)])
    assert len(files) > 1  # rotated, so several objects
    with open(files[-1], "ab") as file:  # a torn last record, as a crash leaves it
        file.write(b"\x50\x00\x00\x00torn")
    for path in files:
        s3.upload(path, f"captures/edge-1/{path.name}")

    remote = load(spark, f"s3://{BUCKET}/captures/edge-1", s3)
    local = spark.read.format("wirecapture").load(str(tmp_path / "edge-1"))
    columns = ["broker", "offset", "message_index", "connection", "kind", "topic", "body_size"]
    assert sorted(remote.select(*columns).collect()) == sorted(local.select(*columns).collect())
    names = {row.file for row in remote.select("file").distinct().collect()}
    assert names == {f"s3://{BUCKET}/captures/edge-1/{path.name}" for path in files}
    assert {row.broker for row in remote.select("broker").distinct().collect()} == {"edge-1"}


def test_a_missing_prefix_fails_clearly(spark: Any, s3: S3Server) -> None:
    with pytest.raises(Exception, match="no capture file or directory"):
        load(spark, f"s3://{BUCKET}/nowhere", s3).collect()


def test_a_stream_picks_up_files_as_they_are_uploaded(tmp_path: Path, spark: Any,
                                                      s3: S3Server) -> None:
    files = write_capture(tmp_path / "edge-2", "edge-2", [f"s/{n}" for n in range(90)])
    assert len(files) >= 3
    s3.upload(files[0], f"live/{files[0].name}")
    stream = (spark.readStream.format("wirecapture").options(**s3.options)
              .load(f"s3://{BUCKET}/live"))
    query = (stream.writeStream.format("memory").queryName("uploaded")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        expected = 0
        for path in files:
            if path is not files[0]:
                s3.upload(path, f"live/{path.name}")
            expected += sum(1 for _ in capture.iter_records(path))
            query.processAllAvailable()
            rows = spark.sql("select file, offset from uploaded").collect()
            assert len(rows) == expected  # each upload read once, nothing twice
        assert len({(row.file, row.offset) for row in rows}) == expected
    finally:
        query.stop()


@starts_its_own_spark
@pytest.mark.timeout(240)
def test_analyze_reads_from_and_writes_to_object_storage(tmp_path: Path, s3: S3Server) -> None:
    from tests.pipeline.test_analyze import run_cli, small_capture

    need_spark()  # the command starts its own

    small_capture(tmp_path / "site-1")
    for path in capture.capture_files(tmp_path / "site-1"):
        s3.upload(path, f"captures/site-1/{path.name}")
    options = [argument for key, value in s3.options.items()
               for argument in ("--storage-option", f"{key}={value}")]
    done = run_cli(f"s3://{BUCKET}/captures/site-1", "--out", f"s3://{BUCKET}/reports/site-1",
                   "--master", "local[2]", *options)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wireproto: ubre requests: 2 paired, 0 unpaired" in done.stdout.splitlines()
    assert f"wireproto: report: s3://{BUCKET}/reports/site-1/report.md" in done.stdout
    again = run_cli(f"s3://{BUCKET}/captures/site-1", "--out", f"s3://{BUCKET}/reports/site-1",
                    *options)  # refused before Spark starts: the report is there
    assert again.returncode == 2 and "is not empty" in again.stderr, again.stderr
    fs = s3.filesystem()
    report = fs.open_input_file(f"{BUCKET}/reports/site-1/report.md").readall().decode()
    assert "| ubre |" in report
    import pyarrow.fs as pafs

    tables = {info.base_name for info in fs.get_file_info(
        pafs.FileSelector(f"{BUCKET}/reports/site-1"))}
    assert {"messages", "report.md"} <= tables

    missing = run_cli(f"s3://{BUCKET}/nothing-here", "--out", str(tmp_path / "out"), *options)
    assert missing.returncode == 2
    assert "no capture file or directory" in missing.stderr
    bad = run_cli(f"s3://{BUCKET}/captures/site-1", "--out", str(tmp_path / "out"),
                  "--storage-option", "colour=blue")
    assert bad.returncode == 2 and "--storage-option 'colour=blue'" in bad.stderr


@pytest_twisted.ensureDeferred
async def test_a_shipped_object_splits_into_tasks_by_its_index(
        tmp_path: Path, spark: Any, s3: S3Server, monkeypatch: Any) -> None:
    from wireproto.capture import storage
    from wireproto.capture.shipping import Shipper

    monkeypatch.setattr(storage, "INDEX_GRAIN", 64 << 10)
    local = tmp_path / "copy"
    with capture.CaptureWriter(tmp_path / "edge-3", broker="edge-3") as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "ws")
        for number in range(6000):
            writer.message(1, "in", websmq.encode(websmq.Publish(f"t/{number}", b"x" * 150)),
                           True)
    (path,) = capture.capture_files(tmp_path / "edge-3")
    local.mkdir()
    (local / path.name).write_bytes(path.read_bytes())
    assert path.stat().st_size > 1 << 20
    shipper = Shipper(tmp_path / "edge-3", f"s3://{BUCKET}/split", reactor, options=s3.options,
                      broker="edge-3")
    shipper.start()
    try:
        await eventually(lambda: shipper.counters.shipped == 1, timeout=30)
    finally:
        shipper.stop()

    def read(location: str) -> Any:
        return (spark.read.format("wirecapture").options(**s3.options)
                .option("maxPartitionBytes", str(256 << 10)).option("openCostInBytes", "1")
                .load(location))

    remote = read(f"s3://{BUCKET}/split")
    columns = ["offset", "message_index", "topic"]
    expected = sorted(read(str(local)).select(*columns).collect())
    assert remote.rdd.getNumPartitions() >= 4
    assert sorted(remote.select(*columns).collect()) == expected  # each record once
    # Without its index (or with one of another file), an object is one task, read whole.
    fs = s3.filesystem()
    index = f"{BUCKET}/split/edge-3/{path.name}.idx"
    with fs.open_output_stream(index) as out:
        out.write(b'{"size": 5, "boundaries": [1, 2]}')
    assert read(f"s3://{BUCKET}/split").rdd.getNumPartitions() == 1
    fs.delete_file(index)
    again = read(f"s3://{BUCKET}/split")
    assert again.rdd.getNumPartitions() == 1
    assert sorted(again.select(*columns).collect()) == expected
