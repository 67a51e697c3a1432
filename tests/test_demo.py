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
    static = {int(w): v for w, v in r["static"].items()}
    assert sorted(static) == [1, 2, 4, 8]
    assert r["best_static_workers"] == max(static, key=static.__getitem__)
    assert r["ratio"] == pytest.approx(r["adaptive"][r["measure"]] / static[r["best_static_workers"]])
    assert r["adaptive"]["history"] and all(1 <= h["workers"] <= 8 for h in r["adaptive"]["history"])


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

    def one(ratio: float, rate: float) -> dict:
        return {"cpu": {"title": "heavy", "num_envs": 8, "static": {"1": 900.0, "2": 1000.0}, "best_static_workers": 2,
                        "adaptive": {"steady_steps_per_s": rate, "final_workers": 2}, "ratio": ratio, "measure": "steady_steps_per_s"}}

    table = _table({"runs": [one(0.9, 900.0), one(1.0, 1000.0), one(0.7, 700.0)]})
    assert "3 runs" in table
    assert "| heavy | 8 | 1: 900, 2: 1000 | 2/2/2 | 900 [700–1000] | 0.90x [0.70x–1.00x] | 2/2/2 |" in table
