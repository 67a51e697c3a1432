"""``aiovec.make``: an :class:`AsyncVecEnv` of a registered gymnasium env id."""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

import gymnasium as gym

from .errors import ConfigError
from .vecenv import AsyncVecEnv

_VEC_OPTIONS = frozenset(inspect.signature(AsyncVecEnv.__init__).parameters) - {"self", "env_fns"}


def resolve(env_id: str, num_envs: int, env_kwargs: dict[str, Any] | None, options: dict[str, Any]) -> tuple[Any, dict, dict]:
    """Check ``env_id``/``num_envs`` and split ``options``: ``(spec, env kwargs, vector-env kwargs)``.

    Options :class:`AsyncVecEnv` knows configure the vector env; the rest go to ``gymnasium.make``.
    """
    if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
        raise ConfigError(f"num_envs must be a positive int, got {num_envs!r}")
    try:
        try:
            spec = gym.spec(env_id)
        except gym.error.NamespaceNotFound:
            if not _register_namespace(env_id):
                raise
            spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise ConfigError(f"unknown env id {env_id!r}: {exc}") from None
    vec_kwargs = {k: v for k, v in options.items() if k in _VEC_OPTIONS}
    kwargs = {**(env_kwargs or {}), **{k: v for k, v in options.items() if k not in _VEC_OPTIONS}}
    return spec, kwargs, vec_kwargs


PLUGINS = {"ALE": "ale_py"}
"""Env namespaces whose package registers them only when asked (``gymnasium.register_envs``), by the module to
ask: since gymnasium 1.0, ``gymnasium.make("ALE/Pong-v5")`` fails until the caller has imported and registered
ale-py, even with it installed. ``aiovec.make`` registers it itself; the spec then names its entry point, which
the workers import."""


def _register_namespace(env_id: str) -> bool:
    """Register the package of ``env_id``'s namespace (:data:`PLUGINS`); False where aiovec knows none.

    Raises:
        ConfigError: the namespace's package is not installed (the message names what to install).
    """
    namespace = env_id.split("/", 1)[0]
    module = PLUGINS.get(namespace)
    if module is None:
        return False
    try:
        gym.register_envs(importlib.import_module(module))
    except ImportError:
        raise ConfigError(f"unknown env id {env_id!r}: the {namespace} envs need {module} (pip install "
                          f"{module.replace('_', '-')})") from None
    return True


def make(env_id: str, num_envs: int, *, env_kwargs: dict[str, Any] | None = None, **options: Any) -> AsyncVecEnv:
    """``num_envs`` copies of ``gymnasium.make(env_id, **env_kwargs)`` in worker processes.

    Keyword arguments that :class:`AsyncVecEnv` knows (``num_workers``, ``batch_size``,
    ``autoreset_mode``, ...) configure the vector env; all others go to ``gymnasium.make``.
    A bad env id or option is a ``ConfigError`` at once, before any worker starts.

    >>> async def main():
    ...     venv = aiovec.make("CartPole-v1", 8, num_workers=2, max_episode_steps=20)  # the last goes to gym.make
    ...     async with venv:
    ...         await venv.reset(seed=0)
    ...         for _ in range(20):
    ...             _, _, terms, truncs, _ = await venv.step(np.ones(8, dtype=np.int64) * (np.arange(8) % 2))
    ...         return venv.num_envs, venv.num_workers, venv.single_observation_space.shape
    >>> aiovec.run(main())
    (8, 2, (4,))
    >>> aiovec.make("CartPol-v1", 8)
    Traceback (most recent call last):
        ...
    aiovec.errors.ConfigError: unknown env id 'CartPol-v1': ...
    """
    spec, kwargs, vec_kwargs = resolve(env_id, num_envs, env_kwargs, options)
    # The spec travels with the factory, so envs registered in __main__ work in workers too.
    factory = functools.partial(gym.make, spec, **kwargs)
    return AsyncVecEnv([factory] * num_envs, **vec_kwargs)
