"""`wireproto analyze` as a user meets it: report.md's links work wherever the report is read
from, --out is new or empty unless --overwrite (which replaces analyze's own outputs and nothing
else), a failed run leaves --out as it was, the latency plot times the calls the latency table
times, and the read tasks tell the progress line how far they have read. The command's own runs
(Ctrl-C, --overwrite end to end) are in test_analyze.py; pattern subscriptions in
test_analyze_wildcards.py."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

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
