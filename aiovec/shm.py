"""Shared-memory slots for every env: actions in, obs/reward/terminated/truncated out.

Built on gymnasium's own shared-memory helpers. The memory comes from
multiprocessing's heap (an anonymous, already-unlinked file), so nothing is ever
left behind in ``/dev/shm``; it reaches a worker as an inherited file descriptor
when the worker process is started. Row ``i`` belongs to env ``i`` whatever worker
hosts it, so moving an env between workers moves no buffer.
"""

from __future__ import annotations

from ctypes import c_bool, c_uint8
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory

from .spaces import action_buffer_space, action_dtype_codes, action_dtype_shape


@dataclass
class Views:
    """numpy views of the shared buffers, each with one row per env."""

    obs: Any
    actions: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    action_dtypes: np.ndarray | None = None  # per env (and widened leaf), the caller's dtype (spaces.action_dtype_codes)


class _Raw:
    """A lock-free shared array with the ``get_obj()`` that gymnasium's readers expect."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def get_obj(self) -> Any:
        return self.obj

    def __getstate__(self) -> Any:
        return self.obj

    def __setstate__(self, obj: Any) -> None:
        self.obj = obj


class _LockFree:
    """A multiprocessing context whose ``Array`` has no lock: rows are owned by one writer
    at a time (the parent for actions, the hosting worker for results), so a lock would
    only cost a named semaphore per buffer."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    def Array(self, typecode: Any, size: int) -> _Raw:  # noqa: N802 - mirrors multiprocessing
        return _Raw(self._ctx.RawArray(typecode, size))


class SharedBuffers:
    """The shared memory of one vector env; picklable only while starting a worker."""

    def __init__(self, ctx: Any, obs_space: spaces.Space, action_space: spaces.Space, num_envs: int) -> None:
        self.obs_space = obs_space
        self.action_space = action_space
        self.num_envs = num_envs
        raw = _LockFree(ctx)
        self._obs = create_shared_memory(obs_space, num_envs, raw)
        self._action_buffer_space = action_buffer_space(action_space)
        self._actions = create_shared_memory(self._action_buffer_space, num_envs, raw)
        self._dtype_shape = action_dtype_shape(action_space, num_envs)
        self._action_dtypes = raw.Array(c_uint8, int(np.prod(self._dtype_shape))) if self._dtype_shape is not None else None
        if self._action_dtypes is not None:
            action_dtype_codes(action_space, num_envs, lambda n: np.frombuffer(self._action_dtypes.get_obj(), dtype=np.uint8))
        self._rewards = raw.Array("d", num_envs)
        self._terminations = raw.Array(c_bool, num_envs)
        self._truncations = raw.Array(c_bool, num_envs)

    def views(self) -> Views:
        n = self.num_envs
        return Views(
            obs=read_from_shared_memory(self.obs_space, self._obs, n),
            actions=read_from_shared_memory(self._action_buffer_space, self._actions, n),
            rewards=np.frombuffer(self._rewards.get_obj(), dtype=np.float64),
            terminations=np.frombuffer(self._terminations.get_obj(), dtype=np.bool_),
            truncations=np.frombuffer(self._truncations.get_obj(), dtype=np.bool_),
            action_dtypes=(None if self._action_dtypes is None
                           else np.frombuffer(self._action_dtypes.get_obj(), dtype=np.uint8).reshape(self._dtype_shape)),
        )
