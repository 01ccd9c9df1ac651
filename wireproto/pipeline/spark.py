"""The SparkSession of `wireproto analyze`: embedded ``local[*]`` unless told otherwise.

Needs the ``spark`` extra (``pip install -e '.[spark]'`` in a checkout) and Java 17.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["spark_session"]


def spark_session(
    master: str | None = None, app_name: str = "wireproto-analyze",
    extra: dict[str, str] | None = None,
) -> Any:
    """A SparkSession with the `wirecapture` data source registered, the UI off and the session
    time zone UTC.

    `master` (``local[2]``, ``spark://host:7077``, ...) is set only when given: otherwise the one
    already configured wins (``spark-submit --master``, spark-defaults.conf), and with none
    Spark's own default is the embedded ``local[*]``. An active session is reused. `extra` is
    more Spark configuration.
    """
    # Python workers run this interpreter, so they import the same wireproto.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from wireproto.pipeline.datasource import WireCaptureDataSource

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    session = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.conf.set("spark.sql.session.timeZone", "UTC")  # also on a session that was running
    context = session.sparkContext
    if (context.master or "").startswith("local") and not context.getConf().contains(
            "spark.sql.shuffle.partitions"):
        # Spark's 200 shuffle partitions are for clusters; one machine's cores do better.
        session.conf.set("spark.sql.shuffle.partitions", str(max(2, context.defaultParallelism)))
    session.dataSource.register(WireCaptureDataSource)
    return session
