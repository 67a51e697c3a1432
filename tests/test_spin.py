"""Workers spin (poll briefly for the next command) only while they leave the parent a CPU: the choice
follows the worker count through resizes, as the workers themselves confirm, without disturbing results."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

import aiovec
from aiovec.autoconf import SPIN_S, spin_for
from aiovec.machine import available_cpus


def spins(venv: aiovec.AsyncVecEnv) -> set:
    return {w["spin_s"] for w in venv.stats()["workers"]}


def test_auto_spin_follows_the_worker_count_and_results_stay_exact():
    cpus = available_cpus()
    hi, lo = cpus, max(1, cpus - 1)  # on 2 CPUs: 2 workers (no spin) <-> 1 worker (spin)
    n = hi + 1
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    rng = np.random.default_rng(0)

    async def main() -> list[int]:
        counts = []
        async with aiovec.make("CartPole-v1", n, num_workers=hi) as venv:
            obs, _ = await venv.reset(seed=0)
            ref_obs, _ = ref.reset(seed=0)
            np.testing.assert_array_equal(obs, ref_obs)
            assert spins(venv) == {spin_for(hi, cpus)}
            for target in (lo, hi, lo):
                await venv.resize(target)
                for _ in range(400):  # every env ends an episode, so every move completes
                    a = rng.integers(0, 2, n)
                    got, want = await venv.step(a), ref.step(a)
                    for g, w in zip(got[:4], want[:4]):
                        np.testing.assert_array_equal(g, w)
                assert venv.num_workers == target and venv.pending_moves == 0
                assert spins(venv) == {spin_for(target, cpus)}, venv.stats()["workers"]
                counts.append(venv.num_workers)
        return counts

    assert aiovec.run(main()) == [lo, hi, lo]
    ref.close()
    if cpus >= 2:  # a 1-CPU machine never spins; elsewhere both settings were exercised
        assert spin_for(lo, cpus) == SPIN_S and spin_for(hi, cpus) == 0.0


def test_explicit_spin_is_kept_through_resizes():
    async def main() -> None:
        for spin, expected in ((False, 0.0), (True, SPIN_S)):
            async with aiovec.make("CartPole-v1", 4, num_workers=1, spin=spin) as venv:
                await venv.reset(seed=0)
                assert spins(venv) == {expected}
                await venv.resize(2)
                await venv.resize(1)
                for _ in range(600):
                    await venv.step(np.zeros(4, dtype=np.int64))
                assert venv.num_workers == 1 and spins(venv) == {expected}

    aiovec.run(main())
