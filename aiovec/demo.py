"""``aiovec demo``: the adaptive controller against every static worker count, per scenario.

For each scenario it runs the env with several static worker counts and with
the adaptive controller, all in this one process, the static runs split into
halves before and after the adaptive one (so drift on a noisy machine favours
neither side), showing a live line per control interval. It ends with a table
(adaptive vs the best static) and a PNG of worker count and throughput over time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .controller import AdaptiveController
from .loop import run
from .machine import available_cpus
from .vecenv import AsyncVecEnv


@dataclass
class Scenario:
    key: str
    title: str
    env_id: str
    num_envs: int
    statics: list[int]
    kwargs: dict = field(default_factory=dict)
    phase_s: float = 0.0  # > 0: a mid-run change of env cost, phases of this length


def scenarios(quick: bool, max_workers: int | None) -> list[Scenario]:
    c = available_cpus()
    out = [
        Scenario("cheap", "cheap CPU-bound (CartPole-v1)", "CartPole-v1", 16, [1, 2, 4]),
        Scenario("cpu", "heavy CPU-bound (1 ms CPU/step)", "aiovec/Busy-v0", 8, [1, c, 2 * c, 8], {"episode_len": 50}),
        Scenario("latency", "latency-bound (1 ms CPU + 10 ms wait)", "aiovec/Sleep-v0", 48, [c, 4 * c, 12 * c, 48],
                 {"cpu_ms": 1.0, "wait_ms": 10.0, "episode_len": 50}),
        Scenario("stragglers", "stragglers (90% 0.5 ms, 10% 5 ms CPU)", "aiovec/Straggler-v0", 8, [1, c, 2 * c, 8], {"episode_len": 50}),
        Scenario("change", "mid-run change (latency -> CPU -> latency)", "aiovec/PhaseChange-v0", 32, [c, 4 * c, 32],
                 {"episode_len": 25}, phase_s=1.0 if quick else 3.0),
    ]
    for s in out:
        s.statics = sorted({min(max(1, n), s.num_envs, max_workers or s.num_envs) for n in s.statics})
    return out


def _env_kwargs(s: Scenario) -> dict:
    kw = dict(s.kwargs)
    if s.phase_s:
        kw["schedule"] = [(s.phase_s, 1.0, 10.0), (s.phase_s, 1.0, 0.0)]
        kw["start_time"] = time.time()
    return kw


async def _run(s: Scenario, num_workers: int | str, duration: float, max_workers: int | None, live: bool) -> dict[str, Any]:
    from .make import make

    controller = AdaptiveController(max_workers=max_workers) if num_workers == "auto" else None
    venv: AsyncVecEnv = make(s.env_id, s.num_envs, num_workers=num_workers, controller=controller, env_kwargs=_env_kwargs(s))
    async with venv:
        await venv.reset(seed=0)
        n, k = s.num_envs, max(1, s.num_envs // 2)
        acts = np.zeros(n, dtype=np.int64)
        venv.send(acts)
        t0 = time.perf_counter()
        steps = 0
        timeline: list[tuple[float, int]] = []
        shown = 0
        while (now := time.perf_counter()) - t0 < duration:
            r = await venv.recv(k)
            steps += len(r.env_ids)
            timeline.append((now - t0, steps))
            venv.send(acts[: len(r.env_ids)], r.env_ids)
            hist = venv.control_history
            if live and len(hist) > shown:
                shown = len(hist)
                h = hist[-1]
                line = (f"  [{s.key:10s}] t={h['t']:5.1f}s workers={h['workers']:3d} {h['steps_per_s']:8.0f} steps/s "
                        f"p50={1e3 * h['latency_p50_s']:6.2f} ms | {h['reason'][:70]}")
                print(("\r" + line.ljust(150)) if sys.stdout.isatty() else line, end="" if sys.stdout.isatty() else "\n", flush=True)
        elapsed = time.perf_counter() - t0
        await venv.drain()
        hist = list(venv.control_history)
        cost = venv._control.cost_s if venv._control is not None else 0.0
        final_workers = venv.num_workers
    if live and sys.stdout.isatty():
        print()
    # steady state: the second half of the run (what a long run would see once settled)
    half = [(t, c) for t, c in timeline if t >= elapsed / 2]
    steady = (half[-1][1] - half[0][1]) / (half[-1][0] - half[0][0]) if len(half) > 1 else steps / elapsed
    return {"workers": num_workers, "steps_per_s": steps / elapsed, "steady_steps_per_s": steady, "history": hist,
            "final_workers": final_workers, "controller_cpu_s": cost, "elapsed_s": elapsed}


def _sweep(s: Scenario, duration: float, max_workers: int | None, key: str, samples: dict[int, list[float]]) -> None:
    """One run per static worker count, its ``key`` rate appended to ``samples[workers]``."""
    for w in s.statics:
        samples[w].append(run(_run(s, w, duration, max_workers, live=False))[key])


def run_demo(quick: bool = False, only: str | None = None, max_workers: int | None = None, output: str = "demo-output") -> dict:
    statics_s = 1.0 if quick else 2.5
    adaptive_s = 2.5 if quick else 7.0
    chosen = [s for s in scenarios(quick, max_workers) if only in (None, s.key)]
    if not chosen:
        raise SystemExit(f"unknown scenario {only!r}; choose from {[s.key for s in scenarios(quick, max_workers)]}")
    print(f"aiovec adaptive-parallelism demo on {available_cpus()} CPUs ({'quick' if quick else 'full'} run)")
    results: dict[str, Any] = {}
    for s in chosen:
        # Static runs are split around the adaptive one (half before, half after) and averaged, so a
        # machine that gets busier or quieter during the scenario does not favour either side. A
        # mid-run-change scenario's static runs must each cover the whole schedule, so they run once.
        rounds = 1 if s.phase_s else 2
        dur = 3 * s.phase_s if s.phase_s else statics_s / rounds
        print(f"\n== {s.title}: {s.num_envs} envs; static sweep {s.statics} "
              f"({dur * rounds:.1f}s each{', half before and half after the adaptive run' if rounds > 1 else ''})")
        key = "steps_per_s" if s.phase_s else "steady_steps_per_s"  # same measure for static and adaptive
        samples: dict[int, list[float]] = {w: [] for w in s.statics}
        _sweep(s, dur, max_workers, key, samples)
        ad_dur = 3 * s.phase_s if s.phase_s else adaptive_s
        print(f"  adaptive ({ad_dur:.0f}s):")
        ad = run(_run(s, "auto", ad_dur, max_workers, live=True))
        if rounds > 1:
            _sweep(s, dur, max_workers, key, samples)
        static = {w: float(np.mean(v)) for w, v in samples.items()}
        for w, v in samples.items():
            print(f"  static {w:3d} workers: {static[w]:8.0f} steps/s ({' / '.join(f'{x:.0f}' for x in v)})")
        best_w = max(static, key=static.__getitem__)
        best = static[best_w]
        ratio = ad[key] / best
        print(f"  adaptive: {ad[key]:8.0f} steps/s ({'whole run' if s.phase_s else 'steady state'}), "
              f"{ratio:.2f}x best static ({best_w} workers: {best:.0f}); ends at {ad['final_workers']} workers")
        results[s.key] = {"title": s.title, "num_envs": s.num_envs, "static": static, "static_samples": samples,
                          "best_static_workers": best_w, "adaptive": ad, "ratio": ratio, "measure": key}
    os.makedirs(output, exist_ok=True)
    table = _table(results)
    print("\n" + table)
    png = os.path.join(output, "adaptive.png")
    _plot(results, png)
    with open(os.path.join(output, "demo.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"\nplot: {png}\nresults: {os.path.join(output, 'demo.json')}")
    return results


def _table(results: dict) -> str:
    lines = ["| scenario | envs | static sweep (workers: steps/s) | best static | adaptive | adaptive / best | adaptive workers at end |",
             "|---|---|---|---|---|---|---|"]
    for r in results.values():
        sweep = ", ".join(f"{w}: {v:.0f}" for w, v in r["static"].items())
        lines.append(f"| {r['title']} | {r['num_envs']} | {sweep} | {r['best_static_workers']} | "
                     f"{r['adaptive'][r['measure']]:.0f} | {r['ratio']:.2f}x | {r['adaptive']['final_workers']} |")
    return "\n".join(lines)


def _plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.6 * len(results)), squeeze=False)
    for ax, r in zip(axes[:, 0], results.values(), strict=True):
        h = r["adaptive"]["history"]
        t = [x["t"] for x in h]
        ax.step(t, [x["workers"] for x in h], where="post", color="tab:blue", label="workers (adaptive)")
        ax.axhline(r["best_static_workers"], color="tab:blue", ls=":", label="best static workers")
        ax.set_ylabel("workers")
        ax2 = ax.twinx()
        ax2.plot(t, [x["steps_per_s"] for x in h], color="tab:orange", label="steps/s (adaptive)")
        ax2.axhline(max(r["static"].values()), color="tab:orange", ls="--", label="best static steps/s")
        ax2.set_ylabel("steps/s")
        ax.set_title(f"{r['title']}: adaptive {r['ratio']:.2f}x best static", fontsize=9)
        lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(lines, [ln.get_label() for ln in lines], fontsize=6, loc="lower right")
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
