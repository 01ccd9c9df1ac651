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

from tests.support import need_peer
from wireproto import capture
from wireproto.pipeline.rows import decode_batch

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

    assert list(report.seconds) == ["one process", "spark local[2]"]
    assert all(len(seconds) == 1 for seconds in report.seconds.values())
    assert all(len(cpu) == 1 and cpu[0] > 0 for cpu in report.cpu.values())
    assert len(report.query_seconds) == 1
    assert list(tmp_path.iterdir()) == []  # the capture is removed
    text = "\n".join(lines)
    assert re.search(rf"capture: {NUMBER} rows \({NUMBER} messages\) in {NUMBER} records,"
                     rf" [3-9] files", text), text
    for name in report.seconds:
        row = next(line for line in lines if line.startswith(name + " "))
        cells = row[len(name):].split()
        assert len(cells) == 5 and all(re.fullmatch(NUMBER, cell) for cell in cells), row
    assert f"{report.capture.rows:,} rows in every run" in text
    assert re.search(rf"spark's fixed cost per query .*: {NUMBER} s", text)
    assert re.search(r"spark local\[2\]: \d+\.\d\dx one process \(goal at least 1\.7x\)"
                     r"  (ok|MISSED)", text)
    assert re.search(rf"spark local\[2\]: {NUMBER} rows/s \(goal at least 1,500,000\)"
                     r"  (ok|MISSED)", text)


def test_options_are_checked() -> None:
    with pytest.raises(SystemExit):
        pipeline.parse_args(["--records", "0"])
    with pytest.raises(SystemExit):
        pipeline.parse_args(["--batch-size", "-1"])
    assert pipeline.parse_args(["--quick"]).records == 20_000
    assert pipeline.parse_args([]).runs == 5
