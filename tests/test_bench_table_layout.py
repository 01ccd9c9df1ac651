"""The table layout benchmark runs on a small fleet: ingest in several batches, the layout, and
partition pruning read from Spark's own scan metrics. No timing assertions."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.pipeline.conftest import need_spark
from tests.support import starts_its_own_spark

BENCH = Path(__file__).resolve().parent.parent / "bench"
spec = importlib.util.spec_from_file_location("bench_table_layout", BENCH / "table_layout.py")
layout = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = layout  # dataclasses look their module up there
spec.loader.exec_module(layout)


@starts_its_own_spark
@pytest.mark.timeout(600)
def test_a_small_fleet_gives_its_layout_and_what_pruning_reads(tmp_path: Path,
                                                              monkeypatch) -> None:
    need_spark()
    monkeypatch.setattr(layout.tempfile, "tempdir", str(tmp_path))
    lines: list[str] = []
    options = layout.parse_args(["--quick", "--brokers", "2", "--days", "2", "--batches", "2"])
    queries = {query.name: query for query in layout.run(options, out=lines.append)}
    text = "\n".join(lines)
    # 2 brokers x 2 days x 4 protocols, a file each per batch.
    assert "table: 16 partitions (date/broker/protocol), 32 data files" in text, text
    assert "files per partition: fewest 2, median 2, most 2" in text
    everything = queries["all"]
    assert everything.files == 32
    for name in ("date = 2026-11-26", "broker = site-1"):  # half the table each
        assert queries[name].files == 16, name
        assert 0.4 < queries[name].rows / everything.rows < 0.6, name
        assert 0.4 < queries[name].bytes / everything.bytes < 0.6, name
    assert queries["all three"].files == 2
    assert queries["protocol = ubre"].files == 8
    assert queries["topic (no partition)"].files == 32  # no pruning on a column of the files
    assert sum(query.bytes for query in queries.values()) > 0
    assert re.search(r"^all three +[\d,]+ +2 +[\d.]+ +[\d.]+%", text, re.MULTILINE), text
    assert list(tmp_path.iterdir()) == []  # the fleet and the table are removed


def test_options_are_checked() -> None:
    with pytest.raises(SystemExit):
        layout.parse_args(["--brokers", "0"])
    assert layout.parse_args(["--quick"]).records == 3_000
    assert layout.parse_args([]).runs == 3
