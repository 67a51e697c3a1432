"""Synthetic envs with known costs (and faults), registered as ``aiovec/...`` gymnasium ids.

Their cost per step is what the benchmarks and the controller are judged on:
CPU burned (measured by ``time.thread_time``, so it is real CPU, not wall time),
time spent waiting (``time.sleep``), heavy-tailed stragglers, a cost that changes
mid-run, and injected faults. Randomness comes from ``self.np_random``, so runs
are reproducible from the seed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


def burn_cpu(seconds: float) -> None:
    """Spin until this thread has used ``seconds`` of CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class CostEnv(gym.Env):
    """Base: ``(obs_dim,)`` float32 observations, two actions, fixed-length episodes.

    Each step costs ``cpu_ms`` of CPU plus ``wait_ms`` of sleeping; subclasses vary
    the cost through :meth:`step_cost`. Reward is 1 when the action matches the sign
    of the first observation, so learning is possible, if not interesting.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, cpu_ms: float = 0.0, wait_ms: float = 0.0, obs_dim: int = 64, episode_len: int = 200,
                 render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.cpu_ms = float(cpu_ms)
        self.wait_ms = float(wait_ms)
        self.episode_len = int(episode_len)
        self.observation_space = spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._t = 0
        self._obs = np.zeros(obs_dim, np.float32)

    def render(self) -> np.ndarray | None:
        """``rgb_array``: the observation as a small grey image (no pygame needed)."""
        if self.render_mode != "rgb_array":
            return None
        grey = (np.clip(self._obs[:64], -3, 3) * 42 + 127).astype(np.uint8)
        side = int(np.ceil(np.sqrt(grey.size)))
        img = np.zeros(side * side, np.uint8)
        img[: grey.size] = grey
        return np.repeat(img.reshape(side, side, 1), 3, axis=2)

    def step_cost(self) -> tuple[float, float]:
        """(cpu_ms, wait_ms) for the next step."""
        return self.cpu_ms, self.wait_ms

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        self._obs = self.np_random.standard_normal(self._obs.shape).astype(np.float32)
        return self._obs.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        cpu_ms, wait_ms = self.step_cost()
        if cpu_ms > 0:
            burn_cpu(cpu_ms / 1000.0)
        if wait_ms > 0:
            time.sleep(wait_ms / 1000.0)
        reward = float(int(action) == int(self._obs[0] > 0))
        self._t += 1
        self._obs = self.np_random.standard_normal(self._obs.shape).astype(np.float32)
        return self._obs.copy(), reward, False, self._t >= self.episode_len, {}


class BusyEnv(CostEnv):
    """W2: ~1 ms of CPU per step."""

    def __init__(self, cpu_ms: float = 1.0, **kwargs: Any) -> None:
        super().__init__(cpu_ms=cpu_ms, **kwargs)


class SleepEnv(CostEnv):
    """W3: ~2 ms of waiting per step (an env that waits on a simulator or a server)."""

    def __init__(self, wait_ms: float = 2.0, cpu_ms: float = 0.0, **kwargs: Any) -> None:
        super().__init__(cpu_ms=cpu_ms, wait_ms=wait_ms, **kwargs)


class StragglerEnv(CostEnv):
    """W4: CPU per step is ``fast_ms`` with probability 1 - p_slow, else ``slow_ms``."""

    def __init__(self, fast_ms: float = 0.5, slow_ms: float = 5.0, p_slow: float = 0.1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fast_ms, self.slow_ms, self.p_slow = fast_ms, slow_ms, p_slow

    def step_cost(self) -> tuple[float, float]:
        slow = self.np_random.random() < self.p_slow
        return (self.slow_ms if slow else self.fast_ms), 0.0


class PhaseChangeEnv(CostEnv):
    """W5: the cost follows a wall-clock schedule shared by all copies.

    ``schedule`` is a list of ``(seconds, cpu_ms, wait_ms)`` phases, cycled, counted
    from ``start_time`` (a ``time.time()`` value; default: when the env was made).
    Default: 2 ms waiting for 10 s, then 1 ms CPU for 10 s, and back.
    """

    def __init__(self, schedule: list[tuple[float, float, float]] | None = None, start_time: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.schedule = [tuple(map(float, p)) for p in (schedule or [(10.0, 0.2, 2.0), (10.0, 1.0, 0.0)])]
        self.start_time = time.time() if start_time is None else float(start_time)
        self._cycle = sum(p[0] for p in self.schedule)

    def phase(self) -> int:
        t = (time.time() - self.start_time) % self._cycle
        for k, (dur, _, _) in enumerate(self.schedule):
            if t < dur:
                return k
            t -= dur
        return len(self.schedule) - 1

    def step_cost(self) -> tuple[float, float]:
        _, cpu_ms, wait_ms = self.schedule[self.phase()]
        return cpu_ms, wait_ms


MISFITS = ("bad_obs", "scalar_obs", "array_reward")  # a result the vector env cannot store: that env's error
FAULTS = ("raise", "exit", "sigkill", "segfault", "hang", *MISFITS)


class FaultEnv(CostEnv):
    """Injects a fault on a step: at step ``at_step`` of its first episode, or with probability ``rate`` per step.

    ``fault`` is one of ``raise`` (exception in ``step``), ``exit`` (``os._exit(3)``),
    ``sigkill`` (kills its own process), ``segfault`` (a real one, through ctypes) or
    ``hang`` (sleeps ``hang_s``), ``bad_obs`` (an observation one element longer than the space: the
    vector env cannot store it), ``scalar_obs`` (a float for the whole observation: numpy would broadcast it
    across the row) or ``array_reward`` (the reward as a one-element array, which ``SyncVectorEnv`` cannot
    store either). Use it to test your own pipeline's failure handling.
    With ``tag`` set, ``obs[0]`` is the tag and ``obs[1]`` the step within the episode,
    so a consumer can check that every transition is attributed to the right env.
    """

    def __init__(self, fault: str = "raise", at_step: int | None = None, rate: float = 0.0, hang_s: float = 3600.0,
                 tag: float | None = None, **kwargs: Any) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
        kwargs.setdefault("obs_dim", 4)
        super().__init__(**kwargs)
        self.fault, self.at_step, self.rate, self.hang_s = fault, at_step, float(rate), float(hang_s)
        self.tag = tag
        self._total = 0

    def _tagged(self, obs: np.ndarray) -> np.ndarray:
        if self.tag is not None:
            obs[0], obs[1] = self.tag, self._t
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(seed=seed, options=options)
        return self._tagged(obs), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._total += 1
        fault = (self.at_step is not None and self._total == self.at_step) or (self.rate > 0 and self.np_random.random() < self.rate)
        if fault and self.fault not in MISFITS:
            self.inject()
        obs, reward, term, trunc, info = super().step(action)
        obs = self._tagged(obs)
        if fault and self.fault == "bad_obs":
            obs = np.append(obs, obs[:1])
        elif fault and self.fault == "scalar_obs":
            obs = float(obs[0])
        elif fault and self.fault == "array_reward":
            reward = np.array([reward])
        return obs, reward, term, trunc, info

    def inject(self) -> None:
        if self.fault == "raise":
            raise RuntimeError(f"injected fault at step {self._total}")
        if self.fault == "exit":
            os._exit(3)
        if self.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "segfault":
            ctypes.string_at(0)
        if self.fault == "hang":
            time.sleep(self.hang_s)


class InfoEnv(CostEnv):
    """Returns an info on every step, as MuJoCo and ALE envs do: numpy and Python scalars of mixed types.

    ``ragged=True``: one key appears only on some steps (infos then differ between envs);
    ``numpy_bool=True``: one value is a ``numpy.bool_`` (gymnasium batches those as objects).
    """

    def __init__(self, ragged: bool = False, numpy_bool: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ragged, self.numpy_bool = ragged, numpy_bool

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, term, trunc, _ = super().step(action)
        info: dict[str, Any] = {"x": np.float64(obs[0]), "ctrl": np.float32(obs[1]), "frame": self._t, "lives": int(obs[2] > 0),
                                "alive": bool(obs[3] > 0), "steps": np.int32(self._t)}
        if self.numpy_bool:
            info["flag"] = np.bool_(obs[4] > 0)
        if self.ragged and obs[5] > 0:
            info["bonus"] = float(obs[5])
        return obs, reward, term, trunc, info


class SlowStartEnv(CostEnv):
    """An env whose constructor takes ``start_s`` seconds, as a booting simulator does.

    ``start="sleep"`` waits (the GIL is free meanwhile); ``start="cpu"`` burns CPU in Python.
    """

    def __init__(self, start_s: float = 0.5, start: str = "sleep", **kwargs: Any) -> None:
        if start not in ("sleep", "cpu"):
            raise ValueError(f"start must be 'sleep' or 'cpu', got {start!r}")
        if start == "sleep":
            time.sleep(start_s)
        else:
            burn_cpu(start_s)
        super().__init__(**kwargs)


_REGISTRY = {
    "aiovec/Busy-v0": BusyEnv,
    "aiovec/Sleep-v0": SleepEnv,
    "aiovec/Straggler-v0": StragglerEnv,
    "aiovec/PhaseChange-v0": PhaseChangeEnv,
    "aiovec/Fault-v0": FaultEnv,
    "aiovec/SlowStart-v0": SlowStartEnv,
    "aiovec/Info-v0": InfoEnv,
}

for _id, _cls in _REGISTRY.items():
    if _id not in gym.registry:
        gym.register(_id, entry_point=f"{__name__}:{_cls.__name__}", disable_env_checker=True)
