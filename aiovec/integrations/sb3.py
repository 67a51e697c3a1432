"""Stable-Baselines3 on aiovec: a ``stable_baselines3.common.vec_env.VecEnv`` over :class:`aiovec.VectorEnv`.

The vector env runs with gymnasium's ``SAME_STEP`` autoreset, which is SB3's own
convention: the observation returned with ``done=True`` already belongs to the next
episode, the last one of the finished episode is in ``infos[i]["terminal_observation"]``
and ``infos[i]["TimeLimit.truncated"]`` tells a time limit from a real termination.

Example::

    from stable_baselines3 import PPO
    from aiovec.integrations.sb3 import make_sb3_vec_env

    env = make_sb3_vec_env("CartPole-v1", 8, seed=0, num_workers=2)
    PPO("MlpPolicy", env).learn(10_000)
    env.close()

Needs stable-baselines3: ``pip install 'aiovec[sb3]'``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

try:
    from stable_baselines3.common.vec_env import VecEnv, VecMonitor
    from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices, VecEnvObs, VecEnvStepReturn
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the package
    raise ImportError(
        "aiovec.integrations.sb3 needs stable-baselines3, which is not installed: pip install 'aiovec[sb3]'"
    ) from exc

from ..errors import ConfigError, EnvError
from ..gym import VectorEnv
from ..make import resolve
from ..vecenv import AsyncVecEnv
from ._factory import make_wrapped

__all__ = ["SB3VecEnv", "make_sb3_vec_env", "unbatch_infos"]


class SB3VecEnv(VecEnv):
    """A Stable-Baselines3 ``VecEnv`` whose envs live in aiovec's worker processes.

    ``venv`` is an :class:`aiovec.VectorEnv` (or a not yet started :class:`aiovec.AsyncVecEnv`)
    created with ``autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP``. Steps follow
    SB3's ``DummyVecEnv`` exactly: ``dones = terminated | truncated``, float32 rewards, a list
    of info dicts with ``terminal_observation`` and ``TimeLimit.truncated``, reset infos in
    ``reset_infos``. Seeds set with ``seed()`` and options set with ``set_options()`` are
    used by the next ``reset()`` only. Closing the adapter closes ``venv``.

    >>> from aiovec.integrations.sb3 import SB3VecEnv
    >>> env = SB3VecEnv(aiovec.make_vec("CartPole-v1", 4, num_workers=2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
    >>> _ = env.seed(0)
    >>> obs = env.reset()
    >>> for _ in range(100):
    ...     obs, rewards, dones, infos = env.step(np.zeros(4, dtype=np.int64))
    ...     if dones.any():
    ...         break
    >>> obs.shape, rewards.dtype, sorted(infos[int(np.flatnonzero(dones)[0])])
    ((4, 4), dtype('float32'), ['TimeLimit.truncated', 'terminal_observation'])
    >>> env.close()
    """

    def __init__(self, venv: VectorEnv | AsyncVecEnv) -> None:
        if isinstance(venv, AsyncVecEnv):
            venv = VectorEnv.wrap(venv)
        if not isinstance(venv, VectorEnv):
            raise ConfigError(f"SB3VecEnv wraps an aiovec.VectorEnv or AsyncVecEnv, got {type(venv).__name__}")
        mode = venv.metadata.get("autoreset_mode")
        if mode != AutoresetMode.SAME_STEP:
            raise ConfigError(
                f"SB3VecEnv needs a vector env with autoreset_mode=AutoresetMode.SAME_STEP (SB3's convention), got {mode}; "
                "create it with aiovec.make_vec(..., autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP) "
                "or use make_sb3_vec_env()"
            )
        self.venv = venv
        self._actions: Any = None
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)

    # -- stepping -----------------------------------------------------------------------
    def reset(self) -> VecEnvObs:
        """Reset every env with the seeds/options set since the last reset (then forget them).

        Example: ``env.seed(0); obs = env.reset()``; reset infos are in ``env.reset_infos``.
        """
        n = self.num_envs
        seeds: list[int | None] | None = list(self._seeds) if any(s is not None for s in self._seeds) else None
        groups: dict[str, tuple[dict[str, Any], list[int]]] = {}
        for i, opts in enumerate(self._options):
            key = repr(sorted(opts.items())) if opts else ""
            groups.setdefault(key, (dict(opts), []))[1].append(i)
        if len(groups) == 1:  # one reset for all: the common case
            opts = next(iter(groups.values()))[0]
            obs, infos = self.venv.reset(seed=seeds, options=opts or None)
            self.reset_infos = unbatch_infos(infos, n)
        else:  # different options per env: one masked reset per distinct options
            self.reset_infos = [{} for _ in range(n)]
            for opts, ids in groups.values():
                mask = np.zeros(n, dtype=np.bool_)
                mask[ids] = True
                obs, infos = self.venv.reset(seed=seeds, options={**opts, "reset_mask": mask})
                rows = unbatch_infos(infos, n)
                for i in ids:
                    self.reset_infos[i] = rows[i]
        self._actions = None
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        """Remember the actions; :meth:`step_wait` steps every env with them.

        Example: ``env.step_async(np.zeros(env.num_envs, dtype=np.int64)); env.step_wait()``.
        """
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        """Step every env once; returns ``(obs, rewards, dones, infos)`` as ``DummyVecEnv`` does.

        Example: ``obs, rewards, dones, infos = env.step(actions)`` (``step`` = ``step_async`` + ``step_wait``);
        ``infos[i]["terminal_observation"]`` where ``dones[i]``.
        """
        if self._actions is None:
            raise RuntimeError("step_wait() without a pending step_async()")
        actions, self._actions = self._actions, None
        obs, rewards, terminated, truncated, infos = self.venv.step(actions)
        dones = terminated | truncated
        rows = unbatch_infos(infos, self.num_envs)
        out: list[dict[str, Any]] = []
        for i, row in enumerate(rows):
            if dones[i] and "final_obs" in row:
                final_obs = row.pop("final_obs")
                info = row.pop("final_info", {}) or {}
                self.reset_infos[i] = row  # what is left is the reset's info
                info["terminal_observation"] = final_obs
            else:
                info = row
            info["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            out.append(info)
        return obs, rewards.astype(np.float32), dones, out

    # -- attributes and methods ---------------------------------------------------------
    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Attribute ``attr_name`` of each env (found through its wrappers); ``AttributeError`` if missing.

        Example: ``env.get_attr("spec", indices=[0])[0].id == "CartPole-v1"``.
        """
        return list(self._relay(self.venv.get_attr, attr_name, env_ids=self._ids(indices)))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set attribute ``attr_name`` to ``value`` in each env (the same value for all, as SB3 does).

        Example: ``env.set_attr("my_flag", True, indices=[1, 2])``.
        """
        ids = self._ids(indices)
        count = self.num_envs if ids is None else len(ids)
        self._relay(self.venv.set_attr, attr_name, [value] * count, env_ids=ids)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any) -> list[Any]:
        """Call ``env.method_name(*method_args, **method_kwargs)`` in each env; results in env order.

        Example: ``env.env_method("get_wrapper_attr", "spec")``.
        """
        return list(self._relay(self.venv.call, method_name, *method_args, env_ids=self._ids(indices), **method_kwargs))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        """Whether each env is wrapped in a wrapper of that class name (e.g. SB3's ``Monitor``).

        The envs live in other processes, so the check compares ``wrapper_class.__name__`` with
        the class names in gymnasium's wrapper chain ``str(env)`` (``<Monitor<TimeLimit<...>>>``);
        a subclass of ``wrapper_class`` with another name does not count.

        Example: ``env.env_is_wrapped(stable_baselines3.common.monitor.Monitor) == [True] * env.num_envs``.
        """
        name = wrapper_class.__name__
        chains = self._relay(self.venv.call, "__str__", env_ids=self._ids(indices))
        return [name in _wrapper_names(chain) for chain in chains]

    def get_images(self) -> Sequence[np.ndarray | None]:
        """One ``render()`` image per env (envs made with ``render_mode="rgb_array"``), as SB3's ``render()`` tiles them.

        Example: ``make_sb3_vec_env("CartPole-v1", 4, render_mode="rgb_array").render()`` is one tiled image.
        """
        if self.render_mode != "rgb_array":
            return [None] * self.num_envs
        return list(self.venv.render() or ())

    def close(self) -> None:
        """Close the aiovec vector env: its workers, its loop and its thread. Idempotent.

        Example: ``env.close(); env.close()`` is fine.
        """
        if not self.venv.closed:
            self.venv.close()

    # -- helpers ------------------------------------------------------------------------
    def _ids(self, indices: VecEnvIndices) -> list[int] | None:
        if indices is None:
            return None
        return [int(i) for i in self._get_indices(indices)]

    @staticmethod
    def _relay(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EnvError as exc:  # SB3 (has_attr, VecEnv.__init__) expects AttributeError
            if exc.exc_type == "AttributeError":
                raise AttributeError(str(exc)) from exc
            raise


def unbatch_infos(infos: dict[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Turn gymnasium's vectorised infos (``key`` + ``_key`` masks) into one dict per env.

    Nested dicts (``final_info``, or ``final_obs`` of a Dict space) are unbatched too; numbers
    come back as Python scalars.

    >>> unbatch_infos({"x": np.array([1, 0]), "_x": np.array([True, False])}, 2)
    [{'x': 1}, {}]
    >>> unbatch_infos({"final_info": {"t": np.array([0.0, 3.5]), "_t": np.array([False, True])},
    ...                "_final_info": np.array([False, True])}, 2)
    [{}, {'final_info': {'t': 3.5}}]
    """
    out: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, value in infos.items():
        if isinstance(key, str) and key.startswith("_") and key[1:] in infos:
            continue  # a mask
        mask = infos.get(f"_{key}")
        rows = range(num_envs) if mask is None else np.flatnonzero(mask).tolist()
        if isinstance(value, dict):
            sub = unbatch_infos(value, num_envs)
            for i in rows:
                out[i][key] = sub[i]
        elif isinstance(value, np.ndarray) and value.shape[:1] == (num_envs,):
            scalar = value.dtype != object and value.ndim == 1
            for i in rows:
                out[i][key] = value[i].item() if scalar else value[i]
        else:  # not batched (an env put something odd in there): every row sees it
            for i in rows:
                out[i][key] = value
    return out


def _wrapper_names(chain: str) -> list[str]:
    return re.findall(r"<(\w+)", chain)


def make_sb3_vec_env(
    env_id: str,
    num_envs: int,
    *,
    seed: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    monitor: bool = True,
    wrapper_class: Callable[..., gym.Env] | None = None,
    wrapper_kwargs: dict[str, Any] | None = None,
    **aiovec_options: Any,
) -> VecEnv:
    """``num_envs`` copies of ``gymnasium.make(env_id)`` in aiovec workers, as an SB3 ``VecEnv``.

    Like SB3's ``make_vec_env``: each env is wrapped in ``wrapper_class(env, **wrapper_kwargs)``
    when given, and episode returns and lengths reach SB3's logger (``infos[i]["episode"]``)
    through a ``VecMonitor`` around the :class:`SB3VecEnv` (``monitor=False``: the bare
    :class:`SB3VecEnv`). ``VecMonitor`` counts in the parent process, so the workers never
    import SB3 or torch (a per-env ``Monitor`` would cost each worker that import).
    ``seed`` seeds the first reset (env ``i`` gets ``seed + i``). Keyword arguments that
    :class:`aiovec.AsyncVecEnv` knows (``num_workers``, ``step_timeout``, ...) configure the
    vector env, all others go to ``gymnasium.make`` (``max_episode_steps=...``). The
    autoreset mode is always ``SAME_STEP``.

    >>> from stable_baselines3 import PPO
    >>> env = make_sb3_vec_env("CartPole-v1", 4, seed=0, num_workers=2, max_episode_steps=200)
    >>> model = PPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
    >>> _ = model.learn(total_timesteps=512)
    >>> model.num_timesteps, type(env.unwrapped).__name__
    (512, 'SB3VecEnv')
    >>> env.close()
    """
    mode = aiovec_options.pop("autoreset_mode", AutoresetMode.SAME_STEP)
    try:
        same_step = AutoresetMode(mode) == AutoresetMode.SAME_STEP
    except ValueError:
        same_step = False
    if not same_step:
        raise ConfigError(f"SB3 needs autoreset_mode=SAME_STEP, got {mode!r}")
    spec, kwargs, vec_kwargs = resolve(env_id, num_envs, env_kwargs, aiovec_options)
    factory = functools.partial(make_wrapped, spec, kwargs, wrapper_class, dict(wrapper_kwargs or {}))
    venv = SB3VecEnv(VectorEnv([factory] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP, **vec_kwargs))
    if seed is not None:
        venv.seed(seed)
    return VecMonitor(venv) if monitor else venv
