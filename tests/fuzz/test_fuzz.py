"""Every decoder's fuzz target runs briefly under atheris, coverage-guided; `make fuzz` runs them
for longer. The harness itself is shown to find a real bug: the Engine.IO decoder as it was,
when base64 of non-ASCII text raised ValueError instead of ProtocolError."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import need_module

need_module("atheris", "pip install atheris (make test installs it)")

from tests.fuzz.targets import TARGETS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("name", TARGETS)
def test_a_brief_fuzz_run_finds_nothing(name, tmp_path):
    done = run("-m", "tests.fuzz.run", name, "-max_total_time=1", "-runs=30000", "-seed=1",
               f"-artifact_prefix={tmp_path}/")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Done" in done.stderr


OLD_ENGINEIO_DECODER = '''
import base64, binascii
import atheris
from tests.fuzz.run import fuzz
from wireproto.errors import InvalidField

@atheris.instrument_func
def decode_packet(frame):
    if frame[:1] == "b":
        try:
            return base64.b64decode(frame[1:], validate=True)
        except binascii.Error as e:
            raise InvalidField(str(e)) from None
    return frame

fuzz(decode_packet, "text", ["-runs=2000000", "-max_total_time=60", "-seed=1",
                             "-artifact_prefix=%s/"])
'''


def test_the_fuzzer_finds_the_engineio_base64_bug(tmp_path):
    done = run("-c", OLD_ENGINEIO_DECODER % tmp_path)
    assert done.returncode != 0
    found = "ValueError: string argument should contain only ASCII characters"
    assert found in done.stdout + done.stderr
    assert list(tmp_path.glob("crash-*"))
