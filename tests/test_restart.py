"""Restart policy and recycling on real processes: nothing lost, episodes end truncated, budgets hold."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
from conftest import assert_clean

import aiovec


def fault_env(fault: str, at_step: int) -> gym.Env:
    return gym.make("aiovec/Fault-v0", fault=fault, at_step=at_step)


def healthy_env() -> gym.Env:
    return gym.make("aiovec/Fault-v0", fault="raise", at_step=None)


class SlowResets(gym.Wrapper):
    """Every reset after the first sleeps ``reset_s``: a worker can be killed while it computes a reset row."""

    def __init__(self, env: gym.Env, reset_s: float) -> None:
        super().__init__(env)
        self.reset_s = reset_s
        self.resets = 0

    def reset(self, **kwargs):  # type: ignore[no-untyped-def]
        if self.resets:
            time.sleep(self.reset_s)
        self.resets += 1
        return self.env.reset(**kwargs)


def two_step_env_with_slow_resets() -> gym.Env:
    return SlowResets(gym.make("aiovec/Sleep-v0", wait_ms=0.0, obs_dim=4, episode_len=2), reset_s=0.5)


@pytest.mark.parametrize("fault", ["sigkill", "exit", "segfault"])
def test_crashed_worker_is_replaced_and_episode_truncated(fault: str, clean) -> None:
    async def main() -> None:
        fns = [functools.partial(fault_env, fault, 4)] + [healthy_env] * 3
        async with aiovec.AsyncVecEnv(fns, num_workers=2, max_restarts=1, restart_backoff=0.0) as venv:
            await venv.reset(seed=0)
            pids = {w["pid"] for w in venv.stats()["workers"]}
            for _ in range(3):
                await venv.step(np.zeros(4, dtype=np.int64))
            obs, rew, term, trunc, infos = await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 30)
            # envs 0 and 1 shared the dead worker: their episodes end truncated, flagged
            assert trunc.tolist() == [True, True, False, False]
            assert not term.any() and rew[:2].tolist() == [0.0, 0.0]
            assert infos["worker_restarted"][:2].all() and not infos["_worker_restarted"][2:].any()
            # next step is the reset step of a fresh episode, then stepping continues
            obs, rew, term, trunc, infos = await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 30)
            assert not trunc[:2].any() and rew[:2].tolist() == [0.0, 0.0]
            obs, rew, *_ = await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 30)
            stats = venv.stats()
            assert stats["restarts"] == 1 and venv.num_workers == 2
            assert {w["pid"] for w in stats["workers"]} != pids
            # the new worker's env faults again at its 4th step: budget exhausted -> typed error
            with pytest.raises(aiovec.WorkerCrashedError) as info:
                for _ in range(6):
                    await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 30)
            assert info.value.env_ids == (0, 1)

    aiovec.run(main())
    assert_clean(clean)


def test_a_worker_killed_while_it_computes_reset_rows_cuts_no_episode(run_uv, clean) -> None:
    """Next-step autoreset: the step after an episode's last row is a reset row. Its worker killed while computing
    it (restarts allowed), the new worker gives that reset row, not a truncation of an episode that had already
    ended (a zero-length episode flagged ``worker_restarted``); the episode then runs its full two steps."""

    async def main() -> None:
        fns = [two_step_env_with_slow_resets] * 2
        async with aiovec.AsyncVecEnv(fns, num_workers=1, placement="process", controller=None, max_restarts=1,
                                      restart_backoff=0.0) as venv:
            await asyncio.wait_for(venv.reset(seed=0), 30)
            act = np.zeros(2, dtype=np.int64)
            await asyncio.wait_for(venv.step(act), 30)
            last, _, _, trunc, _ = await asyncio.wait_for(venv.step(act), 30)
            assert trunc.all()
            (pid,) = (w["pid"] for w in venv.stats()["workers"])
            step = asyncio.ensure_future(venv.step(act))
            await asyncio.sleep(0.2)  # the worker sleeps in the first env's reset
            os.kill(pid, signal.SIGKILL)
            obs, rew, term, trunc, infos = await asyncio.wait_for(step, 30)
            assert venv.stats()["restarts"] == 1
            assert rew.tolist() == [0.0, 0.0] and not term.any() and not trunc.any(), (rew, term, trunc, infos)
            assert "worker_restarted" not in infos and not (obs == last).all(axis=1).any()
            _, _, term, trunc, _ = await asyncio.wait_for(venv.step(act), 30)
            assert not (term | trunc).any()
            _, _, term, trunc, _ = await asyncio.wait_for(venv.step(act), 30)
            assert trunc.all() and not term.any()

    run_uv(main())
    assert_clean(clean)


def _sign_actions(obs: np.ndarray) -> np.ndarray:
    """The action a CostEnv rewards (1.0) on a real step: the sign of the first observation."""
    return (obs[:, 0] > 0).astype(np.int64)


@pytest.mark.parametrize("when", ["idle", "mid-step"])
def test_same_step_autoreset_delivers_a_cut_episode_as_a_same_step_row(run_uv, clean, when: str) -> None:
    """Same-step autoreset: the row that ends an episode carries the next episode's first observation, the last one
    in ``infos["final_obs"]``. A worker killed (restarts allowed), idle between steps or in the middle of one: its
    envs' next row ends the cut episode that way (truncated, no reward, ``worker_restarted``), and the step after
    is a real step of the new episode, never a reset row (reward 0, the action ignored) in between."""
    wait_ms = 0.0 if when == "idle" else 400.0
    fns = [functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=wait_ms, obs_dim=4, episode_len=100)] * 4

    async def main() -> None:
        async with aiovec.AsyncVecEnv(fns, num_workers=2, placement="process", controller=None, max_restarts=1,
                                      restart_backoff=0.0, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP) as venv:
            obs, _ = await asyncio.wait_for(venv.reset(seed=0), 30)
            obs, rew, *_ = await asyncio.wait_for(venv.step(_sign_actions(obs)), 30)
            assert (rew == 1.0).all()
            wid, worker = min(venv._pool.workers.items())
            dead = sorted(worker.envs)
            pid = next(w["pid"] for w in venv.stats()["workers"] if w["worker_id"] == wid)
            if when == "idle":
                os.kill(pid, signal.SIGKILL)
                await asyncio.sleep(0.5)
                step = asyncio.ensure_future(venv.step(_sign_actions(obs)))
            else:
                step = asyncio.ensure_future(venv.step(_sign_actions(obs)))
                await asyncio.sleep(0.2)  # every env sleeps in its step
                os.kill(pid, signal.SIGKILL)
            new, rew, term, trunc, infos = await asyncio.wait_for(step, 30)
            cut = np.isin(np.arange(4), dead)
            assert venv.stats()["restarts"] == 1
            assert trunc.tolist() == cut.tolist() and not term.any(), (trunc, term)
            assert (rew[cut] == 0.0).all() and (rew[~cut] == 1.0).all()
            assert infos["_worker_restarted"].tolist() == cut.tolist()
            assert infos["_final_obs"].tolist() == cut.tolist()
            for i in dead:
                np.testing.assert_array_equal(infos["final_obs"][i], obs[i])  # the cut episode's last observation
                assert not np.array_equal(new[i], obs[i])  # the new episode's first
            _, rew, term, trunc, infos = await asyncio.wait_for(venv.step(_sign_actions(new)), 30)
            assert (rew == 1.0).all() and not (term | trunc).any(), (rew, term, trunc)  # real steps, every env
            assert "worker_restarted" not in infos
            venv._table.check()

    run_uv(main())
    assert_clean(clean)


def test_a_worker_killed_during_reset_is_replaced_and_the_reset_completes(run_uv, clean) -> None:
    """With restarts left, a worker that dies during ``reset()`` costs one restart, not the reset: its envs reset
    again on the new worker, with the same seeds, and ``reset()`` returns what it would have returned."""

    async def main() -> None:
        fns = [two_step_env_with_slow_resets] * 4
        async with aiovec.AsyncVecEnv(fns, num_workers=2, placement="process", controller=None, max_restarts=1,
                                      restart_backoff=0.0) as venv:
            await asyncio.wait_for(venv.reset(seed=0), 30)
            pid = venv.stats()["workers"][0]["pid"]
            reset = asyncio.ensure_future(venv.reset(seed=7))
            await asyncio.sleep(0.2)  # both workers sleep in a reset
            os.kill(pid, signal.SIGKILL)
            obs, infos = await asyncio.wait_for(reset, 30)
            assert venv.stats()["restarts"] == 1
            expected = np.stack([two_step_env_with_slow_resets().reset(seed=7 + i)[0] for i in range(4)])
            np.testing.assert_array_equal(obs, expected)
            _, _, term, trunc, infos = await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 30)
            assert not (term | trunc).any() and "worker_restarted" not in infos

    run_uv(main())
    assert_clean(clean)


def test_hung_env_is_killed_by_step_timeout_and_restarted(clean) -> None:
    async def main() -> None:
        fns = [functools.partial(fault_env, "hang", 2), healthy_env]
        async with aiovec.AsyncVecEnv(fns, num_workers=2, step_timeout=1.0, max_restarts=2, restart_backoff=0.0) as venv:
            await venv.reset(seed=1)
            await venv.step(np.zeros(2, dtype=np.int64))
            _, _, _, trunc, infos = await asyncio.wait_for(venv.step(np.zeros(2, dtype=np.int64)), 30)
            assert trunc.tolist() == [True, False] and infos["worker_restarted"][0]
            await asyncio.wait_for(venv.step(np.zeros(2, dtype=np.int64)), 30)
            assert venv.stats()["restarts"] == 1

    aiovec.run(main())
    assert_clean(clean)


def test_first_finished_with_restarts_delivers_every_transition_once(clean) -> None:
    async def main() -> None:
        fns = [functools.partial(fault_env, "sigkill", 7), healthy_env, healthy_env, healthy_env]
        sent = np.zeros(4, dtype=int)
        got = np.zeros(4, dtype=int)
        async with aiovec.AsyncVecEnv(fns, num_workers=4, max_restarts=5, restart_backoff=0.0) as venv:
            await venv.reset(seed=2)
            venv.send(np.zeros(4, dtype=np.int64))
            sent += 1
            for _ in range(60):
                r = await asyncio.wait_for(venv.recv(2), 30)
                got[r.env_ids] += 1
                venv.send(np.zeros(len(r.env_ids), dtype=np.int64), r.env_ids)
                sent[r.env_ids] += 1
            for r in await asyncio.wait_for(venv.drain(), 30):
                got[r.env_ids] += 1
            assert venv.stats()["restarts"] >= 1
        assert (sent == got).all(), (sent, got)

    aiovec.run(main())
    assert_clean(clean)


def test_recycling_replaces_workers_without_changing_trajectories(clean) -> None:
    async def run(**kw: int) -> tuple[list, dict]:
        outs = []
        async with aiovec.make("CartPole-v1", 4, num_workers=2, **kw) as venv:
            await venv.reset(seed=5)
            rng = np.random.default_rng(0)
            for _ in range(1500):
                outs.append(await venv.step(rng.integers(0, 2, 4)))
            return outs, venv.stats()

    async def main() -> None:
        plain, _ = await run()
        recycled, stats = await run(recycle_steps=800)
        assert stats["recycled"] >= 1 and stats["moves"] >= 1
        for a, b in zip(plain, recycled, strict=True):
            for x, y in zip(a[:4], b[:4], strict=True):
                assert np.array_equal(x, y)

    aiovec.run(main())
    assert_clean(clean)


def test_restart_options_are_validated() -> None:
    with pytest.raises(aiovec.ConfigError):
        aiovec.make("CartPole-v1", 2, max_restarts=-1)
    with pytest.raises(aiovec.ConfigError):
        aiovec.make("CartPole-v1", 2, recycle_steps=0)


@pytest.mark.slow
def test_the_restart_backoff_doubles_through_a_crash_loop(clean) -> None:
    """A worker that dies at every start: the wait before each replacement doubles (0.3, 0.6, 1.2, 2.4 s). It was
    measured from one crash to the next, a gap that holds the backoff itself, so from 1.2 s on it started over."""
    fns = [functools.partial(fault_env, "sigkill", 1)]

    async def main() -> list[float]:
        async with aiovec.AsyncVecEnv(fns, num_workers=1, max_restarts=4, restart_backoff=0.3) as venv:
            await venv.reset(seed=0)
            waits = []
            with pytest.raises(aiovec.WorkerCrashedError):  # the 5th death: the budget is spent
                for _ in range(20):  # a step kills the worker; the step after its reset row waits for the replacement
                    t = time.perf_counter()
                    await asyncio.wait_for(venv.step(np.zeros(1, dtype=np.int64)), 30)
                    waits.append(time.perf_counter() - t)
            return waits

    waits = asyncio.run(main())
    assert max(waits) >= 2.0, [round(w, 2) for w in waits]  # the 4th backoff: 2.4 s (0.3 s again before the fix)
    assert_clean(clean)


def test_a_crash_raised_by_call_is_not_raised_again_by_the_next_recv(clean) -> None:
    slow = functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=3000.0, obs_dim=4)
    fine = functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=0.0, obs_dim=4)

    async def main() -> None:
        async with aiovec.AsyncVecEnv([slow, slow, fine, fine], num_workers=2) as venv:
            await venv.reset(seed=0)
            pid = next(w["pid"] for w in venv.stats()["workers"] if 0 in venv._pool.workers[w["worker_id"]].envs)
            call = asyncio.ensure_future(venv.call("step", 0, env_ids=[0]))  # 3 s in the env
            await asyncio.sleep(0.5)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(aiovec.WorkerCrashedError):
                await asyncio.wait_for(call, 30)
            venv.send(np.zeros(2, dtype=np.int64), [2, 3])  # the other worker's envs: nothing to raise
            r = await asyncio.wait_for(venv.recv(2), 30)
            assert sorted(r.env_ids.tolist()) == [2, 3]

    asyncio.run(main())
    assert_clean(clean)


def test_two_workers_dying_in_one_step_with_one_restart_left(clean) -> None:
    """max_restarts=1 and both workers die in the same lock-step step: one takes the restart (its envs' episodes
    end truncated, flagged, delivered once), the other's crash is raised once naming its envs, which then raise on
    use; the healthy rows are neither lost nor duplicated, and stepping the survivors goes on."""
    fns = [functools.partial(fault_env, "sigkill", 4), healthy_env, functools.partial(fault_env, "sigkill", 4), healthy_env]

    async def main() -> None:
        async with aiovec.AsyncVecEnv(fns, num_workers=2, max_restarts=1, restart_backoff=0.0) as venv:
            await venv.reset(seed=0)
            shards = sorted(sorted(w.envs) for w in venv._pool.workers.values())
            assert shards == [[0, 1], [2, 3]], shards
            for _ in range(3):
                await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 30)
            with pytest.raises(aiovec.WorkerCrashedError) as info:
                await asyncio.wait_for(venv.step(np.zeros(4, dtype=np.int64)), 30)
            lost = set(info.value.env_ids)
            assert lost in ({0, 1}, {2, 3}), lost
            kept = sorted({0, 1, 2, 3} - lost)
            rows = [r for r in await asyncio.wait_for(venv.drain(), 30)]
            got = sorted(i for r in rows for i in r.env_ids.tolist())
            assert got == kept, (got, kept)  # the restarted worker's envs: one truncated row each, once
            for r in rows:
                assert r.truncations.all() and not r.terminations.any()
                assert r.infos["worker_restarted"].all()
            assert venv.stats()["restarts"] == 1
            with pytest.raises(aiovec.WorkerCrashedError):
                venv.send(np.zeros(2, dtype=np.int64), sorted(lost))
            for _ in range(3):  # the survivors step on, first-finished
                venv.send(np.zeros(2, dtype=np.int64), kept)
                r = await asyncio.wait_for(venv.recv(2), 30)
                assert sorted(r.env_ids.tolist()) == kept and not r.truncations.any()

    aiovec.run(main())
    assert_clean(clean)
