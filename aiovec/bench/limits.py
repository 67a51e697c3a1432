"""The physical limit of a workload on this machine, from one env stepped in-process.

limit = min(envs, cores) / one env's median step time, for envs that use the CPU; for
envs that mostly wait (CPU under half of the wall time) every env can wait at once, so
limit = envs / step time.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from aiovec.machine import available_cpus

from .peers import make_env


@dataclass(frozen=True)
class StepTime:
    wall_s: float  # median wall time of one step (random actions, autoreset steps excluded)
    cpu_s: float  # median CPU time of one step

    @property
    def waiting(self) -> bool:
        return self.cpu_s < 0.5 * self.wall_s


def step_time(env_id: str, kwargs: dict, max_steps: int = 400, max_s: float = 0.4) -> StepTime:
    """Median step time of one env in this process, random actions, for up to ``max_steps``/``max_s``."""
    env = make_env(env_id, **kwargs)
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        walls: list[float] = []
        cpus: list[float] = []
        end = time.perf_counter() + max_s
        while len(walls) < max_steps and time.perf_counter() < end:
            action = env.action_space.sample()
            c0, w0 = time.thread_time(), time.perf_counter()
            _, _, term, trunc, _ = env.step(action)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.thread_time() - c0)
            if term or trunc:
                env.reset()
        return StepTime(statistics.median(walls), statistics.median(cpus))
    finally:
        env.close()


def limit(n: int, t: StepTime, cpus: int | None = None) -> tuple[float, str]:
    """(steps/s, how it was computed) for ``n`` envs of step time ``t``."""
    cpus = cpus or available_cpus()
    if t.waiting:
        return n / t.wall_s, f"{n} envs / {t.wall_s * 1e6:.0f} us"
    k = min(n, cpus)
    return k / t.wall_s, f"{k} cores / {t.wall_s * 1e6:.0f} us"
