"""``python -m aiovec.bench controller``: the demo's scenarios as a benchmark (adaptive vs static sweep)."""

from __future__ import annotations

import json


def main(quick: bool = False, repeats: int | None = None, duration: float | None = None, out: str | None = None) -> dict:
    from ..demo import run_demo

    results = run_demo(quick=quick, output="bench-results/demo" if out is None else out)
    if out:
        with open(f"{out}/controller.json", "w") as f:
            json.dump(results, f, indent=1, default=str)
    return results
