"""wireproto as a Python user gets it: `python -m build` makes the sdist and the wheel from a copy
of this checkout's files; the wheel holds the LICENSE, the status page's files (its icon too)
and the twistd plugin, and installs with pip into a fresh venv (no make), whose `wireproto
serve` and `twistd wireproto` serve a real client. The hint `wireproto analyze` gives without
the spark extra names what pip can install.

Slow (a minute or more: the build's own environment, then the install, from pip's cache where
it can), so bounded by its own timeout, as tests/test_install.py is."""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import pytest_twisted

from tests.test_cli import LISTENER_LINE, Child, exchange
from wireproto import __version__
from wireproto.pipeline.command import spark_missing

ROOT = Path(__file__).resolve().parents[1]
LOCAL = "interface=127.0.0.1"


def checkout_copy(target: Path) -> Path:
    """The files git tracks here, copied to `target`: what a fresh clone has, so the build
    writes its egg-info and build/ there and not in this checkout."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            copied = target / name.decode()
            copied.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copied)
    return target


def tracked(under: str) -> set[str]:
    """The files git tracks under `under`, relative to the checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", under], cwd=ROOT, capture_output=True,
                            check=True).stdout.split(b"\0")
    return {name.decode() for name in listed if name}


def spark_extra() -> list[str]:
    """The spark extra's requirements, as setup.cfg lists them."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options.extras_require"]["spark"].splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def without_checkout() -> dict[str, str]:
    """This process's environment, but for what would import wireproto from a checkout."""
    return {name: value for name, value in os.environ.items()
            if name not in ("PYTHONPATH", "VIRTUAL_ENV")}


def test_the_spark_hint_names_what_pip_can_install() -> None:
    hint = spark_missing()
    assert "wireproto[" not in hint  # wireproto is on no package index
    command = hint.split(": ", 1)[1]
    packages = shlex.split(command.split(" (or,")[0])
    assert packages[:2] == ["pip", "install"]
    assert sorted(packages[2:]) == sorted(spark_extra())
    assert hint.endswith("(or, in wireproto's source directory, pip install -e '.[spark]')")


@pytest.mark.timeout(900)
@pytest_twisted.ensureDeferred
async def test_the_wheel_installs_into_a_fresh_venv_and_serves(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.fail("git is needed to list the checkout's files")
    if importlib.util.find_spec("build") is None:
        pytest.fail("no `build` here: pip install -e '.[test]' (make test does)")
    source = checkout_copy(tmp_path / "source")
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
                           capture_output=True, text=True, timeout=420,
                           stdin=subprocess.DEVNULL)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # A wheel for this Python and platform: it carries the compiled fast path.
    (wheel,) = dist.glob(f"wireproto-{__version__}-cp3*-cp3*-*.whl")
    (sdist,) = dist.glob(f"wireproto-{__version__}.tar.gz")

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        licenses = [name for name in names
                    if name.endswith("/LICENSE") and ".dist-info/" in name]
        assert len(licenses) == 1, sorted(names)
        assert archive.read(licenses[0]) == (ROOT / "LICENSE").read_bytes()
        metadata = archive.read(f"wireproto-{__version__}.dist-info/METADATA").decode()
    assert "License: MIT" in metadata or "License-Expression: MIT" in metadata
    for name in tracked("wireproto/admin/static") | tracked("twisted/plugins"):
        assert name in names, f"{name} is not in the wheel"
    assert not any(name.startswith("tests/") for name in names)
    assert any(re.fullmatch(r"wireproto/speedups/_compiled\..*\.so", name) for name in names), \
        "the compiled fast path is not in the wheel"
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    # The docs link the examples (examples/app.py, examples/wireproto.tac ...).
    for name in ("LICENSE", "CHANGELOG.md", "README.md", "setup.cfg", "setup.py",
                 "wireproto/speedups/_compiled.pyx", "docs/quickstart.md",
                 *tracked("wireproto/admin/static"), *tracked("twisted/plugins"),
                 *tracked("examples")):
        assert name in in_sdist, f"{name} is not in the sdist"

    # A venv of its own, the wheel and its dependencies from the package index (or pip's
    # cache): no make, no checkout on the path.
    venv = tmp_path / "venv"
    environment = without_checkout()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120,
                   env=environment)
    installed = subprocess.run(
        [venv / "bin" / "pip", "install", "--disable-pip-version-check", "--progress-bar",
         "off", str(wheel)], capture_output=True, text=True, timeout=420, env=environment,
        stdin=subprocess.DEVNULL)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    where = subprocess.run([venv / "bin" / "python", "-c", "import wireproto; "
                            "print(wireproto.__file__)"], capture_output=True, text=True,
                           cwd=tmp_path, env=environment, check=True, timeout=60)
    assert where.stdout.startswith(str(venv / "lib")), where.stdout
    path = subprocess.run([venv / "bin" / "python", "-c", "import wireproto.speedups as s; "
                           "print(s.implementation)"], capture_output=True, text=True,
                          cwd=tmp_path, env=environment, check=True, timeout=60)
    assert path.stdout.strip() == "compiled", path.stdout

    # Each from another directory, through `env -u`: Child passes on this process's
    # environment, whose PYTHONPATH names the checkout.
    unset = ["env", "-u", "PYTHONPATH", "-u", "VIRTUAL_ENV"]
    serve = Child(*unset, str(venv / "bin" / "wireproto"), "serve",
                  "--listen", f"websmq+ws@tcp:0:{LOCAL}", cwd=tmp_path)
    try:
        listening = await serve.line(LISTENER_LINE, 60)
        page = await serve.line(re.compile(r"^wireproto: status page at (\S+), metrics"))
        await serve.line(re.compile(r"^wireproto: ready; Ctrl-C stops$"))
        await exchange(listening.group(3))
        # The status page's files came with the wheel.
        from tests.test_process_metrics import check_status_page

        await check_status_page(page.group(1))
        await check_status_page(page.group(1) + "js/websmq.js", "javascript")
        await check_status_page(page.group(1) + "favicon.ico", "image/x-icon")
        serve.process.send_signal(signal.SIGINT)
        assert await serve.exit_code(30) == 0, serve.output()
    finally:
        serve.kill()

    twistd = Child(*unset, str(venv / "bin" / "twistd"), "-n", "--pidfile=", "wireproto",
                   "--listen", f"websmq+ws@tcp:0:{LOCAL}", cwd=tmp_path)
    try:
        listening = await twistd.line(LISTENER_LINE, 60)
        await exchange(listening.group(3))
        twistd.process.send_signal(signal.SIGTERM)
        assert await twistd.exit_code(30) in (0, -signal.SIGTERM), twistd.output()
    finally:
        twistd.kill()

    # No spark extra in this venv: the hint names what to install.
    capture = tmp_path / "none.wpcap"
    capture.write_bytes(b"")
    analyze = subprocess.run(
        [*unset, str(venv / "bin" / "wireproto"), "analyze", str(capture), "--out",
         str(tmp_path / "out")], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert analyze.returncode == 2, analyze.stdout + analyze.stderr
    hint = analyze.stderr.strip()
    assert hint.startswith("wireproto analyze: install the spark extra: pip install "), hint
    assert sorted(shlex.split(hint.split(": pip install ")[1].split(" (or,")[0])) == sorted(
        spark_extra())
