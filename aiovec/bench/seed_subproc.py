"""The seed's baselines-style ``SubprocVecEnv``, as a benchmark peer.

One process per env, one duplex pipe each, every step pickled both ways,
``step_wait`` receiving in env order; the worker autoresets itself and returns
the reset observation. Kept faithful to the original's design (and its costs);
it exists only so the benchmark can measure aiovec against it. Uses ``fork`` as
the original does on Linux.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import cloudpickle
import numpy as np


def _worker(remote: Any, parent_remote: Any, fn_bytes: bytes) -> None:
    parent_remote.close()
    env = cloudpickle.loads(fn_bytes)()
    while True:
        cmd, data = remote.recv()
        if cmd == "step":
            obs, reward, term, trunc, info = env.step(data)
            done = term or trunc
            if done:
                obs, _ = env.reset()
            remote.send((obs, reward, done, info))
        elif cmd == "reset":
            obs, _ = env.reset(seed=data)
            remote.send(obs)
        elif cmd == "close":
            remote.close()
            break


class SeedSubprocVecEnv:
    def __init__(self, env_fns: list) -> None:
        ctx = mp.get_context("fork")
        self.remotes, work_remotes = zip(*[ctx.Pipe() for _ in env_fns], strict=True)
        self.ps = [
            ctx.Process(target=_worker, args=(wr, r, cloudpickle.dumps(fn)), daemon=True)
            for wr, r, fn in zip(work_remotes, self.remotes, env_fns, strict=True)
        ]
        for p in self.ps:
            p.start()
        for wr in work_remotes:
            wr.close()
        self.num_envs = len(env_fns)

    def reset(self, seed: int | None = None) -> np.ndarray:
        for i, r in enumerate(self.remotes):
            r.send(("reset", None if seed is None else seed + i))
        return np.stack([r.recv() for r in self.remotes])

    def step(self, actions: Any) -> tuple:
        for r, a in zip(self.remotes, actions, strict=False):  # the seed's defect: fewer actions deadlock
            r.send(("step", a))
        results = [r.recv() for r in self.remotes]
        obs, rews, dones, infos = zip(*results, strict=True)
        return np.stack(obs), np.stack(rews), np.stack(dones), infos

    def close(self) -> None:
        for r in self.remotes:
            r.send(("close", None))
        for p in self.ps:
            p.join()
