"""The demo's quick mode runs end to end and writes its plot and table."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_demo_quick_writes_png_and_results(tmp_path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "aiovec", "demo", "--quick", "--scenario", "cpu", "--output", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "adaptive / best" in proc.stdout
    png = out / "adaptive.png"
    assert png.exists() and os.path.getsize(png) > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "demo.json").read_text())
    assert results["cpu"]["adaptive"]["steps_per_s"] > 0
    assert results["cpu"]["static"]
