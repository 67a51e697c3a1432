"""Does PPO train "7x faster with 8 envs"? Wall time to a target return, measured honestly.

    python examples/ppo_speedup.py                       # the full set, 3 seeds (about 15 minutes on 2 cores)
    python examples/ppo_speedup.py --seeds 1 --settings aiovec-x1-sync,aiovec-x8-sync

Every run is examples/ppo.py's ``train`` on CartPole-v1 (500-step time limit) with the same code and
hyperparameters except the ones the seed's advice changes with the number of envs: the batch is
``num_envs * 128`` and the learning rate ``2.5e-4 * num_envs`` (``--lr-scale linear``); with 4
minibatches x 4 epochs per batch that also means ``num_envs`` times fewer gradient steps per sample.
A run stops once the mean return of its last 20 episodes is >= 475 *and* it has done ``--budget``
env steps (so the return after that fixed budget is known for every run), or at ``--max-steps``
/ ``--max-wall-s``; runs that do not reach the target are reported as such. Settings are interleaved
across seeds (the order rotates per seed) because the machine is shared and noisy. Wall time counts
from the first reset (worker start-up is reported separately as ``setup``).

Writes ``results.json``, ``table.md`` and ``return_vs_time.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ppo  # noqa: E402

import aiovec  # noqa: E402

# name -> (vectorizer, num_envs, mode)
SETTINGS = {
    "aiovec-x1-sync": ("aiovec", 1, "sync"),
    "aiovec-x1-async": ("aiovec", 1, "async"),
    "aiovec-x8-sync": ("aiovec", 8, "sync"),
    "aiovec-x8-async": ("aiovec", 8, "async"),
    "aiovec-x16-sync": ("aiovec", 16, "sync"),
    "aiovec-x16-async": ("aiovec", 16, "async"),
    "gym-sync-x1-sync": ("gym-sync", 1, "sync"),
    "gym-sync-x8-sync": ("gym-sync", 8, "sync"),
    "gym-sync-x8-async": ("gym-sync", 8, "async"),
    "gym-async-x8-sync": ("gym-async", 8, "sync"),
    "gym-async-x8-async": ("gym-async", 8, "async"),
}
BASELINE = "aiovec-x1-sync"


def run_one(name: str, seed: int, args: argparse.Namespace) -> dict:
    vec, n, mode = SETTINGS[name]
    cfg = ppo.parse_args([
        "--quiet", "--env-id", "CartPole-v1", "--seed", str(seed), "--vectorizer", vec, "--num-envs", str(n), "--mode", mode,
        "--num-steps", "128", "--learning-rate", "2.5e-4", "--lr-scale", "linear", "--lr-ref-envs", "1",
        "--total-timesteps", str(args.max_steps), "--max-wall-s", str(args.max_wall_s),
        "--target-return", str(args.target), "--return-window", "20", "--stop-at-target", "--min-timesteps", str(args.budget),
    ])
    s = aiovec.run(ppo.train(cfg))
    curve = s.pop("curve")
    at_budget = [r for step, _, r in curve if step <= args.budget][-20:]
    s.update(setting=name, seed=seed, curve=curve,
             return_at_budget=float(np.mean(at_budget)) if at_budget and s["global_step"] >= args.budget else None)
    return s


def _fmt(xs: list[float], unit: str = "s", digits: int = 1) -> str:
    if not xs:
        return "-"
    med = statistics.median(xs)
    if math.isinf(med):
        return "not reached"
    lo, hi = min(xs), max(xs)
    hi_s = ">cap" if math.isinf(hi) else f"{hi:.{digits}f}"
    return f"{med:.{digits}f}{unit} [{lo:.{digits}f}–{hi_s}]"


def table(runs: list[dict], args: argparse.Namespace) -> str:
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["setting"], []).append(r)
    base = [r["target_hit"]["wall_s"] if r["target_hit"] else math.inf for r in by.get(BASELINE, [])]
    base_med = statistics.median(base) if base else math.nan
    lines = [
        f"CartPole-v1, target: mean return of the last 20 episodes >= {args.target}; caps {args.max_steps} steps / "
        f"{args.max_wall_s:.0f} s per run; {len(args.seeds)} seeds; median [min–max].",
        "",
        f"| setting | reached | time to {args.target:.0f} | steps to {args.target:.0f} | speed-up vs {BASELINE} (median time) "
        f"| return at {args.budget // 1000}k steps | env steps/s | env | inference | learn | wait | setup |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in [s for s in SETTINGS if s in by]:
        rs = by[name]
        t = [r["target_hit"]["wall_s"] if r["target_hit"] else math.inf for r in rs]
        st = [r["target_hit"]["global_step"] / 1000 if r["target_hit"] else math.inf for r in rs]
        med = statistics.median(t)
        speed = f"{base_med / med:.1f}x" if math.isfinite(med) and math.isfinite(base_med) else "-"
        rb = [r["return_at_budget"] for r in rs if r["return_at_budget"] is not None]
        sps = [r["steps_per_s"] for r in rs]

        def share(key: str, rs: list[dict] = rs) -> str:
            return f"{statistics.median(r['profile'][key] / r['wall_s'] for r in rs) * 100:.0f}%"

        wait = f"{statistics.median((r['profile']['wait_learner_s'] + r['profile']['wait_sampler_s']) / r['wall_s'] for r in rs) * 100:.0f}%"
        lines.append(
            f"| {name} | {sum(r['target_hit'] is not None for r in rs)}/{len(rs)} | {_fmt(t)} | {_fmt(st, 'k', 0)} | {speed} "
            f"| {_fmt(rb, '', 0)} | {statistics.median(sps):.0f} | {share('env_s')} | {share('inference_s')} | {share('learn_s')} "
            f"| {wait} | {statistics.median(r['setup_s'] for r in rs):.1f}s |"
        )
    lines += [
        "",
        "Profile columns: share of the run's wall time spent awaiting env steps (env), in the policy's forward pass and "
        "sampling (inference), in PPO updates (learn) and, in async mode, at the join of sampler and learner (wait). In "
        "async mode the sampler (env + inference) and the learner overlap, so the shares can add up to more than 100%.",
    ]
    return "\n".join(lines)


def plot(runs: list[dict], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s for s in SETTINGS if any(r["setting"] == s for r in runs)]
    groups = [("aiovec: 1 / 8 / 16 envs, sync and async", [n for n in names if n.startswith("aiovec")]),
              ("vectorizers (8 envs) and the in-process 1-env baseline", [n for n in names if not n.startswith("aiovec")] + ["aiovec-x8-sync"])]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    cmap = plt.get_cmap("tab10")
    for ax, (title, group) in zip(axes, groups):
        for k, name in enumerate(n for n in names if n in group):
            for j, r in enumerate(r for r in runs if r["setting"] == name):
                if not r["curve"]:
                    continue
                _, wall, ret = map(np.asarray, zip(*r["curve"]))
                mean = np.convolve(ret, np.ones(20), "full")[: len(ret)] / np.minimum(np.arange(1, len(ret) + 1), 20)
                ax.plot(wall, mean, color=cmap(k % 10), alpha=0.8, lw=1.2, label=name if j == 0 else None)
        ax.axhline(target, color="k", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("wall-clock time (s, log scale)")
        ax.set_title(title)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper left")
    axes[0].set_ylabel("mean return, last 20 episodes")
    fig.suptitle("PPO on CartPole-v1: return vs wall-clock time (one line per seed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")] if "," in s else list(range(1, int(s) + 1)), default=[1, 2, 3],
                   help="a count (N: seeds 1..N) or a comma-separated list")
    p.add_argument("--settings", type=lambda s: s.split(","), default=list(SETTINGS), help=f"comma-separated, from {list(SETTINGS)}")
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--budget", type=int, default=50_000, help="fixed env-step budget at which every run's return is read")
    p.add_argument("--max-steps", type=int, default=150_000)
    p.add_argument("--max-wall-s", type=float, default=90.0)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "ppo_speedup")
    args = p.parse_args()
    bad = [s for s in args.settings if s not in SETTINGS]
    if bad:
        p.error(f"unknown settings {bad}")
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    t0 = time.perf_counter()
    for k, seed in enumerate(args.seeds):
        order = args.settings[k % len(args.settings):] + args.settings[: k % len(args.settings)]  # interleave: rotate per seed
        for name in order:
            r = run_one(name, seed, args)
            runs.append(r)
            hit = r["target_hit"]
            print(f"[{time.perf_counter() - t0:6.0f}s] {name:>20s} seed {seed}: "
                  + (f"{args.target:.0f} at {hit['wall_s']:.1f}s / {hit['global_step']} steps" if hit else f"not reached ({r['stopped_by']})")
                  + f", return@{args.budget // 1000}k {r['return_at_budget']}, {r['steps_per_s']:.0f} steps/s", flush=True)
            (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}))
    md = table(runs, args)
    (args.out / "table.md").write_text(md + "\n")
    plot(runs, args.out / "return_vs_time.png", args.target)
    print("\n" + md)
    print(f"\nwrote {args.out}/results.json, table.md, return_vs_time.png ({time.perf_counter() - t0:.0f}s in all)")


if __name__ == "__main__":
    main()
