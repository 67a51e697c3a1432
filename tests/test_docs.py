"""The documentation is executable: every public name has a docstring with an example, every example runs
and prints what it says (doctest), and every Python block of the README runs as a script file.

Examples assume ``import asyncio``, ``import numpy as np``, ``import gymnasium as gym`` and ``import aiovec``
(plus, in the integration modules, that module's own names), as numpy's docs assume ``np``.
"""

from __future__ import annotations

import asyncio
import doctest
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import assert_clean

import aiovec

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["aiovec", "aiovec.integrations.sb3", "aiovec.integrations.torch"]
PUBLIC = [(m, n) for m in MODULES for n in importlib.import_module(m).__all__]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
# Methods whose own docstring must carry an example (the rest of a class's public members need a docstring).
METHODS_WITH_EXAMPLES = {
    aiovec.AsyncVecEnv: ["start", "close", "reset", "send", "recv", "drain", "step", "call", "get_attr", "set_attr",
                         "resize", "stats"],
    aiovec.VectorEnv: ["reset", "step", "call", "get_attr", "set_attr", "render", "resize"],
}


def _globs(module: str) -> dict:
    return {**vars(importlib.import_module(module)), "asyncio": asyncio, "np": np, "gym": gym, "aiovec": aiovec}


def _run_doctests(obj: object, name: str, module: str) -> tuple[int, int, str]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    for test in finder.find(obj, name, globs=_globs(module)):
        runner.run(test, out=report.append)
    return runner.failures, runner.tries, "".join(report)


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=[f"{m}.{n}" for m, n in PUBLIC])
def test_public_name_has_an_example_that_runs(module, name, clean):
    obj = getattr(importlib.import_module(module), name)
    doc = inspect.getdoc(obj) or ""
    assert doc.strip(), f"{module}.{name} has no docstring"
    assert ">>>" in doc, f"{module}.{name}'s docstring has no example (a >>> block the test suite runs)"
    failures, tries, report = _run_doctests(obj, f"{module}.{name}", module)
    assert tries > 0
    assert failures == 0, report
    assert_clean(clean)  # an example leaves no worker, thread or shared memory behind


INTERNAL = ["aiovec.configs", "aiovec.costmodel", "aiovec.measured"]  # pure modules whose docstrings show worked figures


@pytest.mark.parametrize("module", INTERNAL)
def test_internal_modules_examples_run(module):
    """The worked figures in the controller's own modules (the cost model, the candidate configurations, the start
    plan) are examples too: a change of rule that changes them must change the docs with it."""
    failures, tries, report = _run_doctests(importlib.import_module(module), module, module)
    assert tries > 0, f"{module} has no examples: drop it from INTERNAL"
    assert failures == 0, report


@pytest.mark.parametrize("cls", list(METHODS_WITH_EXAMPLES), ids=lambda c: c.__name__)
def test_main_methods_have_examples(cls):
    missing = [m for m in METHODS_WITH_EXAMPLES[cls] if ">>>" not in (getattr(cls, m).__doc__ or "")]
    assert not missing, f"{cls.__name__} methods without an example: {missing}"


CLASSES = [(m, n) for m, n in PUBLIC if inspect.isclass(getattr(importlib.import_module(m), n))]


@pytest.mark.parametrize(("module", "name"), CLASSES, ids=[f"{m}.{n}" for m, n in CLASSES])
def test_public_members_of_public_classes_are_documented(module, name):
    cls = getattr(importlib.import_module(module), name)
    members = {attr: value if isinstance(value, property) else getattr(cls, attr)
               for attr, value in vars(cls).items()
               if not attr.startswith("_") and (isinstance(value, (property, staticmethod, classmethod)) or callable(value))}
    undocumented = [attr for attr, value in members.items() if not inspect.getdoc(value)]
    assert not undocumented, f"{module}.{name}: public members without a docstring: {undocumented}"


def _readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_has_python_examples():
    assert len(_readme_blocks()) >= 4


@pytest.mark.parametrize("index", range(len(_readme_blocks())))
def test_readme_python_block_runs(index, clean, tmp_path):
    code = _readme_blocks()[index]
    script = tmp_path / f"readme_example_{index}.py"  # a file, as a user would run it (workers import it)
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"README block {index} failed:\n{code}\n--- stderr ---\n{proc.stderr[-4000:]}"
    assert_clean(clean)
