"""The v2 workloads: real envs (classic control, MuJoCo, Atari) and a waiting env, with their peers.

Each workload lists the runners that run on it, in the order they run within one
repeat (A B C A B C ...), so drift on a shared machine hits every runner alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import envpool_peer


@dataclass(frozen=True)
class Workload:
    key: str
    env_id: str
    n: int
    kwargs: dict = field(default_factory=dict)
    waiting: bool = False  # the env mostly waits: the floor sweeps up to n workers
    process_forced: bool = False  # also run aiovec with the process backend forced (1 worker)
    checkpoint_peer: bool = False  # also SyncVectorEnv yielding to the event loop once per batch

    @property
    def envpool(self) -> bool:
        return envpool_peer.task_for(self.env_id) is not None


WORKLOADS: list[Workload] = [
    Workload("CartPole-v1 x8", "CartPole-v1", 8, process_forced=True, checkpoint_peer=True),
    Workload("CartPole-v1 x64", "CartPole-v1", 64),
    Workload("HalfCheetah-v5 x8", "HalfCheetah-v5", 8),
    Workload("HalfCheetah-v5 x16", "HalfCheetah-v5", 16),
    Workload("Ant-v5 x8", "Ant-v5", 8),
    Workload("Ant-v5 x16", "Ant-v5", 16),
    Workload("ALE/Pong-v5 x8", "ALE/Pong-v5", 8),
    Workload("ALE/Pong-v5 x16", "ALE/Pong-v5", 16),
    Workload("Sleep 2 ms x16", "aiovec/Sleep-v0", 16, {"wait_ms": 2.0}, waiting=True),
]

QUICK = ("CartPole-v1 x8", "HalfCheetah-v5 x8", "ALE/Pong-v5 x8", "Sleep 2 ms x16")


def select(quick: bool, only: str | None) -> list[Workload]:
    """The workloads of a run: all, the quick subset, or those whose key contains ``only`` (case-insensitive)."""
    chosen = [w for w in WORKLOADS if not quick or w.key in QUICK]
    if only:
        chosen = [w for w in WORKLOADS if only.lower() in w.key.lower()]
    return chosen
