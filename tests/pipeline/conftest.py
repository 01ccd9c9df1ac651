"""A session-scoped SparkSession for the pipeline tests: local[2], bound to 127.0.0.1, no UI.

Without pyspark (the ``spark`` extra) the Spark tests are skipped on a developer's machine and
fail under CI (tests.support.need_peer), so they can never pass by not running."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port, need_peer


def need_spark() -> None:
    """Skip (or under CI fail) a test that runs Spark, here or in a `wireproto analyze`, where
    pyspark or Java is missing."""
    need_peer(
        "pyspark is not installed; pip install -e '.[spark]'"
        if importlib.util.find_spec("pyspark") is None
        else "java is not installed (Spark needs Java 17)" if shutil.which("java") is None
        else None,
        "Spark",
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The SparkSession of this process; its tests share one worker (tests/conftest.py)."""
    need_spark()
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # The Python workers run this interpreter, so they import the same wireproto.
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from wireproto.pipeline.datasource import WireCaptureDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("wireproto-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(WireCaptureDataSource)
    try:
        yield session
    finally:
        session.stop()


# -- an S3 API server on 127.0.0.1 --------------------------------------------------------------

BUCKET = "fleet"


class S3Server:
    def __init__(self, endpoint: str, pid: int = 0) -> None:
        self.endpoint = endpoint
        self.pid = pid  # moto_server's: a test may SIGSTOP it
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
        server_ = S3Server(f"http://127.0.0.1:{port}", child.pid)
        server_.filesystem().create_dir(BUCKET)
        yield server_
    finally:
        child.send_signal(signal.SIGCONT)  # a test that paused it and failed
        child.terminate()
        child.wait(timeout=20)


