"""Capture files in object storage, read by the `wirecapture` source through pyarrow's S3
filesystem, against a real S3 API server on 127.0.0.1 (moto in server mode)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port, need_peer
from wireproto import capture
from wireproto.codecs import websmq

BUCKET = "fleet"


class S3Server:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.options = {"s3.endpoint": endpoint, "s3.region": "us-east-1",
                        "s3.access_key": "wireproto", "s3.secret_key": "wireproto-secret"}

    def filesystem(self) -> Any:
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key="wireproto", secret_key="wireproto-secret", region="us-east-1",
            endpoint_override=self.endpoint.split("://", 1)[1], scheme="http",
            allow_bucket_creation=True)

    def upload(self, local: Path, key: str) -> None:
        with self.filesystem().open_output_stream(f"{BUCKET}/{key}") as out:
            out.write(local.read_bytes())


@pytest.fixture
def s3() -> Iterator[S3Server]:
    # This interpreter's own: a moto_server found on PATH may belong to another Python.
    server = Path(sys.executable).parent / "moto_server"
    need_peer(None if server.exists() else "moto_server is missing: "
              "pip install 'moto[server]' (make test installs it)", "object storage")
    port = free_port()
    child = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert child.poll() is None and time.monotonic() < deadline, "moto_server died"
            time.sleep(0.1)
        server_ = S3Server(f"http://127.0.0.1:{port}")
        server_.filesystem().create_dir(BUCKET)
        yield server_
    finally:
        child.terminate()
        child.wait(timeout=20)


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
