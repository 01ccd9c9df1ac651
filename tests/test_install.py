"""The set-up a fresh clone gets from the Makefile: `make speedups` (what `make serve` runs first)
installs only what serving needs and compiles the fast path, and twistd finds the wireproto
plugin without setuptools' deprecated "compat" editable mode. Run in a copy of this checkout's
files, into a new venv."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_make_install_serves_from_a_fresh_copy(tmp_path: Path) -> None:
    if shutil.which("make") is None or shutil.which("git") is None:
        pytest.fail("make and git are needed to set up wireproto")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    copy = tmp_path / "wireproto"
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            target = copy / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    assert "editable_mode=compat" not in (copy / "Makefile").read_text()

    # `make speedups`: the install, then the compiled fast path (what `make serve` runs before
    # the broker).
    done = subprocess.run(["make", "speedups"], cwd=copy, capture_output=True, text=True,
                          timeout=540, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "installing wireproto (what serving needs)" in done.stdout
    assert "make: the fast path is compiled" in done.stdout, done.stdout[-3000:]
    python = copy / ".venv" / "bin" / "python"
    path = subprocess.run([python, "-c", "import wireproto.speedups as s; "
                           "print(s.implementation, s.__file__)"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert path.stdout.split() == ["compiled", str(copy / "wireproto/speedups/__init__.py")], (
        path.stdout + path.stderr)
    for absent in ("pyspark", "pytest", "atheris", "hypothesis"):
        found = subprocess.run([python, "-c", f"import {absent}"], capture_output=True)
        assert found.returncode != 0, f"make install installed {absent}"
    # orjson reads and writes every JSON message: serving needs it.
    assert subprocess.run([python, "-c", "import orjson"], capture_output=True).returncode == 0
    # From another directory, so only the install can make the plugin visible.
    plugins = subprocess.run([copy / ".venv" / "bin" / "twistd", "--help"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert "wireproto" in plugins.stdout, plugins.stdout + plugins.stderr
    version = subprocess.run([copy / ".venv" / "bin" / "wireproto", "serve", "--help"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and "--listen" in version.stdout
