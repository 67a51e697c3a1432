"""Command lines explain themselves: help for every flag, defaults, choices; ``aiovec`` alone helps."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

import aiovec
from aiovec.cli import main, parser

ROOT = Path(__file__).resolve().parents[1]


def test_aiovec_without_arguments_prints_its_help(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: aiovec") and "demo" in out and "bench" in out and "required" not in out


def test_aiovec_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"aiovec {aiovec.__version__}"


def test_every_demo_flag_has_help_and_default() -> None:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    demo = sub.choices["demo"]
    for action in demo._actions:
        if action.dest == "help":
            continue
        assert action.help and "default" in action.help, action.dest
    assert next(a for a in demo._actions if a.dest == "scenario").choices


def _options(help_text: str) -> list[tuple[str, str]]:
    """(flag, its help text) for every option in an argparse --help output."""
    body = help_text.split("options:", 1)[1]
    out, cur, text = [], None, ""
    for line in body.splitlines():
        m = re.match(r"^  (-[-\w, {}.|]+?)(?:\s{2,}(.*))?$", line)
        if m and line.startswith("  -"):
            if cur:
                out.append((cur, text))
            cur, text = m.group(1), m.group(2) or ""
        elif cur:
            text += " " + line.strip()
    if cur:
        out.append((cur, text))
    return out


@pytest.mark.subprocess
@pytest.mark.parametrize("script", ["cleanrl_ppo.py", "webservice.py", "webservice_load.py"])
def test_example_flags_have_help_defaults_and_choices(script: str) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    options = [(flag, text) for flag, text in _options(proc.stdout) if not flag.startswith("-h")]
    assert len(options) >= 4, proc.stdout
    for flag, text in options:
        assert text.strip(), f"{script} {flag}: no help"
        assert "default" in text, f"{script} {flag}: no default in its help: {text!r}"
    if script == "cleanrl_ppo.py":
        assert "--vector-env {aiovec,gym-sync,gym-async}" in proc.stdout
    if script == "webservice_load.py":
        assert "--mode {step,recv}" in proc.stdout


def test_aiovec_bench_passes_flags_first_to_the_benchmark(capsys) -> None:
    """``aiovec bench --help`` (and ``--quick``, ``--out``) reach ``python -m aiovec.bench``; argparse's REMAINDER
    refused any that came first."""
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--quick" in out and "{core,v2,controller,ray,soak}" in out


@pytest.mark.parametrize("flag", ["--runs", "--max-workers"])
@pytest.mark.parametrize("value", ["0", "-2", "x"])
def test_demo_counts_must_be_positive_integers(capsys, flag: str, value: str) -> None:
    with pytest.raises(SystemExit) as e:
        main(["demo", flag, value])
    assert e.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err
