"""The physical limit of a workload on this machine, from one env stepped in-process.

limit = min(envs, cores) / one env's median step time, for envs that use the CPU; for
envs that mostly wait (CPU under half of the wall time) every env can wait at once, so
limit = envs / step time.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiovec.autoconf import probe_step_cost
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
    """Median step time of one env in this process, random actions, for up to ``max_steps``/``max_s``.

    The same probe as ``num_workers="auto"`` uses (:func:`aiovec.autoconf.probe_step_cost`), run longer.
    """
    env = make_env(env_id, **kwargs)
    try:
        cost = probe_step_cost(env, max_steps=max_steps, max_s=max_s)
    finally:
        env.close()
    if cost is None:
        raise RuntimeError(f"{env_id} could not be stepped to measure its step time")
    return StepTime(cost.wall_s, cost.cpu_s)


def limit(n: int, t: StepTime, cpus: int | None = None) -> tuple[float, str]:
    """(steps/s, how it was computed) for ``n`` envs of step time ``t``."""
    cpus = cpus or available_cpus()
    if t.waiting:
        return n / t.wall_s, f"{n} envs / {t.wall_s * 1e6:.0f} us"
    k = min(n, cpus)
    return k / t.wall_s, f"{k} cores / {t.wall_s * 1e6:.0f} us"
