"""examples/ppo.py: it learns CartPole, async mode runs with lag 1, truncation is bootstrapped, vectorizers agree.

Needs torch (CPU build), which the ``test`` extra must install.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import load_example

import aiovec


@pytest.fixture(scope="module")
def ppo():
    yield from load_example("ppo.py")


def _cfg(ppo, tmp_path, *args: str):
    return ppo.parse_args(["--quiet", "--log-dir", str(tmp_path), *args])


def test_ppo_learns_cartpole(ppo, tmp_path):
    # Random play scores about 22 on CartPole-v1; a correct PPO is far above that after 30k steps.
    cfg = _cfg(ppo, tmp_path, "--seed", "1", "--num-envs", "8", "--total-timesteps", "30720", "--learning-rate", "1e-3",
               "--num-workers", "1")
    s = aiovec.run(ppo.train(cfg))
    assert s["global_step"] == 30720
    assert s["final_mean_return"] > 100, s["final_mean_return"]
    lines = (tmp_path / "episodes.csv").read_text().splitlines()
    assert lines[0].startswith("global_step,wall_s,episodic_return")
    assert len(lines) > 50
    assert (tmp_path / "summary.json").exists() and (tmp_path / "updates.jsonl").exists()


def test_ppo_async_mode_improves_with_lag_one(ppo, tmp_path):
    cfg = _cfg(ppo, tmp_path, "--seed", "2", "--num-envs", "8", "--total-timesteps", "20480", "--learning-rate", "1e-3",
               "--mode", "async", "--num-workers", "1")
    s = aiovec.run(ppo.train(cfg))
    import json

    rows = [json.loads(line) for line in (tmp_path / "updates.jsonl").read_text().splitlines()]
    assert rows[0]["policy_lag"] == 0 and all(r["policy_lag"] == 1 for r in rows[1:])
    assert all(r["behaviour_kl"] > 0 for r in rows[1:])  # the learner's policy really differs from the behaviour one
    assert s["final_mean_return"] > 50, s["final_mean_return"]


def test_gae_bootstraps_truncation_from_final_obs(ppo):
    cfg = ppo.Config(num_envs=1, num_steps=3, gamma=0.9, gae_lambda=1.0)
    import gymnasium as gym

    agent = ppo.Agent(gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2), 8)
    with torch.no_grad():  # V(x) = 10 * x: easy to check by hand
        for p in agent.critic.parameters():
            p.zero_()
        lin = ppo.nn.Linear(1, 1)
        lin.weight.fill_(10.0)
        lin.bias.zero_()
        agent.critic = lin
    learner = ppo.Learner(agent, cfg)
    obs = torch.tensor([[[0.1]], [[0.2]], [[0.3]]])
    ro = ppo.Rollout(
        obs=obs, actions=torch.zeros(3, 1), logprobs=torch.zeros(3, 1), rewards=torch.ones(3, 1),
        terminations=torch.tensor([[False], [False], [False]]), dones=torch.tensor([[False], [True], [False]]),
        trunc_obs=torch.tensor([[0.5]]), trunc_idx=torch.tensor([[1, 0]]), next_obs=torch.tensor([[0.7]]), version=0, prof={},
    )
    adv, ret, values = learner.advantages(ro)
    # step 2: 1 + 0.9 * V(next_obs=0.7); step 1 (truncated): 1 + 0.9 * V(final_obs=0.5), nothing from step 2;
    # step 0: 1 + 0.9 * ret[1]
    assert math.isclose(ret[2, 0].item(), 1 + 0.9 * 7, rel_tol=1e-5)
    assert math.isclose(ret[1, 0].item(), 1 + 0.9 * 5, rel_tol=1e-5)
    assert math.isclose(ret[0, 0].item(), 1 + 0.9 * (1 + 0.9 * 5), rel_tol=1e-5)
    # a termination does not bootstrap
    ro.terminations[1, 0] = True
    ro.trunc_idx = torch.zeros(0, 2, dtype=torch.long)
    ro.trunc_obs = torch.zeros(0, 1)
    _, ret, _ = learner.advantages(ro)
    assert math.isclose(ret[1, 0].item(), 1.0, rel_tol=1e-5)


def test_entropy_is_a_bonus(ppo):
    # With zero advantages (zero rewards, a critic that outputs 0) only the entropy term moves the policy: up.
    import gymnasium as gym

    cfg = ppo.Config(num_envs=2, num_steps=8, ent_coef=1.0, vf_coef=0.0, update_epochs=1, num_minibatches=1, learning_rate=0.05)
    agent = ppo.Agent(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3), 8)
    with torch.no_grad():
        agent.actor[-1].weight.normal_(0, 1.0)
        agent.critic[-1].weight.zero_()
    obs = torch.randn(8, 2, 2)
    before = agent.dist(obs.reshape(16, 2)).entropy().mean().item()
    ro = ppo.Rollout(obs=obs, actions=torch.zeros(8, 2), logprobs=torch.zeros(8, 2), rewards=torch.zeros(8, 2),
                     terminations=torch.zeros(8, 2, dtype=torch.bool), dones=torch.zeros(8, 2, dtype=torch.bool),
                     trunc_obs=torch.zeros(0, 2), trunc_idx=torch.zeros(0, 2, dtype=torch.long), next_obs=torch.zeros(2, 2),
                     version=0, prof={})
    ro.logprobs = agent.logprob_entropy(obs.reshape(16, 2), torch.zeros(16))[0].detach().reshape(8, 2)
    ppo.Learner(agent, cfg).update(ro, 0)
    assert agent.dist(obs.reshape(16, 2)).entropy().mean().item() > before


@pytest.mark.parametrize("vectorizer", ["gym-sync", "gym-async"])
def test_same_trajectories_on_every_vectorizer(ppo, tmp_path, vectorizer):
    # Same seed, same code: aiovec and gymnasium's vector envs give the same episodes and returns.
    args = ["--seed", "3", "--num-envs", "4", "--num-steps", "64", "--total-timesteps", "1024"]
    a = aiovec.run(ppo.train(_cfg(ppo, tmp_path / "a", *args, "--num-workers", "2")))
    b = aiovec.run(ppo.train(_cfg(ppo, tmp_path / "b", *args, "--vectorizer", vectorizer)))
    assert [c[::2] for c in a["curve"]] == [c[::2] for c in b["curve"]]
    assert a["curve"] and np.isclose(a["final_mean_return"], b["final_mean_return"])


def test_continuous_actions_run(ppo, tmp_path):
    cfg = _cfg(ppo, tmp_path, "--env-id", "Pendulum-v1", "--num-envs", "2", "--num-steps", "200", "--total-timesteps", "800",
               "--normalize", "--vectorizer", "gym-sync")
    s = aiovec.run(ppo.train(cfg))
    assert s["updates"] == 2 and s["episodes"] == 4  # Pendulum truncates at 200 steps
