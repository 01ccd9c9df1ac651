"""The pipeline benchmark reads every generated row through both readers and prints its table.

No timing assertions: speed is bench/pipeline.py's business. This runs it on a tiny capture,
through the real data source in Spark local[2].
"""

import importlib.util
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.support import need_peer, starts_its_own_spark
from wireproto import capture
from wireproto.pipeline.rows import decode_batch, projected_schema

BENCH = Path(__file__).resolve().parent.parent / "bench" / "pipeline.py"
spec = importlib.util.spec_from_file_location("bench_pipeline", BENCH)
pipeline = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = pipeline  # dataclasses look their module up there
spec.loader.exec_module(pipeline)

NUMBER = r"[\d,]+(?:\.\d+)?"


def test_the_generated_capture_is_a_broker_mix_in_several_files(tmp_path: Path) -> None:
    generated = pipeline.generate(tmp_path, 3000, 3)
    files = capture.capture_files(tmp_path)
    assert generated.files == len(files) >= 3
    records = [record for path in files for record in capture.iter_records(path)]
    assert generated.records == len(records)
    batches = [record for record in records if record.flags & capture.FLAG_BATCH]
    assert batches and any(len(record.messages()) >= 10 for record in batches)
    assert {record.kind for record in batches} == {capture.Kind.IN, capture.Kind.OUT}
    assert generated.messages >= 3000
    # The row count the benchmark checks against is the one the data source's decode gives.
    paths = [str(path) for path in files]
    assert pipeline.decode_in_process(paths, 100) == generated.rows
    types, errors = Counter(), 0
    for path in paths:
        batch = capture.read_batch(path)
        rows = decode_batch(path, batch).to_pydict()
        types.update(zip(rows["protocol"], rows["message_type"], strict=True))
        errors += sum(error is not None for error in rows["decode_error"])
    for expected in [("websmq", "publish"), ("ubre", "request"), ("ubre", "success"),
                     ("ubre", "publish"), ("nydus", "invoke"), ("nydus", "result"),
                     ("subble", "produce_event"), ("subble", "event")]:
        assert types[expected] > 0, expected
    assert errors == types[("websmq", None)] + types[("ubre", None)] > 0


def test_a_wrong_row_count_fails_the_run() -> None:
    with pytest.raises(pipeline.BenchError, match=r"one process: 5 rows read, 6 written"):
        pipeline._timed("one process", 6, lambda: 5, 1)


@starts_its_own_spark
def test_a_tiny_run_through_spark_prints_the_figures(tmp_path: Path, monkeypatch) -> None:
    need_peer(
        "pyspark is not installed; pip install -e '.[spark]'"
        if importlib.util.find_spec("pyspark") is None
        else "java is not installed (Spark needs Java 17)" if shutil.which("java") is None
        else None,
        "Spark",
    )
    monkeypatch.setattr(pipeline.tempfile, "tempdir", str(tmp_path))
    lines: list[str] = []
    options = pipeline.parse_args(["--quick", "--records", "3000", "--files", "3"])
    report = pipeline.run(options, out=lines.append)

    assert sorted(report.timings) == sorted((reader, view) for reader in pipeline.READERS
                                            for view in pipeline.VIEWS)
    assert all(len(timing.seconds) == len(timing.cpu) == 1 and timing.cpu[0] > 0
               for timing in report.timings.values())
    # Spark's runs are split between the JVM and Python; Parquet has no Python workers.
    assert all(0 < report.timings[reader, view].jvm[0] < report.timings[reader, view].cpu[0]
               for reader in ("wirecapture", "parquet", "table") for view in pipeline.VIEWS)
    assert len(report.query_seconds) == 1
    assert list(tmp_path.iterdir()) == []  # the capture and the Parquet files are removed
    text = "\n".join(lines)
    assert re.search(rf"capture: {NUMBER} rows \({NUMBER} messages\) in {NUMBER} records,"
                     rf" [3-9] files", text), text
    assert re.search(rf"parquet: the same rows in [3-9] files, {NUMBER} MiB", text), text
    assert re.search(rf"table: the same rows in \d+ files, {NUMBER} MiB, partitioned by date,"
                     rf" broker and protocol; ingested in {NUMBER} s", text), text
    for reader, view in report.timings:
        row = next(line for line in lines if line.startswith(f"{reader} ")
                   and line[len(reader):].split()[0] == view)
        cells = row[len(reader):].split()[1:]
        assert len(cells) == 6 and all(re.fullmatch(rf"{NUMBER}|-", cell) for cell in cells), row
        assert (cells[4] == "-") == (reader == "one process"), row
    assert f"{report.capture.rows:,} rows in every run" in text
    assert re.search(rf"spark's fixed cost per query .*: {NUMBER} s", text)
    assert re.search(r"wirecapture CPU per row: \d+\.\d\dx parquet's \(goal at most 1\.5x\)"
                     r"  (ok|MISSED)", text)
    assert re.search(r"wirecapture local\[2\]: \d+\.\d\dx one process \(goal at least 1\.7x\)"
                     r"  (ok|MISSED)", text)
    assert re.search(rf"wirecapture local\[2\]: {NUMBER} rows/s \(goal at least 1,500,000\)"
                     r"  (ok|MISSED)", text)
    assert re.search(r"record columns: wirecapture CPU per row \d+\.\d\dx parquet's", text)
    assert re.search(r"table: \d+\.\d\dx the wirecapture source's rows/s \(goal at least 3\.0x\)"
                     r"  (ok|MISSED)", text)
    assert re.search(r"table CPU per row: \d+\.\d\dx parquet's \(goal at most 1\.2x\)"
                     r"  (ok|MISSED)", text)
    # Filter pushdown: each filter gives the same rows pushed or not; a pushed broker filter
    # reads one broker's file of eight.
    figures = report.pushdown.figures
    assert len(figures) == len(pipeline.pushdown.queries("b", "t0", "t1"))
    for name in ("broker", "protocol", "time"):
        assert figures[f"{name}, pushed"].rows == figures[f"{name}, Spark filters"].rows
        assert 0 < figures[f"{name}, pushed"].rows[0] < figures["no filter"].rows[0]
    assert figures["no filter"].rows[0] == report.pushdown.rows
    assert (figures["broker, pushed"].bytes_read[0] * 4
            < figures["broker, Spark filters"].bytes_read[0])
    assert re.search(rf"broker, pushed +{NUMBER} +{NUMBER} MiB +{NUMBER}%", text), text
    # Ingest, with and without its shuffle, beside Spark's own Parquet write.
    assert list(report.ingest) == list(pipeline.INGESTS)
    assert all(len(timing.cpu) == 1 and timing.cpu[0] > 0 for timing in report.ingest.values())
    assert report.ingest_files["ingest"] <= report.ingest_files["ingest, no shuffle"]
    for name in pipeline.INGESTS:
        assert re.search(rf"^{name} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +\d+$", text,
                         re.MULTILINE), name
    assert re.search(r"ingest CPU per row: \d+\.\d\dx the wirecapture read's plus the Parquet"
                     r" write's \(.*goal at most 1\.1x\)  (ok|MISSED)", text)
    assert re.search(r"net of each query's fixed CPU: -?\d+\.\d\dx .*  (ok|MISSED)", text)
    assert set(report.fixed_cpu) == {"ingest", "wirecapture"} and report.fixed_rows > 2000


def test_the_parquet_floor_holds_the_rows_the_source_makes(tmp_path: Path) -> None:
    import pyarrow.parquet as parquet

    generated = pipeline.generate(tmp_path / "capture", 2000, 2)
    paths = [str(path) for path in capture.capture_files(tmp_path / "capture")]
    pipeline.write_parquet(paths, tmp_path / "parquet", 64)
    table = parquet.read_table(tmp_path / "parquet")
    assert table.num_rows == generated.rows
    assert table.schema == pipeline.ARROW_SCHEMA
    for view in pipeline.VIEWS:
        assert pipeline.decode_in_process(paths, 64, view) == generated.rows


def test_options_are_checked() -> None:
    with pytest.raises(SystemExit):
        pipeline.parse_args(["--records", "0"])
    with pytest.raises(SystemExit):
        pipeline.parse_args(["--batch-size", "-1"])
    assert pipeline.parse_args(["--quick"]).records == 20_000
    assert pipeline.parse_args([]).runs == 5


@pytest.mark.parametrize("names", [
    ["timestamp", "connection", "kind"],  # no message is decoded and no bytes copied
    ["data", "broker", "message_index"],  # the bytes, undecoded
    ["topic", "offset", "decode_error", "file"],
    ["request_id", "body_size", "message_type", "protocol", "transport", "binary"],
])
def test_some_columns_are_those_columns_of_the_whole_row(tmp_path: Path, names: list[str]
                                                          ) -> None:
    pipeline.generate(tmp_path, 3000, 2)
    path = str(capture.capture_files(tmp_path)[0])
    # A batch record that does not split is one row either way.
    with capture.CaptureWriter(tmp_path / "corrupt") as writer:
        writer.open_connection(1, "127.0.0.1:5000", "websmq", "length32")
        writer.message(1, "in", b"\x00\x00\x00\x09abc", True, batch=True)
    corrupt = str(capture.capture_files(tmp_path / "corrupt")[0])
    for source in (path, corrupt):
        batch = capture.read_batch(source)
        whole = decode_batch(source, batch, "edge-1")
        some = decode_batch(source, batch, "edge-1", projected_schema(names))
        assert some.schema.names == names
        assert some.num_rows == whole.num_rows > 0
        assert some.to_pydict() == whole.select(names).to_pydict()


@pytest.mark.parametrize("names", [[], ["topic", "nothing"], ["topic", "topic"]])
def test_columns_that_are_not_the_schemas_are_refused(names: list[str]) -> None:
    with pytest.raises(ValueError, match="not distinct columns"):
        projected_schema(names)


@starts_its_own_spark
@pytest.mark.timeout(300)
def test_the_small_capture_benchmark_times_a_real_analyze_and_reads_its_event_log(
        tmp_path: Path) -> None:
    need_peer(None if importlib.util.find_spec("pyspark") and shutil.which("java") else
              "pyspark or java is missing", "Spark")
    import os

    import _analyze_small as small

    assert pipeline.parse_args(["--small"]).runs == 3
    generated = pipeline.generate(tmp_path / "capture", small.SMALL_MESSAGES, 1)
    assert generated.rows <= small.SMALL_ROWS
    env = small._event_log_env({**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}, tmp_path)
    run = small.run_command(generated.directory, tmp_path / "out", env)
    assert (tmp_path / "out" / "report.md").is_file()
    kinds = {process.kind for process in run.processes.values()}
    assert {"command", "jvm", "pyspark.worker"} <= kinds, kinds
    assert run.cpu_of(lambda kind: kind == "jvm") > 1
    log = small.read_event_log(tmp_path / "events")
    assert len(log["queries"]) > 10 and all(query["end"] for query in log["queries"])
    assert run.started * 1000 < log["application"] < log["queries"][0]["start"]
    lines = small.breakdown(run, log)
    assert any("query 0: parquet" in line for line in lines), lines
    assert any("exit; CPU" in line for line in lines), lines
    assert any("Python pyspark.worker: " in line for line in lines), lines
