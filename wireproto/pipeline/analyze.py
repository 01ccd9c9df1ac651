"""`wireproto analyze CAPTURES --out DIR`: the batch jobs over capture files, on Spark.

`analyze(spark, captures, out)` reads CAPTURES (a capture directory or file) through the
`wirecapture` data source and writes Parquet tables under OUT, then `report.md` with PNG plots
(`wireproto.pipeline.report`). `analyze(spark, None, out, table=TABLE)` reads the rows of a
table `wireproto ingest` wrote instead: nothing is decoded again and ``messages/`` is not
written, the table is it. Either way the jobs run in `analyze_rows`, over a DataFrame of the
data source's rows whatever its source:

- ``messages/``: every row, partitioned by ``protocol`` and ``date`` (UTC);
- ``topic_rates/``: per protocol, topic and direction: messages, messages per second over the
  capture's span, body bytes total, mean and max;
- ``rpc_latency/``: each request paired with its answer; ``rpc_latency_summary/``: per protocol
  and route, count, p50, p95, p99 and max in ms (exact percentiles) and the unpaired requests;
- ``malformed/``: per protocol, connection and peer, the messages that did not decode;
- ``windows/``: per minute, protocol, topic and field: count, min, mean and max of the numeric
  readings in the messages clients sent (`wireproto.pipeline.values`);
- ``broker_rates/``: per broker and protocol: messages in and out, per second over the capture's
  span, connections and malformed messages (the fleet's are their sums);
- ``cluster_calls/``: each call one broker process made to another over the cluster, paired
  across their captures: its round trip where it was made, its handling where it was answered,
  and the difference, the time spent between them.

Only small aggregates reach the driver; the messages table is never collected.

Under spark-submit, run `wireproto.pipeline.command` as the application:
``spark-submit --master URL .../wireproto/pipeline/command.py CAPTURES --out DIR``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wireproto.pipeline.jobs import (
    broker_rates,
    cluster_calls,
    cluster_latency,
    latency_histogram,
    latency_summary,
    malformed,
    rate_over_time,
    rpc_pairs,
    topic_rates,
    windows,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Summary", "analyze", "analyze_rows", "TABLES"]

TABLES = ("messages", "topic_rates", "rpc_latency", "rpc_latency_summary", "malformed", "windows",
          "broker_rates", "cluster_calls")


@dataclass
class Summary:
    """The key figures of one run, and where everything went."""

    out: str
    messages: int = 0
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # protocol -> kind -> rows
    paired: dict[str, int] = field(default_factory=dict)  # protocol -> paired requests
    unpaired: dict[str, int] = field(default_factory=dict)  # protocol -> unanswered requests
    malformed: int = 0
    span_seconds: float = 0.0
    brokers: int = 0  # brokers whose captures were read
    cluster_calls: int = 0  # calls between brokers, paired across their captures
    tables: dict[str, str] = field(default_factory=dict)  # name -> Parquet directory
    report: str = ""
    plots: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """A few lines for the command line."""
        lines = [f"{self.messages} rows over {self.span_seconds:.1f} s"]
        for protocol, kinds in sorted(self.counts.items()):
            detail = ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))
            lines.append(f"{protocol}: {detail}")
        for protocol in sorted(set(self.paired) | set(self.unpaired)):
            lines.append(f"{protocol} requests: {self.paired.get(protocol, 0)} paired, "
                         f"{self.unpaired.get(protocol, 0)} unpaired")
        lines.append(f"malformed messages: {self.malformed}")
        if self.brokers > 1 or self.cluster_calls:
            lines.append(f"brokers: {self.brokers}; calls between them: {self.cluster_calls}")
        lines.append(f"report: {self.report}")
        return lines



def read_captures(spark: Any, captures: str | os.PathLike[str],
                  options: dict[str, str] | None = None) -> Any:
    """The `wirecapture` rows of `captures`, split into tasks as Spark splits files: by its
    spark.sql.files.maxPartitionBytes and openCostInBytes, over its cores at least. `options`
    reach object storage (wireproto.capture.storage)."""
    conf = spark.conf
    return (spark.read.format("wirecapture").options(**(options or {}))
            .option("maxPartitionBytes", _bytes(conf.get("spark.sql.files.maxPartitionBytes")))
            .option("openCostInBytes", _bytes(conf.get("spark.sql.files.openCostInBytes")))
            .option("minPartitions", conf.get("spark.sql.files.minPartitionNum", None)
                    or spark.sparkContext.defaultParallelism)
            .load(os.fspath(captures)))


def _bytes(value: str) -> int:
    """A Spark size setting ("134217728", "128MB", "4m") in bytes."""
    text = value.strip().lower().removesuffix("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)

def analyze(spark: Any, captures: str | os.PathLike[str] | None, out: str | os.PathLike[str],
            *, options: dict[str, str] | None = None,
            table: str | os.PathLike[str] | None = None) -> Summary:
    """Run every batch job over `captures` (local, or in storage with `options`, as the
    `wirecapture` source takes them), or with `table` (and no captures) over the rows of that
    ingested table, and write the tables and the report under `out`."""
    from pyspark.sql import functions as F

    from wireproto.capture.storage import open_store

    if table is not None:
        if captures is not None:
            raise ValueError("analyze: give capture files or a table, not both")
        from wireproto.pipeline.table import read_table

        return analyze_rows(read_table(spark, os.fspath(table), options), out,
                            messages=os.fspath(table))
    if captures is None:
        raise ValueError("analyze: give capture files or a table")
    store = open_store(captures, options)
    if not store.capture_files():  # FileNotFoundError for a missing path
        raise FileNotFoundError(f"no capture files in {os.fspath(captures)!r}")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = read_captures(spark, captures, options)
    messages = rows.withColumn("date", F.to_date("timestamp"))
    target = os.fspath(out_dir / "messages")
    messages.write.mode("overwrite").partitionBy("protocol", "date").parquet(target)
    # The jobs read the Parquet copy: the capture files are decoded once.
    return analyze_rows(spark.read.parquet(target), out_dir, messages=target)


def analyze_rows(rows: DataFrame, out: str | os.PathLike[str], *,
                 messages: str | None = None) -> Summary:
    """Run every batch job over `rows`, a DataFrame with the `wirecapture` source's columns
    (the Parquet copy of a decode, an ingested table, or any selection of either), and write
    the tables and the report under `out`; `messages` names where the rows are kept, for the
    report's list of tables."""
    from pyspark.sql import functions as F

    from wireproto.pipeline import report

    spark = rows.sparkSession
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = Summary(out=os.fspath(out_dir))
    if messages is not None:
        summary.tables["messages"] = messages

    counts = rows.groupBy("protocol", "kind").agg(
        F.count(F.lit(1)).alias("count"), F.count("decode_error").alias("malformed"),
        F.min("timestamp").alias("first"), F.max("timestamp").alias("last"),
    ).collect()
    for row in counts:
        summary.counts.setdefault(row["protocol"] or "unknown", {})[row["kind"]] = row["count"]
        if row["kind"] in ("in", "out"):
            summary.malformed += row["malformed"]
    summary.messages = sum(row["count"] for row in counts)
    if counts:
        first = min(row["first"] for row in counts)
        summary.span_seconds = (max(row["last"] for row in counts) - first).total_seconds()

    tables = {
        "topic_rates": topic_rates(rows, summary.span_seconds),
        "rpc_latency": rpc_pairs(rows),
        "malformed": malformed(rows),
        "windows": windows(rows),
        "broker_rates": broker_rates(rows, summary.span_seconds),
        "cluster_calls": cluster_calls(rows),
    }
    for name, frame in tables.items():
        target = os.fspath(out_dir / name)
        frame.write.mode("overwrite").parquet(target)
        summary.tables[name] = target
    pairs = spark.read.parquet(summary.tables["rpc_latency"])
    latency = latency_summary(rows, pairs)
    target = os.fspath(out_dir / "rpc_latency_summary")
    latency.write.mode("overwrite").parquet(target)
    summary.tables["rpc_latency_summary"] = target

    latency_rows = spark.read.parquet(target).orderBy("protocol", "route").collect()
    for row in latency_rows:
        summary.paired[row["protocol"]] = summary.paired.get(row["protocol"], 0) + row["paired"]
        summary.unpaired[row["protocol"]] = (
            summary.unpaired.get(row["protocol"], 0) + row["unpaired"])
    malformed_rows = (spark.read.parquet(summary.tables["malformed"])
                      .orderBy(F.desc("malformed"), "protocol", "connection").limit(50).collect())
    top_topics = (spark.read.parquet(summary.tables["topic_rates"])
                  .orderBy(F.desc("messages"), "protocol", "topic", "direction").limit(10)
                  .collect())

    brokers = (spark.read.parquet(summary.tables["broker_rates"])
               .orderBy("broker", "protocol").collect())
    summary.brokers = len({row["broker"] for row in brokers})
    calls = spark.read.parquet(summary.tables["cluster_calls"])
    summary.cluster_calls = calls.count()
    report.write_report(
        summary,
        brokers=brokers,
        cluster_latency=cluster_latency(calls).collect(),
        rate=rate_over_time(rows, summary.span_seconds),
        histogram=latency_histogram(pairs),
        latency=latency_rows,
        top_topics=top_topics,
        malformed=malformed_rows,
    )
    return summary
