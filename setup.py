"""What setup.cfg cannot declare: the compiled fast path, a C extension built by Cython.

`optional=True`: where it cannot be built (no C compiler), the install goes on and the broker
runs its plain-Python twin (wireproto/speedups/_pure.py), which behaves the same."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("wireproto.speedups._compiled", ["wireproto/speedups/_compiled.pyx"],
              optional=True),
])
