"""The Ray backend on a Ray cluster on this machine: same API, same trajectories; a lost node is a restart or a typed error."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
from conftest import assert_clean, not_a_ray_actor

import aiovec

ray = pytest.importorskip("ray", reason="the Ray backend needs the 'ray' extra (CI installs it)")
from ray.cluster_utils import Cluster  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[Cluster]:
    """One Ray cluster on this machine for this module's tests, and this process's one connection to it.

    Ray supports one session per process: after ``ray.shutdown()`` another ``ray.init()`` in the same
    process is not guaranteed to work (ray-project/ray#31145 is one such case; CI once saw the suite's
    process segfault while the second of three sessions started, when the tests started one per module
    and one per node-loss test). So every Ray test lives in this module and Ray starts once: a head with
    no CPUs (it places nothing) and the driver connected to it as a user's script on a cluster is
    (``runtime_env`` carrying aiovec, as ``backend="ray"`` with ``ray_address`` sends it), plus one
    worker node with two CPUs; the node-loss tests swap it for two of their own (``two_nodes``).
    Ray started and stopped by aiovec itself is tested in a script of its own.
    """
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        ray.init(address=cluster.address, log_to_driver=False, runtime_env={"py_modules": [aiovec]})
        _only_worker_nodes(cluster, num_cpus=2, count=1)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def _only_worker_nodes(cluster: Cluster, num_cpus: int, count: int) -> list:
    """Remove every worker node, then add ``count`` nodes of ``num_cpus`` CPUs and wait until they are up."""
    for node in list(cluster.worker_nodes):
        cluster.remove_node(node)
    nodes = [cluster.add_node(num_cpus=num_cpus) for _ in range(count)]
    cluster.wait_for_nodes()
    return nodes


@pytest.fixture
def two_nodes(ray_cluster: Cluster) -> tuple[Cluster, list]:
    """Two fresh one-CPU worker nodes, the only ones, for a test that removes one (the other stays for the
    module's next tests: an actor reserves a hundredth of a CPU, so one node hosts them all)."""
    return ray_cluster, _only_worker_nodes(ray_cluster, num_cpus=1, count=2)


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


STARTS_AND_STOPS_RAY = textwrap.dedent("""
    import asyncio

    import numpy as np
    import psutil
    import ray

    import aiovec


    async def steps(venv: aiovec.AsyncVecEnv, n: int) -> None:
        for _ in range(n):
            await asyncio.wait_for(venv.step(np.zeros(venv.num_envs, dtype=np.int64)), 60)


    async def main() -> None:
        first = aiovec.make("CartPole-v1", 2, num_workers=2, backend="ray")
        await first.reset(seed=0)
        assert ray.is_initialized(), "the vector env did not start Ray"
        second = aiovec.make("CartPole-v1", 3, num_workers=1, backend="ray")  # joins the Ray the first started
        await second.reset(seed=1)
        await steps(first, 3)
        await steps(second, 3)
        started = psutil.Process().children(recursive=True)
        assert any("raylet" in " ".join(p.cmdline()) for p in started), [p.cmdline() for p in started]
        await first.close()
        assert ray.is_initialized(), "closing one vector env stopped the Ray that another one runs on"
        await steps(second, 3)
        await second.close()
        assert not ray.is_initialized(), "closing the last vector env on the Ray they started left it running"
        gone, alive = psutil.wait_procs(started, timeout=30)
        print("left running:", [" ".join(p.cmdline()) for p in alive])


    aiovec.run(main())
""")


def test_a_ray_started_by_the_vector_env_stops_with_it() -> None:
    """Without a Ray session, ``backend="ray"`` starts a local Ray; a second vector env opened meanwhile joins it,
    and the last one's ``close()`` stops it, every process of it (not the first's, under the second).

    In a script of its own: one Ray session per process (``ray_cluster``). ``RAY_ADDRESS=local``
    keeps ``ray.init()`` from joining the suite's cluster, which it would find running on this machine.
    """
    env = {**os.environ, "RAY_ADDRESS": "local"}
    out = subprocess.run([sys.executable, "-c", STARTS_AND_STOPS_RAY], env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "left running: []" in out.stdout, out.stdout + out.stderr[-3000:]


async def _node_of_workers(venv: aiovec.AsyncVecEnv) -> dict[int, str]:
    return {wid: await w.handle.actor.node_id.remote() for wid, w in venv._pool.workers.items()}


@pytest.mark.parametrize("restarts", [4, 0])
def test_lost_node_is_a_restart_or_a_typed_error_never_a_hang(two_nodes, restarts: int, clean) -> None:
    c, nodes = two_nodes

    async def main() -> None:
        async with aiovec.make("CartPole-v1", 4, num_workers=2, backend="ray", ray_address=c.address,
                               max_restarts=restarts, restart_backoff=0.0) as venv:
            await venv.reset(seed=0)
            for _ in range(5):
                await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 60)
            placed = await _node_of_workers(venv)
            assert len(set(placed.values())) == 2, f"actors not spread over both nodes: {placed}"
            victim = next(n for n in nodes if n.node_id == placed[0])
            c.remove_node(victim, allow_graceful=False)
            # Ray notices the lost node after a moment; keep stepping (each step bounded) until it does.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 90
            if restarts:
                # The restart shows in stats; a `worker_restarted` row only where it cut an episode (a death that hits
                # an env whose last row ended its episode gives the reset row it was due, no truncation).
                while venv.stats()["restarts"] < 1 and loop.time() < deadline:
                    await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 90)
                assert venv.stats()["restarts"] >= 1
                for _ in range(5):  # and it goes on stepping on the surviving node
                    await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 90)
            else:
                with pytest.raises(aiovec.WorkerCrashedError) as info:
                    while loop.time() < deadline:
                        await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 90)
                assert set(info.value.env_ids) <= {0, 1, 2, 3} and info.value.env_ids

    aiovec.run(main())
    assert_clean(clean, grace=30.0, ignore=not_a_ray_actor)
