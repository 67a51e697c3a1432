"""Two Ray worker "nodes" on this machine (loopback): envs on both, one node removed mid-run."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import assert_clean, not_a_ray_actor

import aiovec

ray = pytest.importorskip("ray", reason="the Ray backend needs the 'ray' extra (CI installs it)")
from ray.cluster_utils import Cluster  # noqa: E402


@pytest.fixture
def cluster():
    loopback: dict = {}  # this machine only (Ray binds its own interface address)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, **loopback})
    nodes = [c.add_node(num_cpus=1, resources={f"node{i}": 1}, **loopback) for i in range(2)]
    c.wait_for_nodes()
    yield c, nodes
    ray.shutdown()
    c.shutdown()


async def _node_of_workers(venv: aiovec.AsyncVecEnv) -> dict[int, str]:
    return {wid: await w.handle.actor.node_id.remote() for wid, w in venv._pool.workers.items()}


@pytest.mark.parametrize("restarts", [4, 0])
def test_lost_node_is_a_restart_or_a_typed_error_never_a_hang(cluster, restarts: int, clean) -> None:
    c, nodes = cluster

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
