"""The compiled fast path is built, current, and chosen: CI fails without it (where every other
test of it would only be skipped), a build older than its source fails here rather than testing
old code, and WIREPROTO_PURE_PYTHON=1 chooses the plain-Python twin in a fresh interpreter."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wireproto import speedups

SOURCE = Path(speedups.__file__).with_name("_compiled.pyx")
REBUILD = "run `make speedups` (or `python setup.py build_ext --inplace` in this checkout)"


def compiled_or_skip():
    module = speedups.IMPLEMENTATIONS["compiled"]
    if module is None:
        if os.environ.get("CI"):
            pytest.fail(f"the compiled fast path is not built: {REBUILD}")
        pytest.skip("the compiled fast path is not built (make speedups)")
    return module


def test_ci_runs_the_compiled_path():
    """Under CI every fast_path test must run on both paths, not skip the compiled one."""
    if not os.environ.get("CI"):
        pytest.skip("only CI (CI=true) insists on the compiled fast path")
    assert speedups.compiled_available(), f"the compiled fast path is not built: {REBUILD}"


def test_the_build_is_not_older_than_its_source():
    """The build carries the SHA-256 of the source it was compiled from (setup.py puts it
    there), so the tests never run old code as the compiled path."""
    module = compiled_or_skip()
    assert module.SOURCE_DIGEST == hashlib.sha256(SOURCE.read_bytes()).hexdigest(), (
        f"{Path(module.__file__).name} was built from another {SOURCE.name}: {REBUILD}")


def test_a_build_older_than_its_source_is_not_run(tmp_path):
    """A copy of the package whose _compiled.pyx changed after the build (a pull, an edit
    without `make speedups`) runs the plain-Python twin, and says why; the same copy with its
    source as built runs the compiled path."""
    module = compiled_or_skip()
    package = tmp_path / "wireproto"
    package.mkdir()
    (package / "__init__.py").write_text("")
    copy = package / "speedups"
    copy.mkdir()
    for name in ("__init__.py", "_pure.py", "_compiled.pyx", Path(module.__file__).name):
        (copy / name).write_bytes((SOURCE.parent / name).read_bytes())
    ask = (f"import wireproto.speedups as s; assert s.__file__.startswith({str(tmp_path)!r}); "
           "print(s.implementation, '|', s.compiled_problem)")

    def implementation() -> str:
        done = subprocess.run([sys.executable, "-c", ask], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, check=False,
                              env={**os.environ, "PYTHONPATH": str(tmp_path)})
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert implementation() == "compiled |"
    (copy / "_compiled.pyx").write_text(SOURCE.read_text() + "\n# changed after the build\n")
    assert implementation() == (
        "pure | built from an older _compiled.pyx (make speedups builds it again)")


def implementation_in_a_fresh_interpreter(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "WIREPROTO_PURE_PYTHON"}
    environment.update(env)
    checkout = Path(speedups.__file__).parents[2]
    done = subprocess.run(
        [sys.executable, "-c",
         "import wireproto.speedups as s, wireproto.speedups._pure as p\n"
         "assert all((getattr(s, n) is getattr(p, n)) == (s.implementation == 'pure')"
         " for n in s.PIECES if callable(getattr(p, n)))\n"
         "print(s.implementation, s.compiled_available())"],
        cwd=checkout, env=environment, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_wireproto_pure_python_chooses_the_plain_path_at_start():
    compiled_or_skip()
    assert implementation_in_a_fresh_interpreter(WIREPROTO_PURE_PYTHON="1") == "pure True"
    assert implementation_in_a_fresh_interpreter() == "compiled True"
    # Only "1" asks for the plain path.
    assert implementation_in_a_fresh_interpreter(WIREPROTO_PURE_PYTHON="0") == "compiled True"


def test_a_broker_process_started_by_a_fast_path_test_runs_that_path(fast_path):
    """fast_path sets WIREPROTO_PURE_PYTHON, so brokers a test starts as processes follow."""
    done = subprocess.run(
        [sys.executable, "-c", "import wireproto.speedups as s; print(s.implementation)"],
        cwd=Path(speedups.__file__).parents[2], capture_output=True, text=True, timeout=60,
        check=False)
    assert (done.returncode, done.stdout.strip()) == (0, fast_path), done.stderr
