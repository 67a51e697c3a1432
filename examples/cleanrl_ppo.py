"""A CleanRL-style PPO written against the plain gymnasium vector API: the vector env is the only switch.

    python examples/cleanrl_ppo.py --vector-env aiovec      # aiovec.VectorEnv (worker processes, adaptive)
    python examples/cleanrl_ppo.py --vector-env gym-sync    # gymnasium.vector.SyncVectorEnv
    python examples/cleanrl_ppo.py --vector-env gym-async   # gymnasium.vector.AsyncVectorEnv

Everything below the constructor line is ordinary synchronous gymnasium code, as in CleanRL's
``ppo.py``: ``envs.single_observation_space``, ``envs.step(action.numpy())``, a vector
``RecordEpisodeStatistics`` wrapper on top, ``infos["episode"]``/``infos["final_obs"]``. It shows that
``aiovec.VectorEnv`` is a drop-in for gymnasium's vector envs: same constructor arguments, and for the
same seed every choice gives the same episodes and the same trained weights (``tests/test_cleanrl_ppo.py``).

PPO as CleanRL does it (GAE, minibatch epochs, advantage normalisation, clipped surrogate, value loss,
entropy bonus, gradient clipping, learning-rate annealing), with one correction CleanRL leaves out:
envs autoreset in SAME_STEP mode and a truncated step is bootstrapped from ``infos["final_obs"]``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field, fields
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

import aiovec

# The one thing that differs between runs: which class builds the vector env. All three take
# (env_fns, autoreset_mode=...) and return a gymnasium.vector.VectorEnv.
VECTOR_ENVS: dict[str, Any] = {
    "aiovec": aiovec.VectorEnv,
    "gym-sync": gym.vector.SyncVectorEnv,
    "gym-async": gym.vector.AsyncVectorEnv,
}


def _arg(default: Any, help: str, choices: list[str] | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class Args:
    """CleanRL's ppo.py arguments (its names and defaults); ``--help`` lists each with its help and default."""

    vector_env: str = _arg("aiovec", "the vector env that steps the envs (the rest of the script is unchanged)",
                           choices=list(VECTOR_ENVS))
    env_id: str = _arg("CartPole-v1", "gymnasium id of the env (discrete actions)")
    seed: int = _arg(1, "seed of torch, numpy and the envs (env i gets seed + i)")
    total_timesteps: int = _arg(100_000, "env steps in total, over all envs")
    learning_rate: float = _arg(2.5e-4, "Adam's learning rate (annealed to 0 with --anneal-lr)")
    num_envs: int = _arg(8, "envs stepped in parallel")
    num_steps: int = _arg(128, "steps per env per rollout (a batch is num_envs * num_steps)")
    anneal_lr: bool = _arg(True, "anneal the learning rate linearly to 0 over the run")
    gamma: float = _arg(0.99, "discount factor")
    gae_lambda: float = _arg(0.95, "lambda of generalised advantage estimation")
    num_minibatches: int = _arg(4, "minibatches per epoch")
    update_epochs: int = _arg(4, "epochs over each batch")
    clip_coef: float = _arg(0.2, "PPO's clipping coefficient of the probability ratio (and the value loss)")
    ent_coef: float = _arg(0.01, "weight of the entropy bonus")
    vf_coef: float = _arg(0.5, "weight of the value loss")
    max_grad_norm: float = _arg(0.5, "gradient clipping norm")
    quiet: bool = _arg(False, "print only the final summary")


def parse_args(argv: list[str] | None = None) -> Args:
    """Command-line flags from :class:`Args`: one per field, with its help, default and choices."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in fields(Args):
        flag = "--" + f.name.replace("_", "-")
        meta = f.metadata
        if isinstance(f.default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=meta["help"])
        else:
            p.add_argument(flag, type=type(f.default), default=f.default, help=meta["help"], choices=meta.get("choices"))
    return Args(**vars(p.parse_args(argv)))


def make_env(env_id: str):
    def thunk() -> gym.Env:
        return gym.make(env_id)

    return thunk


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        super().__init__()
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        self.critic = nn.Sequential(layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                    layer_init(nn.Linear(64, 1), std=1.0))
        self.actor = nn.Sequential(layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                   layer_init(nn.Linear(64, envs.single_action_space.n), std=0.01))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def train(args: Args) -> dict[str, Any]:
    """Run PPO; returns the episodes seen (global step, return, length), the last losses and the agent."""
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    # --- the only line that depends on the vectorizer ---------------------------------------
    envs = VECTOR_ENVS[args.vector_env]([make_env(args.env_id) for _ in range(args.num_envs)],
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    # -----------------------------------------------------------------------------------------
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "only discrete actions are supported"

    agent = Agent(envs)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape)
    logprobs = torch.zeros((args.num_steps, args.num_envs))
    rewards = torch.zeros((args.num_steps, args.num_envs))
    dones = torch.zeros((args.num_steps, args.num_envs))
    values = torch.zeros((args.num_steps, args.num_envs))

    episodes: list[tuple[int, float, int]] = []
    global_step = 0
    start = time.perf_counter()
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.Tensor(next_obs)
    next_done = torch.zeros(args.num_envs)
    losses: dict[str, float] = {}
    try:
        for iteration in range(1, num_iterations + 1):
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / num_iterations) * args.learning_rate

            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                dones[step] = next_done
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(next_obs)
                    values[step] = value.flatten()
                actions[step] = action
                logprobs[step] = logprob

                next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                if truncations.any():  # bootstrap a time limit from the true final observation
                    final = torch.Tensor(np.stack([infos["final_obs"][i] for i in np.flatnonzero(truncations)]))
                    with torch.no_grad():
                        reward = _bootstrap(reward, truncations, agent.get_value(final).flatten().numpy(), args.gamma)
                rewards[step] = torch.tensor(reward, dtype=torch.float32).view(-1)
                next_done = torch.Tensor(np.logical_or(terminations, truncations).astype(np.float32))
                next_obs = torch.Tensor(next_obs)

                if "episode" in infos:
                    for i in np.flatnonzero(infos["_episode"]):
                        episodes.append((global_step, float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])))
                        if not args.quiet:
                            print(f"global_step={global_step}, episodic_return={infos['episode']['r'][i]:.0f}")

            with torch.no_grad():  # GAE
                next_value = agent.get_value(next_obs).reshape(1, -1)
                advantages = torch.zeros_like(rewards)
                lastgaelam = torch.zeros(args.num_envs)
                for t in reversed(range(args.num_steps)):
                    if t == args.num_steps - 1:
                        nextnonterminal, nextvalues = 1.0 - next_done, next_value
                    else:
                        nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                    delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                    advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                returns = advantages + values

            b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
            b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape((-1,) + envs.single_action_space.shape)
            b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)

            b_inds = np.arange(batch_size)
            for _epoch in range(args.update_epochs):
                np.random.shuffle(b_inds)
                for start_i in range(0, batch_size, minibatch_size):
                    mb = b_inds[start_i:start_i + minibatch_size]
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb], b_actions.long()[mb])
                    logratio = newlogprob - b_logprobs[mb]
                    ratio = logratio.exp()
                    mb_adv = b_advantages[mb]
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                    pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()
                    v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb]) ** 2).mean()
                    entropy_loss = entropy.mean()
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
            losses = {"policy_loss": pg_loss.item(), "value_loss": v_loss.item(), "entropy": entropy_loss.item()}
            if not args.quiet:
                print(f"iteration {iteration}/{num_iterations}: SPS={int(global_step / (time.perf_counter() - start))} {losses}")
    finally:
        envs.close()
    return {"episodes": episodes, "losses": losses, "agent": agent, "global_step": global_step,
            "wall_s": time.perf_counter() - start}


def _bootstrap(reward: np.ndarray, truncations: np.ndarray, final_values: np.ndarray, gamma: float) -> np.ndarray:
    """``reward + gamma * V(final_obs)`` on truncated rows (a time limit is not a terminal state)."""
    reward = np.asarray(reward, dtype=np.float64).copy()
    reward[np.flatnonzero(truncations)] += gamma * final_values
    return reward


if __name__ == "__main__":
    result = train(parse_args())
    returns = [r for _, r, _ in result["episodes"][-20:]]
    print(f"done: {result['global_step']} steps in {result['wall_s']:.1f} s; mean return of the last 20 episodes "
          f"{np.mean(returns) if returns else float('nan'):.1f}")
