"""The codec benchmark measures real round trips: each case decodes back what it encoded."""

import importlib.util
import sys
from pathlib import Path

import pytest

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

    codecs = {m.name for m in pkgutil.iter_modules(wireproto.codecs.__path__)} - {"_common"}
    covered = {case.name.split()[0] for case in CASES}
    assert codecs <= covered, f"not in bench/codecs.py: {sorted(codecs - covered)}"


def test_stream_feeds_decode_every_message():
    for name, run in bench.stream_feeds():
        assert run() == 200, name
