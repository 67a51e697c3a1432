"""check_obs: an observation outside the declared space is reported with the env id."""

from __future__ import annotations

import numpy as np
import pytest

import aiovec


def bad_env_factory(bad_at: int):
    import gymnasium as gym
    from gymnasium import spaces

    class OutOfBounds(gym.Env):
        observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
        action_space = spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(3, np.float32), {}

        def step(self, action):
            self.t += 1
            obs = np.full(3, 5.0 if self.t == bad_at else 0.5, np.float32)
            return obs, 0.0, False, False, {}

    return lambda: OutOfBounds()


def test_out_of_space_observation_is_an_env_error_with_check_obs() -> None:
    async def main() -> None:
        fns = [bad_env_factory(10**9), bad_env_factory(2)]
        async with aiovec.AsyncVecEnv(fns, num_workers=2, check_obs=True) as venv:
            await venv.reset(seed=0)
            await venv.step(np.zeros(2, dtype=np.int64))
            with pytest.raises(aiovec.EnvError) as info:
                await venv.step(np.zeros(2, dtype=np.int64))
            assert info.value.env_id == 1 and "outside the declared observation space" in str(info.value)
            r = await venv.recv()  # the healthy env's transition is kept
            assert r.env_ids.tolist() == [0]

    aiovec.run(main())


def test_check_obs_off_by_default_outside_dev_mode(monkeypatch) -> None:
    monkeypatch.delenv("AIOVEC_DEBUG", raising=False)

    async def main() -> None:
        async with aiovec.AsyncVecEnv([bad_env_factory(1)], num_workers=1) as venv:
            await venv.reset(seed=0)
            obs, *_ = await venv.step(np.zeros(1, dtype=np.int64))
            assert obs[0, 0] == 5.0

    aiovec.run(main())
