"""A worker killed from outside while its envs are idle (the learner's pause), under step() and send().

The common case in training: workers sit idle during every policy forward pass, and the OOM
killer or an operator's SIGKILL hits one then. With restarts the vector env must keep
stepping: the killed worker's envs come back once as truncated (``infos["worker_restarted"]``),
then continue from a fresh episode; every other env's transitions are untouched. Without
restarts the crash is raised once, typed, and the lost envs stay refused (never a hang).
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import numpy as np
import pytest
from conftest import assert_clean, wait, wait_pids_gone
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec import WorkerCrashedError

N = 4
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


async def _kill_idle_worker(venv: aiovec.AsyncVecEnv) -> tuple[int, list[int]]:
    """SIGKILL worker 0's process while its envs are idle; wait until the vector env noticed."""
    wid, worker = next((wid, w) for wid, w in sorted(venv._pool.workers.items()) if w.kind == "process")
    pid = next(w["pid"] for w in venv.stats()["workers"] if w["worker_id"] == wid)
    envs = sorted(worker.envs)
    os.kill(pid, signal.SIGKILL)
    assert wait_pids_gone([pid], 10.0) == []
    for _ in range(1000):  # the death is noticed on the loop (EOF, then the executor's report)
        if wid not in venv._pool.workers:
            break
        await asyncio.sleep(0.01)
    assert wid not in venv._pool.workers, "the vector env never noticed the dead worker"
    return pid, envs


def _actions(t: int) -> np.ndarray:
    return np.array([(t + i) % 2 for i in range(N)], dtype=np.int64)


@pytest.mark.parametrize("placement", ["process", "hybrid"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_idle_kill_under_step_with_restarts_keeps_lock_step_working(run_uv, clean, mode: AutoresetMode, placement: str) -> None:
    async def main() -> None:
        async with aiovec.make("CartPole-v1", N, num_workers=2, max_restarts=1, restart_backoff=0.0, autoreset_mode=mode,
                               placement=placement) as venv:
            await wait(venv.reset(seed=0))
            await wait(venv.step(_actions(0)))
            _, envs = await _kill_idle_worker(venv)
            await asyncio.sleep(0.2)  # the learner's pause goes on
            obs, rewards, terms, truncs, infos = await wait(venv.step(_actions(1)))
            restarted = infos.get("_worker_restarted", np.zeros(N, bool))
            assert restarted.tolist() == [i in envs for i in range(N)], infos
            assert truncs[envs].all() and not terms[envs].any() and (rewards[envs] == 0).all()
            assert venv._table.in_flight == 0 and venv._table.num_ready == 0
            if mode == AutoresetMode.DISABLED:  # the cut episodes need a reset before stepping on
                await wait(venv.reset(seed=10, options={"reset_mask": truncs | terms}))
            for t in range(2, 40):
                obs, rewards, terms, truncs, infos = await wait(venv.step(_actions(t)))
                assert "_worker_restarted" not in infos or not infos["_worker_restarted"].any()
                assert venv._table.in_flight == 0 and venv._table.num_ready == 0
                if mode == AutoresetMode.DISABLED and (terms | truncs).any():
                    await wait(venv.reset(options={"reset_mask": terms | truncs}))
            assert venv.stats()["restarts"] == 1 and venv.num_workers == 2
            venv._table.check()

    run_uv(main())
    assert_clean(clean)


@pytest.mark.parametrize("placement", ["process", "hybrid"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_idle_kill_under_send_recv_with_restarts(run_uv, clean, mode: AutoresetMode, placement: str) -> None:
    async def main() -> None:
        async with aiovec.make("CartPole-v1", N, num_workers=2, max_restarts=1, restart_backoff=0.0, autoreset_mode=mode,
                               placement=placement) as venv:
            await wait(venv.reset(seed=0))
            venv.send(_actions(0))
            await wait(venv.drain())
            _, envs = await _kill_idle_worker(venv)
            venv.send(_actions(1))  # no ids: all envs, the killed worker's included
            got: dict[int, Any] = {}
            ended = np.zeros(N, bool)
            for r in await wait(venv.drain()):
                ended[r.env_ids] = r.terminations | r.truncations
                for k, i in enumerate(r.env_ids.tolist()):
                    assert i not in got, f"env {i} delivered twice"
                    got[i] = (bool(r.truncations[k]), bool(r.infos.get("_worker_restarted", np.zeros(len(r.env_ids), bool))[k]))
            assert sorted(got) == list(range(N))
            assert all(got[i] == (True, True) for i in envs), got
            assert not any(got[i][1] for i in range(N) if i not in envs)
            assert ended[envs].all()  # the cut episodes
            for t in range(2, 30):  # first-finished stepping goes on, every env exactly once per round
                if mode == AutoresetMode.DISABLED and ended.any():
                    await wait(venv.reset(options={"reset_mask": ended.copy()}))
                venv.send(_actions(t))
                results = await wait(venv.drain())
                ids = sorted(i for r in results for i in r.env_ids.tolist())
                assert ids == list(range(N))
                ended[:] = False
                for r in results:
                    ended[r.env_ids] = r.terminations | r.truncations
            venv._table.check()

    run_uv(main())
    assert_clean(clean)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("api", ["step", "send"])
def test_idle_kill_without_restarts_raises_once_then_refuses_lost_envs(run_uv, clean, api: str, mode: AutoresetMode) -> None:
    async def main() -> None:
        async with aiovec.make("CartPole-v1", N, num_workers=2, autoreset_mode=mode) as venv:
            await wait(venv.reset(seed=0))
            await wait(venv.step(_actions(0)))
            pid, envs = await _kill_idle_worker(venv)
            survivors = [i for i in range(N) if i not in envs]
            with pytest.raises(WorkerCrashedError) as info:
                if api == "step":
                    await wait(venv.step(_actions(1)))
                else:
                    venv.send(_actions(1))
                    await wait(venv.drain())
            assert sorted(info.value.env_ids) == envs
            # The survivors still step on their own; the lost envs are refused with the same crash.
            venv.send(np.zeros(len(survivors), dtype=np.int64), env_ids=survivors)
            r = await wait(venv.recv(len(survivors)))
            assert sorted(r.env_ids.tolist()) == survivors
            with pytest.raises(WorkerCrashedError):
                venv.send(np.zeros(1, dtype=np.int64), env_ids=envs[:1])
            venv._table.check()

    run_uv(main())
    assert_clean(clean)


def test_a_crash_that_reset_raised_is_not_raised_again(run_uv, clean) -> None:
    """A worker killed with a reset of its envs in flight: reset() raises the crash, and that report is the only
    one (the same error came again from the next recv(), though the survivors' results were fine)."""

    async def main() -> None:
        async with aiovec.make("CartPole-v1", N, num_workers=2, controller=None) as venv:
            await wait(venv.reset(seed=0))
            wid, worker = next((wid, w) for wid, w in sorted(venv._pool.workers.items()) if w.kind == "process")
            pid = next(w["pid"] for w in venv.stats()["workers"] if w["worker_id"] == wid)
            envs = sorted(worker.envs)
            survivors = [i for i in range(N) if i not in envs]
            os.kill(pid, signal.SIGSTOP)  # the reset waits in its socket
            task = asyncio.ensure_future(venv.reset(seed=1))
            await asyncio.sleep(0.05)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(WorkerCrashedError) as info:
                await wait(task)
            assert sorted(info.value.env_ids) == envs
            venv.send(np.zeros(len(survivors), dtype=np.int64), env_ids=survivors)
            r = await wait(venv.recv(len(survivors)))
            assert sorted(r.env_ids.tolist()) == survivors

    run_uv(main())
    assert_clean(clean)


def test_an_idle_kill_after_an_episode_ended_cuts_no_episode(run_uv, clean) -> None:
    """NEXT_STEP: an env whose last row ended its episode steps into a reset row next. Its worker killed in between
    (restarts allowed), that is still what comes: a reset row (reward 0, no flags), not a truncation of an episode
    that had already ended (an extra zero-length episode)."""

    async def main() -> None:
        async with aiovec.make("CartPole-v1", N, num_workers=2, controller=None, max_restarts=1) as venv:
            await wait(venv.reset(seed=0))
            wid = next(wid for wid, w in sorted(venv._pool.workers.items()) if w.kind == "process")
            mine = sorted(venv._pool.workers[wid].envs)
            for _ in range(500):  # push left until one of that worker's envs terminates
                _, _, te, tr, _ = await wait(venv.step(np.zeros(N, dtype=np.int64)))
                if (te | tr)[mine].any():
                    break
            ended = [i for i in mine if te[i] or tr[i]]
            assert ended
            await _kill_idle_worker(venv)
            obs, rew, te, tr, infos = await wait(venv.step(np.zeros(N, dtype=np.int64)))
            for i in ended:
                assert not te[i] and not tr[i] and rew[i] == 0.0, (i, te[i], tr[i], rew[i])
            _, rew, *_ = await wait(venv.step(np.zeros(N, dtype=np.int64)))
            assert all(rew[i] == 1.0 for i in ended)

    run_uv(main())
    assert_clean(clean)
