"""Does PPO train "7x faster with 8 envs"? Wall time to a target return, measured honestly.

    python examples/ppo_speedup.py                      # every setting, 5 seeds (about 20 minutes on 2 cores)
    python examples/ppo_speedup.py --quick              # smoke run: 1 seed, 3 settings, tiny budget, to a temp dir
    python examples/ppo_speedup.py --seeds 3 --settings aiovec-x8-sync,gym-sync-x8
    python examples/ppo_speedup.py --setup-only         # where the seconds before the first step go

Every run is ``examples/ppo.py`` in a fresh Python process (so each pays its own fork server and worker
start, as a user's run does) on CartPole-v1 (500-step time limit), with the same code and hyperparameters
except what the seed's advice changes with the number of envs: the batch is ``num_envs * 128`` and the
learning rate ``2.5e-4 * num_envs`` (``--lr-scale linear``); 4 minibatches x 4 epochs per batch. A run's
clock starts just before the vector env is constructed (interpreter start and imports do not count; worker
start does) and stops once the mean return of its last 20 episodes is >= 475 *and* it has done ``--budget``
env steps (so the return at that fixed budget is known for every run), or at ``--max-steps`` /
``--max-wall-s``. Settings run interleaved, in an order that rotates per seed (the machine is shared and
noisy); ratios are ratios of medians over seeds.

Writes ``results.json``, ``table.md`` and ``return_vs_time.png`` to ``--out`` (and ``setup.md`` with
``--setup-only``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PPO = HERE / "ppo.py"

# name -> ppo.py flags (besides the common ones in run_one)
SETTINGS: dict[str, list[str]] = {
    "aiovec-x1-sync": ["--num-envs", "1"],
    "aiovec-x8-sync": ["--num-envs", "8"],
    "aiovec-x8-pipelined": ["--num-envs", "8", "--mode", "pipelined"],
    "aiovec-x8-overlap": ["--num-envs", "8", "--mode", "overlap"],
    "aiovec-x8-sync-process": ["--num-envs", "8", "--placement", "process"],
    "aiovec-x8-pipelined-process": ["--num-envs", "8", "--mode", "pipelined", "--placement", "process"],
    "aiovec-x16-sync": ["--num-envs", "16"],
    "aiovec-x16-pipelined": ["--num-envs", "16", "--mode", "pipelined"],
    "gym-sync-x1": ["--num-envs", "1", "--vectorizer", "gym-sync"],
    "gym-sync-x8": ["--num-envs", "8", "--vectorizer", "gym-sync"],
    "gym-async-x8": ["--num-envs", "8", "--vectorizer", "gym-async"],
}
QUICK = ["aiovec-x8-sync", "aiovec-x8-pipelined", "gym-sync-x8"]
BASE_X1, BASE_X8 = "gym-sync-x1", "gym-sync-x8"
# (a, b): "a faster than b?" compared on the median and seed by seed
PAIRS = [("aiovec-x8-pipelined", "aiovec-x8-sync"), ("aiovec-x8-pipelined-process", "aiovec-x8-sync-process"),
         ("aiovec-x8-overlap", "aiovec-x8-sync"), ("aiovec-x16-pipelined", "aiovec-x16-sync"),
         ("aiovec-x8-sync", "gym-sync-x8"), ("aiovec-x8-sync", "aiovec-x8-sync-process")]


def placement_supported() -> bool:
    """Whether the installed aiovec has ``placement=`` (asked in a subprocess: this one stays light)."""
    code = "import inspect, aiovec; print('placement' in inspect.signature(aiovec.AsyncVecEnv.__init__).parameters)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "True"


def run_one(name: str, seed: int, args: argparse.Namespace) -> dict:
    """One training run of ``examples/ppo.py`` in a fresh process; returns its summary."""
    log_dir = args.out / "runs" / f"{name}-seed{seed}"
    cmd = [
        sys.executable, str(PPO), "--quiet", "--env-id", "CartPole-v1", "--seed", str(seed), *SETTINGS[name],
        "--num-steps", "128", "--learning-rate", "2.5e-4", "--lr-scale", "linear", "--lr-ref-envs", "1",
        "--num-minibatches", "4", "--update-epochs", "4",
        "--total-timesteps", str(args.max_steps), "--max-wall-s", str(args.max_wall_s),
        "--target-return", str(args.target), "--return-window", "20", "--stop-at-target", "--min-timesteps", str(args.budget),
        "--log-dir", str(log_dir),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} seed {seed} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    s = json.loads((log_dir / "summary.json").read_text())
    at_budget = [r for step, _, r in s["curve"] if step <= args.budget][-20:]
    lags = [json.loads(line)["policy_lag"] for line in (log_dir / "updates.jsonl").read_text().splitlines()]
    s.update(setting=name, seed=seed, policy_lag=max(lags, default=0),
             return_at_budget=float(np.mean(at_budget)) if at_budget and s["global_step"] >= args.budget else None)
    return s


def time_to_target(r: dict) -> float:
    return r["target_hit"]["wall_s"] if r["target_hit"] else math.inf


def _fmt(xs: list[float], unit: str = "s", digits: int = 1) -> str:
    if not xs:
        return "-"
    med = statistics.median(xs)
    if math.isinf(med):
        return "not reached"
    lo, hi = min(xs), max(xs)
    hi_s = ">cap" if math.isinf(hi) else f"{hi:.{digits}f}"
    return f"{med:.{digits}f}{unit} [{lo:.{digits}f}–{hi_s}]"


def _ratio(a: float, b: float, fmt: str = "{:.1f}x") -> str:
    return fmt.format(a / b) if math.isfinite(a) and math.isfinite(b) and b > 0 else "-"


def by_setting(runs: list[dict]) -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["setting"], []).append(r)
    return {name: by[name] for name in SETTINGS if name in by}


def median_time(rs: list[dict]) -> float:
    return statistics.median(time_to_target(r) for r in rs) if rs else math.nan


def table(runs: list[dict], args: argparse.Namespace, core: str) -> str:
    by = by_setting(runs)
    x1, x8 = median_time(by.get(BASE_X1, [])), median_time(by.get(BASE_X8, []))
    n_seeds = len({r["seed"] for r in runs})
    lines = [
        f"CartPole-v1, time to a mean return >= {args.target:.0f} over the last 20 episodes, set-up included (clock from just "
        f"before the vector env is constructed); caps {args.max_steps // 1000}k steps / {args.max_wall_s:.0f} s; {n_seeds} "
        f"seed(s) per setting, interleaved, each run a fresh process; median [min–max]. Core measured: `{core}`.",
        "",
        f"| setting | reached | time to {args.target:.0f} | speed-up vs {BASE_X1} | time / {BASE_X8} | steps to {args.target:.0f} "
        f"| return at {args.budget // 1000}k steps | env steps/s | set-up | env | inference | learn | wait | lag | pipeline |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rs in by.items():
        t = [time_to_target(r) for r in rs]
        st = [r["target_hit"]["global_step"] / 1000 if r["target_hit"] else math.inf for r in rs]
        med = statistics.median(t)
        rb = [r["return_at_budget"] for r in rs if r["return_at_budget"] is not None]

        def share(*keys: str, rs: list[dict] = rs) -> str:
            return f"{statistics.median(sum(r['profile'][k] for k in keys) / r['wall_s'] for r in rs) * 100:.0f}%"

        pipeline = sorted({r["pipeline"].split(":")[0] for r in rs})
        lines.append(
            f"| {name} | {sum(r['target_hit'] is not None for r in rs)}/{len(rs)} | {_fmt(t)} | {_ratio(x1, med)} "
            f"| {_ratio(med, x8, '{:.2f}x')} | {_fmt(st, 'k', 0)} | {_fmt(rb, '', 0)} | {statistics.median(r['steps_per_s'] for r in rs):.0f} "
            f"| {statistics.median(r['setup_s'] for r in rs):.2f}s | {share('env_s')} | {share('inference_s')} | {share('learn_s')} "
            f"| {share('wait_learner_s', 'wait_sampler_s')} | {max(r['policy_lag'] for r in rs)} | {', '.join(pipeline)} |"
        )
    lines += [
        "",
        "Profile: share of each run's wall time spent awaiting env results (env), in the policy's forward pass and action "
        "sampling (inference), in PPO updates (learn) and, in overlap mode, at the join of sampler and learner (wait); "
        "set-up is the median time from construction to the first step's result. In overlap mode sampling and learning "
        "run at the same time, so shares can add up to more than 100%. lag: policy updates between the policy that "
        "collected a rollout and the one trained on it. pipeline: `off` where the envs step in this process (nothing to overlap).",
    ]
    pair_lines = []
    for a, b in PAIRS:
        if a in by and b in by:
            ta = {r["seed"]: time_to_target(r) for r in by[a]}
            tb = {r["seed"]: time_to_target(r) for r in by[b]}
            common = sorted(set(ta) & set(tb))
            wins = sum(ta[s] < tb[s] for s in common)
            pair_lines.append(f"| {a} vs {b} | {_ratio(median_time(by[a]), median_time(by[b]), '{:.2f}x')} | {wins}/{len(common)} |")
    if pair_lines:
        lines += ["", "| comparison | time ratio (medians) | seeds where the first is faster |", "|---|---|---|", *pair_lines]
    return "\n".join(lines)


def targets(runs: list[dict]) -> list[str]:
    """Issue 14's CartPole targets, checked against this run."""
    by = by_setting(runs)
    x1, x8 = median_time(by.get(BASE_X1, [])), median_time(by.get(BASE_X8, []))
    aiovec8 = {n: median_time(rs) for n, rs in by.items() if n.startswith("aiovec-x8")}
    out = []
    if aiovec8:
        best = min(aiovec8, key=aiovec8.get)
        out.append(f"best aiovec x8 ({best}, {aiovec8[best]:.1f}s median): {_ratio(x1, aiovec8[best])} faster than {BASE_X1} "
                   f"(target >= 7x), {_ratio(aiovec8[best], x8, '{:.2f}x')} the time of {BASE_X8} (target <= 1.0x)")
    for a, b in PAIRS[:2]:
        if a in by and b in by:
            ta = {r["seed"]: time_to_target(r) for r in by[a]}
            tb = {r["seed"]: time_to_target(r) for r in by[b]}
            wins = sum(ta[s] < tb[s] for s in set(ta) & set(tb))
            out.append(f"{a} vs {b}: {_ratio(median_time(by[a]), median_time(by[b]), '{:.2f}x')} on the median, "
                       f"faster on {wins}/{len(set(ta) & set(tb))} seeds (target: < 1x and most seeds)")
    setups = [r["setup_s"] for r in by.get("aiovec-x8-sync", [])]
    if setups:
        out.append(f"set-up, aiovec x8 CartPole (default placement): median {statistics.median(setups):.2f}s, max {max(setups):.2f}s (target <= 0.5 s)")
    return out


def plot(runs: list[dict], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = by_setting(runs)
    groups = [("aiovec: 1 / 8 / 16 envs and sampling modes", [n for n in by if n.startswith("aiovec")]),
              ("gymnasium's vector envs, and aiovec x8 (default)", [n for n in by if not n.startswith("aiovec")] + ["aiovec-x8-sync"])]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    cmap = plt.get_cmap("tab10")
    for ax, (title, group) in zip(axes, groups, strict=True):
        for k, name in enumerate(n for n in by if n in group):
            for j, r in enumerate(by[name]):
                if not r["curve"]:
                    continue
                _, wall, ret = map(np.asarray, zip(*r["curve"], strict=True))
                mean = np.convolve(ret, np.ones(20), "full")[: len(ret)] / np.minimum(np.arange(1, len(ret) + 1), 20)
                ax.plot(wall, mean, color=cmap(k % 10), alpha=0.8, lw=1.2, label=name if j == 0 else None)
        ax.axhline(target, color="k", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("wall-clock time from vector-env construction (s, log scale)")
        ax.set_title(title)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper left")
    axes[0].set_ylabel("mean return, last 20 episodes")
    fig.suptitle("PPO on CartPole-v1: return vs wall-clock time (one line per seed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- set-up: where the seconds before the first step go ----------------------------------------
def _py_seconds(code: str, repeats: int, before: str = "") -> float:
    """Median wall time of ``code`` in a fresh interpreter, after ``before`` has run (neither start nor ``before`` timed)."""
    prog = f"{before}\nimport time\nt0 = time.perf_counter()\n{code}\nprint(time.perf_counter() - t0)"
    return statistics.median(float(subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                                                  check=True).stdout.split()[-1]) for _ in range(repeats))


def setup_profile(args: argparse.Namespace, have_placement: bool) -> str:
    """Time to first step for 8 CartPoles and 8 Hoppers, and what each part costs, in fresh processes."""
    reps = args.setup_repeats
    preload = "import aiovec.worker, numpy, gymnasium"  # what aiovec's fork server imports before it forks workers
    parts = {
        "fork server's preload (`import aiovec.worker, numpy, gymnasium`), once per process": _py_seconds(preload, reps),
        "a worker re-importing ppo.py as `__mp_main__` (torch skipped), per worker": _py_seconds(
            f"import runpy; runpy.run_path({str(PPO)!r}, run_name='__mp_main__')", reps, preload),
        "importing torch (what ppo.py cost each worker before)": _py_seconds("import torch", reps, preload),
        "importing Hopper-v5's modules (`gymnasium.envs.mujoco.hopper_v5`), per worker": _py_seconds(
            "import gymnasium.envs.mujoco.hopper_v5", reps, preload),
    }
    lines = [f"| part | seconds (median of {reps} fresh processes) |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in parts.items()]
    rows = []
    configs = [("CartPole-v1", [], "default"), ("CartPole-v1", ["--vectorizer", "gym-sync"], "gym-sync"),
               ("Hopper-v5", ["--normalize"], "default"), ("Hopper-v5", ["--normalize", "--vectorizer", "gym-sync"], "gym-sync")]
    if have_placement:
        configs.insert(1, ("CartPole-v1", ["--placement", "process"], "process"))
        configs.insert(-1, ("Hopper-v5", ["--normalize", "--placement", "process"], "process"))
    for env_id, extra, label in configs:
        sums = []
        for rep in range(reps):
            d = Path(tempfile.mkdtemp(prefix="ppo_setup_"))
            subprocess.run([sys.executable, str(PPO), "--quiet", "--env-id", env_id, "--num-envs", "8", "--num-steps", "16",
                            "--total-timesteps", "128", "--seed", str(rep + 1), "--log-dir", str(d), *extra], check=True, capture_output=True)
            sums.append(json.loads((d / "summary.json").read_text()))
        med = {k: statistics.median(s[k] for s in sums) for k in ("construct_s", "start_s", "reset_s", "setup_s", "torch_warmup_s")}
        rows.append(f"| {env_id} x8, {label} | {med['setup_s']:.3f} | {med['construct_s']:.3f} | {med['start_s']:.3f} | "
                    f"{med['reset_s']:.3f} | {sums[0]['num_workers']} | {sums[0].get('placement')} | {med['torch_warmup_s']:.2f} |")
    lines += ["", "| vector env | time to first step (setup_s) | construct (probe) | start (fork server, workers) | reset | workers "
              "| placement | torch warm-up before the clock |", "|---|---|---|---|---|---|---|---|", *rows]
    return "\n".join(lines)


def core_version() -> str:
    """Which aiovec the runs import: the repository's HEAD (and whether aiovec/ has local changes), or another copy."""
    path = subprocess.run([sys.executable, "-c", "import aiovec; print(aiovec.__file__)"], capture_output=True, text=True).stdout.strip()
    repo = HERE.parent
    head = subprocess.run(["git", "-C", str(repo), "log", "-1", "--oneline"], capture_output=True, text=True).stdout.strip()[:72]
    if not path.startswith(str(repo / "aiovec")):
        return f"aiovec imported from {Path(path).parent}"
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "aiovec"], capture_output=True, text=True).stdout
    return head + (" + uncommitted changes in aiovec/" if dirty else "")


def report(runs: list[dict], args: argparse.Namespace, core: str) -> None:
    """Write table.md and the plot; print the table and the targets."""
    md = table(runs, args, core)
    (args.out / "table.md").write_text(md + "\n")
    plot(runs, args.out / "return_vs_time.png", args.target)
    print("\n" + md + "\n\nTargets (issue 14):\n" + "\n".join("- " + t for t in targets(runs)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seeds", default="5", help="a count N (seeds 1..N) or a comma-separated list")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, from {list(SETTINGS)}")
    p.add_argument("--target", type=float, default=475.0, help="mean return of the last 20 episodes to reach")
    p.add_argument("--budget", type=int, default=50_000, help="fixed env-step budget at which every run's return is read")
    p.add_argument("--max-steps", type=int, default=150_000, help="env-step cap per run")
    p.add_argument("--max-wall-s", type=float, default=90.0, help="wall-clock cap per run (s)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: examples/results/ppo_speedup; --quick: a temp dir)")
    p.add_argument("--quick", action="store_true", help="smoke run: seed 1, settings " + ",".join(QUICK) + ", 8k-step caps")
    p.add_argument("--setup-only", action="store_true", help="only profile set-up (time to first step), write setup.md")
    p.add_argument("--setup-repeats", type=int, default=5, help="fresh processes per set-up measurement")
    p.add_argument("--retable", action="store_true", help="only rebuild table.md and the plot from --out's results.json")
    p.add_argument("--core-label", default=None, help="name the core measured (default: which aiovec the runs import)")
    args = p.parse_args()
    args.seeds = [int(x) for x in args.seeds.split(",")] if "," in args.seeds else list(range(1, int(args.seeds) + 1))
    args.settings = args.settings.split(",")
    if args.quick:
        args.seeds, args.settings, args.max_steps, args.budget, args.setup_repeats = [1], QUICK, 8192, 4096, 1
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="ppo_speedup_")) if args.quick else HERE / "results" / "ppo_speedup"
    bad = [s for s in args.settings if s not in SETTINGS]
    if bad:
        p.error(f"unknown settings {bad}")
    have_placement = placement_supported()
    if not have_placement:
        dropped = [s for s in args.settings if "--placement" in SETTINGS[s]]
        args.settings = [s for s in args.settings if s not in dropped]
        print(f"this aiovec has no placement option: skipping {dropped}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.retable:
        saved = json.loads((args.out / "results.json").read_text())
        core = args.core_label or saved["core"]
        runs = saved["runs"]
        args.settings = [s for s in SETTINGS if any(r["setting"] == s for r in runs)]
        report(runs, args, core)
        return
    core = args.core_label or core_version()
    print(f"core: {core}\nout: {args.out}", flush=True)
    if args.setup_only:
        md = setup_profile(args, have_placement)
        (args.out / "setup.md").write_text(f"Core measured: `{core}`.\n\n{md}\n")
        print(md)
        return
    runs: list[dict] = []
    t0 = time.perf_counter()
    for k, seed in enumerate(args.seeds):
        order = args.settings[k % len(args.settings):] + args.settings[: k % len(args.settings)]  # interleave: rotate per seed
        for name in order:
            r = run_one(name, seed, args)
            runs.append(r)
            hit = r["target_hit"]
            print(f"[{time.perf_counter() - t0:6.0f}s] {name:>28s} seed {seed}: "
                  + (f"{args.target:.0f} at {hit['wall_s']:.1f}s / {hit['global_step']} steps" if hit else f"not reached ({r['stopped_by']})")
                  + f", setup {r['setup_s']:.2f}s, {r['steps_per_s']:.0f} steps/s, pipeline {r['pipeline'].split(':')[0]}", flush=True)
            (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "core": core, "runs": runs}))
    report(runs, args, core)
    print(f"\nwrote {args.out}/results.json, table.md, return_vs_time.png ({time.perf_counter() - t0:.0f}s in all)")
    if os.environ.get("PPO_SPEEDUP_KEEP_RUNS") is None:  # per-run logs are large; results.json has the summaries
        import shutil

        shutil.rmtree(args.out / "runs", ignore_errors=True)


if __name__ == "__main__":
    main()
