"""The physical limit of a workload on this machine, from one env stepped in-process.

limit = min(envs, cores) / one env's step time (the lower quartile of a few hundred random steps, as
``num_workers="auto"`` probes it), for envs that use the CPU; for envs that mostly wait (CPU under half
of the wall time) every env can wait at once, so limit = envs / step time.

The limit assumes the cores step as fast together as one does alone. :func:`cores_rate` measures what
they deliver together: one bare process per core, each stepping its own env in a loop, no IPC, nothing
shared: no design that also synchronises a batch and runs a parent can beat it. Where vCPUs share a physical
core, or the host is busy, it falls below the limit (this project's VM: 0.92-0.99 of it for MuJoCo, so the
gap between a vector env and the limit there is the vector env's own).
"""

from __future__ import annotations

import time
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

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


LEAD_S = 1.0
"""How far ahead :func:`cores_rate` sets the common start: every process builds its env before it."""


def cores_executor(k: int, env_id: str, kwargs: dict) -> ProcessPoolExecutor:
    """``k`` bare processes for :func:`cores_rate` (forkserver: no threads or event loop of this process in them), each
    having built the env once (its imports done, so a measurement's start is not late)."""
    ex = ProcessPoolExecutor(k, mp_context=get_context("forkserver"))
    list(ex.map(_build_once, [(env_id, kwargs)] * k))
    return ex


def cores_rate(ex: Executor, k: int, env_id: str, kwargs: dict, seconds: float) -> float:
    """Steps/s of ``k`` processes of ``ex`` each stepping one env (random actions, drawn in advance) in a bare loop over the
    same ``seconds``: what ``k`` cores deliver together, with no round trip, batch or parent at all."""
    start = time.time() + LEAD_S
    runs = [ex.submit(_step_alone, env_id, kwargs, seed, start, seconds) for seed in range(k)]
    return sum(f.result() for f in runs)


def _build_once(what: tuple[str, dict]) -> None:
    make_env(what[0], **what[1]).close()


def _step_alone(env_id: str, kwargs: dict, seed: int, start: float, seconds: float) -> float:
    env = make_env(env_id, **kwargs)
    try:
        env.reset(seed=seed)
        env.action_space.seed(seed)
        actions = [env.action_space.sample() for _ in range(256)]
        for a in actions[:20]:  # warm: the first steps of a fresh env are slow
            if any(env.step(a)[2:4]):
                env.reset()
        time.sleep(max(0.0, start - time.time()))
        t0 = time.perf_counter()
        end, steps = t0 + seconds, 0
        step, reset = env.step, env.reset
        while True:
            for a in actions:
                _, _, term, trunc, _ = step(a)
                if term or trunc:
                    reset()
            steps += len(actions)
            if time.perf_counter() >= end:
                return steps / (time.perf_counter() - t0)
    finally:
        env.close()
