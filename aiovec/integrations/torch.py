"""torch tensors in and out of aiovec, without extra copies.

The arrays aiovec returns (observations, rewards, terminations, truncations) are fresh
copies owned by the caller, never views of its shared memory, so wrapping them with
``torch.from_numpy`` is safe: the tensor shares the array's memory and the next step
cannot overwrite it.

Example::

    import aiovec
    from aiovec.integrations.torch import TorchVecEnv

    async def main():
        async with TorchVecEnv(aiovec.make("CartPole-v1", 8)) as venv:
            obs, infos = await venv.reset(seed=0)             # torch.float32 (8, 4)
            actions = torch.zeros(8, dtype=torch.int64)
            obs, rewards, terms, truncs, infos = await venv.step(actions)

    aiovec.run(main())

Needs torch: ``pip install 'aiovec[torch]'`` (or the CPU build ``torch==2.13.0``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the package
    raise ImportError("aiovec.integrations.torch needs torch, which is not installed: pip install 'aiovec[torch]'") from exc

from ..errors import ConfigError
from ..vecenv import AsyncVecEnv

__all__ = ["TorchStepResult", "TorchVecEnv", "as_tensor", "to_numpy_actions"]


def as_tensor(obs: Any, device: torch.device | str | None = None) -> Any:
    """numpy arrays (or dicts/tuples/lists of them) as torch tensors, sharing memory on the CPU.

    Uses ``torch.from_numpy``: no copy, the tensor *is* the array. With a ``device`` other
    than the CPU the tensor is then moved there (that is one copy, to the device).
    Anything that is not a numpy array (an info value, ``None``) passes through.

    >>> arr = np.zeros((8, 4), dtype=np.float32)
    >>> t = as_tensor(arr)
    >>> t[0, 0] = 1.0          # the tensor is the array: no copy was made
    >>> float(arr[0, 0])
    1.0
    >>> as_tensor({"pos": arr, "id": np.arange(8)})["id"].dtype
    torch.int64
    """
    if isinstance(obs, dict):
        return {k: as_tensor(v, device) for k, v in obs.items()}
    if isinstance(obs, (tuple, list)):
        return type(obs)(as_tensor(v, device) for v in obs)
    if isinstance(obs, np.ndarray):
        t = torch.from_numpy(obs if obs.flags.writeable else obs.copy())
        if device is not None and torch.device(device) != t.device:
            t = t.to(device)
        return t
    return obs


def to_numpy_actions(actions: Any) -> Any:
    """torch tensors (or dicts/tuples/lists of them) as numpy arrays for ``send``/``step``.

    ``detach().cpu().numpy()``: on the CPU that is a view, not a copy (aiovec copies the
    actions into its shared memory at once, so the tensor may change afterwards). numpy
    arrays and other values pass through.

    >>> to_numpy_actions(torch.tensor([0, 1, 1]))
    array([0, 1, 1])
    >>> {k: v.shape for k, v in to_numpy_actions({"move": torch.zeros(2, 3), "fire": np.ones(2)}).items()}
    {'move': (2, 3), 'fire': (2,)}
    """
    if isinstance(actions, torch.Tensor):
        return actions.detach().cpu().numpy()
    if isinstance(actions, dict):
        return {k: to_numpy_actions(v) for k, v in actions.items()}
    if isinstance(actions, (tuple, list)):
        return type(actions)(to_numpy_actions(v) for v in actions)
    return actions


class TorchStepResult(NamedTuple):
    """What :meth:`TorchVecEnv.recv` returns: :class:`aiovec.StepResult` with tensors.

    >>> async def main():
    ...     async with TorchVecEnv(aiovec.make("CartPole-v1", 8, num_workers=2)) as venv:
    ...         await venv.reset(seed=0)
    ...         venv.send(torch.zeros(8, dtype=torch.int64))
    ...         r = await venv.recv(4)
    ...         await venv.drain()
    ...         return type(r).__name__, r.obs.shape, r.rewards.dtype, r.env_ids.dtype
    >>> aiovec.run(main())
    ('TorchStepResult', torch.Size([4, 4]), torch.float32, torch.int64)
    """

    obs: Any
    rewards: torch.Tensor
    terminations: torch.Tensor
    truncations: torch.Tensor
    infos: dict[str, Any]
    env_ids: torch.Tensor


class TorchVecEnv:
    """An :class:`aiovec.AsyncVecEnv` that takes and returns torch tensors.

    ``reset``, ``step``, ``send`` and ``recv`` work as on the wrapped vector env, but
    observations, rewards (``reward_dtype``, float32 by default), terminations,
    truncations and env ids come back as tensors on ``device``, and actions and env ids
    may be tensors. Infos stay numpy. Everything else (``num_envs``, spaces, ``drain``,
    ``resize``, ``call``, ``close``, ...) is the wrapped env's; ``async with`` starts and
    closes it.

    >>> policy = torch.nn.Linear(4, 2)
    >>> async def main():
    ...     async with TorchVecEnv(aiovec.make("CartPole-v1", 8, num_workers=2), device="cpu") as venv:
    ...         obs, _ = await venv.reset(seed=0)
    ...         with torch.no_grad():
    ...             venv.send(policy(obs).argmax(-1))                  # tensors in
    ...             for _ in range(50):
    ...                 r = await venv.recv(4)                          # the first 4 envs to finish
    ...                 venv.send(policy(r.obs).argmax(-1), r.env_ids)  # tensors out, and back in
    ...         await venv.drain()
    ...         return obs.dtype, r.obs.shape
    >>> aiovec.run(main())
    (torch.float32, torch.Size([4, 4]))
    """

    def __init__(self, async_venv: AsyncVecEnv, device: torch.device | str = "cpu", reward_dtype: torch.dtype = torch.float32) -> None:
        if not isinstance(async_venv, AsyncVecEnv):
            hint = " (aiovec.make_vec builds the synchronous facade: use aiovec.make)" if hasattr(async_venv, "async_env") else ""
            raise ConfigError(f"TorchVecEnv wraps an aiovec.AsyncVecEnv, got {type(async_venv).__name__}{hint}")
        self.venv = async_venv
        self.device = torch.device(device)
        self.reward_dtype = reward_dtype

    def __getattr__(self, name: str) -> Any:
        if name == "venv":  # not set yet (unpickling, a failed __init__)
            raise AttributeError(name)
        return getattr(self.venv, name)

    async def __aenter__(self) -> TorchVecEnv:
        await self.venv.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.venv.close()

    def _tensor(self, arr: Any) -> Any:
        return as_tensor(arr, self.device)

    async def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """``AsyncVecEnv.reset`` returning observations as tensors.

        Example: ``obs, infos = await venv.reset(seed=0)``.
        """
        obs, infos = await self.venv.reset(seed=seed, options=options)
        return self._tensor(obs), infos

    async def step(self, actions: Any) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """``AsyncVecEnv.step`` with tensor (or numpy) actions; returns gymnasium's 5-tuple as tensors.

        Example: ``obs, rewards, terms, truncs, infos = await venv.step(policy(obs).sample())``.
        """
        obs, rewards, terms, truncs, infos = await self.venv.step(to_numpy_actions(actions))
        return self._tensor(obs), self._rewards(rewards), self._tensor(terms), self._tensor(truncs), infos

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """``AsyncVecEnv.send``; ``actions`` and ``env_ids`` may be tensors.

        Example: ``venv.send(actions, r.env_ids)`` with ``r`` a :class:`TorchStepResult`.
        """
        self.venv.send(to_numpy_actions(actions), to_numpy_actions(env_ids))

    async def recv(self, batch_size: int | None = None, timeout: float | None = None) -> TorchStepResult:
        """``AsyncVecEnv.recv`` as a :class:`TorchStepResult` of tensors (``env_ids``: int64).

        Example: ``r = await venv.recv(4, timeout=1.0)``.
        """
        r = await self.venv.recv(batch_size, timeout)
        return TorchStepResult(self._tensor(r.obs), self._rewards(r.rewards), self._tensor(r.terminations),
                               self._tensor(r.truncations), r.infos, self._tensor(r.env_ids))

    def _rewards(self, rewards: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(rewards).to(device=self.device, dtype=self.reward_dtype)
