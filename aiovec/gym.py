"""``aiovec.VectorEnv``: a synchronous ``gymnasium.vector.VectorEnv`` facade over :class:`AsyncVecEnv`.

The async vector env runs on a private event loop in a background thread (uvloop
where installed), so the facade works from plain scripts, from threads without a
loop, and from Jupyter cells whose loop is already running. ``close()`` stops the
workers, the loop and its thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import gymnasium as gym

from .loop import has_uvloop
from .vecenv import AsyncVecEnv


class VectorEnv(gym.vector.VectorEnv):
    """Drop-in for ``gymnasium.vector.AsyncVectorEnv(env_fns, ...)``; same options as :class:`AsyncVecEnv`."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], **options: Any) -> None:
        self._init_with(AsyncVecEnv(env_fns, **options))

    @classmethod
    def wrap(cls, venv: AsyncVecEnv) -> VectorEnv:
        """A facade over an :class:`AsyncVecEnv` that has not been started yet."""
        self = cls.__new__(cls)
        self._init_with(venv)
        return self

    def _init_with(self, venv: AsyncVecEnv) -> None:
        self._venv = venv
        if has_uvloop():
            import uvloop

            self._loop = uvloop.new_event_loop()
        else:
            self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="aiovec-loop", daemon=True)
        self._thread.start()
        self.num_envs = venv.num_envs
        self.single_observation_space = venv.single_observation_space
        self.single_action_space = venv.single_action_space
        self.observation_space = venv.observation_space
        self.action_space = venv.action_space
        self.metadata = venv.metadata
        self.render_mode = venv.render_mode
        self.spec = venv.spec
        self.closed = False
        try:
            self._run(venv.start())
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if self.closed:
            coro.close()
            from .errors import ClosedError

            raise ClosedError("the vector env is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def async_env(self) -> AsyncVecEnv:
        """The underlying :class:`AsyncVecEnv` (lives on the facade's loop thread)."""
        return self._venv

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        return self._run(self._venv.reset(seed=seed, options=options))

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        return self._run(self._venv.step(actions))

    def call(self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any) -> tuple[Any, ...]:
        return self._run(self._venv.call(name, *args, env_ids=env_ids, **kwargs))

    def get_attr(self, name: str, env_ids: Sequence[int] | None = None) -> tuple[Any, ...]:
        return self._run(self._venv.get_attr(name, env_ids=env_ids))

    def set_attr(self, name: str, values: Any, env_ids: Sequence[int] | None = None) -> None:
        self._run(self._venv.set_attr(name, values, env_ids=env_ids))

    def render(self) -> tuple[Any, ...] | None:
        return self.call("render")

    def resize(self, num_workers: int) -> None:
        self._run(self._venv.resize(num_workers))

    @property
    def num_workers(self) -> int:
        return self._venv.num_workers

    def stats(self) -> dict[str, Any]:
        return self._venv.stats()

    def close_extras(self, **kwargs: Any) -> None:
        try:
            if self._thread.is_alive():
                asyncio.run_coroutine_threadsafe(self._venv.close(), self._loop).result()
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        if not self._loop.is_closed():
            self._loop.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            try:
                self.close()
            except Exception:
                pass


def make_vec(env_id: str, num_envs: int, **kwargs: Any) -> VectorEnv:
    """``aiovec.make(...)`` behind the synchronous gymnasium ``VectorEnv`` API."""
    from .make import make

    return VectorEnv.wrap(make(env_id, num_envs, **kwargs))
