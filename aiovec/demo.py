"""``aiovec demo``: the adaptive controller (processes, threads per process, inline) against static settings.

The scenarios are those of ``python -m aiovec.bench controller`` (:mod:`aiovec.bench.controller`,
one definition): cheap CartPoles, heavy CPU, many waiting envs (where threads win), latency-bound,
stragglers (first-finished) and a change of cost (waiting, then CPU, then waiting). Per scenario it
runs a short static sweep (:func:`~aiovec.bench.controller.demo_grid`, a subset of the benchmark's
grid: inline, a process per core, with and without threads, a process per env), half of it before
and half after the adaptive run so drift on a busy machine favours neither side, all in this one
process and measured the same way (:func:`~aiovec.bench.controller.measure`: lock-step steps/s after
a warm-up; the change of cost over its whole schedule). A live terminal view (rich; plain lines when
stdout is not a terminal) shows per scenario the configuration, steps/s and the controller's last
reason. It ends with a table (adaptive vs the best static), ``demo.json`` and a PNG of processes and
threads over time. ``--runs 3`` repeats the whole demo and reports the median of the runs with their
range. About 3 minutes on 2 cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import textwrap
from typing import Any

import numpy as np

from .bench.controller import Scenario, demo_grid, ended_at, measure, scenarios
from .configs import Config
from .loop import run
from .machine import available_cpus

PHASE_S = 3.0
"""Length of each phase of the change-of-cost scenario in the full demo (quick: 1.5 s)."""

SCENARIOS = tuple(s.key for s in scenarios() if s.demo)


def demo_scenarios(quick: bool = False) -> list[Scenario]:
    """The benchmark's scenarios that the demo runs."""
    return [s for s in scenarios(quick, phase_s=None if quick else PHASE_S) if s.demo]


def _label(h: dict) -> str:
    return str(h.get("config") or f"{h['workers']}p")


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

    def static_start(self, key: str, setting: str) -> None:
        pass

    def static_done(self, key: str, setting: str, rate: float) -> None:
        self.say(f"static {setting}: {rate:.0f} steps/s")

    def adaptive_start(self, key: str, seconds: float) -> None:
        self.say(f"adaptive ({seconds:.0f} s):")

    def interval(self, key: str, h: dict) -> None:
        self.say(f"t={h['t']:5.1f}s  {_label(h):>9}  {h['steps_per_s']:8.0f} steps/s  "
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
        t.add_column("processes x threads", justify="right", no_wrap=True)
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

    def static_start(self, key: str, setting: str) -> None:
        self._show(key, state=f"static sweep: {setting}", workers=setting, rate="", reason="")

    def static_done(self, key: str, setting: str, rate: float) -> None:
        self._show(key, rate=f"{rate:,.0f}")

    def adaptive_start(self, key: str, seconds: float) -> None:
        self._show(key, state=f"adaptive ({seconds:.0f} s)", workers="", rate="", reason="starting")

    def interval(self, key: str, h: dict) -> None:
        self._show(key, state=f"adaptive, t = {h['t']:.1f} s", workers=_label(h), rate=f"{h['steps_per_s']:,.0f}",
                   reason=h["reason"])

    def scenario_done(self, key: str, text: str, ad: dict) -> None:
        last = ad["history"][-1]["reason"] if ad["history"] else ""
        self._show(key, state=text, workers=ad["final"], rate=f"{ad['steps_per_s']:,.0f}", reason=last)

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
    every = demo_scenarios(quick)
    chosen = [s for s in every if only in (None, s.key)]
    if not chosen:
        raise SystemExit(f"unknown scenario {only!r}; choose from {[s.key for s in every]}")
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


def _sweep(s: Scenario, settings: list[Config], warm: float, seconds: float, static: dict[str, float], view: View) -> None:
    """One run per static setting, its steps/s into ``static[label]``."""
    for c in settings:
        view.static_start(s.key, c.label)
        static[c.label] = run(measure(s, c, warm, seconds))["steps_per_s"]
        view.static_done(s.key, c.label, static[c.label])


def _one_run(chosen: list[Scenario], quick: bool, max_workers: int | None, view: View) -> dict[str, Any]:
    warm_static, seconds = (0.3, 1.0) if quick else (0.5, 1.5)
    warm_auto, seconds_auto = (2.0, 1.0) if quick else (3.0, 2.5)
    cpus = available_cpus()
    results: dict[str, Any] = {}
    for s in chosen:
        grid = demo_grid(s, cpus, max_workers)
        whole = sum(p[0] for p in s.phases) if s.phases else 0.0
        view.scenario_start(s, f"{s.num_envs} envs, {'lock-step' if s.lockstep else 'first-finished'}; static sweep "
                               f"{', '.join(c.label for c in grid)} (half before and half after the adaptive run)")
        static: dict[str, float] = {}
        half = len(grid) // 2
        _sweep(s, grid[:half], warm_static, whole or seconds, static, view)
        view.adaptive_start(s.key, whole or warm_auto + seconds_auto)
        a = run(measure(s, "auto", warm_auto, whole or seconds_auto, on_interval=lambda h, k=s.key: view.interval(k, h),
                        max_workers=max_workers))
        _sweep(s, grid[half:], warm_static, whole or seconds, static, view)
        static = {c.label: static[c.label] for c in grid}
        best = max(static, key=static.__getitem__)
        ratio = a["steps_per_s"] / static[best]
        final = ended_at(a)
        ad = {"steps_per_s": a["steps_per_s"], "history": a["history"], "final": final, "controller_cpu_s": a["controller_cpu_s"],
              "warm_s": a["warm_s"], "measure_s": a["measure_s"], "schedule_start_s": a["schedule_start_s"]}
        view.scenario_done(s.key, f"done: adaptive {a['steps_per_s']:,.0f} steps/s = {ratio:.2f}x the best static "
                                  f"({best}: {static[best]:,.0f}); ends at {final}", ad)
        results[s.key] = {"title": s.title, "num_envs": s.num_envs, "lockstep": s.lockstep, "static": static,
                          "best_static": best, "adaptive": ad, "ratio": ratio, "whole_run": bool(s.phases),
                          "phases": s.phases}
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
        "Static sweep: the same env at fixed settings (processes x threads per process, or inline), half of them "
        "before and half after the adaptive run; best static: the fastest of them, in that run. Steps/s in lock-step "
        "(stragglers: first-finished, half the envs per recv) after a warm-up; the change of cost over its whole "
        "schedule, static and adaptive alike. " + (
            "Noise floor: the setting with the best median, its worst run against that median (below 0.90x, a run of "
            "the best fixed setting fails the per-run target itself). " if n > 1 else "") +
        "The full grid and the targets: `python -m aiovec.bench controller`.")
    floor = " noise floor |" if n > 1 else ""
    lines = [head, "",
             "| scenario | envs | static sweep (setting: steps/s) | best static | adaptive steps/s | adaptive / best static |"
             f"{floor} adaptive at end |",
             "|---|---|---|---|---|---|---|" + ("---|" if n > 1 else "")]
    for key, first in runs[0].items():
        per = [r[key] for r in runs if key in r]
        sweep = ", ".join(f"{c}: {np.median([p['static'][c] for p in per if c in p['static']]):.0f}" for c in first["static"])
        best = "/".join(str(p["best_static"]) for p in per)
        adaptive = _span([p["adaptive"]["steps_per_s"] for p in per], "{:.0f}")
        ratio = _span([p["ratio"] for p in per], "{:.2f}x")
        ends = "/".join(str(p["adaptive"]["final"]) for p in per)
        cell = f" {_floor(per)} |" if n > 1 else ""
        lines.append(f"| {first['title']} | {first['num_envs']} | {sweep} | {best} | {adaptive} | {ratio} |{cell} {ends} |")
    return "\n".join(lines)


def _floor(per: list[dict]) -> str:
    """The worst run of the setting with the best median over the runs, against that median."""
    labels = [c for c in per[0]["static"] if all(c in p["static"] for p in per)]
    med = {c: float(np.median([p["static"][c] for p in per])) for c in labels}
    best = max(med, key=med.__getitem__)
    return f"{best}: {min(p['static'][best] for p in per) / med[best]:.2f}x"


def _median_run(runs: list[dict], key: str) -> dict:
    per = sorted((r[key] for r in runs if key in r), key=lambda p: p["ratio"])
    return per[len(per) // 2]


def _plot(data: dict, path: str) -> None:
    """One panel per scenario (its median run): adaptive processes, threads per process and steps/s over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    runs = _runs(data)
    keys = list(runs[0])
    fig, axes = plt.subplots(len(keys), 1, figsize=(10, 2.7 * len(keys) + 1.6), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        r = _median_run(runs, key)
        h = r["adaptive"]["history"]
        t = [x["t"] for x in h]
        inline = [x.get("placement") == "inline" for x in h]
        procs = [0 if il else x["workers"] for x, il in zip(h, inline, strict=True)]
        threads = [1 if il else x.get("threads", 1) for x, il in zip(h, inline, strict=True)]
        ax.step(t, procs, where="post", color="tab:blue", lw=2)
        ax.step(t, threads, where="post", color="tab:green", lw=1.5, ls="--")
        for x0, il in zip(t, inline, strict=True):
            if il:
                ax.axvspan(x0 - 0.12, x0 + 0.12, color="tab:blue", alpha=0.08, lw=0)
        ax.set_ylabel("processes / threads")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, max(procs + threads + [1]) * 1.15 + 0.5)
        ax2 = ax.twinx()
        ax2.plot(t, [x["steps_per_s"] for x in h], color="tab:orange", lw=1.2)
        ax2.axhline(max(r["static"].values()), color="tab:orange", ls=":", lw=1.2)
        ax2.set_ylabel("steps/s", color="tab:orange")
        ax2.set_ylim(0, max([x["steps_per_s"] for x in h] + list(r["static"].values())) * 1.15)
        start = r["adaptive"].get("schedule_start_s")
        if r.get("phases") and start is not None and t:
            edge = start
            for k, (dur, cpu, wait) in enumerate(r["phases"]):
                what = f"{cpu:g} ms CPU" if cpu else f"waiting {wait:g} ms"
                if edge <= max(t):
                    ax.axvline(edge, color="grey", lw=1, ls="-.")
                    ax.annotate(("" if k == 0 else "→ ") + what, (edge, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12),
                                textcoords="offset points", fontsize=8, color="dimgrey")
                edge += dur
        sweep = ", ".join(f"{c}: {v:,.0f}" for c, v in r["static"].items())
        ax.set_title(f"{r['title']}, {r['num_envs']} envs: adaptive {r['ratio']:.2f}x best static ({r['best_static']}); "
                     f"ends at {r['adaptive']['final']}\nstatic sweep, steps/s: {sweep}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds since the adaptive run's vector env started (shaded: envs inline, 0 processes)")
    handles = [Line2D([], [], color="tab:blue", lw=2), Line2D([], [], color="tab:green", lw=1.5, ls="--"),
               Line2D([], [], color="tab:orange", lw=1.2), Line2D([], [], color="tab:orange", ls=":", lw=1.2),
               Line2D([], [], color="grey", ls="-.", lw=1)]
    labels = ["adaptive: processes", "adaptive: threads per process", "adaptive: steps/s", "best static: steps/s",
              "env cost changes"]
    fig.legend(handles, labels, loc="upper center", ncol=5, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 1.0))
    n = len(runs)
    caption = ("Static sweep: each scenario at a few fixed settings (processes x threads, inline); best static = the fastest. "
               "Ratio = adaptive steps/s (after its warm-up; whole run for the change of cost) / best static steps/s."
               + (f" Each panel: the median of {n} runs by ratio." if n > 1 else ""))
    fig.text(0.01, 0.005, textwrap.fill(caption, 150), fontsize=7.5, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)
