"""Live resizing: no transition lost, duplicated, reordered or misattributed; trajectories unchanged."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
import pytest
from conftest import assert_clean, pid_gone, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aiovec
import aiovec.pool

N_ENVS = 5


def reference(seed: int, actions_per_env: list[list[int]]) -> list[list[tuple]]:
    """Each env stepped alone in-process with the same actions (NEXT_STEP autoreset)."""
    out = []
    for i, acts in enumerate(actions_per_env):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=seed + i)
        done, traj = False, []
        for a in acts:
            if done:
                obs, _ = env.reset()
                traj.append((obs, 0.0, False, False))
                done = False
            else:
                obs, r, te, tr, _ = env.step(a)
                traj.append((obs, r, te, tr))
                done = te or tr
        out.append(traj)
    return out


def assert_equals_sync(outs: list, seed: int, action_seed: int) -> None:
    """Lock-step results of CartPoles equal SyncVectorEnv's for the same seeds and actions."""
    n = len(outs[0][0])
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n)
    sync.reset(seed=seed)
    rng = np.random.default_rng(action_seed)
    for got in outs:
        want = sync.step(rng.integers(0, 2, n))
        for x, y in zip(got, want[:4], strict=True):
            assert np.array_equal(x, y)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.lists(st.integers(0, N_ENVS - 1), min_size=1, max_size=N_ENVS, unique=True)),
        st.tuples(st.just("recv"), st.integers(1, N_ENVS)),
        st.tuples(st.just("resize"), st.integers(1, N_ENVS)),
    ),
    min_size=5,
    max_size=60,
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, seed=st.integers(0, 1000))
def test_random_interleavings_of_send_recv_resize(ops: list, seed: int) -> None:
    before = snapshot()  # per example: hypothesis cannot take a function-scoped fixture
    asyncio.run(asyncio.wait_for(_interleave(ops, seed), 120))
    assert_clean(before)


async def _interleave(ops: list, seed: int) -> None:
    rng = np.random.default_rng(seed)
    sent: list[list[int]] = [[] for _ in range(N_ENVS)]
    got: list[list[tuple]] = [[] for _ in range(N_ENVS)]
    async with aiovec.make("CartPole-v1", N_ENVS, num_workers=2) as venv:
        await venv.reset(seed=seed)
        busy: set[int] = set()
        for op, arg in ops:
            if op == "send":
                ids = [i for i in arg if i not in busy]
                if ids:
                    acts = rng.integers(0, 2, len(ids))
                    venv.send(acts, ids)
                    for i, a in zip(ids, acts, strict=True):
                        sent[i].append(int(a))
                    busy.update(ids)
            elif op == "recv" and busy:
                r = await venv.recv(arg)
                _record(r, got, busy)
            elif op == "resize":
                await venv.resize(arg)
        # Drive every env to completion of whatever was sent, stepping on so pending moves finish.
        for r in await venv.drain():
            _record(r, got, busy)
        assert venv.num_workers >= 1
    ref = reference(seed, sent)
    for i in range(N_ENVS):
        assert len(got[i]) == len(sent[i]), f"env {i}: sent {len(sent[i])} actions, received {len(got[i])} results"
        for k, (a, b) in enumerate(zip(got[i], ref[i], strict=True)):
            assert np.array_equal(a[0], b[0]) and a[1:] == b[1:], f"env {i} step {k} differs from the reference"


def _record(r: aiovec.StepResult, got: list, busy: set) -> None:
    for row, i in enumerate(r.env_ids.tolist()):
        got[i].append((r.obs[row], float(r.rewards[row]), bool(r.terminations[row]), bool(r.truncations[row])))
        busy.discard(i)


def test_resize_changes_worker_count_and_keeps_lockstep_results(clean) -> None:
    async def main() -> tuple[list, list[int]]:
        counts = []
        outs = []
        async with aiovec.make("CartPole-v1", 6, num_workers=1) as venv:
            await venv.reset(seed=7)
            rng = np.random.default_rng(0)
            for t in range(300):
                if t in (5, 120, 200):
                    await venv.resize({5: 6, 120: 2, 200: 3}[t])
                obs, rew, te, tr, _ = await venv.step(rng.integers(0, 2, 6))
                outs.append((obs, rew, te, tr))
                counts.append(venv.num_workers)
            assert venv.pending_moves == 0
        return outs, counts

    outs, counts = asyncio.run(main())
    assert_clean(clean)
    assert 6 in counts and counts[-1] == 3
    assert_equals_sync(outs, seed=7, action_seed=0)


def _worker_pids(venv: aiovec.AsyncVecEnv) -> set[int]:
    return {w["pid"] for w in venv.stats()["workers"] if w["pid"] is not None}


async def _step_until_settled(venv: aiovec.AsyncVecEnv, rng: np.random.Generator, outs: list) -> None:
    """Lock-step until every planned move is done (envs move at their episode boundaries)."""
    for _ in range(2000):
        obs, rew, te, tr, _ = await venv.step(rng.integers(0, 2, venv.num_envs))
        outs.append((obs, rew, te, tr))
        if not venv.pending_moves:
            return
    raise AssertionError("moves never finished")


async def _step_n(venv: aiovec.AsyncVecEnv, rng: np.random.Generator, outs: list, k: int) -> None:
    """Lock-step ``k`` batches of random actions, recording each result."""
    for _ in range(k):
        obs, rew, te, tr, _ = await venv.step(rng.integers(0, 2, venv.num_envs))
        outs.append((obs, rew, te, tr))


def _assert_run_equals_sync(main: Callable[[], Awaitable[list]], clean: Any, seed: int, action_seed: int) -> None:
    """Run ``main`` (it returns the lock-step results it recorded), check nothing leaked, compare with SyncVectorEnv."""
    outs = asyncio.run(main())
    assert_clean(clean)
    assert_equals_sync(outs, seed=seed, action_seed=action_seed)


def test_a_grow_soon_after_a_shrink_takes_the_parked_worker_back(clean, monkeypatch) -> None:
    """A shrink parks the emptied worker process (alive, idle, not counted); a grow within PARK_S takes that
    same process back instead of starting one, and sends it the settings of now; trajectories are unchanged."""
    monkeypatch.setattr(aiovec.pool, "PARK_S", 30.0)

    async def main() -> tuple[list, list]:
        outs: list = []
        seen = []
        async with aiovec.make("CartPole-v1", 6, num_workers=3, controller=None) as venv:
            await venv.reset(seed=3)
            rng = np.random.default_rng(1)
            three = _worker_pids(venv)
            await venv.resize(1)
            await _step_until_settled(venv, rng, outs)
            one = _worker_pids(venv)
            parked = three - one
            assert venv.num_workers == 1 and len(parked) == 2
            assert all(psutil.pid_exists(p) for p in parked), "parked workers stay alive"
            await venv.set_env_threads(2)  # a setting changed while they were parked
            await venv.resize(3)
            await _step_until_settled(venv, rng, outs)
            await _step_n(venv, rng, outs, 1)  # the worker that sent its envs away confirms its share's threads
            assert _worker_pids(venv) == three, "the parked processes came back, none started"
            seen = [w["env_threads"] for w in venv.stats()["workers"]]
            assert venv.num_workers == 3
        return outs, seen

    outs, threads = asyncio.run(main())
    assert_clean(clean)
    assert threads == [2, 2, 2]
    assert_equals_sync(outs, seed=3, action_seed=1)


class _Script:
    """A controller that asks for ``plan[i]`` (processes, threads) at its ``i``-th decision, then the last one."""

    def __init__(self, plan: list[tuple[int, int]]) -> None:
        self.plan, self.i = plan, 0

    def decide(self, m: aiovec.Measurement) -> aiovec.Decision:
        p, t = self.plan[min(self.i, len(self.plan) - 1)]
        self.i += 1
        return aiovec.Decision(p, "scripted", threads=t, placement="process")


def test_workers_still_holding_envs_bound_elsewhere_keep_threads_for_them(clean) -> None:
    """The controller goes from 2p x 8t to 8p x 2t (16 waiting envs): the two old processes keep 8 threads while
    they still hold more than their share of envs (which move only at their episode's end), so those envs do not
    step in 4 rounds of 2 threads; each drops to 2 once down to its share; the new processes step on 2 throughout."""

    async def main() -> tuple[list, list]:
        during: list = []
        kw = {"wait_ms": 2.0, "episode_len": 30}
        script = _Script([(2, 8)] * 3 + [(8, 2)])
        async with aiovec.make("aiovec/Sleep-v0", 16, num_workers="auto", controller=script, env_kwargs=kw) as venv:
            await venv.reset(seed=0)
            acts = np.zeros(16, dtype=np.int64)
            for _ in range(3000):
                await venv.step(acts)
                ws = [w for w in venv.stats()["workers"] if w["kind"] == "process"]
                if venv.env_threads == 2 and venv.pending_moves:
                    during.append([(w["envs"], w["env_threads"]) for w in ws])
                if script.i > 4 and not venv.pending_moves and venv.num_workers == 8:
                    break
            await venv.step(acts)  # the last TUNE's reply
            after = [(w["envs"], w["env_threads"]) for w in venv.stats()["workers"] if w["kind"] == "process"]
        return during, after

    during, after = asyncio.run(main())
    assert_clean(clean)
    assert during, "the move to 8 processes was seen under way"
    for workers in during:
        for envs, threads in workers:
            if envs > 2:  # more than its share of 2: a thread for each (8 here, as before the move), not 2 for all
                assert threads >= min(envs, 8), f"a worker holding {envs} envs stepped on {threads} threads: {workers}"
    assert any(envs > 2 for workers in during for envs, _ in workers), "old workers held more than their share meanwhile"
    assert after == [(2, 2)] * 8


def test_env_threads_reads_the_pools_setting_while_it_runs_and_keeps_the_last_after_close(clean) -> None:
    """One owner for the thread count: the constructor's before start, the worker pool's while it runs (workers
    confirm it), the last one after close."""

    async def main() -> tuple[int, int, list, int]:
        venv = aiovec.make("aiovec/Sleep-v0", 4, num_workers=2, env_threads=2, env_kwargs={"wait_ms": 1.0})
        before = venv.env_threads
        async with venv:
            await venv.reset(seed=0)
            await venv.set_env_threads(3)
            acts = np.zeros(4, dtype=np.int64)
            await venv.step(acts)
            await venv.step(acts)  # the TUNE's reply is in
            running, confirmed = venv.env_threads, [w["env_threads"] for w in venv.stats()["workers"]]
        return before, running, confirmed, venv.env_threads

    before, running, confirmed, after = asyncio.run(main())
    assert_clean(clean)
    assert (before, running, confirmed, after) == (2, 3, [3, 3], 3)


def test_parked_workers_stop_after_park_s_and_a_parked_death_costs_nothing(clean, monkeypatch) -> None:
    """A parked worker that dies (SIGKILL) is not a crash: no restart spent, no error raised; the others stop
    on their own after PARK_S, and close() stops any still parked."""
    monkeypatch.setattr(aiovec.pool, "PARK_S", 0.5)

    async def main() -> None:
        async with aiovec.make("CartPole-v1", 4, num_workers=4, max_restarts=0, controller=None) as venv:
            await venv.reset(seed=0)
            rng = np.random.default_rng(0)
            four = _worker_pids(venv)
            await venv.resize(2)
            await _step_until_settled(venv, rng, [])
            parked = sorted(four - _worker_pids(venv))
            assert len(parked) == 2
            os.kill(parked[0], signal.SIGKILL)
            deadline = time.monotonic() + 10
            while not all(pid_gone(p) for p in parked):  # (pid_exists then Process raced with the reaping)
                assert time.monotonic() < deadline, "parked workers outlived PARK_S"
                await venv.step(rng.integers(0, 2, 4))
                await asyncio.sleep(0.01)
            for _ in range(20):
                await venv.step(rng.integers(0, 2, 4))  # no error, no lost env
            assert venv.num_workers == 2 and venv.stats()["restarts"] == 0
            await venv.resize(1)
            await _step_until_settled(venv, rng, [])  # one more parked: close() stops it

    asyncio.run(main())
    assert_clean(clean)


def test_a_look_at_inline_and_back_to_hybrid_keeps_the_worker_process(clean, monkeypatch) -> None:
    """The controller's look at inline from hybrid, and its move back: the worker process the look emptied is
    parked, then hosts the process shard again; trajectories are SyncVectorEnv's throughout."""
    monkeypatch.setattr(aiovec.pool, "PARK_S", 30.0)

    async def main() -> list:
        outs: list = []
        async with aiovec.make("CartPole-v1", 6, num_workers=2, placement="hybrid", controller=None) as venv:
            await venv.reset(seed=5)
            rng = np.random.default_rng(2)
            before = _worker_pids(venv)
            assert len(before) == 1
            await venv.resize(1, placement="inline")
            await _step_until_settled(venv, rng, outs)
            assert venv.placement == "inline" and not _worker_pids(venv)
            await venv.resize(2, placement="hybrid")
            await _step_until_settled(venv, rng, outs)
            assert venv.placement == "hybrid" and _worker_pids(venv) == before
            await _step_n(venv, rng, outs, 20)
        return outs

    _assert_run_equals_sync(main, clean, seed=5, action_seed=2)


@pytest.mark.parametrize("last", [1, 2])
def test_a_resize_while_envs_move_sends_them_where_the_last_one_planned(clean, last: int) -> None:
    """resize(3) starts moves into the new worker; a resize straight after (before any Remove is answered) retires
    the workers those envs were leaving and the one they were bound for. Each such env must land where the last
    resize planned it, so the retired workers empty and leave (once left on a retiring worker, nothing moved it
    again: num_workers stayed above the request with no move pending)."""

    async def main() -> list:
        outs: list = []
        async with aiovec.make("CartPole-v1", 8, num_workers=2, controller=None) as venv:
            await venv.reset(seed=11)
            rng = np.random.default_rng(4)
            await venv.resize(3)
            assert venv.pending_moves  # envs are on their way into the new worker
            await venv.resize(last)
            await _step_until_settled(venv, rng, outs)
            await _step_n(venv, rng, outs, 5)
            assert venv.num_workers == last and len(_worker_pids(venv)) == last, venv.stats()["workers"]
            assert sorted(w["envs"] for w in venv.stats()["workers"]) == [8 // last] * last
        return outs

    _assert_run_equals_sync(main, clean, seed=11, action_seed=4)


def test_a_worker_that_dies_hosting_no_envs_costs_nothing(clean, monkeypatch) -> None:
    """A worker taken back from the park hosts nothing until envs reach their episode boundaries; killed before
    then, nothing was lost: no error, no restart, and the moves planned into it go to the workers left."""
    monkeypatch.setattr(aiovec.pool, "PARK_S", 30.0)

    async def main() -> list:
        outs: list = []
        async with aiovec.make("CartPole-v1", 6, num_workers=2, controller=None) as venv:
            await venv.reset(seed=9)
            rng = np.random.default_rng(6)
            await venv.resize(1)
            await _step_until_settled(venv, rng, outs)
            while True:  # mid-episode everywhere: nothing may move at once
                obs, rew, te, tr, _ = await venv.step(rng.integers(0, 2, 6))
                outs.append((obs, rew, te, tr))
                if not (te | tr).any():
                    break
            before = _worker_pids(venv)
            await venv.resize(2)
            (empty,) = _worker_pids(venv) - before
            assert venv.num_workers == 2 and sorted(w["envs"] for w in venv.stats()["workers"]) == [0, 6]
            os.kill(empty, signal.SIGKILL)
            await asyncio.sleep(0.5)
            await _step_until_settled(venv, rng, outs)
            await _step_n(venv, rng, outs, 10)
            assert venv.num_workers == 1 and _worker_pids(venv) == before
            assert venv.stats()["restarts"] == 0
        return outs

    _assert_run_equals_sync(main, clean, seed=9, action_seed=6)


def test_a_parked_worker_that_died_unreported_is_not_taken_back(clean, monkeypatch) -> None:
    """A parked worker killed just before a grow, its death not yet seen by the event loop: the grow starts a
    new process instead of sending envs to the dead one (they would have been lost or restarted)."""
    monkeypatch.setattr(aiovec.pool, "PARK_S", 30.0)

    async def main() -> list:
        outs: list = []
        async with aiovec.make("CartPole-v1", 6, num_workers=2, controller=None) as venv:
            await venv.reset(seed=13)
            rng = np.random.default_rng(8)
            two = _worker_pids(venv)
            await venv.resize(1)
            await _step_until_settled(venv, rng, outs)
            (parked,) = two - _worker_pids(venv)
            os.kill(parked, signal.SIGKILL)
            time.sleep(0.2)  # dead, and the event loop has not run since
            await venv.resize(2)
            assert parked not in _worker_pids(venv) and venv.num_workers == 2
            await _step_until_settled(venv, rng, outs)
            await _step_n(venv, rng, outs, 10)
            assert venv.stats()["restarts"] == 0 and len(_worker_pids(venv)) == 2
        return outs

    _assert_run_equals_sync(main, clean, seed=13, action_seed=8)


def test_a_worker_taken_back_from_the_park_keeps_its_age_for_recycle_steps(clean, monkeypatch) -> None:
    """recycle_steps counts a worker's env steps over its life: a park and a return do not make it young again."""
    monkeypatch.setattr(aiovec.pool, "PARK_S", 30.0)

    async def main() -> list:
        outs: list = []
        async with aiovec.make("CartPole-v1", 4, num_workers=2, controller=None, recycle_steps=400) as venv:
            await venv.reset(seed=21)
            rng = np.random.default_rng(10)
            await _step_n(venv, rng, outs, 150)  # each worker: 2 envs x 150 = 300 steps, under the limit
            assert venv.stats()["recycled"] == 0
            two = _worker_pids(venv)
            await venv.resize(1)
            await _step_until_settled(venv, rng, outs)
            (parked,) = two - _worker_pids(venv)
            await venv.resize(2)
            assert parked in _worker_pids(venv)
            await _step_n(venv, rng, outs, 100)  # 200 more steps on it: 500 in its life
            await _step_until_settled(venv, rng, outs)
            assert parked not in _worker_pids(venv), venv.stats()["workers"]
        return outs

    _assert_run_equals_sync(main, clean, seed=21, action_seed=10)


@pytest.mark.parametrize("max_restarts", [0, 1])
def test_envs_on_their_way_into_a_worker_that_dies_lose_nothing(clean, max_restarts: int) -> None:
    """A grow sends REMOVE to the source (stopped here, so the replies wait); the new worker dies before the envs
    arrive. Their state is still in the replies: they land back on the source, no error, no restart, and every
    transition is SyncVectorEnv's (they were counted lost, and a reply arriving later found no move to finish)."""

    async def main() -> list:
        outs: list = []
        async with aiovec.make("CartPole-v1", 6, num_workers=1, controller=None, max_restarts=max_restarts) as venv:
            await venv.reset(seed=17)
            rng = np.random.default_rng(12)
            (src,) = _worker_pids(venv)
            os.kill(src, signal.SIGSTOP)
            try:
                await venv.resize(2)
                assert venv.pending_moves
                (new,) = _worker_pids(venv) - {src}
                os.kill(new, signal.SIGKILL)
                for _ in range(50):  # until the event loop has seen it die
                    await asyncio.sleep(0.02)
                    if new not in _worker_pids(venv):
                        break
            finally:
                os.kill(src, signal.SIGCONT)
            await _step_until_settled(venv, rng, outs)
            await _step_n(venv, rng, outs, 10)
            assert _worker_pids(venv) == {src} and venv.stats()["restarts"] == 0
        return outs

    _assert_run_equals_sync(main, clean, seed=17, action_seed=12)


def _cartpole_whose_close_raises() -> gym.Env:
    env = gym.make("CartPole-v1")

    def close() -> None:
        raise RuntimeError("close failed")

    env.close = close
    return env


def test_an_env_whose_close_raises_still_moves(clean) -> None:
    """Moving an env closes the copy it leaves behind; a close that raises must not keep the env on a worker that no
    longer hosts it (its stale row came back as a new transition on every step, an explicit step killed the worker)."""

    async def main() -> list:
        outs: list = []
        async with aiovec.AsyncVecEnv([_cartpole_whose_close_raises] * 6, num_workers=1, controller=None) as venv:
            await venv.reset(seed=19)
            rng = np.random.default_rng(14)
            await venv.resize(2)
            await _step_until_settled(venv, rng, outs)
            await _step_n(venv, rng, outs, 30)
            assert sorted(w["envs"] for w in venv.stats()["workers"]) == [3, 3]
            venv.send(rng.integers(0, 2, 2), env_ids=[0, 5])  # explicit ids: each on its own worker
            res = await venv.recv(2)
            assert sorted(res.env_ids.tolist()) == [0, 5]
        return outs

    _assert_run_equals_sync(main, clean, seed=19, action_seed=14)


def test_a_retiring_worker_that_dies_is_replaced_by_a_retiring_one(clean) -> None:
    """A shrink waits for the envs of the worker it retires to reach their episode boundaries; that worker dies
    meanwhile (restarts allowed): its replacement retires too, so the shrink still ends at the count asked for."""

    async def main() -> None:
        async with aiovec.make("CartPole-v1", 6, num_workers=2, controller=None, max_restarts=1) as venv:
            await venv.reset(seed=23)
            rng = np.random.default_rng(16)
            while True:  # mid-episode everywhere: nothing may move at once
                *_, te, tr, _ = await venv.step(rng.integers(0, 2, 6))
                if not (te | tr).any():
                    break
            two = _worker_pids(venv)
            await venv.resize(1)
            assert venv.pending_moves
            retiring = next(wid for wid in venv._pool._retiring)
            pid = next(w["pid"] for w in venv.stats()["workers"] if w["worker_id"] == retiring)
            os.kill(pid, signal.SIGKILL)
            for _ in range(400):
                await venv.step(rng.integers(0, 2, 6))
                if venv.stats()["restarts"] and not venv.pending_moves and venv.num_workers == 1:
                    break
            assert venv.stats()["restarts"] == 1
            assert venv.num_workers == 1 and len(_worker_pids(venv)) == 1 and _worker_pids(venv) < two, venv.stats()["workers"]

    asyncio.run(main())
    assert_clean(clean)


def test_a_resize_that_does_not_fit_where_the_envs_are_asks_for_a_placement(clean) -> None:
    async def main() -> None:
        async with aiovec.make("CartPole-v1", 4, num_workers=1, placement="inline") as venv:
            await venv.reset(seed=0)
            with pytest.raises(aiovec.ConfigError, match="placement"):
                await venv.resize(2)  # inline is one worker: it did nothing, silently
            assert venv.placement == "inline"
            await venv.resize(2, placement="process")
            for _ in range(600):  # the envs move at their episode boundaries
                await venv.step(np.zeros(4, dtype=np.int64))
                if not venv.pending_moves:
                    break
            assert venv.placement == "process" and venv.num_workers == 2
        async with aiovec.make("CartPole-v1", 4, num_workers=2, placement="hybrid") as venv:
            await venv.reset(seed=0)
            with pytest.raises(aiovec.ConfigError, match="placement"):
                await venv.resize(1)
            assert venv.placement == "hybrid" and venv.num_workers == 2

    asyncio.run(asyncio.wait_for(main(), 120))
    assert_clean(clean)
