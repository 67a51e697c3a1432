"""Live vector envs that can be measured again and again: built once per workload, measured in turns.

Building 16 Atari or MuJoCo envs takes seconds, more than a measurement; so the v2
benchmark builds every contender of a workload once, inside one event loop, and then
measures them in interleaved turns (A B C A B C ...). Idle contenders block on their
pipes and cost nothing meanwhile. Every contender closes in ``aclose`` (bounded).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import gymnasium as gym
import numpy as np

import aiovec

from . import envpool_peer
from .floor import FloorVecEnv
from .peers import _actions, _atimed, env_fns


def _sync(step: Callable[[np.ndarray], Any], n: int, checkpoint: bool = False) -> Callable[[np.ndarray], Awaitable[int]]:
    """A synchronous vector env's step as the coroutine :func:`.peers._atimed` awaits (it runs inside the loop);
    ``checkpoint``: then one turn of the event loop, as an asyncio API that is a checkpoint takes on every call."""

    async def run(a: np.ndarray) -> int:
        step(a)
        return n

    async def run_checkpoint(a: np.ndarray) -> int:
        step(a)
        await asyncio.sleep(0)
        return n

    return run_checkpoint if checkpoint else run


class Contender:
    """One vector env, built and reset; ``measure`` times lock-step stepping with fixed random actions."""

    name: str
    workers: int | None = None  # what it ran with, where that is meaningful
    placement: str | None = None

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n

    async def measure(self, duration: float, warmup: float) -> float:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError


class GymContender(Contender):
    """gymnasium's SyncVectorEnv or AsyncVectorEnv (shared memory), stepped synchronously inside the loop.

    ``gym_sync_checkpoint``: SyncVectorEnv followed by one turn of the event loop per batch, the least any
    asyncio API pays that lets other tasks run on every call (aiovec's ``step`` does)."""

    def __init__(self, name: str, env_id: str, n: int, kwargs: dict) -> None:
        super().__init__(name, n)
        sync = name in ("gym_sync", "gym_sync_checkpoint")
        cls = gym.vector.SyncVectorEnv if sync else gym.vector.AsyncVectorEnv
        options = {} if sync else {"shared_memory": True}
        self.venv = cls(env_fns(env_id, n, kwargs), **options)
        self.venv.reset(seed=0)
        self.acts = _actions(self.venv.single_action_space, n)

    async def measure(self, duration: float, warmup: float) -> float:
        return await _atimed(self.venv, self.acts, duration, _sync(self.venv.step, self.n, self.name == "gym_sync_checkpoint"), warmup)

    async def aclose(self) -> None:
        if isinstance(self.venv, gym.vector.AsyncVectorEnv):
            self.venv.close(timeout=10)  # a call cut short (SIGTERM) is not waited for forever
        else:
            self.venv.close()


class EnvPoolContender(Contender):
    """EnvPool's stand-in task in sync mode, one thread per CPU (see :mod:`.envpool_peer`)."""

    def __init__(self, env_id: str, n: int, kwargs: dict) -> None:
        super().__init__("envpool", n)
        self.venv = envpool_peer.make(env_id, n, kwargs)
        self.venv.reset()
        self.acts = _actions(self.venv.action_space, n)  # EnvPool's action_space is one env's

    async def measure(self, duration: float, warmup: float) -> float:
        return await _atimed(self.venv, self.acts, duration, _sync(self.venv.step, self.n), warmup)

    async def aclose(self) -> None:
        self.venv.close()


class FloorContender(Contender):
    """The floor (:mod:`.floor`) with a given worker count."""

    def __init__(self, env_id: str, n: int, kwargs: dict, workers: int) -> None:
        super().__init__(f"floor_{workers}", n)
        self.venv = FloorVecEnv(env_id, n, kwargs, workers)
        self.workers = self.venv.num_workers
        self.acts = _actions(self.venv.single_action_space, n)

    async def start(self) -> FloorContender:
        await self.venv.start()
        return self

    async def measure(self, duration: float, warmup: float) -> float:
        async def step(a: np.ndarray) -> int:
            await self.venv.step(a)
            return self.n

        return await _atimed(self.venv, self.acts, duration, step, warmup)

    async def aclose(self) -> None:
        self.venv.close()


class AiovecContender(Contender):
    """aiovec with the given options (its defaults when none); reports its worker count after each measurement."""

    def __init__(self, name: str, env_id: str, n: int, kwargs: dict, **options: Any) -> None:
        super().__init__(name, n)
        self.venv = aiovec.AsyncVecEnv(env_fns(env_id, n, kwargs), **options)

    async def start(self) -> AiovecContender:
        await self.venv.reset(seed=0)
        self.acts = _actions(self.venv.single_action_space, self.n)
        return self

    async def measure(self, duration: float, warmup: float) -> float:
        async def step(a: np.ndarray) -> int:
            await self.venv.step(a)
            return self.n

        rate = await _atimed(self.venv, self.acts, duration, step, warmup)
        self.workers = int(self.venv.num_workers)
        p = getattr(self.venv, "placement", None) or self.venv.stats().get("placement")
        self.placement = str(p) if p is not None else ("inline" if self.workers == 0 else "process")
        return rate

    async def aclose(self) -> None:
        await self.venv.close()
