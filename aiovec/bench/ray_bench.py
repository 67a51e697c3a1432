"""``python -m aiovec.bench ray``: the Ray backend against the process backend, same run.

Reports Ray's start-up time, per-step overhead with one CartPole env, and steps/s on
W1 (CartPole x8), W2 (1 ms CPU x8) and W3 (2 ms sleep x16, first-finished over 2
actors), plus Ray's own baseline of one actor per env.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from .core import machine, per_step_cpu
from .peers import aiovec_runner


def _startup_s() -> float:
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=available(), include_dashboard=False, log_to_driver=False)
    return time.perf_counter() - t0


def available() -> int:
    from aiovec.machine import available_cpus

    return available_cpus()


def one_actor_per_env(n: int, duration: float, wait_ms: float) -> float:
    """Ray's naive pattern: one actor per env, first-finished through ray.wait."""
    import gymnasium as gym
    import ray

    @ray.remote(num_cpus=0.01)
    class EnvActor:
        def __init__(self) -> None:
            import aiovec  # noqa: F401

            self.env = gym.make("aiovec/Sleep-v0", wait_ms=wait_ms)
            self.env.reset(seed=0)

        def step(self, a: int) -> Any:
            obs, r, te, tr, _ = self.env.step(a)
            if te or tr:
                obs, _ = self.env.reset()
            return obs

    actors = [EnvActor.remote() for _ in range(n)]
    ray.get([a.step.remote(0) for a in actors])
    pending = {a.step.remote(0): a for a in actors}
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < duration:
        done, _ = ray.wait(list(pending), num_returns=max(1, n // 2))
        for ref in done:
            a = pending.pop(ref)
            steps += 1
            pending[a.step.remote(0)] = a
    rate = steps / (time.perf_counter() - t0)
    for a in actors:
        ray.kill(a)
    return rate


def main(quick: bool = False, repeats: int | None = None, duration: float | None = None, out: str | None = None) -> dict:
    import ray

    repeats = repeats or (1 if quick else 3)
    duration = duration or (0.5 if quick else 2.0)
    report: dict[str, Any] = {"machine": machine(), "repeats": repeats, "duration_s": duration}
    report["ray_init_s"] = _startup_s()
    cases = [
        ("W1 CartPole (8)", "CartPole-v1", 8, {}, "step", None, 2),
        ("W2 1 ms CPU (8)", "aiovec/Busy-v0", 8, {}, "step", None, 2),
        ("W3 2 ms sleep (16), recv(8), 2 workers", "aiovec/Sleep-v0", 16, {}, "recv", 8, 2),
        ("W3 2 ms sleep (16), recv(8), 2 workers x 8 env_threads", "aiovec/Sleep-v0", 16, {"threads": 8}, "recv", 8, 2),
    ]
    rows = []
    for key, env_id, n, kw, mode, k, workers in cases:
        res: dict[str, list[float]] = {"process": [], "ray": []}
        for _ in range(repeats):
            for backend in res:
                run = aiovec_runner(mode, k, num_workers=workers, backend=backend, batch_size=k or n,
                                    env_threads=kw.get("threads", 1))
                res[backend].append(run(env_id, n, {}, duration))
        p, r = statistics.median(res["process"]), statistics.median(res["ray"])
        rows.append(f"| {key} | {p:.0f} | {r:.0f} | {r / p:.2f}x |")
        report[key] = res
        print(rows[-1], flush=True)
    naive = [one_actor_per_env(16, duration, 2.0) for _ in range(repeats)]
    report["ray_one_actor_per_env_W3"] = naive
    w3 = statistics.median(report[cases[3][0]]["ray"])
    bare = per_step_cpu("CartPole-v1", {}, 5000)[1]
    one = {b: 1.0 / aiovec_runner("step", None, num_workers=1, backend=b)("CartPole-v1", 1, {}, duration) - bare
           for b in ("process", "ray")}
    report["overhead_us"] = {b: v * 1e6 for b, v in one.items()}
    ray.shutdown()
    table = "\n".join([
        "| workload | process backend steps/s | Ray backend steps/s | Ray / process |",
        "|---|---|---|---|",
        *rows,
        f"| W3, Ray one actor per env (ray.wait of 8) | | {statistics.median(naive):.0f} | aiovec-on-Ray {w3 / statistics.median(naive):.2f}x of it |",
    ])
    report["table"] = table
    print(f"\n# {machine()}; {repeats} interleaved repeats x {duration}s, medians\n{table}")
    print(f"\nray.init: {report['ray_init_s']:.1f} s; per-step overhead, 1 CartPole env: "
          f"process +{report['overhead_us']['process']:.0f} us, Ray +{report['overhead_us']['ray']:.0f} us")
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
