"""The Ray backend on a local Ray instance started by the tests: same API, same trajectories."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import numpy as np
import pytest
from conftest import assert_clean, not_a_ray_actor

import aiovec

ray = pytest.importorskip("ray", reason="the Ray backend needs the 'ray' extra (CI installs it)")


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def lockstep(backend: str, env_id: str, n: int, workers: int, mode: gym.vector.AutoresetMode, steps: int, resize_at=None) -> list:
    async def main() -> list:
        out = []
        async with aiovec.make(env_id, n, num_workers=workers, backend=backend, autoreset_mode=mode) as venv:
            out.append(await venv.reset(seed=11))
            space = gym.vector.utils.batch_space(venv.single_action_space, n)
            space.seed(3)
            for t in range(steps):
                if resize_at and t in resize_at:
                    await venv.resize(resize_at[t])
                out.append(await asyncio.wait_for(venv.step(space.sample()), 60))
        return out

    return aiovec.run(main())


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("mode", [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP])
def test_ray_matches_process_backend_and_gymnasium(env_id: str, mode: gym.vector.AutoresetMode, clean) -> None:
    ray_out = lockstep("ray", env_id, 3, 2, mode, 120, resize_at={40: 3, 80: 1})
    proc_out = lockstep("process", env_id, 3, 2, mode, 120)
    sync = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * 3, autoreset_mode=mode)
    ref = [sync.reset(seed=11)]
    space = gym.vector.utils.batch_space(sync.single_action_space, 3)
    space.seed(3)
    ref += [sync.step(space.sample()) for _ in range(120)]
    for a, b, c in zip(ray_out, proc_out, ref, strict=True):
        for x, y, z in zip(a[:-1], b[:-1], c[:-1], strict=True):
            np.testing.assert_allclose(x, y)
            np.testing.assert_allclose(x, z)
    assert_clean(clean, grace=30.0, ignore=not_a_ray_actor)


def test_ray_first_finished_subsets_and_attributes(clean) -> None:
    async def main() -> None:
        async with aiovec.make("aiovec/Sleep-v0", 4, num_workers=2, backend="ray", wait_ms=1.0) as venv:
            await venv.reset(seed=0)
            venv.send(np.zeros(2, dtype=np.int64), [1, 3])
            r = await asyncio.wait_for(venv.recv(2), 60)
            assert sorted(r.env_ids.tolist()) == [1, 3] and r.obs.shape == (2, 64)
            assert await venv.get_attr("wait_ms", env_ids=[2]) == (1.0,)
            await venv.set_attr("wait_ms", [2.0, 3.0], env_ids=[0, 1])
            assert await venv.get_attr("wait_ms") == (2.0, 3.0, 1.0, 1.0)
            assert venv.stats()["steps"] == 2

    aiovec.run(main())
    assert_clean(clean, grace=30.0, ignore=not_a_ray_actor)


def test_ray_steps_nested_spaces_as_sync_vector_env_does(clean) -> None:
    """A Dict action with a float32 leaf given float64 values, a Tuple observation: the same transitions as
    ``SyncVectorEnv`` through Ray actors (each float leaf arrives in the caller's dtype, as there)."""
    from gymnasium import spaces

    class Nested(gym.Env):  # defined here, so cloudpickle sends the class by value to the actors
        observation_space = spaces.Tuple((spaces.Box(-np.inf, np.inf, (2,), np.float64), spaces.Discrete(9)))
        action_space = spaces.Dict({"move": spaces.Box(-1.0, 1.0, (2,), np.float32), "pick": spaces.Discrete(3)})

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return (self.np_random.normal(size=2), 0), {}

        def step(self, action):
            self.t += 1
            move = action["move"]
            return ((move * 3).astype(np.float64), move.dtype.itemsize), float(action["pick"]), self.t >= 4, False, {}

    n = 3
    space = gym.vector.utils.batch_space(Nested.action_space, n)
    space.seed(1)
    acts = [{**a, "move": a["move"].astype(np.float64) + 1e-9} for a in (space.sample() for _ in range(10))]

    async def main() -> list:
        async with aiovec.AsyncVecEnv([Nested] * n, num_workers=2, backend="ray") as venv:
            out = [(await asyncio.wait_for(venv.reset(seed=5), 60))[0]]
            for a in acts:
                out.append((await asyncio.wait_for(venv.step(a), 60))[:4])
        return out

    got = aiovec.run(main())
    sync = gym.vector.SyncVectorEnv([Nested] * n)
    want = [sync.reset(seed=5)[0]] + [sync.step(a)[:4] for a in acts]
    sync.close()
    for t, (x, y) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_equal(x, y, err_msg=f"step {t}")
    assert_clean(clean, grace=30.0, ignore=not_a_ray_actor)


def test_ray_actor_death_is_a_typed_error_or_a_restart(clean) -> None:
    async def main() -> None:
        async with aiovec.make("CartPole-v1", 4, num_workers=2, backend="ray", max_restarts=1, restart_backoff=0.0) as venv:
            await venv.reset(seed=0)
            await venv.step(np.zeros(4, dtype=np.int64))
            actor = venv._pool.workers[0].handle.actor
            ray.kill(actor)
            for _ in range(200):  # ray.kill is asynchronous: step only once the actor is gone, or the step may beat it
                try:
                    await asyncio.wait_for(actor.__ray_ready__.remote(), 10)
                except ray.exceptions.RayActorError:
                    break
                await asyncio.sleep(0.05)
            _, _, _, trunc, infos = await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 60)
            assert trunc[:2].all() and infos["worker_restarted"][:2].all()
            await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 60)
            ray.kill(next(iter(venv._pool.workers.values())).handle.actor)
            with pytest.raises(aiovec.WorkerCrashedError) as info:
                for _ in range(3):
                    await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 60)
            assert "RayActorError" in str(info.value) or "Actor" in str(info.value)

    aiovec.run(main())
    assert_clean(clean, grace=30.0, ignore=not_a_ray_actor)


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(aiovec.ConfigError):
        aiovec.make("CartPole-v1", 2, backend="dask")
