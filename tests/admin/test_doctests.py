"""The examples in the admin modules' docstrings run and say what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["wireproto.admin.listing", "wireproto.admin.payloads", "wireproto.admin.history",
           "wireproto.cluster.lastvalues"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    results = doctest.testmod(importlib.import_module(name))
    assert results.attempted > 0 and results.failed == 0
