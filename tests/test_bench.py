"""The codec benchmark measures real round trips: each case decodes back what it encoded. The
Phyllo benchmark moves every message through every row, in a tiny run."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import pytest_twisted

from tests.support import wait_for

BENCH = Path(__file__).resolve().parent.parent / "bench" / "codecs.py"
spec = importlib.util.spec_from_file_location("bench_codecs", BENCH)
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # dataclasses look their module up there
spec.loader.exec_module(bench)
CASES = bench.cases()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bench_case_round_trips(case):
    assert case.roundtrip() == case.expected
    text_envelope = bench._text_envelope(case.envelope)
    bare = bench.bare_roundtrips(case.envelope)
    assert bare.pop("msgpack")() == case.envelope
    for name, roundtrip in bare.items():
        assert roundtrip() == text_envelope, name


def test_every_codec_is_benchmarked():
    import pkgutil

    import wireproto.codecs

    codecs = {m.name for m in pkgutil.iter_modules(wireproto.codecs.__path__)} - {"serialization"}
    covered = {case.name.split()[0] for case in CASES}
    assert codecs <= covered, f"not in bench/codecs.py: {sorted(codecs - covered)}"


def test_stream_feeds_decode_every_message():
    for name, run in bench.stream_feeds():
        assert run() == 200, name


PHYLLO_BENCH = BENCH.parent / "phyllo.py"
phyllo_spec = importlib.util.spec_from_file_location("bench_phyllo", PHYLLO_BENCH)
phyllo_bench = importlib.util.module_from_spec(phyllo_spec)
sys.modules[phyllo_spec.name] = phyllo_bench
phyllo_spec.loader.exec_module(phyllo_bench)


@pytest_twisted.ensureDeferred
async def test_phyllo_bench_moves_every_message_through_every_row():
    lines: list[str] = []
    options = phyllo_bench.parse_args(["--quick", "--messages", "60", "--line-messages", "12"])
    report = await wait_for(phyllo_bench.run(options, out=lines.append), timeout=120)

    rows = {row.name: row for row in phyllo_bench.ROWS}
    if os.environ.get("CI"):
        assert report.skipped == {}, lines  # the test extra installs phyllo-python
    else:
        assert {rows[name].stack for name in report.skipped} <= {"phyllo-python"}
    assert {m.row.name for m in report.measurements} == set(rows) - set(report.skipped), lines
    for m in report.measurements:
        # run() raised BenchError had a row lost, doubled or changed a message
        assert m.messages == (12 if m.row.paced else 60)
        assert m.seconds > 0 and m.cpu_seconds >= 0
    table = "\n".join(report.lines)
    assert "wireproto receive" in table and "goals:" in table


@pytest_twisted.ensureDeferred
async def test_phyllo_bench_finds_its_board_by_identity_with_the_watcher_on():
    by_identity = [row for row in phyllo_bench.ROWS if row.poll is not None]
    assert {row.direction for row in by_identity} == {"receive", "send"}
    assert any(row.paced for row in by_identity)
    assert {row.poll for row in by_identity} == {phyllo_bench.DEFAULT_POLL,
                                                 phyllo_bench.MIN_INTERVAL}
    lines: list[str] = []
    options = phyllo_bench.parse_args(["--quick", "--messages", "60", "--line-messages", "12",
                                       "--rows", ",".join(row.name for row in by_identity)])
    report = await wait_for(phyllo_bench.run(options, out=lines.append), timeout=120)
    assert [m.row for m in report.measurements] == by_identity, lines
    for m in report.measurements:
        # run() checked each message arrived once and unchanged, on the stand-in it found
        assert m.messages == (12 if m.row.paced else 60) and m.seconds > 0
        assert m.lists and all(seconds >= 0 for seconds in m.lists)
    assert any(line.startswith("by identity: serial:vid=2341:pid=0043:serial_number=BENCH")
               for line in report.lines)


def test_phyllo_bench_rows_are_chosen_by_their_whole_names():
    # names with a comma in them, which splitting on every comma could not choose
    assert phyllo_bench.parse_args(
        ["--rows", "phyllo-python receive, bulk,wireproto receive, by identity, polled 20/s,"
                   "wireproto send"]).rows == [
        "phyllo-python receive, bulk", "wireproto receive, by identity, polled 20/s",
        "wireproto send"]
    with pytest.raises(SystemExit):
        phyllo_bench.parse_args(["--rows", "wireproto receive, bulk"])
