"""examples/ppo.py: it learns, pipelined sampling equals lock-step, overlap has lag 1, truncation is bootstrapped,
vectorizers agree, workers do not import torch, and ``--help`` documents every flag.

Needs torch (CPU build), which the ``test`` extra must install.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import EXAMPLES, assert_clean, load_example

import aiovec


@pytest.fixture(scope="module")
def ppo():
    yield from load_example("ppo.py")


def _args(ppo, tmp_path, *args: str):
    return ppo.parse_args(["--quiet", "--log-dir", str(tmp_path), *args])


def _updates(path) -> list[dict]:
    return [json.loads(line) for line in (path / "updates.jsonl").read_text().splitlines()]


def _process_placement(ppo) -> list[str]:
    return ["--placement", "process"] if ppo.placement_supported() else []


def test_help_documents_every_flag(ppo, capsys):
    with pytest.raises(SystemExit):
        ppo.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    docs = ppo.field_docs(ppo.Args)
    for f in dataclasses.fields(ppo.Args):
        assert "--" + f.name.replace("_", "-") in text, f.name
        assert docs.get(f.name), f"Args.{f.name} has no docstring"
        assert docs[f.name] in text, f.name
    assert "--mode {sync,pipelined,overlap}" in text and "--vectorizer {aiovec,gym-sync,gym-async}" in text
    assert "(default: 128)" in text  # --num-steps


def test_worker_import_skips_torch():
    # Workers re-import the main script as __mp_main__; torch (~1 s of imports) must stay out of them.
    code = (f"import runpy, sys; runpy.run_path({str(EXAMPLES / 'ppo.py')!r}, run_name='__mp_main__'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_act_log_probs_match_the_distribution(ppo):
    import gymnasium as gym

    rng = np.random.default_rng(0)
    obs = rng.standard_normal((64, 3)).astype(np.float32)
    for space in (gym.spaces.Discrete(4), gym.spaces.Box(-1, 1, (2,))):
        agent = ppo.Agent(gym.spaces.Box(-5, 5, (3,)), space, 16)
        with torch.no_grad():
            agent.actor[-1].weight.normal_(0, 1.0)
        noise = rng.random(64) if agent.discrete else rng.standard_normal((64, 2))
        a, logp = agent.act(obs, noise)
        want, _ = agent.logprob_entropy(torch.from_numpy(obs), torch.as_tensor(a, dtype=torch.float32))
        np.testing.assert_allclose(logp, want.detach().numpy(), rtol=1e-4, atol=1e-5)
    # inverse-CDF sampling: action frequencies follow the policy's probabilities
    agent = ppo.Agent(gym.spaces.Box(-5, 5, (3,)), gym.spaces.Discrete(3), 16)
    with torch.no_grad():
        agent.actor[-1].bias.copy_(torch.tensor([0.0, 1.0, 2.0]))
    x = np.zeros((20_000, 3), np.float32)
    a, _ = agent.act(x, rng.random(20_000))
    probs = torch.softmax(agent.actor(torch.from_numpy(x[:1])), -1)[0].detach().numpy()
    np.testing.assert_allclose(np.bincount(a, minlength=3) / len(a), probs, atol=0.015)


@pytest.mark.slow
def test_ppo_learns_cartpole(ppo, tmp_path, clean):
    # Random play scores about 22 on CartPole-v1; a correct PPO is far above that after 30k steps.
    args = _args(ppo, tmp_path, "--seed", "1", "--num-envs", "8", "--total-timesteps", "30720", "--learning-rate", "1e-3",
                 "--num-workers", "1")
    s = aiovec.run(ppo.train(args))
    assert s["global_step"] == 30720
    assert s["final_mean_return"] > 100, s["final_mean_return"]
    lines = (tmp_path / "episodes.csv").read_text().splitlines()
    assert lines[0].startswith("global_step,wall_s,episodic_return")
    assert len(lines) > 50
    assert 0 < s["setup_s"] < s["wall_s"] and (tmp_path / "summary.json").exists()
    assert_clean(clean)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_pipelined_sampling_equals_lockstep(ppo, tmp_path, clean, env_id):
    # Same seed: the pipelined sampler (groups in flight, first-finished recv) collects the same rollouts
    # as lock-step stepping, so the updates (losses, KL) and the episodes are identical, float for float.
    steps = 768 if env_id == "CartPole-v1" else 1344  # Pendulum's episodes last 200 steps
    common = ["--env-id", env_id, "--seed", "4", "--num-envs", "6", "--num-steps", "32", "--total-timesteps", str(steps),
              "--num-workers", "3", "--pipeline-groups", "3", *_process_placement(ppo)]
    if env_id == "Pendulum-v1":
        common.append("--normalize")  # per-env wrapper state: fine with a fixed worker count (no env moves)
    lock = aiovec.run(ppo.train(_args(ppo, tmp_path / "sync", *common, "--mode", "sync")))
    pipe = aiovec.run(ppo.train(_args(ppo, tmp_path / "pipe", *common, "--mode", "pipelined")))
    assert pipe["pipeline"] == "3 groups" and lock["pipeline"] == "off"
    keys = ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "behaviour_kl")
    a, b = _updates(tmp_path / "sync"), _updates(tmp_path / "pipe")
    assert len(a) == len(b) == steps // (6 * 32)
    assert [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]
    assert [(s, r) for s, _, r in lock["curve"]] == [(s, r) for s, _, r in pipe["curve"]] and lock["curve"]
    assert_clean(clean)


def test_pipelined_falls_back_where_envs_step_in_process(ppo, tmp_path):
    s = aiovec.run(ppo.train(_args(ppo, tmp_path, "--vectorizer", "gym-sync", "--mode", "pipelined", "--num-envs", "4",
                                   "--num-steps", "16", "--total-timesteps", "64")))
    assert s["pipeline"].startswith("off: envs step in this process")


@pytest.mark.slow
def test_overlap_mode_trains_with_lag_one(ppo, tmp_path, clean):
    args = _args(ppo, tmp_path, "--seed", "2", "--num-envs", "8", "--total-timesteps", "20480", "--learning-rate", "1e-3",
                 "--mode", "overlap", "--num-workers", "1")
    s = aiovec.run(ppo.train(args))
    rows = _updates(tmp_path)
    assert rows[0]["policy_lag"] == 0 and all(r["policy_lag"] == 1 for r in rows[1:])
    assert all(r["behaviour_kl"] > 0 for r in rows[1:])  # the learner's policy really differs from the behaviour one
    assert s["final_mean_return"] > 50, s["final_mean_return"]
    assert_clean(clean)


def test_gae_bootstraps_truncation_from_final_obs(ppo):
    args = ppo.Args(num_envs=1, num_steps=3, gamma=0.9, gae_lambda=1.0)
    import gymnasium as gym

    agent = ppo.Agent(gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2), 8)
    with torch.no_grad():  # V(x) = 10 * x: easy to check by hand
        lin = ppo.nn.Linear(1, 1)
        lin.weight.fill_(10.0)
        lin.bias.zero_()
        agent.critic = lin
    learner = ppo.Learner(agent, args)
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

    args = ppo.Args(num_envs=2, num_steps=8, ent_coef=1.0, vf_coef=0.0, update_epochs=1, num_minibatches=1, learning_rate=0.05)
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
    ppo.Learner(agent, args).update(ro, 0)
    assert agent.dist(obs.reshape(16, 2)).entropy().mean().item() > before


@pytest.mark.parametrize("vectorizer", ["gym-sync", "gym-async"])
def test_same_trajectories_on_every_vectorizer(ppo, tmp_path, clean, vectorizer):
    # Same seed, same code: aiovec and gymnasium's vector envs give the same episodes and returns.
    args = ["--seed", "3", "--num-envs", "4", "--num-steps", "64", "--total-timesteps", "1024"]
    a = aiovec.run(ppo.train(_args(ppo, tmp_path / "a", *args, "--num-workers", "2")))
    b = aiovec.run(ppo.train(_args(ppo, tmp_path / "b", *args, "--vectorizer", vectorizer)))
    assert [c[::2] for c in a["curve"]] == [c[::2] for c in b["curve"]]
    assert a["curve"] and np.isclose(a["final_mean_return"], b["final_mean_return"])
    assert_clean(clean)


def test_continuous_actions_run(ppo, tmp_path):
    args = _args(ppo, tmp_path, "--env-id", "Pendulum-v1", "--num-envs", "2", "--num-steps", "200", "--total-timesteps", "800",
                 "--normalize", "--vectorizer", "gym-sync")
    s = aiovec.run(ppo.train(args))
    assert s["updates"] == 2 and s["episodes"] == 4  # Pendulum truncates at 200 steps
