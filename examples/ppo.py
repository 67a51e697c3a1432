"""PPO on aiovec, in the CleanRL tradition: one readable file, every hyperparameter a flag.

    python examples/ppo.py                                   # CartPole-v1, 8 envs, synchronous rollouts
    python examples/ppo.py --mode async                      # learner trains while envs keep stepping
    python examples/ppo.py --num-envs 1 --num-steps 128      # the single-env baseline
    python examples/ppo.py --vectorizer gym-sync             # same loop on gymnasium's SyncVectorEnv
    python examples/ppo.py --env-id Pendulum-v1 --normalize  # continuous actions (Gaussian policy)

What it implements: GAE(lambda), minibatch SGD over several epochs, per-minibatch advantage
normalisation, the clipped surrogate with an entropy *bonus* (the loss subtracts ent_coef * entropy),
optional value clipping, global gradient clipping, learning-rate annealing, and proper bootstrapping
on truncation: the envs run with ``autoreset_mode=SAME_STEP``, so a truncated step carries the true
final observation in ``infos["final_obs"]``; its reward gets ``+ gamma * V(final_obs)`` and the step
is treated as the end of the trajectory. Values are computed at learning time with the critic being
trained (identical to the behaviour critic in synchronous mode).

Sampling modes (``--mode``):

* ``sync``: collect ``num_steps`` lock-step steps (``await venv.step``), then update. Classic PPO.
* ``async``: double-buffered. A sampler task collects rollout k+1 with a frozen copy of the policy
  (version k) while the learner, in a thread, trains on rollout k; both join, the frozen copy is
  refreshed, and the next round starts. torch releases the GIL in its kernels and aiovec's envs run
  in other processes, so the two overlap. The policy lag is bounded to exactly one rollout, recorded
  per update (``policy_lag``, ``behaviour_kl``), and handled by PPO's own ratio: it is computed
  against the *behaviour* policy's stored log-probabilities, so samples that have already drifted
  past ``1 +- clip_coef`` stop contributing gradient.

The seed's advice is available as options, not hard-coded: the batch is ``num_envs * num_steps``;
``--lr-scale linear|sqrt`` multiplies the learning rate by ``num_envs / lr_ref_envs`` (or its square
root); ``--update-epochs`` and ``--num-minibatches`` set the number of gradient steps per sample.

``--vectorizer gym-sync|gym-async`` runs the same loop on gymnasium's SyncVectorEnv / AsyncVectorEnv
(wrapped to the same async interface), so aiovec's own contribution can be measured.

Logs (``--log-dir``): ``episodes.csv`` (global step, wall time, episodic return and length),
``updates.jsonl`` (losses, KL, clip fraction, lag, time profile per update) and ``summary.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import csv
import dataclasses
import functools
import json
import math
import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from gymnasium.vector import AutoresetMode

import aiovec


@dataclass
class Config:
    env_id: str = "CartPole-v1"
    seed: int = 1
    num_envs: int = 8
    num_steps: int = 128  # steps per env per rollout; batch = num_envs * num_steps
    total_timesteps: int = 200_000
    mode: str = "sync"  # "sync" or "async" (learner overlapped with sampling, policy lag 1)
    vectorizer: str = "aiovec"  # "aiovec", "gym-sync" (SyncVectorEnv) or "gym-async" (AsyncVectorEnv)
    num_workers: str = "auto"  # aiovec worker processes: "auto" or an int
    learning_rate: float = 2.5e-4
    lr_scale: str = "none"  # "none", "linear" or "sqrt" in num_envs / lr_ref_envs (the seed's advice)
    lr_ref_envs: int = 1
    anneal_lr: bool = False  # linear decay to 0 over total_timesteps
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None  # stop the epochs of an update early above this approx KL
    hidden: int = 64
    normalize: bool = False  # observation/reward normalisation wrappers (for continuous control)
    torch_threads: int = 1
    target_return: float | None = None  # e.g. 475: note when the mean of the last `return_window` episodes reaches it
    return_window: int = 20
    stop_at_target: bool = False
    min_timesteps: int = 0  # with stop_at_target: keep going at least this far (to read the return at a fixed budget)
    max_wall_s: float | None = None  # wall-clock cap on training
    log_dir: str | None = None
    quiet: bool = False

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return max(1, self.batch_size // self.num_minibatches)

    @property
    def lr(self) -> float:
        ratio = self.num_envs / self.lr_ref_envs
        return self.learning_rate * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[self.lr_scale]


def parse_args(argv: list[str] | None = None) -> Config:
    """Every field of :class:`Config` becomes a ``--flag`` (booleans: ``--flag`` / ``--no-flag``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            conv = {"int": int, "float": float, "str": str, "float | None": float, "str | None": str}[str(f.type)]
            p.add_argument(flag, type=conv, default=f.default)
    cfg = Config(**vars(p.parse_args(argv)))
    if cfg.mode not in ("sync", "async"):
        p.error(f"--mode must be sync or async, got {cfg.mode!r}")
    if cfg.vectorizer not in ("aiovec", "gym-sync", "gym-async"):
        p.error(f"--vectorizer must be aiovec, gym-sync or gym-async, got {cfg.vectorizer!r}")
    if cfg.lr_scale not in ("none", "linear", "sqrt"):
        p.error(f"--lr-scale must be none, linear or sqrt, got {cfg.lr_scale!r}")
    return cfg


# -- environments ------------------------------------------------------------------------------
def make_env(env_id: str, normalize: bool, gamma: float) -> gym.Env:
    """One env; RecordEpisodeStatistics sits innermost, so logged returns are raw even when normalised."""
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
    if normalize:
        if isinstance(env.action_space, gym.spaces.Box):
            env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(env, lambda o: np.clip(o, -10, 10), env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda r: float(np.clip(r, -10, 10)))
    return env


class GymVec:
    """gymnasium's SyncVectorEnv / AsyncVectorEnv behind aiovec's async ``reset``/``step`` (same loop code).

    The calls block the event loop while the envs step; in ``--mode async`` the learner runs in its
    own thread, so it keeps training meanwhile.
    """

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        self.env = env
        self.num_envs = env.num_envs
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space

    async def __aenter__(self) -> GymVec:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.env.close()

    async def reset(self, *, seed: Any = None) -> tuple[Any, dict]:
        return self.env.reset(seed=seed)

    async def step(self, actions: Any) -> tuple[Any, ...]:
        return self.env.step(actions)


def make_vector_env(cfg: Config) -> Any:
    if __name__ != "__main__":  # imported (tests): workers cannot import this file, so send make_env by value
        import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    fns = [functools.partial(make_env, cfg.env_id, cfg.normalize, cfg.gamma)] * cfg.num_envs
    mode = AutoresetMode.SAME_STEP
    if cfg.vectorizer == "aiovec":
        workers = cfg.num_workers if cfg.num_workers == "auto" else int(cfg.num_workers)
        return aiovec.AsyncVecEnv(fns, num_workers=workers, autoreset_mode=mode)
    if cfg.vectorizer == "gym-sync":
        return GymVec(gym.vector.SyncVectorEnv(fns, autoreset_mode=mode))
    return GymVec(gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode, shared_memory=True))


# -- the agent ---------------------------------------------------------------------------------
def layer(i: int, o: int, std: float = math.sqrt(2)) -> nn.Linear:
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, 0.0)
    return lin


class Agent(nn.Module):
    """Separate actor and critic MLPs (tanh), orthogonal init; Categorical or diagonal Gaussian policy."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, hidden: int) -> None:
        super().__init__()
        d = int(np.prod(obs_space.shape))
        self.discrete = isinstance(act_space, gym.spaces.Discrete)
        if not self.discrete and not isinstance(act_space, gym.spaces.Box):
            raise SystemExit(f"ppo.py supports Discrete and Box action spaces, not {act_space}")
        out = int(act_space.n) if self.discrete else int(np.prod(act_space.shape))
        self.critic = nn.Sequential(layer(d, hidden), nn.Tanh(), layer(hidden, hidden), nn.Tanh(), layer(hidden, 1, 1.0))
        self.actor = nn.Sequential(layer(d, hidden), nn.Tanh(), layer(hidden, hidden), nn.Tanh(), layer(hidden, out, 0.01))
        if not self.discrete:
            self.logstd = nn.Parameter(torch.zeros(out))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        out = self.actor(obs)
        if self.discrete:
            return torch.distributions.Categorical(logits=out)
        return torch.distributions.Normal(out, self.logstd.exp().expand_as(out))

    def logprob_entropy(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.dist(obs)
        if self.discrete:
            return d.log_prob(actions.long()), d.entropy()
        return d.log_prob(actions).sum(-1), d.entropy().sum(-1)

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample actions and their log-probabilities (the fast path used by the sampler)."""
        out = self.actor(obs)
        if self.discrete:
            logp = torch.log_softmax(out, -1)
            a = torch.multinomial(logp.exp(), 1, generator=gen)
            return a.squeeze(-1), logp.gather(-1, a).squeeze(-1)
        std = self.logstd.exp()
        a = out + std * torch.randn(out.shape, generator=gen)
        logp = (-((a - out) ** 2) / (2 * std**2) - self.logstd - 0.5 * math.log(2 * math.pi)).sum(-1)
        return a, logp


# -- rollouts ----------------------------------------------------------------------------------
@dataclass
class Rollout:
    obs: torch.Tensor  # (T, N, *obs_shape)
    actions: torch.Tensor  # (T, N, *act_shape)
    logprobs: torch.Tensor  # behaviour policy's log-probabilities
    rewards: torch.Tensor
    terminations: torch.Tensor
    dones: torch.Tensor  # terminated or truncated: the trajectory ends after this step
    trunc_obs: torch.Tensor  # (K, *obs_shape): final observations of the K truncated steps
    trunc_idx: torch.Tensor  # (K, 2): their (t, env) positions
    next_obs: torch.Tensor  # observation after the last step (for the bootstrap)
    version: int  # policy version that collected it
    prof: dict[str, float]


class Sampler:
    """Steps the vector env with a given policy and records rollouts, episode returns and timings."""

    def __init__(self, venv: Any, cfg: Config, log: Logger) -> None:
        self.venv, self.cfg, self.log = venv, cfg, log
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.obs: torch.Tensor | None = None
        self.global_step = 0
        space = venv.single_action_space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self.low = None if self.discrete else space.low
        self.high = None if self.discrete else space.high

    async def reset(self) -> None:
        obs, _ = await self.venv.reset(seed=self.cfg.seed)
        self.obs = torch.as_tensor(obs, dtype=torch.float32)

    async def collect(self, policy: Agent, version: int) -> Rollout:
        T, N = self.cfg.num_steps, self.cfg.num_envs
        obs_buf = torch.zeros((T, N, *self.obs.shape[1:]))
        logp_buf = torch.zeros((T, N))
        act_buf: list[torch.Tensor] = []
        rew = np.zeros((T, N), dtype=np.float32)
        term = np.zeros((T, N), dtype=np.bool_)
        done = np.zeros((T, N), dtype=np.bool_)
        trunc_obs, trunc_idx = [], []
        t_inf = t_env = 0.0
        t_start = time.perf_counter()
        for t in range(T):
            t0 = time.perf_counter()
            obs_buf[t] = self.obs
            a, logp = policy.act(self.obs, self.gen)
            act_buf.append(a)
            logp_buf[t] = logp
            a_np = a.numpy()
            if self.discrete:
                a_np = a_np.astype(np.int64)
            else:
                a_np = np.clip(a_np, self.low, self.high)  # the unclipped action is what the policy sampled
            t1 = time.perf_counter()
            next_obs, r, te, tr, infos = await self.venv.step(a_np)
            t2 = time.perf_counter()
            t_inf += t1 - t0
            t_env += t2 - t1
            self.global_step += N
            rew[t], term[t], done[t] = r, te, te | tr
            boot = tr & ~te  # truncated but not terminated: bootstrap from the true final observation
            if boot.any():
                for i in np.flatnonzero(boot):
                    trunc_obs.append(np.asarray(infos["final_obs"][i], dtype=np.float32))
                    trunc_idx.append((t, i))
            self.obs = torch.as_tensor(next_obs, dtype=torch.float32)
            if "final_info" in infos:
                self.log.episodes(self.global_step, infos["final_info"])
        shape = (0, *self.obs.shape[1:])
        return Rollout(
            obs=obs_buf, actions=torch.stack(act_buf), logprobs=logp_buf, rewards=torch.from_numpy(rew),
            terminations=torch.from_numpy(term), dones=torch.from_numpy(done),
            trunc_obs=torch.as_tensor(np.stack(trunc_obs)) if trunc_obs else torch.zeros(shape),
            trunc_idx=torch.as_tensor(trunc_idx, dtype=torch.long).reshape(-1, 2),
            next_obs=self.obs.clone(), version=version,
            prof={"sample_s": time.perf_counter() - t_start, "inference_s": t_inf, "env_s": t_env},
        )


# -- learning ----------------------------------------------------------------------------------
class Learner:
    def __init__(self, agent: Agent, cfg: Config) -> None:
        self.agent, self.cfg = agent, cfg
        self.opt = torch.optim.Adam(agent.parameters(), lr=cfg.lr, eps=1e-5)
        self.rng = np.random.default_rng(cfg.seed)
        self.version = 0  # number of updates applied

    @torch.no_grad()
    def advantages(self, ro: Rollout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GAE(lambda) with the critic being trained; truncated steps bootstrap from V(final_obs)."""
        cfg, agent = self.cfg, self.agent
        T, N = ro.rewards.shape
        values = agent.value(ro.obs.reshape(T * N, *ro.obs.shape[2:])).reshape(T, N)
        next_value = agent.value(ro.next_obs)
        rewards = ro.rewards.clone()
        if len(ro.trunc_idx):
            t, i = ro.trunc_idx[:, 0], ro.trunc_idx[:, 1]
            rewards[t, i] += cfg.gamma * agent.value(ro.trunc_obs)
        adv = torch.zeros_like(rewards)
        last = torch.zeros(N)
        for t in reversed(range(T)):
            nv = next_value if t == T - 1 else values[t + 1]
            notdone = 1.0 - ro.dones[t].float()
            delta = rewards[t] + cfg.gamma * nv * notdone - values[t]
            last = delta + cfg.gamma * cfg.gae_lambda * notdone * last
            adv[t] = last
        return adv, adv + values, values

    def update(self, ro: Rollout, total_steps_done: int) -> dict[str, float]:
        cfg, agent = self.cfg, self.agent
        t0 = time.perf_counter()
        if cfg.anneal_lr:
            self.opt.param_groups[0]["lr"] = cfg.lr * max(0.0, 1.0 - total_steps_done / cfg.total_timesteps)
        adv, returns, values = self.advantages(ro)
        B = adv.numel()
        b_obs = ro.obs.reshape(B, *ro.obs.shape[2:])
        b_act = ro.actions.reshape(B, *ro.actions.shape[2:])
        b_logp, b_adv, b_ret, b_val = ro.logprobs.reshape(B), adv.reshape(B), returns.reshape(B), values.reshape(B)
        with torch.no_grad():  # how far the policy has moved since it collected this rollout (lag > 0 in async mode)
            newlogp, _ = agent.logprob_entropy(b_obs, b_act)
            lr = newlogp - b_logp
            behaviour_kl = ((lr.exp() - 1) - lr).mean().item()
        clipfracs, approx_kl, stats = [], 0.0, {}
        mb = cfg.minibatch_size
        for _epoch in range(cfg.update_epochs):
            perm = torch.from_numpy(self.rng.permutation(B))
            for start in range(0, B, mb):
                idx = perm[start : start + mb]
                newlogp, entropy = agent.logprob_entropy(b_obs[idx], b_act[idx])
                logratio = newlogp - b_logp[idx]  # against the behaviour policy's log-probabilities
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean().item()
                    clipfracs.append(((ratio - 1.0).abs() > cfg.clip_coef).float().mean().item())
                a = b_adv[idx]
                if cfg.norm_adv and len(idx) > 1:
                    a = (a - a.mean()) / (a.std() + 1e-8)
                pg_loss = torch.max(-a * ratio, -a * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
                v = agent.value(b_obs[idx])
                if cfg.clip_vloss:
                    v_clip = b_val[idx] + (v - b_val[idx]).clamp(-cfg.clip_coef, cfg.clip_coef)
                    v_loss = 0.5 * torch.max((v - b_ret[idx]) ** 2, (v_clip - b_ret[idx]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((v - b_ret[idx]) ** 2).mean()
                ent = entropy.mean()
                loss = pg_loss - cfg.ent_coef * ent + cfg.vf_coef * v_loss  # entropy is a bonus: maximised
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
                self.opt.step()
                stats = {"pg_loss": pg_loss.item(), "v_loss": v_loss.item(), "entropy": ent.item()}
            if cfg.target_kl is not None and approx_kl > cfg.target_kl:
                break
        var_y = b_ret.var().item()
        self.version += 1
        return {
            **stats, "approx_kl": approx_kl, "clipfrac": float(np.mean(clipfracs)), "behaviour_kl": behaviour_kl,
            "explained_var": float("nan") if var_y == 0 else 1 - (b_ret - b_val).var().item() / var_y,
            "policy_lag": self.version - 1 - ro.version, "lr": self.opt.param_groups[0]["lr"],
            "learn_s": time.perf_counter() - t0,
        }


# -- logging -----------------------------------------------------------------------------------
class Logger:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.t0 = time.perf_counter()
        self.returns: deque[float] = deque(maxlen=cfg.return_window)
        self.n_episodes = 0
        self.target_hit: dict[str, float] | None = None
        self.curve: list[tuple[int, float, float]] = []  # (global step, wall s, episodic return)
        self._csv = self._jsonl = None
        if cfg.log_dir:
            d = Path(cfg.log_dir)
            d.mkdir(parents=True, exist_ok=True)
            self._csv_file = open(d / "episodes.csv", "w", newline="")  # noqa: SIM115
            self._csv = csv.writer(self._csv_file)
            self._csv.writerow(["global_step", "wall_s", "episodic_return", "episodic_length", f"mean_return_last{cfg.return_window}"])
            self._jsonl = open(d / "updates.jsonl", "w")  # noqa: SIM115

    def wall(self) -> float:
        return time.perf_counter() - self.t0

    def episodes(self, global_step: int, final_info: dict) -> None:
        ep = final_info.get("episode")
        if ep is None:
            return
        wall = self.wall()
        for i in np.flatnonzero(final_info["_episode"]):
            r, ln = float(ep["r"][i]), int(ep["l"][i])
            self.returns.append(r)
            self.n_episodes += 1
            mean = self.mean_return()
            self.curve.append((global_step, wall, r))
            if self._csv is not None:
                self._csv.writerow([global_step, f"{wall:.4f}", r, ln, f"{mean:.2f}"])
            tgt = self.cfg.target_return
            if (tgt is not None and self.target_hit is None and len(self.returns) == self.returns.maxlen and mean >= tgt):
                self.target_hit = {"global_step": global_step, "wall_s": wall, "episodes": self.n_episodes}

    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("nan")

    def update(self, row: dict[str, Any]) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(row) + "\n")
        if not self.cfg.quiet:
            print(f"step {row['global_step']:>8d}  {row['wall_s']:7.1f}s  return(last {self.cfg.return_window}) "
                  f"{row['mean_return']:7.1f}  kl {row['approx_kl']:.4f}  lag {row['policy_lag']}", flush=True)

    def close(self) -> None:
        if self._csv is not None:
            self._csv_file.close()
            self._jsonl.close()


# -- the training loop -------------------------------------------------------------------------
async def train(cfg: Config) -> dict[str, Any]:
    """Train PPO; returns a summary (final mean return, time to target, time profile)."""
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    log = Logger(cfg)
    t_setup = time.perf_counter()
    async with make_vector_env(cfg) as venv:
        agent = Agent(venv.single_observation_space, venv.single_action_space, cfg.hidden)
        behaviour = copy.deepcopy(agent)  # the frozen copy the sampler acts with
        learner = Learner(agent, cfg)
        sampler = Sampler(venv, cfg, log)
        await sampler.reset()
        setup_s = time.perf_counter() - t_setup
        log.t0 = time.perf_counter()  # wall time counts from here (worker start-up excluded)
        prof = {"sample_s": 0.0, "inference_s": 0.0, "env_s": 0.0, "learn_s": 0.0, "wait_learner_s": 0.0, "wait_sampler_s": 0.0}
        num_updates = max(1, cfg.total_timesteps // cfg.batch_size)
        reason = "total_timesteps"

        def done() -> str | None:
            if cfg.stop_at_target and log.target_hit is not None and sampler.global_step >= cfg.min_timesteps:
                return "target"
            if cfg.max_wall_s is not None and log.wall() >= cfg.max_wall_s:
                return "max_wall_s"
            return None

        def record(ro: Rollout, st: dict[str, float], extra: dict[str, float]) -> None:
            for k in ("sample_s", "inference_s", "env_s"):
                prof[k] += ro.prof[k]
            prof["learn_s"] += st["learn_s"]
            for k, v in extra.items():
                prof[k] += v
            log.update({"update": learner.version, "global_step": sampler.global_step, "wall_s": log.wall(),
                        "mean_return": log.mean_return(), **ro.prof, **st, **extra})

        if cfg.mode == "sync":
            for _ in range(num_updates):
                ro = await sampler.collect(agent, learner.version)
                record(ro, learner.update(ro, sampler.global_step), {})
                if (stop := done()) is not None:
                    reason = stop
                    break
        else:
            ro = await sampler.collect(behaviour, learner.version)  # the first rollout has nobody to overlap with
            for u in range(num_updates):
                version = learner.version  # = the frozen copy's version; the learner moves on in its thread
                learn = asyncio.ensure_future(asyncio.to_thread(learner.update, ro, sampler.global_step))
                stop = done()
                nxt = asyncio.ensure_future(sampler.collect(behaviour, version)) if u < num_updates - 1 and stop is None else None
                first, _ = await asyncio.wait([f for f in (learn, nxt) if f is not None], return_when=asyncio.FIRST_COMPLETED)
                t1 = time.perf_counter()
                st = await learn
                new_ro = await nxt if nxt is not None else None
                idle = time.perf_counter() - t1  # one side waiting for the other at the join
                learner_first = learn in first and nxt is not None
                record(ro, st, {"wait_sampler_s": idle if learner_first else 0.0, "wait_learner_s": 0.0 if learner_first else idle})
                behaviour.load_state_dict(agent.state_dict())  # the learner's new policy acts from now on
                if new_ro is None:
                    reason = stop or reason
                    break
                ro = new_ro
        wall = log.wall()
        stats = venv.stats() if isinstance(venv, aiovec.AsyncVecEnv) else {}
    log.close()
    summary = {
        "config": dataclasses.asdict(cfg), "lr_effective": cfg.lr, "global_step": sampler.global_step, "wall_s": wall,
        "setup_s": setup_s, "updates": learner.version, "episodes": log.n_episodes, "final_mean_return": log.mean_return(),
        "target_hit": log.target_hit, "stopped_by": reason, "profile": prof,
        "steps_per_s": sampler.global_step / wall if wall > 0 else float("nan"),
        "num_workers": stats.get("num_workers"), "curve": log.curve,
    }
    if cfg.log_dir:
        Path(cfg.log_dir, "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    s = aiovec.run(train(cfg))
    hit = s["target_hit"]
    p = s["profile"]
    print(f"\n{cfg.env_id}  {cfg.vectorizer} x{cfg.num_envs}  mode={cfg.mode}: {s['global_step']} steps in {s['wall_s']:.1f}s "
          f"({s['steps_per_s']:.0f} steps/s), final mean return {s['final_mean_return']:.1f}, stopped by {s['stopped_by']}")
    if cfg.target_return is not None:
        print("target " + (f"{cfg.target_return} reached at {hit['global_step']} steps, {hit['wall_s']:.1f}s" if hit else "not reached"))
    print("time: " + ", ".join(f"{k[:-2]} {v:.1f}s" for k, v in p.items()))
    if os.environ.get("PPO_PRINT_SUMMARY"):
        print(json.dumps({k: v for k, v in s.items() if k != "curve"}))


if __name__ == "__main__":
    main()
