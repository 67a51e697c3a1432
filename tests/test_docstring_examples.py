"""Every example in the package's docstrings runs and prints what it says (real envs, real workers); the examples
assume ``import aiovec`` and ``import numpy as np``."""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest

import aiovec

MODULES = ["configs", "controller", "costmodel", "errors", "gym", "loop", "make", "measured", "vecenv"]


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_in_a_modules_docstrings_hold(name: str) -> None:
    module = importlib.import_module(f"aiovec.{name}")
    flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    result = doctest.testmod(module, extraglobs={"aiovec": aiovec, "np": np}, optionflags=flags, report=True)
    assert result.attempted > 0, f"aiovec.{name} has no examples: drop it from the list"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in aiovec.{name} fail (printed above)"
