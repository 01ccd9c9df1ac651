"""What setup.cfg cannot declare: the compiled fast path, a C extension built by Cython.

`optional=True`: where it cannot be built (no C compiler), the install goes on and the broker
runs its plain-Python twin (wireproto/speedups/_pure.py), which behaves the same. The source's
SHA-256 is compiled in, so that a build older than its source is never run
(wireproto/speedups/__init__.py)."""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "wireproto/speedups/_compiled.pyx"
DIGEST = hashlib.sha256(Path(__file__).with_name("wireproto").joinpath(
    "speedups", "_compiled.pyx").read_bytes()).hexdigest()

setup(ext_modules=[
    Extension("wireproto.speedups._compiled", [SOURCE], optional=True,
              define_macros=[("WIREPROTO_SOURCE_DIGEST", f'"{DIGEST}"')]),
])
