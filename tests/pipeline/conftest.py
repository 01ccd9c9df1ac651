"""A session-scoped SparkSession for the pipeline tests: local[2], bound to 127.0.0.1, no UI.

Without pyspark (the ``spark`` extra) the Spark tests are skipped on a developer's machine and
fail under CI (tests.support.need_peer), so they can never pass by not running."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import need_peer


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    need_peer(
        "pyspark is not installed; pip install -e '.[spark]'"
        if importlib.util.find_spec("pyspark") is None
        else "java is not installed (Spark needs Java 17)" if shutil.which("java") is None
        else None,
        "Spark",
    )
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
