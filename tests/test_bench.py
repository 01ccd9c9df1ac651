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
