"""The demo's quick mode runs end to end and writes its results, table and plot; its checks come first."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def test_demo_quick_writes_png_and_results(tmp_path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "aiovec", "demo", "--quick", "--scenario", "cpu", "--output", str(out)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, COLUMNS="100"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "adaptive / best static" in proc.stdout
    # plain mode (stdout is not a terminal): wrapped at word boundaries, within the terminal's width
    assert max(len(line) for line in proc.stdout.splitlines() if not line.startswith("|")) <= 100
    png = out / "adaptive.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 10_000
    r = json.loads((out / "demo.json").read_text())["cpu"]
    assert list(r["static"]) == ["inline", "2p x 1t", "8p x 1t"]  # demo_grid on 2 cores: inline, a process per core, per env (no hybrid: 1 ms steps)
    assert r["best_static"] == max(r["static"], key=r["static"].__getitem__)
    assert r["ratio"] == pytest.approx(r["adaptive"]["steps_per_s"] / r["static"][r["best_static"]])
    hist = r["adaptive"]["history"]
    assert hist and all(1 <= h["workers"] <= 8 and h["threads"] >= 1 for h in hist)  # processes and threads over time


def test_demo_runs_the_benchmarks_scenarios() -> None:
    """One definition: the demo's scenarios are the controller benchmark's, and the CLI offers exactly them."""
    from aiovec import cli, demo
    from aiovec.bench import controller as bench

    assert all(type(s) is bench.Scenario for s in demo.demo_scenarios())
    keys = [s.key for s in demo.demo_scenarios()]
    assert tuple(keys) == demo.SCENARIOS == cli.SCENARIOS
    assert {"wait64", "change"} <= set(keys)  # many waiting envs (threads win) and a change of cost
    change = next(s for s in demo.demo_scenarios() if s.key == "change")
    assert [p[1:] for p in change.phases] == [p[1:] for p in next(s for s in bench.scenarios() if s.key == "change").phases]
    wait64 = next(s for s in demo.demo_scenarios() if s.key == "wait64")
    assert any(c.threads > 1 for c in bench.demo_grid(wait64, 2))
    # hybrid is a static setting only where a step fits the loop-hold limit, as it is for the controller
    by_key = {s.key: s for s in demo.demo_scenarios()}
    assert [c.label for c in bench.demo_grid(by_key["cheap"], 2)][:2] == ["inline", "inline + 1p"]
    assert all(c.placement != "hybrid" for k in ("cpu", "stragglers") for c in by_key[k].grid(2))


def test_demo_without_matplotlib_says_what_to_install_before_running(tmp_path) -> None:
    code = ("import importlib.util as u; real = u.find_spec; "
            "u.find_spec = lambda name, *a: None if name == 'matplotlib' else real(name, *a); "
            f"from aiovec.cli import main; main(['demo', '--quick', '--output', {str(tmp_path / 'demo')!r}])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "matplotlib" in proc.stderr and 'pip install -e ".[demo]"' in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "demo").exists()  # nothing ran


def test_table_shows_median_and_range_of_runs() -> None:
    from aiovec.demo import _table

    def one(ratio: float, rate: float, two: float = 1000.0) -> dict:
        return {"cpu": {"title": "heavy", "num_envs": 8, "static": {"inline": 900.0, "2p x 1t": two}, "best_static": "2p x 1t",
                        "adaptive": {"steps_per_s": rate, "final": "2p x 1t"}, "ratio": ratio}}

    # the noise floor: the best median's setting (2p x 1t, 1000), its worst run (800) against that median
    table = _table({"runs": [one(0.9, 900.0), one(1.0, 1000.0, two=800.0), one(0.7, 700.0, two=1100.0)]})
    assert "3 runs" in table and "Noise floor" in table
    assert ("| heavy | 8 | inline: 900, 2p x 1t: 1000 | 2p x 1t/2p x 1t/2p x 1t | 900 [700–1000] | 0.90x [0.70x–1.00x] | "
            "2p x 1t: 0.80x | 2p x 1t/2p x 1t/2p x 1t |") in table
    single = _table({"runs": [one(0.9, 900.0)]})  # one run has no floor to show
    assert "noise floor" not in single.lower() and "| heavy | 8 | inline: 900, 2p x 1t: 1000 | 2p x 1t | 900 | 0.90x | 2p x 1t |" in single
