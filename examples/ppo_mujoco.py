"""PPO on a MuJoCo task where processes matter: wall time for a fixed 200k env steps, same learning everywhere.

    python examples/ppo_mujoco.py                 # Hopper-v5, 3 seeds: aiovec x8 vs SyncVectorEnv x8 and x1 (~15 min on 2 cores)
    python examples/ppo_mujoco.py --env-id HalfCheetah-v5   # the costlier task (~80 us a step; ~18 min)
    python examples/ppo_mujoco.py --quick         # smoke run: 1 seed, 8k steps, to a temp dir

Every run is ``examples/ppo.py`` in a fresh process with observation/reward normalisation, a batch of
2048 steps per update (8 envs x 256 steps, or 1 env x 2048 steps), 8 minibatches x 10 epochs, learning
rate 3e-4 annealed, no entropy bonus. With the same seed, aiovec's envs produce exactly the episodes of
gymnasium's SyncVectorEnv with 8 envs (checked here, episode by episode), so the learning is the same
and the wall time is the comparison. aiovec runs with a fixed worker count, so that every run does the
same work (a move now carries the normalisation wrappers' statistics, so the adaptive controller would
keep the trajectories too, but its probes cost time that differs between runs).

Writes ``results.json`` and ``table.md`` to ``--out`` (default ``examples/results/ppo_mujoco/<env-id>/``, which
``python -m aiovec.bench.readme`` renders into the README's block for that env).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PPO = HERE / "ppo.py"
sys.path.insert(0, str(HERE))
from ppo_speedup import core_version  # noqa: E402

# name -> ppo.py flags (besides the common ones in run_one)
SETTINGS: dict[str, list[str]] = {
    "aiovec-x8-pipelined": ["--num-envs", "8", "--num-steps", "256", "--mode", "pipelined", "--num-workers", "2"],
    "aiovec-x8-sync": ["--num-envs", "8", "--num-steps", "256", "--num-workers", "2"],
    "aiovec-x8-hybrid": ["--num-envs", "8", "--num-steps", "256", "--num-workers", "2", "--placement", "hybrid"],
    "gym-sync-x8": ["--num-envs", "8", "--num-steps", "256", "--vectorizer", "gym-sync"],
    "gym-sync-x1": ["--num-envs", "1", "--num-steps", "2048", "--vectorizer", "gym-sync"],
    "gym-async-x8": ["--num-envs", "8", "--num-steps", "256", "--vectorizer", "gym-async"],
}
DEFAULT = ["aiovec-x8-hybrid", "aiovec-x8-sync", "gym-sync-x8", "gym-sync-x1"]
REFERENCE = "gym-sync-x8"


def run_one(name: str, seed: int, args: argparse.Namespace) -> dict:
    log_dir = args.out / "runs" / f"{name}-seed{seed}"
    cmd = [sys.executable, str(PPO), "--quiet", "--env-id", args.env_id, "--seed", str(seed), *SETTINGS[name],
           "--normalize", "--learning-rate", "3e-4", "--anneal-lr", "--ent-coef", "0", "--num-minibatches", "8",
           "--update-epochs", "10", "--total-timesteps", str(args.steps), "--log-dir", str(log_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} seed {seed} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    s = json.loads((log_dir / "summary.json").read_text())
    with open(log_dir / "episodes.csv") as f:
        s["episodes_log"] = [(int(r["global_step"]), float(r["episodic_return"]), int(r["episodic_length"])) for r in csv.DictReader(f)]
    s.pop("curve")
    s.update(setting=name, seed=seed)
    return s


def _fmt(xs: list[float], digits: int = 1, unit: str = "s") -> str:
    return f"{statistics.median(xs):.{digits}f}{unit} [{min(xs):.{digits}f}–{max(xs):.{digits}f}]"


def table(runs: list[dict], args: argparse.Namespace, core: str) -> str:
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["setting"], []).append(r)
    ref = {r["seed"]: r["episodes_log"] for r in by.get(REFERENCE, [])}
    ref_med = statistics.median(r["wall_s"] for r in by[REFERENCE]) if REFERENCE in by else float("nan")
    x1_med = statistics.median(r["wall_s"] for r in by["gym-sync-x1"]) if "gym-sync-x1" in by else float("nan")
    lines = [
        f"{args.env_id}, PPO for {args.steps // 1000}k env steps, {len({r['seed'] for r in runs})} seed(s) per setting, "
        f"interleaved, each run a fresh process; median [min–max]. Core measured: `{core}`.",
        "",
        f"| setting | wall time | time / {REFERENCE} | speed-up vs gym-sync-x1 | return (last 20 episodes) | env steps/s | set-up "
        f"| env | inference | learn | episodes identical to {REFERENCE} (same seed) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in [n for n in SETTINGS if n in by]:
        rs = by[name]
        wall = statistics.median(r["wall_s"] for r in rs)
        same = [r["episodes_log"] == ref[r["seed"]] for r in rs if r["seed"] in ref and r["config"]["num_envs"] == 8]
        same_s = f"{sum(same)}/{len(same)}" if same else "n/a (1 env)"

        def share(key: str, rs: list[dict] = rs) -> str:
            return f"{statistics.median(r['profile'][key] / r['wall_s'] for r in rs) * 100:.0f}%"

        lines.append(
            f"| {name} | {_fmt([r['wall_s'] for r in rs])} | {wall / ref_med:.2f}x | {x1_med / wall:.1f}x "
            f"| {_fmt([r['final_mean_return'] for r in rs], 0, '')} | {statistics.median(r['steps_per_s'] for r in rs):.0f} "
            f"| {statistics.median(r['setup_s'] for r in rs):.2f}s | {share('env_s')} | {share('inference_s')} | {share('learn_s')} | {same_s} |"
        )
    lines += ["", "Profile: share of wall time awaiting env results (env), in the policy's forward pass (inference) and in "
              "PPO updates (learn); set-up: construction to the first step's result. aiovec: 2 workers, fixed (hybrid: "
              "one shard in this process, one worker process; otherwise 2 worker processes)."]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--env-id", default="Hopper-v5", help="MuJoCo env id")
    p.add_argument("--seeds", default="3", help="a count N (seeds 1..N) or a comma-separated list")
    p.add_argument("--steps", type=int, default=200_000, help="env steps per run")
    p.add_argument("--settings", default=",".join(DEFAULT), help=f"comma-separated, from {list(SETTINGS)}")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: examples/results/ppo_mujoco/<env-id>; --quick: a temp dir)")
    p.add_argument("--quick", action="store_true", help="smoke run: seed 1, 8192 steps")
    p.add_argument("--render", action="store_true", help="no runs: write table.md again from --out's results.json")
    args = p.parse_args()
    args.seeds = [int(x) for x in args.seeds.split(",")] if "," in args.seeds else list(range(1, int(args.seeds) + 1))
    args.settings = args.settings.split(",")
    if args.quick:
        args.seeds, args.steps = [1], 8192
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="ppo_mujoco_")) if args.quick else HERE / "results" / "ppo_mujoco" / args.env_id
    bad = [s for s in args.settings if s not in SETTINGS]
    if bad:
        p.error(f"unknown settings {bad}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.render:
        saved = json.loads((args.out / "results.json").read_text())
        args.steps = int(saved["args"]["steps"])
        md = table(saved["runs"], args, saved["core"])
        (args.out / "table.md").write_text(md + "\n")
        print(md)
        return
    core = core_version()
    print(f"core: {core}\nout: {args.out}", flush=True)
    runs: list[dict] = []
    t0 = time.perf_counter()
    for k, seed in enumerate(args.seeds):
        order = args.settings[k % len(args.settings):] + args.settings[: k % len(args.settings)]
        for name in order:
            r = run_one(name, seed, args)
            runs.append(r)
            print(f"[{time.perf_counter() - t0:6.0f}s] {name:>20s} seed {seed}: {r['wall_s']:.1f}s, return {r['final_mean_return']:.0f}, "
                  f"setup {r['setup_s']:.2f}s, {r['steps_per_s']:.0f} steps/s", flush=True)
            (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "core": core, "runs": runs}))
    md = table(runs, args, core)
    (args.out / "table.md").write_text(md + "\n")
    print("\n" + md)
    import shutil

    shutil.rmtree(args.out / "runs", ignore_errors=True)


if __name__ == "__main__":
    main()
