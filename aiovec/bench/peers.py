"""The vectorizers aiovec is measured against, each behind one small interface.

A *runner* builds a vector env, steps it with fixed random actions for a given
time and returns env steps per second (all envs counted). Peers that are not
installed are reported as skipped, never as zero.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

import aiovec

Runner = Callable[[str, int, dict, float], float]


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """Picklable by reference: importing this module in a peer's worker registers aiovec's envs."""
    return gym.make(env_id, **kwargs)


def env_fns(env_id: str, n: int, kwargs: dict) -> list[Callable[[], gym.Env]]:
    return [functools.partial(make_env, env_id, **kwargs)] * n


def _actions(space: gym.Space, n: int, count: int = 64) -> list[np.ndarray]:
    space = gym.vector.utils.batch_space(space, n)
    space.seed(0)
    return [space.sample() for _ in range(count)]


def _timed(step: Callable[[Any], int], actions: list, duration: float, warmup: float = 0.2) -> float:
    end = time.perf_counter() + warmup
    k = 0
    while time.perf_counter() < end:
        step(actions[k % len(actions)])
        k += 1
    steps, t0 = 0, time.perf_counter()
    end = t0 + duration
    while True:
        steps += step(actions[k % len(actions)])
        k += 1
        now = time.perf_counter()
        if now >= end:
            return steps / (now - t0)


def _lockstep(venv: Any, env_id: str, n: int, kwargs: dict, duration: float, reset: Callable[[], Any]) -> float:
    """Time lock-step stepping of a synchronous peer, then close it."""
    try:
        reset()
        probe = gym.make(env_id, **kwargs)
        acts = _actions(probe.action_space, n)
        probe.close()
        return _timed(lambda a: (venv.step(a), n)[1], acts, duration)
    finally:
        venv.close()


def gym_sync(env_id: str, n: int, kwargs: dict, duration: float) -> float:
    venv = gym.vector.SyncVectorEnv(env_fns(env_id, n, kwargs))
    return _lockstep(venv, env_id, n, kwargs, duration, lambda: venv.reset(seed=0))


def gym_async(env_id: str, n: int, kwargs: dict, duration: float) -> float:
    venv = gym.vector.AsyncVectorEnv(env_fns(env_id, n, kwargs), shared_memory=True)
    return _lockstep(venv, env_id, n, kwargs, duration, lambda: venv.reset(seed=0))


def sb3_subproc(env_id: str, n: int, kwargs: dict, duration: float) -> float:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    venv = SubprocVecEnv(env_fns(env_id, n, kwargs))
    return _lockstep(venv, env_id, n, kwargs, duration, lambda: (venv.seed(0), venv.reset()))


def seed_subproc(env_id: str, n: int, kwargs: dict, duration: float) -> float:
    from .seed_subproc import SeedSubprocVecEnv

    venv = SeedSubprocVecEnv(env_fns(env_id, n, kwargs))
    return _lockstep(venv, env_id, n, kwargs, duration, lambda: venv.reset(seed=0))


def aiovec_runner(mode: str = "step", recv_batch: int | None = None, **options: Any) -> Runner:
    """aiovec lock-step (``mode='step'``) or first-finished ``send``/``recv(recv_batch)``."""

    def run(env_id: str, n: int, kwargs: dict, duration: float) -> float:
        return aiovec.run(_aiovec_run(env_id, n, kwargs, duration, mode, recv_batch, options))

    return run


async def _aiovec_run(env_id: str, n: int, kwargs: dict, duration: float, mode: str, recv_batch: int | None, options: dict) -> float:
    async with aiovec.AsyncVecEnv(env_fns(env_id, n, kwargs), **options) as venv:
        await venv.reset(seed=0)
        acts = _actions(venv.single_action_space, n)
        if mode == "step":
            return await _atimed(venv, acts, duration, lambda a: _astep(venv, a, n))
        k = recv_batch or n
        venv.send(acts[0])

        async def cycle(a: np.ndarray) -> int:
            r = await venv.recv(k)
            venv.send(a[: len(r.env_ids)], r.env_ids)
            return len(r.env_ids)

        rate = await _atimed(venv, acts, duration, cycle)
        await venv.drain()
        return rate


async def _astep(venv: aiovec.AsyncVecEnv, a: np.ndarray, n: int) -> int:
    await venv.step(a)
    return n


async def _atimed(venv: Any, actions: list, duration: float, step: Callable, warmup: float = 0.2) -> float:
    end = time.perf_counter() + warmup
    k = 0
    while time.perf_counter() < end:
        await step(actions[k % len(actions)])
        k += 1
    steps, t0 = 0, time.perf_counter()
    end = t0 + duration
    while True:
        steps += await step(actions[k % len(actions)])
        k += 1
        now = time.perf_counter()
        if now >= end:
            return steps / (now - t0)


def installed(name: str) -> bool:
    if name == "sb3_subproc":
        try:
            import stable_baselines3  # noqa: F401
        except Exception:
            return False
    return True


PEERS: dict[str, Runner] = {
    "gym_sync": gym_sync,
    "gym_async": gym_async,
    "sb3_subproc": sb3_subproc,
    "seed_subproc": seed_subproc,
}
