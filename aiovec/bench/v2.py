"""``python -m aiovec.bench v2``: real envs, the floor, and the issue-12 targets, in one run.

Per workload, every contender is built once, in one event loop (see :mod:`.contenders`):
gymnasium SyncVectorEnv and AsyncVectorEnv, EnvPool (where it has the task), aiovec
defaults, aiovec with the process backend forced (CartPole x8), and the floor at each
worker count of its sweep. Then, per repeat: one env's step time in-process (the limit),
each contender's measurement (the two sides of each ratio next to each other, every other
repeat in reverse order, so drift hits every contender alike), and the floor at aiovec's
worker count when the sweep lacks it. aiovec's
first measurement follows its warm-up (>= 2 s: the controller settles). Ratios are
taken within a repeat (paired), then their median and min-max over repeats reported.
Then the loop-hold, constructor-stall and idle-kill soak checks.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiovec

from ..machine import available_cpus
from . import aiovec_options, envpool_peer, limits, loophold, soak, stall
from .contenders import AiovecContender, Contender, EnvPoolContender, FloorContender, GymContender
from .core import kilo, machine
from .floor import sweep_counts
from .workloads import Workload, select

SECTIONS = ("loophold", "stall", "soak")


def _span(xs: list[float], fmt: Callable[[float], str]) -> str:
    """``median (min-max)``; a single value alone."""
    if not xs:
        return ""
    med = fmt(statistics.median(xs))
    return med if len(xs) == 1 else f"{med} ({fmt(min(xs))}-{fmt(max(xs))})"


def _ratio(x: float) -> str:
    return f"{x:.2f}"


async def _build(w: Workload, counts: list[int], stack: contextlib.AsyncExitStack) -> list[Contender]:
    """Every contender of ``w``, built and reset, each closed by ``stack``; AsyncVectorEnv (fork) before any thread."""
    out: list[Contender] = []

    async def add(c: Contender | Awaitable[Contender]) -> None:
        c = await c if inspect.isawaitable(c) else c
        stack.push_async_callback(c.aclose)
        out.append(c)

    # Built in this order (AsyncVectorEnv forks before any thread exists) ...
    await add(GymContender("gym_sync", w.env_id, w.n, w.kwargs))
    await add(GymContender("gym_async", w.env_id, w.n, w.kwargs))
    if w.checkpoint_peer:
        await add(GymContender("gym_sync_checkpoint", w.env_id, w.n, w.kwargs))
    if w.envpool and envpool_peer.installed():
        await add(EnvPoolContender(w.env_id, w.n, w.kwargs))
    await add(AiovecContender("aiovec", w.env_id, w.n, w.kwargs).start())
    if w.process_forced:
        await add(AiovecContender("aiovec_process", w.env_id, w.n, w.kwargs, **aiovec_options.process_forced()).start())
    for c in counts:
        await add(FloorContender(w.env_id, w.n, w.kwargs, c).start())
    # ... and measured in this one: each ratio's two sides next to each other (aiovec between SyncVectorEnv and
    # SyncVectorEnv plus a loop turn; the forced process backend next to the 1-worker floor).
    order = ["gym_sync", "aiovec", "gym_sync_checkpoint", "envpool", "gym_async", "aiovec_process", "floor_1"]
    return sorted(out, key=lambda c: order.index(c.name) if c.name in order else len(order))


async def _run_workload(w: Workload, repeats: int, duration: float, warmup: float, log: Callable[[str], None]) -> dict[str, Any]:
    counts = sweep_counts(w.n, w.waiting)
    rates: dict[str, list[float]] = {}
    workers: list[int] = []
    placements: list[str] = []
    limit_v: list[float] = []
    step_s: list[float] = []
    limit_how = ""
    k_cores = min(w.n, available_cpus())
    async with contextlib.AsyncExitStack() as stack:
        t_build = time.perf_counter()
        contenders = await _build(w, counts, stack)
        cores = None if w.waiting else limits.cores_executor(k_cores, w.env_id, w.kwargs)
        if cores is not None:
            stack.callback(cores.shutdown)
        extra: dict[int, FloorContender] = {}  # the floor at aiovec's worker count, when the sweep lacks it
        log(f"  {w.key}: {len(contenders)} contenders built in {time.perf_counter() - t_build:.1f} s")
        for r in range(repeats):
            t = limits.step_time(w.env_id, w.kwargs)
            lim, limit_how = limits.limit(w.n, t)
            limit_v.append(lim)
            step_s.append(t.wall_s)
            if cores is not None:  # what the cores deliver together, beside the limit that assumes they add up
                rates.setdefault("cores", []).append(limits.cores_rate(cores, k_cores, w.env_id, w.kwargs, duration))
            # ABBA: every other repeat in reverse, so a drift of the host's speed over a repeat (this project's VMs
            # drift by tens of percent within seconds) biases no contender against its neighbour in the median
            for c in contenders if r % 2 == 0 else contenders[::-1]:
                # aiovec's defaults are measured after the controller's warm-up, once; the others need only a short one
                first_aiovec = r == 0 and c.name.startswith("aiovec")
                rates.setdefault(c.name, []).append(await c.measure(duration, warmup if first_aiovec else 0.2))
                if c.name == "aiovec":
                    workers.append(c.workers or 0)
                    placements.append(c.placement or "?")
            k = workers[-1]
            if k >= 1:  # the floor at aiovec's own count: the sweep's figure of this repeat, or a floor built for it
                if k in counts:
                    rates.setdefault("floor_at_aiovec", []).append(rates[f"floor_{k}"][-1])
                else:
                    if k not in extra:
                        extra[k] = await FloorContender(w.env_id, w.n, w.kwargs, k).start()
                        stack.push_async_callback(extra[k].aclose)
                    rates.setdefault("floor_at_aiovec", []).append(await extra[k].measure(duration, 0.2))
            log(f"  {w.key} repeat {r + 1}/{repeats}: aiovec {kilo(rates['aiovec'][-1])} ({k} workers, {placements[-1]})")
    best = max(counts, key=lambda c: statistics.median(rates[f"floor_{c}"]))
    floor_best = rates[f"floor_{best}"]
    ours = rates["aiovec"]

    def paired(a: list[float], b: list[float]) -> list[float]:
        return [x / y for x, y in zip(a, b, strict=True)]

    ratios: dict[str, list[float]] = {"aiovec/gym_sync": paired(ours, rates["gym_sync"]), "aiovec/floor": paired(ours, floor_best),
                                      "aiovec/limit": paired(ours, limit_v), "floor/limit": paired(floor_best, limit_v)}
    if len(rates.get("floor_at_aiovec", [])) == len(ours):
        ratios["aiovec/floor_at_aiovec"] = paired(ours, rates["floor_at_aiovec"])
    if "envpool" in rates:
        ratios["aiovec/envpool"] = paired(ours, rates["envpool"])
    if "cores" in rates:
        ratios["cores/limit"] = paired(rates["cores"], limit_v)
        ratios["aiovec/cores"] = paired(ours, rates["cores"])
    if w.process_forced:
        ratios["aiovec_process/floor_1"] = paired(rates["aiovec_process"], rates["floor_1"])
    if w.checkpoint_peer:
        ratios["aiovec/gym_sync_checkpoint"] = paired(ours, rates["gym_sync_checkpoint"])
        ratios["gym_sync_checkpoint/gym_sync"] = paired(rates["gym_sync_checkpoint"], rates["gym_sync"])
    return {"env_id": w.env_id, "num_envs": w.n, "kwargs": w.kwargs, "steps_per_s": rates, "floor_best_workers": best,
            "aiovec_workers": workers, "aiovec_placement": placements, "limit_steps_per_s": limit_v, "limit_basis": limit_how,
            "step_time_s": step_s, "ratios": ratios}


def run_workload(w: Workload, repeats: int, duration: float, warmup: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Every contender of ``w``, built once and measured in interleaved turns over ``repeats``; then paired ratios."""
    return aiovec.run(_run_workload(w, repeats, duration, warmup, log))


COLUMNS = ("workload", "limit", "gym Sync", "gym Async", "EnvPool", "floor best (workers)", "floor @ aiovec's workers",
           "aiovec defaults (workers, placement)", "aiovec / Sync", "aiovec / floor", "aiovec / limit", "aiovec / EnvPool", "floor / limit",
           "cores busy / limit", "aiovec / cores busy")


def table(workloads: dict[str, dict[str, Any]]) -> str:
    """The workload table: medians with their min-max over repeats; ratios paired within each repeat."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for key, r in workloads.items():
        s, q = r["steps_per_s"], r["ratios"]
        best = r["floor_best_workers"]
        w = sorted(set(r["aiovec_workers"]))
        where = "/".join(sorted(set(r.get("aiovec_placement") or [])))
        cells = [key, f"{_span(r['limit_steps_per_s'], kilo)} ({r['limit_basis']})", _span(s["gym_sync"], kilo),
                 _span(s["gym_async"], kilo), _span(s.get("envpool", []), kilo) or "-",
                 f"{_span(s[f'floor_{best}'], kilo)} ({best})", _span(s["floor_at_aiovec"], kilo) or "-",
                 f"{_span(s['aiovec'], kilo)} ({'/'.join(map(str, w))}{', ' + where if where else ''})", _span(q["aiovec/gym_sync"], _ratio),
                 _span(q["aiovec/floor"], _ratio), _span(q["aiovec/limit"], _ratio),
                 _span(q.get("aiovec/envpool", []), _ratio) or "-", _span(q["floor/limit"], _ratio),
                 _span(q.get("cores/limit", []), _ratio) or "-", _span(q.get("aiovec/cores", []), _ratio) or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets that this run measured: what, the median value, the bound, and whether it holds."""
    out: list[dict[str, Any]] = []

    def add(what: str, value: float, bound: float, higher: bool = True) -> None:
        ok = value >= bound if higher else value <= bound
        out.append({"target": what, "value": value, "bound": bound, "holds": bool(ok)})

    wl = report.get("workloads", {})
    q = {k: v["ratios"] for k, v in wl.items()}
    if "CartPole-v1 x8" in q:
        add("CartPole-v1 x8 defaults / SyncVectorEnv >= 1.0", _median(q["CartPole-v1 x8"]["aiovec/gym_sync"]), 1.0)
        if "aiovec/gym_sync_checkpoint" in q["CartPole-v1 x8"]:  # the floor of the target above for an API that yields
            add("CartPole-v1 x8 defaults / (SyncVectorEnv + one loop turn a batch) >= 1.0",
                _median(q["CartPole-v1 x8"]["aiovec/gym_sync_checkpoint"]), 1.0)
        add("process backend forced (1 worker, 8 CartPoles) / floor (1 worker) >= 0.8",
            _median(q["CartPole-v1 x8"]["aiovec_process/floor_1"]), 0.8)
    if "CartPole-v1 x64" in q:
        add("CartPole-v1 x64 defaults / floor >= 0.9", _median(q["CartPole-v1 x64"]["aiovec/floor"]), 0.9)
        add("CartPole-v1 x64 defaults / SyncVectorEnv >= 1.1", _median(q["CartPole-v1 x64"]["aiovec/gym_sync"]), 1.1)
    for key, r in q.items():
        if key.startswith(("HalfCheetah", "Ant")):
            add(f"{key} defaults / 2-core limit >= 0.75", _median(r["aiovec/limit"]), 0.75)
        elif key.startswith(("ALE/", "Sleep")):
            add(f"{key} defaults / floor >= 0.9", _median(r["aiovec/floor"]), 0.9)
    lh = report.get("loophold", {})
    for case in lh.get("cases", []):  # the target is about in-process stepping: the label says what ran
        add(f"loop held ({lh['options']}), {case['name']}: p99 gap <= 1 ms", case["gaps"]["p99_ms"], 1.0, higher=False)
    for case in report.get("stall", {}).get("cases", []):
        add(f"constructor stall, {case['name']}: max gap <= 20 ms", case["gaps"]["max_ms"], 20.0, higher=False)
    sk = report.get("soak")
    if sk:
        bad = sum(sk.get(k, 0) for k in ("lost", "duplicated", "misattributed", "out_of_sequence", "ended_twice", "hangs",
                                         "leaked_processes", "errors"))
        add("soak with idle-time and mid-step kills: lost+duplicated+misattributed+out-of-sequence+ended-twice+hangs+leaks"
            "+errors == 0",
            bad, 0, higher=False)
    return out


def core_commit() -> str:
    """The checkout's HEAD, the last commit that changed the core (aiovec/ outside aiovec/bench), and local core edits."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    core = ("--", "aiovec", ":!aiovec/bench")
    dirty = git("status", "--porcelain", "--untracked-files=no", *core)
    last = git("log", "-1", "--format=%h %s", *core)
    last = last if len(last) <= 90 else last[:87].rsplit(" ", 1)[0] + " ..."
    return (f"HEAD {git('rev-parse', '--short', 'HEAD')}; core last changed by {last}"
            + (" (+ uncommitted core changes)" if dirty else ""))


def main(quick: bool = False, repeats: int | None = None, duration: float | None = None, out: str | None = None,
         only: str | None = None) -> dict[str, Any]:
    repeats = repeats or (1 if quick else 3)
    duration = duration or (0.3 if quick else 1.0)
    warmup = 0.5 if quick else 2.0
    sections = [s for s in SECTIONS if only is None or only == s]
    chosen = [] if only in SECTIONS else select(quick, only)

    def log(msg: str) -> None:
        print(msg, flush=True)

    t0 = time.perf_counter()
    report: dict[str, Any] = {"machine": machine(), "core_commit": core_commit(), "quick": quick, "repeats": repeats,
                              "duration_s": duration, "aiovec_warmup_s": warmup, "placement_option": aiovec_options.has_option("placement"),
                              "envpool": envpool_peer.installed(), "workloads": {}}
    log(f"# aiovec v2 benchmark: {report['machine']}\n# core: {report['core_commit']}\n"
        f"# {repeats} interleaved repeats x {duration} s (aiovec after {warmup} s warm-up); median (min-max)")
    for w in chosen:
        report["workloads"][w.key] = run_workload(w, repeats, duration, warmup, log)
    if "loophold" in sections:
        report["loophold"] = loophold.main(quick)
    if "stall" in sections:
        report["stall"] = stall.main(quick)
    if "soak" in sections:
        report["soak"] = soak.kill_phases(8.0 if quick else 30.0)
    report["targets"] = targets(report)
    report["table"] = table(report["workloads"])
    report["elapsed_s"] = time.perf_counter() - t0
    log("\n" + render_text(report))
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    return report


def render_text(report: dict[str, Any]) -> str:
    """Everything after the header: the workload table, the process-forced row, the checks and the targets."""
    lines = [report["table"]] if report["workloads"] else []
    cp = report["workloads"].get("CartPole-v1 x8")
    if cp:
        lines.append(f"\nProcess backend forced (1 worker, 8 CartPoles): {_span(cp['steps_per_s']['aiovec_process'], kilo)} steps/s, "
                     f"{_span(cp['ratios']['aiovec_process/floor_1'], _ratio)}x the floor with 1 worker.")
        if "gym_sync_checkpoint" in cp["steps_per_s"]:
            lines.append(f"\nSyncVectorEnv plus one turn of the event loop per batch (the least an asyncio API that is a checkpoint "
                         f"on every call can cost; 8 CartPoles): {_span(cp['steps_per_s']['gym_sync_checkpoint'], kilo)} steps/s, "
                         f"{_span(cp['ratios']['gym_sync_checkpoint/gym_sync'], _ratio)}x SyncVectorEnv; aiovec defaults "
                         f"{_span(cp['ratios']['aiovec/gym_sync_checkpoint'], _ratio)}x it.")
    lh = report.get("loophold")
    if lh:
        lines.append(f"\nLoop held while aiovec steps ({lh['options']}); gaps between turns of a sleep(0) task:")
        lines += [f"- {c['name']}: p50 {c['gaps']['p50_ms']:.3f} ms, p99 {c['gaps']['p99_ms']:.3f} ms, max {c['gaps']['max_ms']:.2f} ms; "
                  f"{c['gaps']['turns']} side-task turns, {kilo(c['steps_per_s'])} env steps/s" for c in lh["cases"]]
    st = report.get("stall")
    if st:
        lines.append("\nConstructor stall (4 envs whose constructor takes 0.5 s; construct, start, reset inside a running loop):")
        lines += [f"- {c['name']}: max gap {c['gaps']['max_ms']:.1f} ms (p99 {c['gaps']['p99_ms']:.2f} ms) over {c['seconds']:.2f} s"
                  + (f"; error: {c['error']}" if c.get("error") else "") for c in st["cases"]]
    sk = report.get("soak")
    if sk:
        lines.append("\nSoak, lock-step with pauses, SIGKILLs in the pause and mid-step: "
                     + ", ".join(f"{k} {v}" for k, v in sk.items() if not isinstance(v, dict | list)))
    if report["targets"]:
        lines.append("\nTargets:")
        lines += [f"- [{'x' if t['holds'] else ' '}] {t['target']}: {t['value']:.3g}" for t in report["targets"]]
    lines.append(f"\nElapsed: {report['elapsed_s']:.0f} s.")
    return "\n".join(lines)
