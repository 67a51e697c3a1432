"""aiovec.integrations.sb3: SB3 trains on it, and its steps equal SB3's own DummyVecEnv's.

Needs stable-baselines3 (and torch, CPU build), which the ``test`` extra must install.
"""

from __future__ import annotations

import importlib
import sys

import gymnasium as gym
import numpy as np
import pytest
from conftest import assert_clean
from gymnasium.vector import AutoresetMode
from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

import aiovec
from aiovec.integrations.sb3 import SB3VecEnv, make_sb3_vec_env, unbatch_infos

N = 4


def test_ppo_trains_on_the_adapter(clean):
    env = make_sb3_vec_env("CartPole-v1", N, seed=0, num_workers=1)
    try:
        assert isinstance(env, VecMonitor) and isinstance(env.unwrapped, SB3VecEnv)
        model = PPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
        model.learn(256)
        assert model.num_timesteps == 256
        assert len(model.ep_info_buffer) > 0  # episode returns reached SB3's logger through VecMonitor
        assert all(ep["r"] == ep["l"] for ep in model.ep_info_buffer)  # CartPole: reward 1 per step
    finally:
        env.close()
    assert_clean(clean)


def _dummy(max_steps: int) -> DummyVecEnv:
    return DummyVecEnv([lambda: gym.make("CartPole-v1", max_episode_steps=max_steps) for _ in range(N)])


def test_steps_equal_dummy_vec_env(clean):
    # A short time limit, so both terminations and truncations happen within a few hundred steps.
    max_steps, steps = 15, 300
    ours = make_sb3_vec_env("CartPole-v1", N, monitor=False, num_workers=2, max_episode_steps=max_steps)
    ref = _dummy(max_steps)
    try:
        assert ours.num_envs == ref.num_envs and ours.observation_space == ref.observation_space
        assert ours.action_space == ref.action_space
        rng = np.random.default_rng(0)
        seen = {"terminated": 0, "truncated": 0}
        for seed in (123, 7):  # a second seeded reset mid-run restarts both identically
            assert ours.seed(seed) == ref.seed(seed)
            o1, o2 = ours.reset(), ref.reset()
            np.testing.assert_array_equal(o1, o2)
            assert ours.reset_infos == ref.reset_infos
            for t in range(steps // 2):
                actions = rng.integers(0, 2, size=N)
                o1, r1, d1, i1 = ours.step(actions)
                o2, r2, d2, i2 = ref.step(actions)
                np.testing.assert_array_equal(o1, o2, err_msg=f"obs at step {t}")
                assert r1.dtype == r2.dtype and d1.dtype == d2.dtype
                np.testing.assert_array_equal(r1, r2)
                np.testing.assert_array_equal(d1, d2)
                assert len(i1) == len(i2) == N
                for k in range(N):
                    assert i1[k]["TimeLimit.truncated"] == i2[k]["TimeLimit.truncated"]
                    assert ("terminal_observation" in i1[k]) == ("terminal_observation" in i2[k]) == bool(d2[k])
                    if d2[k]:
                        np.testing.assert_array_equal(i1[k]["terminal_observation"], i2[k]["terminal_observation"])
                        seen["truncated" if i2[k]["TimeLimit.truncated"] else "terminated"] += 1
                    assert set(i1[k]) == set(i2[k]), (i1[k].keys(), i2[k].keys())
                    np.testing.assert_equal(i1[k], i2[k], err_msg=f"info of env {k} at step {t}")  # every value
        assert seen["terminated"] > 5 and seen["truncated"] > 5, seen
    finally:
        ours.close()
        ref.close()
    assert_clean(clean)


def test_attributes_methods_wrappers_and_options(clean):
    env = make_sb3_vec_env("CartPole-v1", N, monitor=False, num_workers=1, wrapper_class=Monitor)
    try:
        assert env.get_attr("spec", indices=[0])[0].id == "CartPole-v1"
        assert env.has_attr("gravity") and not env.has_attr("no_such_attribute")  # AttributeError, as SB3 expects
        env.set_attr("gravity", 20.0, indices=[1, 2])
        assert env.get_attr("gravity") == [9.8, 20.0, 20.0, 9.8]
        assert env.env_method("get_wrapper_attr", "gravity", indices=3) == [9.8]
        assert env.env_is_wrapped(Monitor) == [True] * N
        assert env.env_is_wrapped(gym.wrappers.RecordEpisodeStatistics, indices=[0]) == [False]
        assert env.render_mode is None and env.get_images() == [None] * N
        # Per-env options: envs with different options are reset by separate masked resets.
        env.seed(5)
        env.set_options([{"low": -0.01, "high": 0.01}, {}, {"low": -0.01, "high": 0.01}, {}])
        obs = env.reset()
        assert np.abs(obs[[0, 2]]).max() <= 0.01 and np.abs(obs[[1, 3]]).max() > 0.01
        assert env._seeds == [None] * N and env._options == [{}] * N  # used once, as SB3 does
        obs, rewards, dones, infos = env.step(np.zeros(N, dtype=np.int64))
        assert obs.shape == (N, 4) and rewards.dtype == np.float32 and dones.dtype == np.bool_
    finally:
        env.close()
        env.close()  # idempotent
    assert_clean(clean)


def test_wraps_only_same_step_vector_envs(clean):
    venv = aiovec.make_vec("CartPole-v1", 2, num_workers=1)  # NEXT_STEP by default
    try:
        with pytest.raises(aiovec.ConfigError, match="SAME_STEP"):
            SB3VecEnv(venv)
    finally:
        venv.close()
    for mode in (AutoresetMode.NEXT_STEP, "bogus"):  # not a mode at all: the same typed error, not a ValueError
        with pytest.raises(aiovec.ConfigError, match="SAME_STEP"):
            make_sb3_vec_env("CartPole-v1", 2, autoreset_mode=mode)
    assert_clean(clean)


def test_unbatch_infos():
    infos = {
        "x": np.array([1, 0, 3]), "_x": np.array([True, False, True]),
        "final_obs": np.array([None, np.ones(2), None], dtype=object), "_final_obs": np.array([False, True, False]),
        "final_info": {"r": np.array([0.0, 2.5, 0.0]), "_r": np.array([False, True, False])},
        "_final_info": np.array([False, True, False]),
    }
    rows = unbatch_infos(infos, 3)
    assert rows[0] == {"x": 1} and rows[2] == {"x": 3}
    assert type(rows[0]["x"]) is int and rows[1]["final_info"] == {"r": 2.5}
    np.testing.assert_array_equal(rows[1]["final_obs"], np.ones(2))
    assert unbatch_infos({}, 2) == [{}, {}]


def test_clear_import_error_without_sb3(monkeypatch):
    for name in [m for m in sys.modules if m == "stable_baselines3" or m.startswith("stable_baselines3.")]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: "import it" raises ImportError
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)
    monkeypatch.delitem(sys.modules, "aiovec.integrations.sb3")
    with pytest.raises(ImportError, match=r"pip install 'aiovec\[sb3\]'"):
        importlib.import_module("aiovec.integrations.sb3")
