"""Regenerate the README's result blocks from result files, so its numbers are never typed by hand.

    python -m aiovec.bench core --out bench-results/core.json
    python -m aiovec.bench v2 --out bench-results/v2.json
    python -m aiovec.bench controller --out bench-results/controller.json
    aiovec demo --output bench-results/demo
    python -m aiovec.bench ray --out bench-results/ray.json
    python examples/ppo_speedup.py           # examples/results/ppo_speedup/table.md
    python examples/ppo_speedup.py --setup-only   # examples/results/ppo_speedup/setup.md
    python examples/ppo_mujoco.py            # examples/results/ppo_mujoco/<env-id>/table.md (also --env-id HalfCheetah-v5)
    python examples/webservice_load.py --out bench-results/web.json
    python -m aiovec.bench.readme            # rewrites the blocks between the README's markers
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from .core import kilo


def core_block(path: Path) -> str:
    r = json.loads(path.read_text())
    ov, lag = r["overhead_us"], r["loop_lag"]
    return "\n".join([
        f"Machine: {r['machine']}. {r['repeats']} interleaved repeats of {r['duration_s']} s each; medians; steps/s with all envs counted.",
        "",
        r["table"],
        "",
        f"- Per-step overhead, one CartPole env (bare step {ov['bare_env_step_us']:.1f} us): aiovec +{ov['aiovec']:.0f} us, gymnasium AsyncVectorEnv +{ov['gym_async']:.0f} us.",
        f"- Event-loop lag (lateness of a 1 ms timer) while stepping CartPole x8 at {lag['steps_per_s'] / 1000:.1f}k steps/s: p50 {lag['p50_ms']:.2f} ms, p99 {lag['p99_ms']:.2f} ms.",
        f"- Skipped (not installed): {', '.join(r['skipped']) or 'none'}.",
    ])


def v2_block(path: Path) -> str:
    from .v2 import render_text

    r = json.loads(path.read_text())
    head = (f"Machine: {r['machine']}. Core: {r['core_commit']}. {r['repeats']} interleaved repeats of {r['duration_s']} s each "
            f"(aiovec defaults after a {r['aiovec_warmup_s']:g} s warm-up); median (min-max over repeats); steps/s with all envs "
            "counted; ratios paired within a repeat." + (" Quick run: not a measurement." if r["quick"] else ""))
    return head + "\n\n" + render_text(r).replace("\nElapsed:", "\nWhole run:")


def controller_block(path: Path) -> str:
    from .controller import floor_tally, table, targets

    r = json.loads(path.read_text())
    res = r["results"]
    window = (f"; each run counted {r['window_s']:g} s after a warm-up of {r['warm_s']:g} s (static) or {r['warm_auto_s']:g} s "
              "(adaptive)") if "window_s" in r else ""
    head = (f"{r.get('cpus')} CPUs; {len(next(iter(res.values()))['adaptive']['samples'])} interleaved rounds per scenario, "
            f"every static setting and the adaptive run once per round{window}; medians [ranges]. Lock-step unless marked "
            "first-finished; the cost change counts its whole schedule. Intervals to settle: control intervals from start "
            "until the configuration stops changing (a reverted probe counts as holding), per round. The targets, as the "
            "issue defines them: adaptive's median over the best static median (the best of the settings' medians), and "
            "each adaptive run over that same median; the per-round column (each round over its fastest setting, the "
            "luckiest of several that tie) is stricter. Best static again: " + (
                "right beside each adaptive run (in turn after and before it), after the round's static settings, "
                if r.get("floor_run") == "beside" else "at the end of each round ") +
            "the setting with the best median so far ran once more with the adaptive run's warm-up and counted window, "
            "against the same best static median: what a controller that knew the best setting from the start would "
            "show in that run (the floor of the checks; shown beside them, never counted as a pass).")
    readapt = [f"{k}: {v['adaptive']['readapt_intervals']}" for k, v in res.items() if any(v["adaptive"].get("readapt_intervals") or [])]
    tail = [""] + (["Re-adaptation, control intervals after each change of cost, per round: " + "; ".join(readapt) + ".", ""]
                   if readapt else []) + ["Targets:"] + [f"- [{'x' if t.startswith('PASS') else ' '}] {t[5:]}" for t in targets(res)]
    tally = floor_tally(res)
    if tally:
        tail.append("\n" + tally)
    tail.append(f"\nWhole run: {r['elapsed_s']:.0f} s.")
    return head + "\n\n" + table(res) + "\n" + "\n".join(tail)


def demo_block(path: Path) -> str:
    from aiovec.demo import _table

    return _table(json.loads(path.read_text()))


def _span(lo: float, hi: float) -> str:
    return f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"


def web_block(path: Path) -> str:
    r = json.loads(path.read_text())
    lag_mon = r["loop_lag_monitor"]

    lines = [
        f"Machine: {r['machine']}. Server: `examples/webservice.py` in its own process ({r['server_loop']}), one rollout "
        f"({r['env_id']} x{r['num_envs']}, {r['mode']}), a fresh server per level; load generator: "
        f"`examples/webservice_load.py`, a separate process (aiohttp client), {r['duration_s']:g} s per level, "
        "GETs of `/stats?history=120`, `/rollouts/{id}` and `/rollouts/{id}/episodes?limit=20` in turn.",
        "",
        "| load | requests/s | request latency p50 / p99 | server loop lag p50 / p99 | env steps/s under load / without |",
        "|---|---|---|---|---|",
    ]
    for p in r["phases"]:
        lat, lag = p["latency_ms"], p["server_loop_lag_ms"]
        lines.append(f"| {p['name']} | {p['requests_per_s']:.0f} | {lat['p50']:.1f} / {lat['p99']:.1f} ms | "
                     f"{lag['p50']:.1f} / {lag['p99']:.1f} ms | {kilo(p['steps_per_s_under_load'])} / {kilo(p['steps_per_s_no_load'])} |")
    others = [p["cpu_percent"]["other_processes"] for p in r["phases"]]
    lines += [
        "",
        "Paced levels are open-loop (each request's latency counts from its scheduled send time, queueing included); "
        "the saturating level is closed-loop. Loop lag: how late the server's own "
        f"{lag_mon['interval_s'] * 1000:.0f} ms timer fires ({lag_mon['clock']}), over each level's load window only"
        + (f"; the loop's timers have {lag_mon['timer_granularity_ms']:g} ms granularity, so lags under ~1 ms are noise"
           if lag_mon.get("timer_granularity_ms") else "")
        + f". Other processes on the machine used {_span(min(others), max(others))}% of a CPU during the levels.",
    ]
    return "\n".join(lines)


def replace(text: str, name: str, body: str) -> str:
    pat = re.compile(rf"(<!-- {name} -->\n)(?:.*?\n)?(<!-- /{name} -->)", re.S)  # the body may be empty
    if not pat.search(text):
        raise SystemExit(f"README has no <!-- {name} --> block")
    return pat.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def main(root: str = ".") -> None:
    base = Path(root)
    readme = base / "README.md"
    text = readme.read_text()
    core = base / "bench-results" / "core.json"
    v2 = base / "bench-results" / "v2.json"
    if v2.exists():
        text = replace(text, "bench:v2", v2_block(v2))
    demo = base / "bench-results" / "demo" / "demo.json"
    controller = base / "bench-results" / "controller.json"
    if controller.exists():
        text = replace(text, "bench:controller", controller_block(controller))
    if core.exists():
        text = replace(text, "bench:core", core_block(core))
    if demo.exists():
        text = replace(text, "bench:demo", demo_block(demo))
    soak = base / "bench-results" / "soak.json"
    if soak.exists():
        r = json.loads(soak.read_text())
        text = replace(text, "bench:soak", "| " + " | ".join(r) + " |\n|" + "---|" * len(r) + "\n| "
                       + " | ".join(str(round(v, 1) if isinstance(v, float) else v) for v in r.values()) + " |")
    ppo = base / "examples" / "results" / "ppo_speedup" / "table.md"
    if ppo.exists():
        text = replace(text, "bench:ppo", ppo.read_text().strip())
    setup = base / "examples" / "results" / "ppo_speedup" / "setup.md"
    if setup.exists():
        text = replace(text, "bench:ppo_setup", setup.read_text().strip())
    for mujoco in sorted((base / "examples" / "results" / "ppo_mujoco").glob("*/table.md")):
        text = replace(text, f"bench:ppo_mujoco:{mujoco.parent.name}", mujoco.read_text().strip())
    ray_json = base / "bench-results" / "ray.json"
    if ray_json.exists():
        r = json.loads(ray_json.read_text())
        text = replace(text, "bench:ray", f"Machine: {r['machine']}; {r['repeats']} interleaved repeats of {r['duration_s']} s; medians.\n\n"
                       + r["table"] + f"\n\n`ray.init`: {r['ray_init_s']:.1f} s. Per-step overhead, one CartPole env: process backend "
                       f"+{r['overhead_us']['process']:.0f} us, Ray backend +{r['overhead_us']['ray']:.0f} us.")
    web = base / "bench-results" / "web.json"
    if web.exists():
        text = replace(text, "bench:web", web_block(web))
    readme.write_text(text)


if __name__ == "__main__":
    main(*sys.argv[1:])
