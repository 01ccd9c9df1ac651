"""`wireproto analyze` as a user meets it: report.md's links work wherever the report is read
from, --out is new or empty unless --overwrite (which replaces analyze's own outputs and nothing
else), a failed run leaves --out as it was, the latency plot times the calls the latency table
times, and the read tasks tell the progress line how far they have read. The command's own runs
(Ctrl-C, --overwrite end to end) are in test_analyze.py; pattern subscriptions in
test_analyze_wildcards.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

from tests.pipeline.conftest import BUCKET, S3Server, need_spark
from tests.pipeline.test_analyze_wildcards import wildcard_capture
from wireproto import capture

# -- report.md's links ------------------------------------------------------------------------


def test_report_links_are_relative_to_the_report(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from wireproto.pipeline.analyze import Summary
    from wireproto.pipeline.report import write_report

    monkeypatch.chdir(tmp_path)
    out = Path("reports") / "site 1"  # relative to the working directory, as a user types it
    out.mkdir(parents=True)
    elsewhere = tmp_path / "table"
    summary = Summary(out=str(out), tables={
        "messages": str(elsewhere), "topic_rates": str(out / "topic_rates"),
        "rpc_latency": str(out / "rpc_latency")})
    for name in ("topic_rates", "rpc_latency"):
        (out / name).mkdir()
    write_report(summary, rate=[], histogram=[], latency=[], top_topics=[], malformed=[])
    text = (out / "report.md").read_text(encoding="utf-8")
    links = dict(re.findall(r"- \[`(\w+)`\]\(([^)]+)\)", text))
    assert set(links) == {"messages", "topic_rates", "rpc_latency"}, text
    # Read from anywhere, each link leads from the report to its table.
    for name in ("topic_rates", "rpc_latency"):
        assert not os.path.isabs(links[name]) and "reports" not in links[name], links
        assert (tmp_path / out / unquote(links[name])).resolve() == (tmp_path / out / name)
    assert urlparse(links["messages"]).scheme == "file"
    assert Path(unquote(urlparse(links["messages"]).path)) == elsewhere
    for picture in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (out / picture).is_file(), picture


# -- --out: new or empty, or --overwrite ----------------------------------------------------------


def run_without_java(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`wireproto analyze ARGS` where no JVM can start: any answer comes before Spark."""
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java")}
    return subprocess.run([sys.executable, "-m", "wireproto", "analyze", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_non_empty_out_is_refused_unless_overwrite(tmp_path: Path) -> None:
    need_spark()  # pyspark must be there for the command to look at --out
    from tests.pipeline.test_analyze import small_capture

    small_capture(tmp_path / "capture")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("mine")
    done = run_without_java(tmp_path, str(tmp_path / "capture"), "--out", str(docs))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line == (f"wireproto analyze: --out {str(docs)!r} is not empty: give a new or empty "
                    "directory, or --overwrite to replace what analyze writes there (its "
                    "tables, report.md and plots) and leave the rest")
    assert sorted(os.listdir(docs)) == ["index.md"]
    follow = run_without_java(tmp_path, str(tmp_path / "capture"), "--out", str(docs),
                              "--follow", "--overwrite")
    assert follow.returncode == 2 and len(follow.stderr.splitlines()) == 1
    assert "--overwrite goes with a batch run" in follow.stderr


def test_a_failed_run_leaves_out_as_it_was(tmp_path: Path) -> None:
    from wireproto.pipeline import outdir

    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "report.md").write_text("the last run's")
    with pytest.raises(RuntimeError), outdir.staging(str(out)) as staged:
        Path(staged, "report.md").write_text("half")
        Path(staged, "messages").mkdir()
        raise RuntimeError("Spark failed")
    assert sorted(os.listdir(out)) == ["notes.txt", "report.md"]
    assert (out / "report.md").read_text() == "the last run's"
    new = tmp_path / "new"
    with pytest.raises(KeyboardInterrupt), outdir.staging(str(new)) as staged:
        Path(staged, "report.md").write_text("half")
        raise KeyboardInterrupt
    assert not new.exists()


def test_overwrite_replaces_what_analyze_writes_and_nothing_else(tmp_path: Path) -> None:
    from wireproto.pipeline import outdir
    from wireproto.pipeline.analyze import Summary

    out = tmp_path / "out"
    (out / "messages").mkdir(parents=True)
    (out / "messages" / "part-old.parquet").write_text("the last run's rows")
    (out / "report.md").write_text("the last run's")
    (out / "notes.txt").write_text("mine")
    (out / "drafts").mkdir()
    assert outdir.check_out(str(out), {}, overwrite=True) is None
    assert "is not empty" in (outdir.check_out(str(out), {}, overwrite=False) or "")
    with outdir.staging(str(out)) as staged:
        (Path(staged) / "messages").mkdir()
        (Path(staged) / "messages" / "part-new.parquet").write_text("rows")
        (Path(staged) / "report.md").write_text("new")
        summary = Summary(out=staged, tables={"messages": f"{staged}/messages"},
                          report=f"{staged}/report.md")
        summary = outdir.publish(summary, staged, str(out), {})
    assert sorted(os.listdir(out)) == ["drafts", "messages", "notes.txt", "report.md"]
    assert os.listdir(out / "messages") == ["part-new.parquet"]
    assert (out / "report.md").read_text() == "new" and (out / "notes.txt").read_text() == "mine"
    assert summary.out == str(out) and summary.report == str(out / "report.md")
    assert summary.tables == {"messages": str(out / "messages")}


def test_overwrite_in_object_storage(tmp_path: Path, s3: S3Server) -> None:
    from wireproto.pipeline import outdir
    from wireproto.pipeline.analyze import Summary

    fs = s3.filesystem()
    for key, text in (("reports/messages/part-old.parquet", b"old rows"),
                      ("reports/report.md", b"the last run's"), ("reports/notes.txt", b"mine")):
        with fs.open_output_stream(f"{BUCKET}/{key}") as stream:
            stream.write(text)
    target = f"s3://{BUCKET}/reports"
    assert "is not empty" in (outdir.check_out(target, s3.options, overwrite=False) or "")
    assert outdir.check_out(f"s3://{BUCKET}/new", s3.options, overwrite=False) is None
    staged = tmp_path / "staged"
    (staged / "messages").mkdir(parents=True)
    (staged / "messages" / "part-new.parquet").write_bytes(b"rows")
    (staged / "report.md").write_bytes(b"new")
    summary = outdir.publish(Summary(out=str(staged), report=str(staged / "report.md")),
                             str(staged), target, s3.options)
    import pyarrow.fs as pafs

    found = {info.path.removeprefix(f"{BUCKET}/reports/") for info in fs.get_file_info(
        pafs.FileSelector(f"{BUCKET}/reports", recursive=True))
        if info.type == pafs.FileType.File}
    assert found == {"messages/part-new.parquet", "report.md", "notes.txt"}
    assert fs.open_input_file(f"{BUCKET}/reports/report.md").readall() == b"new"
    assert summary.report == f"{target}/report.md"


# -- the latency plot and the latency table ---------------------------------------------------


def test_the_latency_plot_times_the_calls_the_table_times(spark: Any) -> None:
    from datetime import UTC, datetime

    from wireproto.pipeline.analyze import latency_histogram, latency_summary

    when = datetime(2026, 11, 27, tzinfo=UTC)
    pairs = spark.createDataFrame(
        [("ubre", "boom", "fail", 1.5), ("ubre", "boom", "fail", 2.5),  # every call failed
         ("ubre", "add", "success", 1.0), ("ubre", "add", "success", 3.0),
         ("ubre", "add", "fail", 0.1), ("ubre", "add", "success", 45_000.0),  # too late
         ("nydus", "/echo", "result", 2.0)],
        "protocol string, route string, outcome string, latency_ms double",
    ).selectExpr("*", "1 as connection", "'1' as request_id",
                 f"timestamp'{when:%Y-%m-%d %H:%M:%S}' as requested",
                 f"timestamp'{when:%Y-%m-%d %H:%M:%S}' as answered")
    rows = spark.createDataFrame([], "protocol string, kind string, message_type string, "
                                     "topic string")
    timed: dict[tuple[str, str], int] = {}
    for row in latency_histogram(pairs):
        key = (row["protocol"], row["route"])
        timed[key] = timed.get(key, 0) + row["count"]
    table = {(row["protocol"], row["route"]): row["ok"]
             for row in latency_summary(rows, pairs).collect()}
    assert timed == {key: ok for key, ok in table.items() if ok}
    assert timed == {("ubre", "add"): 2, ("nydus", "/echo"): 1}
    # The plot says what it times, as the table does.
    from wireproto.pipeline.report import latency_plot_title

    assert "ok answers" in latency_plot_title(2) and "ok answers" in latency_plot_title(20)


# -- read progress ----------------------------------------------------------------------------


def test_read_tasks_tell_how_far_they_have_read(tmp_path: Path) -> None:
    need_spark()
    from wireproto.pipeline.datasource import WireCaptureReader, bytes_read

    wildcard_capture(tmp_path / "capture")  # opens, 2,000 publishes, a few subscriptions
    (path,) = capture.capture_files(tmp_path / "capture")
    told = tmp_path / "progress"
    told.mkdir()
    reader = WireCaptureReader({"path": str(path), "batch_size": "500", "progress": str(told)})
    ranges = capture.split_ranges(path, path.stat().st_size // 3)
    assert len(ranges) >= 2
    seen = []
    for first, last in ranges:
        for _ in reader._read_file(str(path), first, last):
            seen.append(bytes_read(str(told)))
    assert seen == sorted(seen) and 0 < seen[0] < path.stat().st_size
    assert bytes_read(str(told)) == path.stat().st_size
    assert len(os.listdir(told)) == len(ranges)  # a file per task
    # Without the directory (a worker on another machine) the read goes on, untold.
    elsewhere = WireCaptureReader({"path": str(path), "progress": str(tmp_path / "nowhere")})
    assert sum(batch.num_rows for batch in elsewhere._read_file(str(path), None, None)) > 0
    assert not (tmp_path / "nowhere").exists()


# -- a small capture's JVM ----------------------------------------------------------------------


def test_a_small_input_gets_a_jvm_that_compiles_with_c1_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from wireproto.pipeline.spark import SMALL_INPUT_BYTES, prepare_jvm

    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    prepare_jvm(SMALL_INPUT_BYTES + 1)  # a large input keeps the JIT as it is
    assert "SPARK_SUBMIT_OPTS" not in os.environ
    # The Python workers the JVM starts on its own run this interpreter too.
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-Dsome.option=1")
    prepare_jvm(968_100)
    assert os.environ["SPARK_SUBMIT_OPTS"] == "-XX:TieredStopAtLevel=1 -Dsome.option=1"
    prepare_jvm(968_100)  # once
    assert os.environ["SPARK_SUBMIT_OPTS"] == "-XX:TieredStopAtLevel=1 -Dsome.option=1"
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=4")  # the user's choice
    prepare_jvm(968_100)
    assert os.environ["SPARK_SUBMIT_OPTS"] == "-XX:TieredStopAtLevel=4"
    prepare_jvm(None)  # --follow: no size known
    assert os.environ["SPARK_SUBMIT_OPTS"] == "-XX:TieredStopAtLevel=4"
