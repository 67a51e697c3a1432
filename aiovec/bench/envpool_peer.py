"""EnvPool as an anchor: the same tasks in C++ threads (a ceiling, not a like-for-like peer).

EnvPool reimplements the envs natively, so only tasks it ships are measured: its v4
MuJoCo tasks stand in for gymnasium's v5 ones, and its Atari Pong is configured to
look like gymnasium's ``ALE/Pong-v5`` (210x160x3 RGB, frameskip 4, sticky actions
0.25, no frame stack, no episodic life, no reward clipping). It runs in sync mode
(``batch_size = num_envs``) with one thread per available CPU.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from aiovec.machine import available_cpus

from .peers import _actions, _timed

ATARI_AS_GYMNASIUM = {"img_height": 210, "img_width": 160, "gray_scale": False, "stack_num": 1, "frame_skip": 4,
                      "noop_max": 1, "use_fire_reset": False, "episodic_life": False, "reward_clip": False,
                      "repeat_action_probability": 0.25, "max_episode_steps": 27000}

# gymnasium id -> (EnvPool task, its options)
TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    "CartPole-v1": ("CartPole-v1", {}),
    "HalfCheetah-v5": ("HalfCheetah-v4", {}),
    "Ant-v5": ("Ant-v4", {}),
    "ALE/Pong-v5": ("Pong-v5", ATARI_AS_GYMNASIUM),
}


def installed() -> bool:
    return importlib.util.find_spec("envpool") is not None


def task_for(env_id: str) -> str | None:
    """The EnvPool task that stands in for ``env_id``, or None if EnvPool has none."""
    return TASKS[env_id][0] if env_id in TASKS else None


def make(env_id: str, n: int, kwargs: dict) -> Any:
    """EnvPool's stand-in for ``n`` envs of ``env_id``: sync mode, one thread per available CPU."""
    import envpool

    task, options = TASKS[env_id]
    return envpool.make_gymnasium(task, num_envs=n, batch_size=n, num_threads=available_cpus(), seed=0, **options, **kwargs)


def envpool_sync(env_id: str, n: int, kwargs: dict, duration: float) -> float:
    """A runner (see :mod:`.peers`): lock-step steps/s of EnvPool's stand-in for ``env_id``."""
    venv = make(env_id, n, kwargs)
    try:
        venv.reset()
        acts = _actions(venv.action_space, n)  # EnvPool's action_space is one env's
        return _timed(lambda a: (venv.step(a), n)[1], acts, duration)
    finally:
        venv.close()
