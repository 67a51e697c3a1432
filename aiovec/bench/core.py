"""``python -m aiovec.bench core``: aiovec against its peers on W1-W4, side by side.

Every vectorizer runs in the same process, interleaved (A B C A B C ...) so that
drift on a shared machine hits all of them alike; each figure is the median over
repeats with the min-max spread, and aiovec is reported as a ratio to peers.
"""

from __future__ import annotations

import asyncio
import json
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

import aiovec
from aiovec.machine import available_cpus

from .peers import PEERS, aiovec_runner, installed, puffer_mp


@dataclass
class Case:
    key: str
    env_id: str
    n: int
    kwargs: dict = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # name -> aiovec runner for this case
    peers: dict[str, Any] = field(default_factory=dict)  # peer name -> runner with its best settings for this case


# PufferLib Multiprocessing: its recommended layout (one worker per core, batch_size = num_envs / 2, async) except
# for CartPole, where one worker with all envs and batch_size = num_envs wins: its recv and its workers busy-wait, so
# main + 1 worker fill 2 cores while a second worker would oversubscribe them. From interleaved sweeps on 2 cores of
# 1-2 workers (and 4-16 with overwork=True: worse in the sweeps' medians) x batch num_envs or num_envs / 2; the
# spinning makes every layout very sensitive to other load on the machine (one-off runs vary 10-100x).
PUFFER_CARTPOLE = puffer_mp(num_workers=1)


def cases(quick: bool) -> list[Case]:
    out = [
        Case("W1 CartPole (8)", "CartPole-v1", 8),
        Case("W1 CartPole (64)", "CartPole-v1", 64),
        Case("W2 1 ms CPU (8)", "aiovec/Busy-v0", 8),
        Case("W3 2 ms sleep (16)", "aiovec/Sleep-v0", 16),
        Case("W4 stragglers (8)", "aiovec/Straggler-v0", 8,
             extra={"aiovec recv(4)": aiovec_runner("recv", 4, num_workers=8, batch_size=4)}),
    ]
    if not quick:
        out.insert(1, Case("W1 CartPole (16)", "CartPole-v1", 16))
    for case in out:
        if case.env_id == "CartPole-v1":
            case.peers["puffer_mp"] = PUFFER_CARTPOLE
    return out


def run_case(case: Case, repeats: int, duration: float, peers: list[str]) -> dict[str, list[float]]:
    runners = {name: case.peers.get(name, PEERS[name]) for name in peers}
    runners["aiovec"] = aiovec_runner("step")
    runners.update(case.extra)
    results: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            results[name].append(runner(case.env_id, case.n, case.kwargs, duration))
    return results


def per_step_cpu(env_id: str, kwargs: dict, steps: int = 300) -> tuple[float, float]:
    """(cpu_s, wall_s) per step of one env stepped in-process: the bare cost."""
    env = gym.make(env_id, **kwargs)
    env.reset(seed=0)
    env.action_space.seed(0)
    acts = [env.action_space.sample() for _ in range(64)]
    c0, w0 = time.thread_time(), time.perf_counter()
    for k in range(steps):
        _, _, term, trunc, _ = env.step(acts[k % 64])
        if term or trunc:
            env.reset()
    cpu, wall = (time.thread_time() - c0) / steps, (time.perf_counter() - w0) / steps
    env.close()
    return cpu, wall


def overhead(repeats: int, duration: float) -> dict[str, float]:
    """Per-step overhead with one CartPole env: time per step minus the bare env step."""
    out: dict[str, list[float]] = {"gym_async": [], "aiovec": []}
    bare: list[float] = []
    for _ in range(repeats):
        bare.append(per_step_cpu("CartPole-v1", {}, 20000)[1])
        out["gym_async"].append(1.0 / PEERS["gym_async"]("CartPole-v1", 1, {}, duration))
        out["aiovec"].append(1.0 / aiovec_runner("step")("CartPole-v1", 1, {}, duration))
    b = statistics.median(bare)
    return {name: (statistics.median(v) - b) * 1e6 for name, v in out.items()} | {"bare_env_step_us": b * 1e6}


async def _loop_lag(duration: float, n: int = 8) -> dict[str, float]:
    """Lateness of a 1 ms periodic timer while stepping CartPole at full speed."""
    lags: list[float] = []
    stop = False

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        while not stop:
            t = loop.time()
            await asyncio.sleep(0.001)
            lags.append(loop.time() - t - 0.001)

    async with aiovec.make("CartPole-v1", n) as venv:
        await venv.reset(seed=0)
        a = np.zeros(n, dtype=np.int64)
        task = asyncio.ensure_future(ticker())
        end = time.perf_counter() + duration
        steps = 0
        while time.perf_counter() < end:
            await venv.step(a)
            steps += n
        stop = True
        await task
    arr = np.maximum(np.array(lags), 0.0) * 1e3
    return {"p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99)), "steps_per_s": steps / duration}


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    loop = "uvloop" if aiovec.loop.has_uvloop() else "asyncio"
    return f"{available_cpus()} CPUs ({cpu}), Python {platform.python_version()}, gymnasium {gym.__version__}, start method forkserver, {loop}"


def kilo(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def fmt(xs: list[float]) -> str:
    return kilo(statistics.median(xs))


def main(quick: bool = False, repeats: int | None = None, duration: float | None = None, out: str | None = None) -> dict:
    repeats = repeats or (1 if quick else 3)
    duration = duration or (0.4 if quick else 1.5)
    peers = [p for p in PEERS if installed(p)]
    skipped = [p for p in PEERS if p not in peers]
    print(f"# aiovec benchmark: {machine()}\n# {repeats} interleaved repeats x {duration}s; median (min-max)\n")
    report: dict[str, Any] = {"machine": machine(), "repeats": repeats, "duration_s": duration, "skipped": skipped, "cases": {}}
    cols = peers + ["aiovec", "aiovec recv(4)"]
    lines = ["| workload (num_envs) | " + " | ".join(cols) + " | aiovec / best peer | limit |", "|" + "---|" * (len(cols) + 3)]
    for case in cases(quick):
        res = run_case(case, repeats, duration, peers)
        cpu, wall = per_step_cpu(case.env_id, case.kwargs)
        limit = ""
        if case.env_id == "aiovec/Busy-v0" or case.env_id == "aiovec/Straggler-v0":
            limit_v = available_cpus() / cpu
            limit = f"{limit_v / 1000:.2f}k (cores / {cpu * 1e3:.2f} ms CPU)"
        elif case.env_id == "aiovec/Sleep-v0":
            limit_v = case.n / wall
            limit = f"{limit_v / 1000:.2f}k (envs / {wall * 1e3:.2f} ms)"
        best_peer = max(statistics.median(res[p]) for p in peers)
        best_ours = max(statistics.median(v) for k, v in res.items() if k.startswith("aiovec"))
        cells = [fmt(res[c]) if c in res else "" for c in cols]
        lines.append(f"| {case.key} | " + " | ".join(cells) + f" | {best_ours / best_peer:.2f}x | {limit} |")
        report["cases"][case.key] = {"steps_per_s": res, "per_step_cpu_s": cpu, "per_step_wall_s": wall, "limit": limit}
        print(lines[-1] if len(lines) > 3 else "\n".join(lines), flush=True)
    ov = overhead(repeats, duration)
    lag = aiovec.run(_loop_lag(duration * 2))
    report["overhead_us"] = ov
    report["loop_lag"] = lag
    print()
    print(f"Per-step overhead, 1 CartPole env (bare step {ov['bare_env_step_us']:.1f} us): "
          f"aiovec +{ov['aiovec']:.0f} us, gym_async +{ov['gym_async']:.0f} us")
    print(f"Event-loop lag while stepping CartPole x8 at {lag['steps_per_s'] / 1000:.1f}k steps/s: "
          f"p50 {lag['p50_ms']:.2f} ms, p99 {lag['p99_ms']:.2f} ms")
    if skipped:
        print(f"Skipped (not installed): {', '.join(skipped)}")
    report["table"] = "\n".join(lines)
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    return report
