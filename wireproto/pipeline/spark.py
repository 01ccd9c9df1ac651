"""The SparkSession of `wireproto analyze`: embedded ``local[*]`` unless told otherwise.

Needs the ``spark`` extra (``pip install -e '.[spark]'`` in a checkout) and Java 17.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["spark_session", "prepare_jvm", "SMALL_INPUT_BYTES"]

# Up to this much input, the JIT's C2 compiler costs the JVM more than its faster code saves, so
# it compiles with C1 alone: `wireproto analyze` of 10,000 rows takes 40% less CPU, of 300,000
# rows (30 MB) a quarter less time (docs/performance.md, "wireproto analyze of a small
# capture"). Past it, C2's fixed cost (about 20 CPU seconds) is paid back on the JVM's work per
# row.
SMALL_INPUT_BYTES = 256 << 20
C1_ONLY = "-XX:TieredStopAtLevel=1"


def prepare_jvm(input_bytes: int | None = None) -> None:
    """Before this process launches a SparkSession's JVM: the Python workers the JVM starts (the
    data source look-up among them, which it starts on its own) run this interpreter, and for
    an input of at most SMALL_INPUT_BYTES the JVM compiles with C1 alone, unless
    SPARK_SUBMIT_OPTS already says how it compiles."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if input_bytes is not None and input_bytes <= SMALL_INPUT_BYTES:
        options = os.environ.get("SPARK_SUBMIT_OPTS", "")
        if "TieredStopAtLevel" not in options and "TieredCompilation" not in options:
            os.environ["SPARK_SUBMIT_OPTS"] = f"{C1_ONLY} {options}".strip()


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
        # The wirecapture source applies a query's filters itself (docs/pipeline.md).
        .config("spark.sql.python.filterPushdown.enabled", "true")
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
