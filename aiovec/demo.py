"""``aiovec demo``: the adaptive controller against every static worker count, per scenario.

For each scenario it runs the env with several static worker counts and with
the adaptive controller, all in this one process, the static runs split into
halves before and after the adaptive one (so drift on a noisy machine favours
neither side). A live terminal view (rich; plain lines when stdout is not a
terminal) shows per scenario the worker count, steps/s and the controller's last
reason. It ends with a table (adaptive vs the best static), ``demo.json`` and a
PNG of worker count and throughput over time. ``--runs 3`` repeats the whole demo
and reports the median of the runs with their range.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import textwrap
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


async def _run(s: Scenario, num_workers: int | str, duration: float, max_workers: int | None, view: View | None) -> dict[str, Any]:
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
            if view is not None and len(hist) > shown:
                shown = len(hist)
                view.interval(s.key, hist[-1])
        elapsed = time.perf_counter() - t0
        await venv.drain()
        hist = list(venv.control_history)
        cost = venv._control.cost_s if venv._control is not None else 0.0
        final_workers = venv.num_workers
    # steady state: the second half of the run (what a long run would see once settled)
    half = [(t, c) for t, c in timeline if t >= elapsed / 2]
    steady = (half[-1][1] - half[0][1]) / (half[-1][0] - half[0][0]) if len(half) > 1 else steps / elapsed
    return {"workers": num_workers, "steps_per_s": steps / elapsed, "steady_steps_per_s": steady, "history": hist,
            "final_workers": final_workers, "controller_cpu_s": cost, "elapsed_s": elapsed}


def _sweep(s: Scenario, duration: float, max_workers: int | None, key: str, samples: dict[int, list[float]], view: View) -> None:
    """One run per static worker count, its ``key`` rate appended to ``samples[workers]``."""
    for w in s.statics:
        view.static_start(s.key, w)
        samples[w].append(run(_run(s, w, duration, max_workers, view=None))[key])
        view.static_done(s.key, w, samples[w][-1])


class View:
    """What the demo shows while it runs: plain lines, wrapped at word boundaries (no terminal needed)."""

    def __init__(self, chosen: list[Scenario]) -> None:
        self.titles = {s.key: s.title for s in chosen}
        self.width = max(60, shutil.get_terminal_size((100, 24)).columns)

    def say(self, text: str, indent: str = "  ") -> None:
        print(textwrap.fill(text, self.width, initial_indent=indent, subsequent_indent=indent + "    ",
                            break_long_words=False, break_on_hyphens=False), flush=True)

    def run_start(self, index: int, runs: int) -> None:
        if runs > 1:
            self.say(f"-- run {index + 1} of {runs}", indent="")

    def scenario_start(self, s: Scenario, text: str) -> None:
        self.say(f"== {s.title}: {text}", indent="")

    def static_start(self, key: str, workers: int) -> None:
        pass

    def static_done(self, key: str, workers: int, rate: float) -> None:
        self.say(f"static {workers} workers: {rate:.0f} steps/s")

    def adaptive_start(self, key: str, seconds: float) -> None:
        self.say(f"adaptive ({seconds:.0f} s):")

    def interval(self, key: str, h: dict) -> None:
        self.say(f"t={h['t']:5.1f}s  workers {h['workers']:3d}  {h['steps_per_s']:8.0f} steps/s  "
                 f"p50 {1e3 * h['latency_p50_s']:.2f} ms  | {h['reason']}", indent="    ")

    def scenario_done(self, key: str, text: str, ad: dict) -> None:
        self.say(text)

    def close(self) -> None:
        pass


class LiveView(View):
    """A live table, updated in place (rich): per scenario, its state, worker count, steps/s and the
    controller's last reason, wrapped at word boundaries."""

    def __init__(self, chosen: list[Scenario]) -> None:
        super().__init__(chosen)
        from rich.console import Console
        from rich.live import Live

        self.rows: dict[str, dict[str, str]] = {s.key: {"state": "waiting", "workers": "", "rate": "", "reason": ""} for s in chosen}
        self.header = ""
        self.console = Console()
        self.live = Live(self._render(), console=self.console, auto_refresh=False, transient=False)
        self.live.start()

    def _render(self) -> Any:
        from rich.table import Table

        t = Table(title=self.header or None, title_justify="left", expand=True, show_lines=True)
        t.add_column("scenario", ratio=3, overflow="fold")
        t.add_column("now", ratio=3)
        t.add_column("workers", justify="right", no_wrap=True)
        t.add_column("steps/s", justify="right", no_wrap=True)
        t.add_column("controller's last reason", ratio=6)
        for key, r in self.rows.items():
            t.add_row(self.titles[key], r["state"], r["workers"], r["rate"], r["reason"])
        return t

    def _show(self, key: str | None = None, **fields: str) -> None:
        if key is not None:
            self.rows[key].update(fields)
        self.live.update(self._render(), refresh=True)

    def say(self, text: str, indent: str = "  ") -> None:
        self.live.console.print(text, soft_wrap=False)

    def run_start(self, index: int, runs: int) -> None:
        self.header = f"run {index + 1} of {runs}" if runs > 1 else ""
        for r in self.rows.values():
            r.update(state="waiting", workers="", rate="", reason="")
        self._show()

    def scenario_start(self, s: Scenario, text: str) -> None:
        self._show(s.key, state=text)

    def static_start(self, key: str, workers: int) -> None:
        self._show(key, state=f"static sweep: {workers} workers", workers=str(workers), rate="", reason="")

    def static_done(self, key: str, workers: int, rate: float) -> None:
        self._show(key, rate=f"{rate:,.0f}")

    def adaptive_start(self, key: str, seconds: float) -> None:
        self._show(key, state=f"adaptive ({seconds:.0f} s)", workers="", rate="", reason="starting")

    def interval(self, key: str, h: dict) -> None:
        self._show(key, state=f"adaptive, t = {h['t']:.1f} s", workers=str(h["workers"]), rate=f"{h['steps_per_s']:,.0f}",
                   reason=h["reason"])

    def scenario_done(self, key: str, text: str, ad: dict) -> None:
        last = ad["history"][-1]["reason"] if ad["history"] else ""
        self._show(key, state=text, workers=str(ad["final_workers"]), rate=f"{ad[ad['measure']]:,.0f}", reason=last)

    def close(self) -> None:
        self.live.stop()


def _require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise SystemExit("aiovec demo draws its plot with matplotlib, which is not installed here.\n"
                         "Install the demo extra first:  pip install -e \".[demo]\"   (or: pip install matplotlib rich)")


def _live_view_available() -> bool:
    return sys.stdout.isatty() and importlib.util.find_spec("rich") is not None


def run_demo(quick: bool = False, only: str | None = None, max_workers: int | None = None, output: str = "demo-output",
             live: bool = True, runs: int = 1) -> dict:
    """Run the demo ``runs`` times; write ``demo.json`` (before plotting) and ``adaptive.png`` under ``output``."""
    _require_matplotlib()  # before minutes of measuring, not after
    chosen = [s for s in scenarios(quick, max_workers) if only in (None, s.key)]
    if not chosen:
        raise SystemExit(f"unknown scenario {only!r}; choose from {[s.key for s in scenarios(quick, max_workers)]}")
    print(f"aiovec adaptive-parallelism demo on {available_cpus()} CPUs ({'quick' if quick else 'full'} run"
          f"{f', {runs} runs' if runs > 1 else ''})", flush=True)
    os.makedirs(output, exist_ok=True)
    json_path, png = os.path.join(output, "demo.json"), os.path.join(output, "adaptive.png")
    view = LiveView(chosen) if live and _live_view_available() else View(chosen)
    all_runs: list[dict[str, Any]] = []
    try:
        for i in range(runs):
            view.run_start(i, runs)
            all_runs.append(_one_run(chosen, quick, max_workers, view))
            with open(json_path, "w") as f:  # after every run: an interrupted or failed plot loses nothing
                json.dump(all_runs[0] if runs == 1 else {"runs": all_runs}, f, indent=1, default=str)
    finally:
        view.close()
    data = json.loads(open(json_path).read())
    width = max(60, shutil.get_terminal_size((100, 24)).columns)
    print("\n" + "\n".join(line if line.startswith("|") else textwrap.fill(line, width) for line in _table(data).splitlines()))
    _plot(data, png)
    print(f"\nplot: {png}\nresults: {json_path}")
    return data


def _one_run(chosen: list[Scenario], quick: bool, max_workers: int | None, view: View) -> dict[str, Any]:
    statics_s = 1.0 if quick else 2.5
    adaptive_s = 2.5 if quick else 7.0
    results: dict[str, Any] = {}
    for s in chosen:
        # Static runs are split around the adaptive one (half before, half after) and averaged, so a
        # machine that gets busier or quieter during the scenario does not favour either side. A
        # mid-run-change scenario's static runs must each cover the whole schedule, so they run once.
        rounds = 1 if s.phase_s else 2
        dur = 3 * s.phase_s if s.phase_s else statics_s / rounds
        view.scenario_start(s, f"{s.num_envs} envs; static sweep {s.statics} "
                               f"({dur * rounds:.1f} s each{', half before and half after the adaptive run' if rounds > 1 else ''})")
        key = "steps_per_s" if s.phase_s else "steady_steps_per_s"  # same measure for static and adaptive
        samples: dict[int, list[float]] = {w: [] for w in s.statics}
        _sweep(s, dur, max_workers, key, samples, view)
        ad_dur = 3 * s.phase_s if s.phase_s else adaptive_s
        view.adaptive_start(s.key, ad_dur)
        ad = run(_run(s, "auto", ad_dur, max_workers, view=view))
        if rounds > 1:
            _sweep(s, dur, max_workers, key, samples, view)
        static = {w: float(np.mean(v)) for w, v in samples.items()}
        best_w = max(static, key=static.__getitem__)
        best = static[best_w]
        ratio = ad[key] / best
        view.scenario_done(s.key, f"done: adaptive {ad[key]:,.0f} steps/s = {ratio:.2f}x the best static "
                                  f"({best_w} workers: {best:,.0f}); ends at {ad['final_workers']} workers",
                           {**ad, "measure": key})
        results[s.key] = {"title": s.title, "num_envs": s.num_envs, "static": static, "static_samples": samples,
                          "best_static_workers": best_w, "adaptive": ad, "ratio": ratio, "measure": key,
                          "phase_s": s.phase_s, "static_s": dur * rounds, "adaptive_s": ad_dur}
    return results


# -- the table and the plot (from demo.json: one run, or {"runs": [...]}) ---------------------
def _runs(data: dict) -> list[dict]:
    return data["runs"] if "runs" in data else [data]


def _span(values: list[float], fmt: str) -> str:
    """Median, and the range when there are several values: ``1.00x [0.91-1.03]``."""
    med = float(np.median(values))
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(min(values))}–{fmt.format(max(values))}]"


def _table(data: dict) -> str:
    """The README's demo table: per scenario, the median over runs with their range [min–max]."""
    runs = _runs(data)
    n = len(runs)
    head = (f"{n} runs of `aiovec demo`; median [min–max] over the runs. " if n > 1 else "One run of `aiovec demo`. ") + (
        "Static sweep: the same env with a fixed worker count, each count run half before and half after the adaptive run "
        "(the mid-run change: once, over the whole schedule); best static: the fastest of them, in that run. Ratio: adaptive steps/s (steady state: second half of its run; "
        "whole run for the mid-run change) over the best static's.")
    lines = [head, "",
             "| scenario | envs | static sweep (workers: steps/s) | best static workers | adaptive steps/s | adaptive / best static | adaptive workers at end |",
             "|---|---|---|---|---|---|---|"]
    for key, first in runs[0].items():
        per = [r[key] for r in runs if key in r]
        workers = sorted(per[0]["static"], key=int)
        sweep = ", ".join(f"{w}: {np.median([p['static'][w] for p in per]):.0f}" for w in workers)
        best = "/".join(str(p["best_static_workers"]) for p in per)
        adaptive = _span([p["adaptive"][p["measure"]] for p in per], "{:.0f}")
        ratio = _span([p["ratio"] for p in per], "{:.2f}x")
        ends = "/".join(str(p["adaptive"]["final_workers"]) for p in per)
        lines.append(f"| {first['title']} | {first['num_envs']} | {sweep} | {best} | {adaptive} | {ratio} | {ends} |")
    return "\n".join(lines)


def _median_run(runs: list[dict], key: str) -> dict:
    per = sorted((r[key] for r in runs if key in r), key=lambda p: p["ratio"])
    return per[len(per) // 2]


def _plot(data: dict, path: str) -> None:
    """One panel per scenario (its median run): adaptive workers and steps/s over time against the best static."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    runs = _runs(data)
    keys = list(runs[0])
    fig, axes = plt.subplots(len(keys), 1, figsize=(10, 2.9 * len(keys) + 1.6), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        r = _median_run(runs, key)
        h = r["adaptive"]["history"]
        t = [x["t"] for x in h]
        ax.step(t, [x["workers"] for x in h], where="post", color="tab:blue", lw=2)
        ax.axhline(r["best_static_workers"], color="tab:blue", ls=":", lw=1.5)
        ax.set_ylabel("workers", color="tab:blue")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, max([x["workers"] for x in h] + [r["best_static_workers"]]) * 1.15 + 0.5)
        ax2 = ax.twinx()
        ax2.plot(t, [x["steps_per_s"] for x in h], color="tab:orange", lw=1.5)
        ax2.axhline(max(r["static"].values()), color="tab:orange", ls="--", lw=1.2)
        ax2.set_ylabel("steps/s", color="tab:orange")
        ax2.set_ylim(0, max([x["steps_per_s"] for x in h] + list(r["static"].values())) * 1.15)
        phase = float(r.get("phase_s") or 0.0)
        if phase and t:
            for k, what in ((1, "→ CPU-bound"), (2, "→ waiting again")):
                if k * phase <= max(t):
                    ax.axvline(k * phase, color="grey", lw=1, ls="-.")
                    ax.annotate(what, (k * phase, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12),
                                textcoords="offset points", fontsize=8, color="dimgrey")
        sweep = ", ".join(f"{w}: {v:,.0f}" for w, v in sorted(r["static"].items(), key=lambda kv: int(kv[0])))
        ax.set_title(f"{r['title']}, {r['num_envs']} envs: adaptive {r['ratio']:.2f}x best static "
                     f"({r['best_static_workers']} workers)\nstatic sweep, steps/s: {sweep}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds since the adaptive run started")
    handles = [Line2D([], [], color="tab:blue", lw=2), Line2D([], [], color="tab:blue", ls=":", lw=1.5),
               Line2D([], [], color="tab:orange", lw=1.5), Line2D([], [], color="tab:orange", ls="--", lw=1.2),
               Line2D([], [], color="grey", ls="-.", lw=1)]
    labels = ["adaptive: workers", "best static: workers", "adaptive: steps/s", "best static: steps/s", "env cost changes"]
    fig.legend(handles, labels, loc="upper center", ncol=5, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 1.0))
    n = len(runs)
    caption = ("Static sweep: each scenario run with a fixed worker count per listed value; best static = the fastest of them. "
               "Ratio = adaptive steps/s (steady state: second half of its run; whole run for the mid-run change) "
               "/ best static steps/s." + (f" Each panel: the median of {n} runs by ratio." if n > 1 else ""))
    fig.text(0.01, 0.005, textwrap.fill(caption, 150), fontsize=7.5, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)
