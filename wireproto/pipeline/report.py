"""The human report of `wireproto analyze`: ``report.md`` and its PNG plots (matplotlib, Agg).

It is written from small aggregates the driver already collected (`analyze.analyze`), never
from the messages table.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

__all__ = ["write_report", "RATE_PLOT", "LATENCY_PLOT"]

RATE_PLOT = "rate.png"
LATENCY_PLOT = "latency.png"
PLOTTED_ROUTES = 8  # the latency plot's lines
LISTED_ROUTES = 20  # the latency table's rows


def write_report(summary: Any, *, rate: list[Any], histogram: list[Any], latency: list[Any],
                 top_topics: list[Any], malformed: list[Any], brokers: Sequence[Any] = (),
                 cluster_latency: Sequence[Any] = ()) -> None:
    """Write OUT/report.md and the plots; fills in `summary.report` and `summary.plots`."""
    out = Path(summary.out)
    plots = [_rate_plot(out / RATE_PLOT, rate), _latency_plot(out / LATENCY_PLOT, histogram)]
    summary.plots = [str(path) for path in plots]
    path = out / "report.md"
    text = _markdown(summary, latency, top_topics, malformed, list(brokers),
                     list(cluster_latency))
    path.write_text(text, encoding="utf-8")
    summary.report = str(path)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _rate_plot(path: Path, rate: list[Any]) -> Path:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 3.5))
    series: dict[str, list[tuple[datetime, float]]] = defaultdict(list)
    for row in rate:
        when = datetime.fromtimestamp(row["bucket"], UTC)
        series[row["protocol"] or "unknown"].append((when, row["messages"] / row["width"]))
    for protocol, points in sorted(series.items()):
        times, values = zip(*points, strict=True)
        axes.plot(times, values, marker=".", label=protocol)
    if series:
        # A short capture has a point or two: keep the axis to seconds around them.
        moments = [when for points in series.values() for when, _ in points]
        pad = max((max(moments) - min(moments)) * 0.05, timedelta(seconds=2))
        axes.set_xlim(min(moments) - pad, max(moments) + pad)
    axes.set_title("Messages per second (in and out)")
    axes.set_xlabel("time (UTC)")
    axes.set_ylabel("messages/s")
    figure.autofmt_xdate()
    return _save(plt, figure, axes, path, drawn=bool(series), empty="no messages")


def _latency_plot(path: Path, histogram: list[Any]) -> Path:
    """The latency CDF of each route, from the log-binned histogram of its ok answers."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 3.5))
    routes: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for row in histogram:
        routes[f"{row['protocol']} {_route(row['route'])}"].append((row["bin"], row["count"]))
    busiest = sorted(routes, key=lambda name: (-sum(count for _, count in routes[name]), name))
    shown = sorted(busiest[:PLOTTED_ROUTES])
    for name in shown:
        bins = routes[name]
        total = sum(count for _, count in bins)
        seen = 0
        xs, ys = [], []
        for number, count in sorted(bins):
            seen += count
            xs.append(10 ** ((number + 1) / 20))  # the bin's upper edge, in ms
            ys.append(seen / total)
        axes.step(xs, ys, where="post", label=name)
    axes.set_title(latency_plot_title(len(routes)))
    axes.set_xlabel("latency (ms)")
    axes.set_ylabel("share of ok answers")
    if routes:
        axes.set_xscale("log")
        # Plain milliseconds (0.1, 1, 10), not 10^-1 and the like.
        from matplotlib.ticker import FuncFormatter

        axes.xaxis.set_major_formatter(FuncFormatter(plain_ticks))
    return _save(plt, figure, axes, path, drawn=bool(routes), empty="no ok answers")


def latency_plot_title(routes: int) -> str:
    """The latency plot's title, for `routes` routes with ok answers: it shows what the
    latency table's percentiles are of, the ok answers (failures and timeouts are left out)."""
    if routes <= PLOTTED_ROUTES:
        return "RPC latency of the ok answers (CDF per route)"
    return f"RPC latency of the ok answers (CDF of the {PLOTTED_ROUTES} busiest of {routes} routes)"


def _save(plt: Any, figure: Any, axes: Any, path: Path, *, drawn: bool, empty: str) -> Path:
    """A legend, or `empty` in the middle if nothing was drawn; then the PNG."""
    if drawn:
        axes.legend(fontsize="small")
    else:
        axes.text(0.5, 0.5, empty, ha="center", transform=axes.transAxes)
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
    return path


def plain_ticks(value: float, _position: Any = None) -> str:
    """A log axis's tick as plain milliseconds: 0.1, 1, 10, 1000 (not 10^-1, 10^3)."""
    return f"{value:.10g}"


def connection_name(connection: int) -> str:
    """A capture's connection id as a person reads it: its broker run's mark in hex and the
    connection's number in that run, ``5e1f03a2#17`` (ids are a hash of the broker and its
    run, shifted 32 bits, plus that number)."""
    run, number = connection >> 32, connection & 0xFFFFFFFF
    return f"{run:08x}#{number}" if run else f"#{number}"


def _route(route: str | None) -> str:
    return route if route else "-"


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return lines


def _per_second(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _brokers(brokers: list[Any]) -> list[str]:
    """Per broker, its messages and rates summed over its protocols, then the fleet's."""
    totals: dict[str, list[float]] = {}
    keys = ("messages_in", "messages_out", "connections", "malformed")
    for row in brokers:
        sums = totals.setdefault(row["broker"] or "-", [0, 0, 0, 0, 0.0, 0.0])
        for index, key in enumerate(keys):
            sums[index] += row[key]
        sums[4] += row["in_per_second"] or 0.0
        sums[5] += row["out_per_second"] or 0.0
    timed = any(row["in_per_second"] is not None for row in brokers)
    fleet = [sum(values[index] for values in totals.values()) for index in range(6)]
    rows = [[name, *values[:4], *(_per_second(v if timed else None) for v in values[4:])]
            for name, values in sorted(totals.items())]
    rows.append(["**fleet**", *fleet[:4], *(_per_second(v if timed else None)
                                            for v in fleet[4:])])
    return _table(["broker", "in", "out", "connections", "malformed", "in per second",
                   "out per second"], rows)


def _cluster_calls(rows: list[Any]) -> list[str]:
    if not rows:
        return ["No calls between brokers in the capture."]
    lines = _table(
        ["caller", "answerer", "route", "calls", "replies", "refused", "unanswered", "p50 ms",
         "p95 ms", "p99 ms", "handled p50 ms", "transit p50 ms"],
        [[row["caller"], row["answerer"] or "-", row["route"], row["calls"], row["replies"],
          row["refused"], row["unanswered"], _ms(row["p50_ms"]), _ms(row["p95_ms"]),
          _ms(row["p99_ms"]), _ms(row["handled_p50_ms"]), _ms(row["transit_p50_ms"])]
         for row in rows[:LISTED_ROUTES]])
    return lines + ["", "The round trip is timed where the call was made, the handling where it "
                        "was answered, each on its own clock; transit is the difference: "
                        "NATS and the two processes' queues. Every call is in `cluster_calls`."]


def _markdown(summary: Any, latency: list[Any], top_topics: list[Any],
              malformed: list[Any], brokers: list[Any], cluster_latency: list[Any]) -> str:
    lines = ["# wireproto capture report", ""]
    lines.append(f"{summary.messages} rows over {summary.span_seconds:.1f} s; "
                 f"{summary.malformed} malformed messages.")
    lines += ["", "## Totals", ""]
    kinds = ["open", "in", "out", "close"]
    lines += _table(["protocol", *kinds], [
        [protocol, *(counts.get(kind, 0) for kind in kinds)]
        for protocol, counts in sorted(summary.counts.items())
    ])
    if brokers:
        lines += ["", "## Brokers", ""] + _brokers(brokers)
    lines += ["", "## Message rate", "", f"![messages per second]({RATE_PLOT})", ""]
    lines += ["## Top topics", ""]
    lines += _table(
        ["protocol", "topic", "direction", "messages", "per second", "bytes", "mean bytes",
         "max bytes"],
        [[row["protocol"], row["topic"], row["direction"], row["messages"],
          _ms(row["messages_per_second"]), row["bytes_total"], _ms(row["bytes_mean"]),
          row["bytes_max"]] for row in top_topics],
    ) if top_topics else ["No topics."]
    lines += ["", "## RPC latency", ""]
    busiest = sorted(latency, key=lambda row: (-row["requests"], row["protocol"],
                                               _route(row["route"])))
    lines += _table(
        ["protocol", "route", "requests", "ok", "fail", "timeout", "unanswered", "p50 ms",
         "p95 ms", "p99 ms", "max ms"],
        [[row["protocol"], _route(row["route"]), row["requests"], row["ok"], row["fail"],
          row["timeout"], row["unpaired"], _ms(row["p50_ms"]), _ms(row["p95_ms"]),
          _ms(row["p99_ms"]), _ms(row["max_ms"])]
         for row in busiest[:LISTED_ROUTES]],
    ) if latency else ["No requests."]
    if latency:
        lines += ["", "Latency, here and in the plot below, is of the ok answers: failures and "
                      "timeouts are counted, not timed. A timeout is an answer later than the "
                      "clients' 30 s request timeout; unanswered requests got no answer in the "
                      "capture."]
    if len(latency) > LISTED_ROUTES:
        lines += ["", f"The {LISTED_ROUTES} busiest of {len(latency)} routes; all of them are "
                      "in `rpc_latency_summary`."]
    lines += ["", f"![RPC latency]({LATENCY_PLOT})", ""]
    if summary.brokers > 1 or cluster_latency:
        lines += ["## Calls between brokers", ""] + _cluster_calls(cluster_latency) + [""]
    lines += ["## Malformed messages", ""]
    lines += _table(
        ["protocol", "transport", "connection", "peer", "malformed", "example error"],
        [[row["protocol"], row["transport"], connection_name(row["connection"]), row["peer"],
          row["malformed"], row["example_error"]] for row in malformed],
    ) if malformed else ["None."]
    lines += ["", "## Tables", ""]
    lines += [f"- [`{name}`]({_link(summary.out, path)})" for name, path in summary.tables.items()]
    return "\n".join(lines) + "\n"


def _link(out: str, path: str) -> str:
    """Where a table is, as report.md (in `out`) links it: relative to the report for a table
    under `out`, wherever the report is read from; any other location as it is."""
    if "://" in path:
        return path
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(out))
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return Path(os.path.abspath(path)).as_uri()
    return quote(Path(relative).as_posix()) + "/"
