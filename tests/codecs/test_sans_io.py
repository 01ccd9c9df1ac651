"""The codecs are sans-IO: importing any of them must not import Twisted or any networking."""

import importlib
import pkgutil
import subprocess
import sys

import pytest

import wireproto.codecs

MODULES = sorted(m.name for m in pkgutil.iter_modules(wireproto.codecs.__path__))
SPEC_CODECS = [m for m in MODULES if not m.startswith("_")]
FORBIDDEN = ("twisted", "autobahn", "serial", "socket", "asyncio", "selectors")


@pytest.mark.parametrize("name", MODULES)
def test_codec_imports_no_io(name):
    probe = (
        "import sys, importlib\n"
        f"importlib.import_module('wireproto.codecs.{name}')\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"wireproto.codecs.{name} imports {out.stdout.strip()}"


def test_probe_can_see_an_io_import():
    probe = "import sys, twisted.internet.protocol; print('twisted' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


@pytest.mark.parametrize("name", SPEC_CODECS)
def test_codec_exposes_encode_and_decode(name):
    module = importlib.import_module(f"wireproto.codecs.{name}")
    assert callable(module.encode) and callable(module.decode)
