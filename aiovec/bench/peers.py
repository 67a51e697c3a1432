"""The vectorizers aiovec is measured against, each behind one small interface.

A *runner* builds a vector env, steps it with fixed random actions for a given
time and returns env steps per second (all envs counted). Peers that are not
installed are reported as skipped, never as zero.
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

import aiovec
from aiovec.machine import available_cpus

Runner = Callable[[str, int, dict, float], float]


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """Picklable by reference: importing this module in a peer's worker registers aiovec's envs.

    Atari ids (``ALE/...``) register ale-py's envs first, in whatever process makes them.
    """
    if env_id.startswith("ALE/") and env_id not in gym.registry:
        import ale_py

        gym.register_envs(ale_py)
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
    done = False
    try:
        reset()
        probe = gym.make(env_id, **kwargs)
        acts = _actions(probe.action_space, n)
        probe.close()
        rate = _timed(lambda a: (venv.step(a), n)[1], acts, duration)
        done = True
        return rate
    finally:
        try:
            if isinstance(venv, gym.vector.AsyncVectorEnv):
                venv.close(timeout=10)  # a call cut short (SIGTERM) is not waited for forever
            else:
                venv.close()
        except Exception:
            if done:
                raise  # after an error or a SIGTERM, a failure to close must not hide it


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


def puffer_mp(num_workers: int | None = None, batch_size: int | None = None, overwork: bool = False,
              zero_copy: bool = True) -> Runner:
    """PufferLib's multiprocessing backend, ``pufferlib.vector.Multiprocessing`` (tested with PufferLib 2.0.2).

    Each env is wrapped in ``pufferlib.emulation.GymnasiumPufferEnv``; ``num_envs / num_workers`` envs run one
    after the other in each worker process (PufferLib's default start method). The runner drives ``send``/``recv``:
    with ``batch_size < num_envs`` that is PufferLib's asynchronous mode, where ``recv`` returns the first
    ``batch_size`` envs whose workers are done; every env ``recv`` returns counts as one step. Defaults follow
    PufferLib's documented layout: one worker per physical core, ``batch_size = num_envs / 2``. Its workers and
    its ``recv`` busy-wait, and ``overwork=True`` is its opt-in for more workers than physical cores.
    """

    def run(env_id: str, n: int, kwargs: dict, duration: float) -> float:
        import psutil
        import pufferlib.emulation
        import pufferlib.vector

        cores = min(n, available_cpus(), psutil.cpu_count(logical=False) or 1)
        workers = num_workers or max(w for w in range(1, cores + 1) if n % w == 0)
        batch = batch_size or (n // workers) * (workers // 2 if workers % 2 == 0 else 1)
        creator = functools.partial(pufferlib.emulation.GymnasiumPufferEnv, env_creator=functools.partial(make_env, env_id, **kwargs))
        venv = pufferlib.vector.make(creator, num_envs=n, backend=pufferlib.vector.Multiprocessing, num_workers=workers,
                                     batch_size=batch, overwork=overwork, zero_copy=zero_copy)
        try:
            venv.async_reset(0)
            venv.recv()
            acts = _actions(venv.single_action_space, batch)

            def step(a: np.ndarray) -> int:
                venv.send(a)
                return len(venv.recv()[5])  # env (agent) ids of the batch

            return _timed(step, acts, duration)
        finally:
            venv.close()  # terminates the workers without joining them: reap them here
            for proc in venv.processes:
                proc.join(5)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
            venv.driver_env.close()

    return run


_IMPORTS = {"sb3_subproc": ("stable_baselines3",), "puffer_mp": ("pufferlib.vector", "pufferlib.emulation")}


def installed(name: str) -> bool:
    for module in _IMPORTS.get(name, ()):
        try:
            importlib.import_module(module)
        except Exception:
            return False
    return True


PEERS: dict[str, Runner] = {
    "gym_sync": gym_sync,
    "gym_async": gym_async,
    "sb3_subproc": sb3_subproc,
    "seed_subproc": seed_subproc,
    "puffer_mp": puffer_mp(),  # its default layout; core.py overrides it where a sweep found a better one
}
