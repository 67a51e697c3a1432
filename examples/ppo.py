"""PPO on aiovec, in the CleanRL tradition: one readable file, every hyperparameter a documented flag.

    python examples/ppo.py                                   # CartPole-v1, 8 envs, lock-step rollouts
    python examples/ppo.py --mode pipelined                  # policy on one half of the envs while the other half steps
    python examples/ppo.py --mode overlap                    # learner trains while the next rollout is sampled (lag 1)
    python examples/ppo.py --num-envs 1                      # the single-env baseline
    python examples/ppo.py --vectorizer gym-sync             # same loop on gymnasium's SyncVectorEnv
    python examples/ppo.py --env-id Hopper-v5 --normalize --num-steps 256 --num-minibatches 8 --update-epochs 10
    python examples/ppo.py --help                            # every flag, its meaning, default and choices

What it implements: GAE(lambda), minibatch SGD over several epochs, per-minibatch advantage
normalisation, the clipped surrogate with an entropy *bonus*, optional value clipping, global gradient
clipping, learning-rate annealing, and bootstrapping on truncation: the envs run with
``autoreset_mode=SAME_STEP``, so a truncated step carries its true final observation in
``infos["final_obs"]``; its reward gets ``+ gamma * V(final_obs)`` and the trajectory ends there.

Sampling modes (``--mode``):

* ``sync``: every step is ``await venv.step(actions)`` for all envs; then the update. Classic PPO.
* ``pipelined`` (EnvPool-style, no policy lag): the envs form ``--pipeline-groups`` groups. The policy
  acts on one group and ``send``s its actions, then acts on the next group while the first one steps;
  whichever envs finish first (``recv``) are acted on next. Every action comes from the current policy,
  and env stepping (in worker processes) overlaps inference (in this process). The rollout is the same
  array as in ``sync`` mode, bit for bit: the sampling noise of every (step, env) is drawn up front,
  and the policy always runs on the full ``num_envs``-row observation buffer, so a row's output does not
  depend on which group it travelled with. Where the envs step inside this process (gymnasium's
  vector envs, or aiovec's in-process placement) there is nothing to overlap: it falls back to ``sync``
  and says so in the summary (``pipeline``).
* ``overlap``: rollout-level double buffering. A sampler task collects rollout k+1 with a frozen copy
  of the policy (version k) while the learner, in a thread, trains on rollout k. Lag: one update,
  recorded per update (``policy_lag``, ``behaviour_kl``); PPO's ratio uses the behaviour policy's
  log-probabilities. The lag costs samples; it pays only where learning and sampling are both long.

Set-up (``setup_s`` in the summary): the clock starts just before the vector env is constructed and
``setup_s`` ends at the first step's result. Worker processes re-import this file as ``__mp_main__``
(multiprocessing recreates the main module); torch costs about a second of CPU to import, so this file
imports it only outside workers, and the torch code below is defined only there.

Logs (``--log-dir``): ``episodes.csv`` (global step, wall time, episodic return and length),
``updates.jsonl`` (losses, KL, clip fraction, lag, time profile per update) and ``summary.json``.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import copy
import csv
import dataclasses
import functools
import inspect
import json
import math
import os
import sys
import time
import typing
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

import aiovec

IN_WORKER = __name__ == "__mp_main__"  # a worker process re-importing the main script: it only steps envs
if not IN_WORKER:
    import torch
    from torch import nn


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    """gymnasium env id"""
    seed: int = 1
    """seed of the envs (env i gets seed + i), of torch and of the action noise"""
    num_envs: int = 8
    """number of parallel envs"""
    num_steps: int = 128
    """steps per env per rollout; the batch is num_envs * num_steps"""
    total_timesteps: int = 200_000
    """env steps (all envs counted) to train for"""
    mode: Literal["sync", "pipelined", "overlap"] = "sync"
    """sync: lock-step rollouts; pipelined: policy on one env group while the others step (no lag);
    overlap: learner in a thread while the next rollout is sampled (policy lag 1)"""
    pipeline_groups: int = 2
    """--mode pipelined: number of env groups in flight (the recv batch is num_envs / groups)"""
    vectorizer: Literal["aiovec", "gym-sync", "gym-async"] = "aiovec"
    """aiovec.AsyncVecEnv, or gymnasium's SyncVectorEnv / AsyncVectorEnv(shared_memory=True) with the same loop"""
    num_workers: str = "auto"
    """aiovec worker processes: 'auto' (from the envs' measured cost and the CPUs) or an int"""
    placement: Literal["auto", "inline", "hybrid", "process"] = "auto"
    """aiovec env placement: 'auto' (let aiovec decide), 'inline' (step envs in this process), 'hybrid' (one
    shard here, the others in --num-workers minus one processes) or 'process' (always in workers); needs an
    aiovec that has the option, 'auto' works with any"""
    learning_rate: float = 2.5e-4
    """Adam learning rate before --lr-scale"""
    lr_scale: Literal["none", "linear", "sqrt"] = "none"
    """multiply the learning rate by num_envs / lr_ref_envs (linear) or its square root (the seed's advice)"""
    lr_ref_envs: int = 1
    """the env count at which --learning-rate applies unscaled"""
    anneal_lr: bool = False
    """decay the learning rate linearly to 0 over total_timesteps"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    num_minibatches: int = 4
    """minibatches per epoch"""
    update_epochs: int = 4
    """epochs over each batch"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient"""
    clip_vloss: bool = True
    """clip the value loss like the surrogate"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip"""
    target_kl: float | None = None
    """stop an update's epochs early once the approximate KL exceeds this"""
    hidden: int = 64
    """width of the actor's and the critic's two hidden layers"""
    normalize: bool = False
    """observation and reward normalisation wrappers, per env (for continuous control)"""
    torch_threads: int = 1
    """torch intra-op threads"""
    target_return: float | None = None
    """note when the mean return of the last --return-window episodes first reaches this (e.g. 475)"""
    return_window: int = 20
    """episodes in the running mean for --target-return"""
    stop_at_target: bool = False
    """stop training once --target-return is reached"""
    min_timesteps: int = 0
    """with --stop-at-target: train at least this many env steps (to read the return at a fixed budget)"""
    max_wall_s: float | None = None
    """wall-clock cap on the run, set-up included"""
    log_dir: str | None = None
    """write episodes.csv, updates.jsonl and summary.json here"""
    quiet: bool = False
    """no per-update lines on stdout"""

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


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (as tyro reads them), from its source."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def parse_args(argv: list[str] | None = None) -> Args:
    """Every field of :class:`Args` becomes a ``--flag`` with its docstring as help (booleans: ``--flag/--no-flag``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints, docs = typing.get_type_hints(Args), field_docs(Args)
    for f in dataclasses.fields(Args):
        flag, hint, help_ = "--" + f.name.replace("_", "-"), hints[f.name], docs[f.name]
        if hint is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_)
        elif typing.get_origin(hint) is Literal:
            p.add_argument(flag, choices=typing.get_args(hint), default=f.default, help=help_)
        else:
            conv = next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))  # X | None -> X
            p.add_argument(flag, type=conv, default=f.default, metavar=conv.__name__.upper(), help=help_)
    args = Args(**vars(p.parse_args(argv)))
    if args.num_workers != "auto" and not args.num_workers.isdigit():
        p.error(f"--num-workers must be 'auto' or an int, got {args.num_workers!r}")
    if args.pipeline_groups < 1:
        p.error(f"--pipeline-groups must be >= 1, got {args.pipeline_groups}")
    return args


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

    The calls block the event loop while the envs step; in ``--mode overlap`` the learner runs in its
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


def placement_supported() -> bool:
    return "placement" in inspect.signature(aiovec.AsyncVecEnv.__init__).parameters


def make_vector_env(args: Args) -> Any:
    if __name__ != "__main__":  # imported (tests, ppo_speedup): workers cannot import this file by name, so send make_env by value
        import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    fns = [functools.partial(make_env, args.env_id, args.normalize, args.gamma)] * args.num_envs
    mode = AutoresetMode.SAME_STEP
    if args.vectorizer == "aiovec":
        options: dict[str, Any] = {"autoreset_mode": mode}
        if placement_supported():
            options["placement"] = args.placement
        elif args.placement != "auto":
            raise SystemExit(f"--placement {args.placement}: this aiovec has no placement option (use auto)")
        workers = args.num_workers if args.num_workers == "auto" else int(args.num_workers)
        return aiovec.AsyncVecEnv(fns, num_workers=workers, **options)
    if args.vectorizer == "gym-sync":
        return GymVec(gym.vector.SyncVectorEnv(fns, autoreset_mode=mode))
    return GymVec(gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode, shared_memory=True))


def steps_in_workers(venv: Any) -> bool:
    """Whether the envs step outside this process, so that inference here can overlap them."""
    if not isinstance(venv, aiovec.AsyncVecEnv):
        return False  # GymVec: no per-env send/recv
    placement = getattr(venv, "placement", "process")  # "inline" or "process" (aiovec before core v2: always processes)
    return placement == "process"


# -- the agent (defined where torch is imported: not in worker processes) ----------------------
if not IN_WORKER:

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

        def act(self, obs: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """Actions and their log-probabilities for every row, from given noise (the sampler's fast path).

            ``noise`` is one uniform per row (discrete: inverse-CDF sampling) or one standard normal per
            action dimension (Gaussian): drawn up front per (step, env), so the sampled actions do not depend
            on the order in which envs are acted on.
            """
            with torch.inference_mode():
                out = self.actor(torch.from_numpy(obs))
                if self.discrete:
                    logp = torch.log_softmax(out, -1).numpy()
                    a = (np.cumsum(np.exp(logp), -1) < noise[:, None]).sum(-1).clip(max=logp.shape[-1] - 1)
                    return a, logp[np.arange(len(a)), a]
                mean, logstd = out.numpy(), self.logstd.numpy()
                a = mean + np.exp(logstd) * noise
                return a, (-0.5 * noise**2 - logstd - 0.5 * math.log(2 * math.pi)).sum(-1)


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

    def __init__(self, venv: Any, args: Args, log: Logger) -> None:
        self.venv, self.args, self.log = venv, args, log
        self.rng = np.random.default_rng(args.seed)  # the action noise
        self.obs: np.ndarray | None = None
        self.global_step = 0
        self.rollouts = 0
        space = venv.single_action_space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self.act_shape = () if self.discrete else space.shape
        self.low = None if self.discrete else space.low
        self.high = None if self.discrete else space.high
        self.groups = 1
        self.pipeline = "off"
        self.first_step_s: float | None = None  # perf_counter time of the first step's result

    def plan_pipeline(self) -> None:
        """Pipeline this rollout? Only where envs step in other processes (aiovec may move them between rollouts)."""
        groups = min(self.args.pipeline_groups, self.args.num_envs)
        if self.args.mode != "pipelined":
            self.groups, self.pipeline = 1, "off"
        elif groups < 2:
            self.groups, self.pipeline = 1, "off: one group (a single env or --pipeline-groups 1), lock-step instead"
        elif not steps_in_workers(self.venv):
            self.groups, self.pipeline = 1, "off: envs step in this process, nothing to overlap (lock-step instead)"
        else:
            self.groups, self.pipeline = groups, f"{groups} groups"

    async def reset(self) -> None:
        obs, _ = await self.venv.reset(seed=self.args.seed)
        self.obs = np.asarray(obs, dtype=np.float32)

    def env_actions(self, a: np.ndarray) -> np.ndarray:
        """What the envs get: ints, or the Gaussian sample clipped to the box (the policy keeps the unclipped one)."""
        return a.astype(np.int64) if self.discrete else np.clip(a, self.low, self.high).astype(np.float32)

    async def collect(self, policy: Agent, version: int) -> Rollout:
        T, N = self.args.num_steps, self.args.num_envs
        noise = self.rng.random((T, N)) if self.discrete else self.rng.standard_normal((T, N, *self.act_shape))
        ro = {
            "obs": np.zeros((T, N, *self.obs.shape[1:]), np.float32), "actions": np.zeros((T, N, *self.act_shape), np.float32),
            "logprobs": np.zeros((T, N), np.float32), "rewards": np.zeros((T, N), np.float32),
            "terminations": np.zeros((T, N), np.bool_), "dones": np.zeros((T, N), np.bool_),
        }
        self.trunc: list[tuple[int, int, np.ndarray]] = []
        self.ended: list[tuple[int, int, float, int]] = []  # (t, env, return, length) of the episodes that ended
        self.t_inf = self.t_env = 0.0
        t_start = time.perf_counter()
        self.plan_pipeline()
        if self.groups > 1:
            await self._pipelined(policy, noise, ro)
        else:
            await self._lockstep(policy, noise, ro)
        # Episodes are logged at the end of the rollout, in (step, env) order: the same log in every mode.
        base = self.rollouts * T * N
        for t, _i, r, length in sorted(self.ended):
            self.log.episode(base + (t + 1) * N, r, length)
        self.rollouts += 1
        self.global_step += T * N
        self.trunc.sort(key=lambda x: x[:2])
        shape = (0, *self.obs.shape[1:])
        return Rollout(
            **{k: torch.from_numpy(v) for k, v in ro.items()},
            trunc_obs=torch.from_numpy(np.stack([o for *_, o in self.trunc])) if self.trunc else torch.zeros(shape),
            trunc_idx=torch.tensor([x[:2] for x in self.trunc], dtype=torch.long).reshape(-1, 2),
            next_obs=torch.from_numpy(self.obs.copy()), version=version,
            prof={"sample_s": time.perf_counter() - t_start, "inference_s": self.t_inf, "env_s": self.t_env},
        )

    def _act(self, policy: Agent, ids: np.ndarray, t: np.ndarray, noise: np.ndarray, ro: dict[str, np.ndarray]) -> np.ndarray:
        """Act on envs ``ids`` (at steps ``t``), record obs/action/log-prob; returns their env actions.

        The policy runs on all N rows of the observation buffer (only ``ids``' rows are used), so every
        row's output is exactly what a lock-step forward pass gives it.
        """
        t0 = time.perf_counter()
        all_t = np.minimum(self.tstep, self.args.num_steps - 1)
        a, logp = policy.act(self.obs, noise[all_t, np.arange(len(all_t))])
        ro["obs"][t, ids] = self.obs[ids]
        ro["actions"][t, ids] = a[ids]
        ro["logprobs"][t, ids] = logp[ids]
        out = self.env_actions(a[ids])
        self.t_inf += time.perf_counter() - t0
        return out

    def _record(self, ids: np.ndarray, t: np.ndarray, obs: Any, r: np.ndarray, te: np.ndarray, tr: np.ndarray,
                infos: dict, ro: dict[str, np.ndarray]) -> None:
        """Store the results of envs ``ids`` at steps ``t`` (rows of ``infos`` follow ``ids``)."""
        if self.first_step_s is None:
            self.first_step_s = time.perf_counter()
        ro["rewards"][t, ids], ro["terminations"][t, ids], ro["dones"][t, ids] = r, te, te | tr
        for k in np.flatnonzero(tr & ~te):  # truncated, not terminated: bootstrap from the true final observation
            self.trunc.append((int(t[k]), int(ids[k]), np.asarray(infos["final_obs"][k], dtype=np.float32)))
        fi = infos.get("final_info")
        if fi is not None and "episode" in fi:
            for k in np.flatnonzero(fi["_episode"]):
                self.ended.append((int(t[k]), int(ids[k]), float(fi["episode"]["r"][k]), int(fi["episode"]["l"][k])))
        self.obs[ids] = obs

    async def _lockstep(self, policy: Agent, noise: np.ndarray, ro: dict[str, np.ndarray]) -> None:
        N = self.args.num_envs
        ids = np.arange(N)
        for t in range(self.args.num_steps):
            self.tstep = np.full(N, t)
            a = self._act(policy, ids, self.tstep, noise, ro)
            t1 = time.perf_counter()
            obs, r, te, tr, infos = await self.venv.step(a)
            self.t_env += time.perf_counter() - t1
            self._record(ids, self.tstep, obs, r, te, tr, infos, ro)

    async def _pipelined(self, policy: Agent, noise: np.ndarray, ro: dict[str, np.ndarray]) -> None:
        """EnvPool-style: act on a group, send it, act on the next while it steps; then whichever finish first."""
        T, N, venv = self.args.num_steps, self.args.num_envs, self.venv
        self.tstep = np.zeros(N, dtype=np.int64)  # each env's step within this rollout
        for group in np.array_split(np.arange(N), self.groups):
            venv.send(self._act(policy, group, self.tstep[group], noise, ro), group)
        batch, in_flight = N // self.groups, N
        while in_flight:  # until every env has done its T steps
            t1 = time.perf_counter()
            res = await venv.recv(batch)  # the first `batch` envs to finish, whichever group they were sent with
            self.t_env += time.perf_counter() - t1
            ids = res.env_ids
            self._record(ids, self.tstep[ids], res.obs, res.rewards, res.terminations, res.truncations, res.infos, ro)
            self.tstep[ids] += 1
            more = np.sort(ids[self.tstep[ids] < T])  # sorted: a worker's whole shard goes as one short command
            in_flight += len(more) - len(ids)
            if len(more):
                venv.send(self._act(policy, more, self.tstep[more], noise, ro), more)


# -- learning ----------------------------------------------------------------------------------
class Learner:
    def __init__(self, agent: Agent, args: Args) -> None:
        self.agent, self.args = agent, args
        # fused: one kernel for every parameter, ~15% of an update of this MLP on a 256-row minibatch (1 CPU thread)
        self.opt = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5, fused=True)
        self.rng = np.random.default_rng(args.seed)
        self.version = 0  # number of updates applied

    def advantages(self, ro: Rollout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GAE(lambda) with the critic being trained; truncated steps bootstrap from V(final_obs)."""
        with torch.no_grad():
            args, agent = self.args, self.agent
            T, N = ro.rewards.shape
            values = agent.value(ro.obs.reshape(T * N, *ro.obs.shape[2:])).reshape(T, N)
            next_value = agent.value(ro.next_obs)
            rewards = ro.rewards.clone()
            if len(ro.trunc_idx):
                t, i = ro.trunc_idx[:, 0], ro.trunc_idx[:, 1]
                rewards[t, i] += args.gamma * agent.value(ro.trunc_obs)
            adv = torch.zeros_like(rewards)
            last = torch.zeros(N)
            for t in reversed(range(T)):
                nv = next_value if t == T - 1 else values[t + 1]
                notdone = 1.0 - ro.dones[t].float()
                delta = rewards[t] + args.gamma * nv * notdone - values[t]
                last = delta + args.gamma * args.gae_lambda * notdone * last
                adv[t] = last
            return adv, adv + values, values

    def update(self, ro: Rollout, total_steps_done: int) -> dict[str, float]:
        args, agent = self.args, self.agent
        t0 = time.perf_counter()
        if args.anneal_lr:
            self.opt.param_groups[0]["lr"] = args.lr * max(0.0, 1.0 - total_steps_done / args.total_timesteps)
        adv, returns, values = self.advantages(ro)
        B = adv.numel()
        b_obs = ro.obs.reshape(B, *ro.obs.shape[2:])
        b_act = ro.actions.reshape(B, *ro.actions.shape[2:])
        b_logp, b_adv, b_ret, b_val = ro.logprobs.reshape(B), adv.reshape(B), returns.reshape(B), values.reshape(B)
        with torch.no_grad():  # how far the policy has moved since it collected this rollout (lag > 0 in overlap mode)
            newlogp, _ = agent.logprob_entropy(b_obs, b_act)
            lr = newlogp - b_logp
            behaviour_kl = ((lr.exp() - 1) - lr).mean().item()
        clipfracs, approx_kl, stats = [], 0.0, {}
        mb = args.minibatch_size
        for _epoch in range(args.update_epochs):
            perm = torch.from_numpy(self.rng.permutation(B))
            for start in range(0, B, mb):
                idx = perm[start : start + mb]
                newlogp, entropy = agent.logprob_entropy(b_obs[idx], b_act[idx])
                logratio = newlogp - b_logp[idx]  # against the behaviour policy's log-probabilities
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean().item()
                    clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())
                a = b_adv[idx]
                if args.norm_adv and len(idx) > 1:
                    a = (a - a.mean()) / (a.std() + 1e-8)
                pg_loss = torch.max(-a * ratio, -a * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
                v = agent.value(b_obs[idx])
                if args.clip_vloss:
                    v_clip = b_val[idx] + (v - b_val[idx]).clamp(-args.clip_coef, args.clip_coef)
                    v_loss = 0.5 * torch.max((v - b_ret[idx]) ** 2, (v_clip - b_ret[idx]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((v - b_ret[idx]) ** 2).mean()
                ent = entropy.mean()
                loss = pg_loss - args.ent_coef * ent + args.vf_coef * v_loss  # entropy is a bonus: maximised
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
                self.opt.step()
                stats = {"pg_loss": pg_loss.item(), "v_loss": v_loss.item(), "entropy": ent.item()}
            if args.target_kl is not None and approx_kl > args.target_kl:
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
    def __init__(self, args: Args) -> None:
        self.args = args
        self.t0 = time.perf_counter()
        self.returns: deque[float] = deque(maxlen=args.return_window)
        self.n_episodes = 0
        self.target_hit: dict[str, float] | None = None
        self.curve: list[tuple[int, float, float]] = []  # (global step, wall s, episodic return)
        self._csv = self._jsonl = None
        if args.log_dir:
            d = Path(args.log_dir)
            d.mkdir(parents=True, exist_ok=True)
            self._csv_file = open(d / "episodes.csv", "w", newline="")  # noqa: SIM115
            self._csv = csv.writer(self._csv_file)
            self._csv.writerow(["global_step", "wall_s", "episodic_return", "episodic_length", f"mean_return_last{args.return_window}"])
            self._jsonl = open(d / "updates.jsonl", "w")  # noqa: SIM115

    def wall(self) -> float:
        return time.perf_counter() - self.t0

    def episode(self, global_step: int, ret: float, length: int) -> None:
        wall = self.wall()
        self.returns.append(ret)
        self.n_episodes += 1
        mean = self.mean_return()
        self.curve.append((global_step, wall, ret))
        if self._csv is not None:
            self._csv.writerow([global_step, f"{wall:.4f}", ret, length, f"{mean:.2f}"])
        tgt = self.args.target_return
        if tgt is not None and self.target_hit is None and len(self.returns) == self.returns.maxlen and mean >= tgt:
            self.target_hit = {"global_step": global_step, "wall_s": wall, "episodes": self.n_episodes}

    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("nan")

    def update(self, row: dict[str, Any]) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(row) + "\n")
        if not self.args.quiet:
            print(f"step {row['global_step']:>8d}  {row['wall_s']:7.1f}s  return(last {self.args.return_window}) "
                  f"{row['mean_return']:7.1f}  kl {row['approx_kl']:.4f}  lag {row['policy_lag']}", flush=True)

    def close(self) -> None:
        if self._csv is not None:
            self._csv_file.close()
            self._jsonl.close()


# -- the training loop -------------------------------------------------------------------------
async def train(args: Args) -> dict[str, Any]:
    """Train PPO; returns a summary (final mean return, time to target, set-up, time profile)."""
    torch.set_num_threads(args.torch_threads)
    t_warm = time.perf_counter()
    torch.optim.Adam(layer(1, 1).parameters(), fused=True)  # torch's lazy imports (torch._dynamo for optimizers): ~1 s, same for all
    torch_warmup_s = time.perf_counter() - t_warm
    torch.manual_seed(args.seed)
    log = Logger(args)  # the clock starts here, just before the vector env is constructed
    t_construct = time.perf_counter()
    venv = make_vector_env(args)
    setup = {"construct_s": time.perf_counter() - t_construct}
    async with venv:
        setup["start_s"] = time.perf_counter() - t_construct - setup["construct_s"]
        agent = Agent(venv.single_observation_space, venv.single_action_space, args.hidden)
        behaviour = copy.deepcopy(agent)  # overlap mode: the frozen copy the sampler acts with
        learner = Learner(agent, args)
        sampler = Sampler(venv, args, log)
        t_reset = time.perf_counter()
        await sampler.reset()
        setup["reset_s"] = time.perf_counter() - t_reset
        prof = {"sample_s": 0.0, "inference_s": 0.0, "env_s": 0.0, "learn_s": 0.0, "wait_learner_s": 0.0, "wait_sampler_s": 0.0}
        num_updates = max(1, args.total_timesteps // args.batch_size)
        reason = "total_timesteps"

        def done() -> str | None:
            if args.stop_at_target and log.target_hit is not None and sampler.global_step >= args.min_timesteps:
                return "target"
            if args.max_wall_s is not None and log.wall() >= args.max_wall_s:
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

        if args.mode != "overlap":
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
        placement = getattr(venv, "placement", None)
    log.close()
    setup["setup_s"] = (sampler.first_step_s or time.perf_counter()) - log.t0
    summary = {
        "config": dataclasses.asdict(args), "lr_effective": args.lr, "global_step": sampler.global_step, "wall_s": wall,
        **setup, "torch_warmup_s": torch_warmup_s, "updates": learner.version, "episodes": log.n_episodes, "final_mean_return": log.mean_return(),
        "target_hit": log.target_hit, "stopped_by": reason, "profile": prof, "pipeline": sampler.pipeline,
        "steps_per_s": sampler.global_step / wall if wall > 0 else float("nan"),
        "num_workers": stats.get("num_workers"), "env_moves": stats.get("moves"), "placement": placement, "aiovec_version": aiovec.__version__,
        "curve": log.curve,
    }
    if args.log_dir:
        Path(args.log_dir, "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    s = aiovec.run(train(args))
    hit = s["target_hit"]
    p = s["profile"]
    print(f"\n{args.env_id}  {args.vectorizer} x{args.num_envs}  mode={args.mode} (pipeline: {s['pipeline']}): {s['global_step']} steps "
          f"in {s['wall_s']:.1f}s ({s['steps_per_s']:.0f} steps/s), set-up {s['setup_s']:.2f}s, final mean return "
          f"{s['final_mean_return']:.1f}, stopped by {s['stopped_by']}")
    if args.target_return is not None:
        print("target " + (f"{args.target_return} reached at {hit['global_step']} steps, {hit['wall_s']:.1f}s" if hit else "not reached"))
    print("time: " + ", ".join(f"{k[:-2]} {v:.1f}s" for k, v in p.items()))
    if os.environ.get("PPO_PRINT_SUMMARY"):
        print(json.dumps({k: v for k, v in s.items() if k != "curve"}))


if __name__ == "__main__":
    main()
