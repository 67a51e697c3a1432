"""Faults: env exceptions, dead and hung workers, cancellation, errors in ``async with``,
a SIGKILLed parent and Ctrl-C. Nothing may hang: every await has a 30 s guard.

Seed defects covered here: 1 (a raising worker hangs the parent), 2 (close() after
a crash hangs), 3 (workers outlive a SIGKILLed parent), 10 (a missing env method
or an unknown command kills the worker), 11 (timeouts: a hung step is bounded).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
import pytest
from conftest import (
    LOOPS,
    RefEnv,
    assert_clean,
    assert_tree_equal,
    default_signals,
    pid_gone,
    run_on,
    snapshot,
    wait,
    wait_pids_gone,
)

import aiovec
from aiovec import AsyncVecEnv, EnvError, EnvStateError, WorkerCrashedError

N = 3
FAULT_ENV = 1  # with 2 workers, envs [0, 1] share worker 0 and env 2 has worker 1


def fault_fns(fault: str, at_step: int = 3, **kwargs: Any) -> list[functools.partial]:
    """Env ``FAULT_ENV`` injects ``fault`` at step ``at_step``; the others never fault."""
    return [
        functools.partial(gym.make, "aiovec/Fault-v0", fault=fault, at_step=at_step if i == FAULT_ENV else None, **kwargs)
        for i in range(N)
    ]


def healthy() -> functools.partial:
    """The reference for every env: the same env, no fault."""
    return functools.partial(gym.make, "aiovec/Fault-v0", fault="raise", at_step=None)


def worker_pids(venv: AsyncVecEnv) -> list[int]:
    return sorted(w["pid"] for w in venv.stats()["workers"])


async def reset_broken_env_and_step_like_refs(venv: AsyncVecEnv, refs: list, acts: np.ndarray, steps: int) -> None:
    """Reset env ``FAULT_ENV`` alone (seed 70) and step every env ``steps`` times, each exactly like its reference."""
    mask = np.zeros(N, dtype=bool)
    mask[FAULT_ENV] = True
    obs, _ = await wait(venv.reset(seed=70, options={"reset_mask": mask}))
    assert_tree_equal(obs[FAULT_ENV], refs[FAULT_ENV].reset(seed=70 + FAULT_ENV)[0])
    for t in range(steps):
        obs, rew, *_ = await wait(venv.step(acts))
        for i in range(N):
            want = refs[i].step(acts[i])
            assert_tree_equal(obs[i], want[0], f"after recovery: step {t} env {i}")
            assert rew[i] == want[1]


# -- an exception inside an env ------------------------------------------------------------------
def test_env_exception_is_relayed_and_the_worker_survives(run, clean) -> None:
    async def main() -> None:
        refs = [RefEnv(healthy(), i) for i in range(N)]
        async with AsyncVecEnv(fault_fns("raise"), num_workers=2) as venv:
            await wait(venv.reset(seed=0))
            pids = worker_pids(venv)
            acts = np.array([1, 0, 1])
            for _ in range(2):
                await wait(venv.step(acts))
                for i in range(N):
                    refs[i].step(acts[i])
            with pytest.raises(EnvError) as info:
                await wait(venv.step(acts))
            err = info.value
            assert err.env_id == FAULT_ENV
            assert err.exc_type == "RuntimeError"
            assert "injected fault at step 3" in err.remote_traceback
            assert "Traceback" in err.remote_traceback and "inject" in err.remote_traceback
            assert f"env {FAULT_ENV}" in str(err) and "injected fault at step 3" in str(err)
            # The worker survived: same processes, same count.
            assert venv.num_workers == 2 and worker_pids(venv) == pids
            # The other envs' transitions of that step are not lost: they wait for recv.
            got = {}
            for res in await wait(venv.drain()):
                for k, i in enumerate(res.env_ids.tolist()):
                    got[i] = res.obs[k]
            assert sorted(got) == [0, 2]
            for i in (0, 2):
                assert_tree_equal(got[i], refs[i].step(acts[i])[0], f"env {i}")
            # The broken env must be reset before it steps again; the others keep going meanwhile.
            with pytest.raises(EnvStateError, match="reset"):
                venv.send(acts[:1], env_ids=[FAULT_ENV])
            venv.send(acts[[0, 2]], env_ids=[0, 2])
            res = await wait(venv.recv(2))
            for k, i in enumerate(res.env_ids.tolist()):
                assert_tree_equal(res.obs[k], refs[i].step(acts[i])[0], f"env {i}")
            # ...and everything continues in lock-step, exactly like the references.
            await reset_broken_env_and_step_like_refs(venv, refs, acts, 4)
            assert worker_pids(venv) == pids
        for ref in refs:
            ref.close()

    run(main())
    assert_clean(clean)


@pytest.mark.parametrize("fault", ["bad_obs", "scalar_obs", "array_reward"])
@pytest.mark.parametrize("placement", ["inline", "process"])
def test_a_result_that_does_not_fit_is_that_envs_error(run, clean, placement: str, fault: str) -> None:
    """Every env on one worker, stepped as a whole shard (its rows written at once): an observation of the wrong
    shape (one element too many, or a scalar numpy would broadcast across the row) or a reward that is an array
    is an EnvError of its own env (``SyncVectorEnv`` raises too), never written into any row; the other envs'
    results of that step are delivered, and after a reset of that env everything steps on like the references."""

    async def main() -> None:
        refs = [RefEnv(healthy(), i) for i in range(N)]
        async with AsyncVecEnv(fault_fns(fault), num_workers=1, placement=placement) as venv:
            await wait(venv.reset(seed=0))
            acts = np.array([1, 0, 1])
            for _ in range(2):
                obs, *_ = await wait(venv.step(acts))
                for i in range(N):
                    assert_tree_equal(obs[i], refs[i].step(acts[i])[0], f"env {i}")
            with pytest.raises(EnvError) as info:
                await wait(venv.step(acts))
            assert info.value.env_id == FAULT_ENV and info.value.exc_type == "ValueError", info.value
            got = {i: res.obs[k] for res in await wait(venv.drain()) for k, i in enumerate(res.env_ids.tolist())}
            assert sorted(got) == [0, 2]
            for i in (0, 2):
                assert_tree_equal(got[i], refs[i].step(acts[i])[0], f"env {i}")
            await reset_broken_env_and_step_like_refs(venv, refs, acts, 3)
        for ref in refs:
            ref.close()

    run(main())
    assert_clean(clean)


def test_env_exception_through_send_recv_is_raised_once(run, clean) -> None:
    async def main() -> None:
        async with AsyncVecEnv(fault_fns("raise", at_step=1), num_workers=2) as venv:
            await wait(venv.reset(seed=0))
            venv.send(np.zeros(N, dtype=np.int64))
            with pytest.raises(EnvError) as info:
                await wait(venv.recv(N))
            assert info.value.env_id == FAULT_ENV
            rest = await wait(venv.recv(N))  # raised once; the others are still delivered
            assert sorted(rest.env_ids.tolist()) == [0, 2]
            with pytest.raises(EnvStateError):
                await wait(venv.recv())  # nothing outstanding, and no stale error either

    run(main())
    assert_clean(clean)


def test_missing_env_method_or_attribute_does_not_kill_the_worker(run, clean) -> None:
    """Seed defect 10: a missing method is the caller's error, relayed; the worker lives on."""

    async def main() -> None:
        async with aiovec.make("CartPole-v1", N, num_workers=2) as venv:
            await wait(venv.reset(seed=0))
            pids = worker_pids(venv)
            with pytest.raises(EnvError) as info:
                await wait(venv.call("no_such_method", 1, x=2))
            assert info.value.exc_type == "AttributeError" and "no_such_method" in str(info.value)
            with pytest.raises(EnvError) as info:
                await wait(venv.get_attr("no_such_attribute", env_ids=[2]))
            assert info.value.env_id == 2
            with pytest.raises(EnvError):
                await wait(venv.call("step"))  # a method called with the wrong arguments
            assert venv.num_workers == 2 and worker_pids(venv) == pids
            obs, *_ = await wait(venv.step(np.zeros(N, dtype=np.int64)))
            assert obs.shape == (N, 4)
            assert (await wait(venv.get_attr("gravity"))) == (9.8,) * N

    run(main())
    assert_clean(clean)


def test_unknown_command_is_reported_not_a_hang(run_uv, clean) -> None:
    """Seed defect 10 (white box): a command the worker does not know ends in a typed error, never a hang."""

    async def main() -> None:
        async with aiovec.make("CartPole-v1", 2, num_workers=1) as venv:
            await wait(venv.reset(seed=0))
            with pytest.raises(aiovec.AiovecError) as info:
                await wait(venv._pool.request([0], lambda g: (99, tuple(g))))
            assert "unknown command" in str(info.value)
            await wait(venv.close())

    run_uv(main())
    assert_clean(clean)


# -- dead workers ------------------------------------------------------------------------------------
CRASHES = {"exit": ("exitcode", 3), "sigkill": ("signal", signal.SIGKILL), "segfault": ("signal", signal.SIGSEGV)}


@pytest.mark.parametrize("fault", list(CRASHES))
def test_worker_crash_is_reported_with_env_ids_and_exit_status(run, clean, fault: str) -> None:
    field, value = CRASHES[fault]

    async def main() -> None:
        refs = {2: RefEnv(healthy(), 2)}
        venv = AsyncVecEnv(fault_fns(fault), num_workers=2)
        async with venv:
            await wait(venv.reset(seed=0))
            acts = np.ones(N, dtype=np.int64)
            for _ in range(2):
                await wait(venv.step(acts))
                refs[2].step(1)
            dead_pid = next(w["pid"] for w in venv.stats()["workers"] if w["envs"] == 2)
            with pytest.raises(WorkerCrashedError) as info:
                await wait(venv.step(acts))
            err = info.value
            assert err.env_ids == (0, 1), "names every env the dead worker hosted"
            assert getattr(err, field) == value, f"{field}={getattr(err, field)!r}, exitcode={err.exitcode!r}"
            assert "[0, 1]" in str(err)
            if fault == "exit":
                assert "exit code 3" in str(err)
            else:
                assert signal.Signals(value).name in str(err)
            assert wait_pids_gone([dead_pid], 5.0) == []
            # The survivor's transition of the crashed step is kept, and it keeps stepping.
            res = (await wait(venv.drain()))[0]
            assert res.env_ids.tolist() == [2]
            assert_tree_equal(res.obs[0], refs[2].step(1)[0])
            for _ in range(3):
                venv.send(acts[:1], env_ids=[2])
                res = await wait(venv.recv())
                assert res.env_ids.tolist() == [2]
                assert_tree_equal(res.obs[0], refs[2].step(1)[0])
            # The lost envs say why, every time they are used.
            for attempt in (lambda: venv.send(acts[:1], env_ids=[0]), lambda: venv.send(acts)):
                with pytest.raises(WorkerCrashedError):
                    attempt()
            with pytest.raises(WorkerCrashedError):
                await wait(venv.step(acts))
            with pytest.raises(WorkerCrashedError):
                await wait(venv.reset())
            assert venv.num_workers == 1
        # Seed defect 2: leaving the block closes after a crash without hanging (run() has a 60 s guard).
        for ref in refs.values():
            ref.close()

    run(main())
    assert_clean(clean)


def test_worker_crash_under_spawn_and_first_finished_recv(run_uv, clean) -> None:
    """Seed defect 1 under spawn was a bare EOFError: here it is a WorkerCrashedError with the signal."""

    async def main() -> None:
        async with AsyncVecEnv(fault_fns("sigkill", at_step=1), num_workers=3, context="spawn") as venv:
            await wait(venv.reset(seed=0))
            venv.send(np.zeros(N, dtype=np.int64))
            got = []
            with pytest.raises(WorkerCrashedError) as info:
                while len(got) < N:
                    got += (await wait(venv.recv(1))).env_ids.tolist()
            assert info.value.env_ids == (FAULT_ENV,)
            assert info.value.signal == signal.SIGKILL
            got += [i for r in await wait(venv.drain()) for i in r.env_ids.tolist()]
            assert sorted(got) == [0, 2]

    run_uv(main())
    assert_clean(clean)


def test_step_timeout_counts_from_when_the_worker_starts_the_step_not_from_the_send(run_uv, clean) -> None:
    """Two steps queued on one worker, 0.7 s each, step_timeout 1 s: the second starts at 0.7 s and ends at 1.4 s,
    within its limit; counted from its send it was killed at 1.0 s."""
    slow = functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=700.0, obs_dim=4)

    async def main() -> None:
        async with AsyncVecEnv([slow, slow], num_workers=1, step_timeout=1.0) as venv:
            await wait(venv.reset(seed=0))
            venv.send(np.zeros(1, dtype=np.int64), env_ids=[0])
            venv.send(np.zeros(1, dtype=np.int64), env_ids=[1])
            got = [i for r in await wait(venv.drain()) for i in r.env_ids.tolist()]
            assert sorted(got) == [0, 1] and venv.stats()["restarts"] == 0

    run_uv(main())
    assert_clean(clean)


def test_hung_step_is_killed_after_step_timeout(run, clean) -> None:
    async def main() -> None:
        async with AsyncVecEnv(fault_fns("hang", at_step=2, hang_s=3600.0), num_workers=3, step_timeout=1.0) as venv:
            await wait(venv.reset(seed=0))
            await wait(venv.step(np.zeros(N, dtype=np.int64)))
            with pytest.raises(WorkerCrashedError) as info:
                await wait(venv.step(np.zeros(N, dtype=np.int64)))
            err = info.value
            assert err.env_ids == (FAULT_ENV,)
            assert "step_timeout" in str(err)
            res = await wait(venv.drain())
            assert sorted(i for r in res for i in r.env_ids.tolist()) == [0, 2]
            venv.send(np.zeros(2, dtype=np.int64), env_ids=[0, 2])
            assert sorted((await wait(venv.recv(2))).env_ids.tolist()) == [0, 2]

    run(main())
    assert_clean(clean)


def test_close_kills_a_hung_worker(run, clean) -> None:
    """No step_timeout: close() still returns, within its grace period, and kills the hung worker."""

    async def main() -> None:
        venv = AsyncVecEnv(fault_fns("hang", at_step=1, hang_s=3600.0), num_workers=2, close_timeout=1.0)
        await wait(venv.reset(seed=0))
        pids = worker_pids(venv)
        venv.send(np.zeros(N, dtype=np.int64))
        res = await wait(venv.recv(1))  # env 2 answers; envs 0 and 1 wait behind the hung env
        assert res.env_ids.tolist() == [2]
        await wait(venv.close())
        assert venv.closed
        assert wait_pids_gone(pids, 5.0) == []

    run(main())
    assert_clean(clean)


def test_close_with_steps_in_flight_has_released_everything_when_it_returns(run, clean) -> None:
    """close() returns only after its workers, their threads and their queues are gone (checked at once, five times)."""
    slow = functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=5000.0, obs_dim=4)

    async def main() -> None:
        for _ in range(5):
            before = snapshot()
            venv = AsyncVecEnv([slow] * 2, num_workers=1, close_timeout=0.3)
            await wait(venv.reset(seed=0))
            venv.send(np.zeros(2, dtype=np.int64))
            await wait(venv.close())
            assert_clean(before)

    run(main())
    assert_clean(clean)


def _slow_to_make(delay_s: float) -> gym.Env:
    time.sleep(delay_s)
    return gym.make("CartPole-v1")


@pytest.mark.parametrize("pause_s", [0.3, 1.4], ids=["probing env 0", "starting workers"])
def test_close_while_another_task_starts_the_workers_stops_the_start(run, clean, pause_s: float) -> None:
    """``close()`` from one task while another is still starting the vector env (each env takes 1 s to make: env 0's
    probe, then the workers): the start is stopped, its caller gets ``ClosedError``, and when ``close()`` returns
    nothing of it is left (the start used to go on forking workers after ``close()`` had returned)."""

    async def main() -> None:
        venv = AsyncVecEnv([functools.partial(_slow_to_make, 1.0)] * 4, num_workers=4, placement="process")
        starting = asyncio.ensure_future(venv.reset(seed=0))
        await asyncio.sleep(pause_s)
        assert not starting.done()  # the start takes 2 s at least
        await wait(venv.close())
        assert starting.done()
        with pytest.raises(aiovec.ClosedError, match="closed while starting"):
            starting.result()

    run(main())
    assert_clean(clean)


def _running(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_close_cancelled_midway_leaves_no_worker_and_no_task_pending(run, clean) -> None:
    """A second Ctrl-C lands in ``close()``: the workers are killed at once, and no task reaping them is left
    for nobody to await (a worker's ``stop()`` pending when the loop closed printed "Task was destroyed but it
    is pending!" at exit, about one double Ctrl-C in thirty). Cancelled at several points of the close."""

    async def main() -> None:
        ours = asyncio.all_tasks()  # this test's own (and the fixture's)
        for delay in (0.0, 0.001, 0.003, 0.01, 0.03, 0.1):
            venv = AsyncVecEnv([functools.partial(gym.make, "CartPole-v1")] * 4, num_workers=4, placement="process")
            await wait(venv.reset(seed=0))
            pids = [w["pid"] for w in venv.stats()["workers"]]
            closing = asyncio.ensure_future(venv.close())
            await asyncio.sleep(delay)
            closing.cancel()
            await asyncio.gather(closing, return_exceptions=True)
            for _ in range(200):  # the kills land within milliseconds
                alive = [p for p in pids if _running(p)]
                if not alive:
                    break
                await asyncio.sleep(0.01)
            assert not alive, (delay, alive)
            await asyncio.sleep(0.02)  # the deaths are seen: nothing is started to reap them, nothing left pending
            others = [t for t in asyncio.all_tasks() if t not in ours]
            assert not others, (delay, others)
            assert venv.closed

    run(main())
    assert_clean(clean)


# -- cancellation and errors in async with ----------------------------------------------------------
@pytest.mark.parametrize("placement", ["inline", "hybrid"])
def test_a_step_cancelled_after_stepping_in_this_process_leaves_its_results_for_recv(run, clean, placement: str) -> None:
    """In-process stepping finishes within step()'s own turn, before its checkpoint: a cancel that lands there must
    not drop the batch (the envs have moved on), it waits for recv() as a worker's results would; then lock-step
    goes on, every transition equal to SyncVectorEnv's."""
    n = 4

    async def main() -> None:
        ref = gym.vector.SyncVectorEnv([functools.partial(gym.make, "CartPole-v1")] * n)
        ref.reset(seed=7)
        async with aiovec.make("CartPole-v1", n, num_workers=2 if placement == "hybrid" else 1, placement=placement) as venv:
            await wait(venv.reset(seed=7))
            acts = np.array([0, 1, 1, 0])
            for _ in range(100):  # until in-process stepping has measured the envs cheap enough for one turn
                obs, *_ = await wait(venv.step(acts))
                np.testing.assert_array_equal(obs, ref.step(acts)[0])
            for cancel_after in (0, 1, 2, 0, 0):  # the first turn, and later ones (a hybrid batch takes several)
                task = asyncio.ensure_future(venv.step(acts))
                for _ in range(cancel_after + 1):
                    await asyncio.sleep(0)
                task.cancel()
                try:
                    got = await wait(task)
                except asyncio.CancelledError:
                    res = await wait(venv.drain())
                    assert sum(len(r.env_ids) for r in res) == n, [r.env_ids for r in res]
                    rows = {i: (r.obs[k], r.rewards[k]) for r in res for k, i in enumerate(r.env_ids.tolist())}
                    got = (np.stack([rows[i][0] for i in range(n)]), np.array([rows[i][1] for i in range(n)]))
                want = ref.step(acts)
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])
            obs, *_ = await wait(venv.step(acts))
            np.testing.assert_array_equal(obs, ref.step(acts)[0])
        ref.close()

    run(main())


@pytest.mark.parametrize("placement", ["process", "inline"])
def test_a_call_pending_when_the_vector_env_closes_ends_with_an_error(run, clean, placement: str) -> None:
    """close() stops a worker stuck in a hung call (killed after close_timeout, or dropped in-process); the task
    awaiting that call must end with an error, not wait forever."""

    async def main() -> None:
        venv = aiovec.make("aiovec/Fault-v0", 2, num_workers=1, placement=placement, controller=None, close_timeout=0.5,
                           fault="hang", hang_s=3.0)
        await wait(venv.reset(seed=0))
        task = asyncio.ensure_future(venv.call("inject"))
        await asyncio.sleep(0.2)
        await wait(venv.close())
        with pytest.raises((aiovec.errors.ClosedError, WorkerCrashedError)):
            await wait(task)

    run(main())
    if placement == "process":
        assert_clean(clean)


def test_cancelled_step_leaves_results_for_recv(run, clean) -> None:
    fns = [functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=300.0, obs_dim=4) for _ in range(N)]
    ref_fns = [functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=0.0, obs_dim=4) for _ in range(N)]

    async def main() -> None:
        refs = [RefEnv(ref_fns[i], 40 + i) for i in range(N)]
        async with AsyncVecEnv(fns, num_workers=N) as venv:
            await wait(venv.reset(seed=40))
            acts = np.array([0, 1, 0])
            task = asyncio.ensure_future(venv.step(acts))
            await asyncio.sleep(0)  # step() has sent and is waiting
            assert venv.stats()["in_flight"] == N
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await wait(task)
            # Defined state: the step still completes; its results wait for recv/drain.
            with pytest.raises(EnvStateError):
                await wait(venv.step(acts))
            results = await wait(venv.drain())
            seen = {}
            for res in results:
                for k, i in enumerate(res.env_ids.tolist()):
                    assert i not in seen
                    seen[i] = res.obs[k]
            assert sorted(seen) == list(range(N))
            for i in range(N):
                assert_tree_equal(seen[i], refs[i].step(acts[i])[0], f"env {i}")
            # A deadline on step() (wait_for cancels it) behaves the same.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(venv.step(acts), 0.05)
            res = await wait(venv.recv(N))
            assert sorted(res.env_ids.tolist()) == list(range(N))
            for k, i in enumerate(res.env_ids.tolist()):
                assert_tree_equal(res.obs[k], refs[i].step(acts[i])[0], f"env {i}")
            # A cancelled recv loses nothing either.
            venv.send(acts)
            task = asyncio.ensure_future(venv.recv(N))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await wait(task)
            res = await wait(venv.recv(N))
            assert sorted(res.env_ids.tolist()) == list(range(N))
            for k, i in enumerate(res.env_ids.tolist()):
                assert_tree_equal(res.obs[k], refs[i].step(acts[i])[0], f"env {i}")
            # And lock-step goes on.
            obs, *_ = await wait(venv.step(acts))
            for i in range(N):
                assert_tree_equal(obs[i], refs[i].step(acts[i])[0])
        for ref in refs:
            ref.close()

    run(main())
    assert_clean(clean)


def test_exception_inside_async_with_cleans_up(run, clean) -> None:
    fns = [functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=200.0, obs_dim=4) for _ in range(N)]

    async def main() -> None:
        venv = AsyncVecEnv(fns, num_workers=N)
        with pytest.raises(ValueError, match="user code failed"):
            async with venv:
                await wait(venv.reset(seed=0))
                venv.send(np.zeros(N, dtype=np.int64))  # steps in flight when the error hits
                raise ValueError("user code failed")
        assert venv.closed and venv.num_workers == 0
        # Also with a hung worker inside the block.
        venv = AsyncVecEnv(fault_fns("hang", at_step=1, hang_s=3600.0), num_workers=2, close_timeout=0.5)
        with pytest.raises(KeyError):
            async with venv:
                await wait(venv.reset(seed=0))
                venv.send(np.zeros(N, dtype=np.int64))
                await wait(venv.recv(1))
                raise KeyError("boom")
        assert venv.closed

    run(main())
    assert_clean(clean)


def test_cancelling_the_task_inside_async_with_cleans_up(run, clean) -> None:
    fns = [functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=200.0, obs_dim=4) for _ in range(N)]
    holder: dict[str, Any] = {}

    async def body() -> None:
        async with AsyncVecEnv(fns, num_workers=N) as venv:
            holder["venv"] = venv
            await venv.reset(seed=0)
            while True:
                await venv.step(np.zeros(N, dtype=np.int64))

    async def main() -> None:
        task = asyncio.ensure_future(body())
        while "venv" not in holder or holder["venv"].stats()["steps"] < N:
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wait(task)
        assert holder["venv"].closed

    run(main())
    assert_clean(clean)


# -- the parent dies ----------------------------------------------------------------------------------
PARENT_SCRIPT = """
import asyncio, json, sys
import numpy as np
import aiovec

async def main(context, busy):
    kwargs = {{"wait_ms": 60000.0}} if busy else {{}}
    venv = aiovec.make("aiovec/Sleep-v0", 4, num_workers=2, context=context, obs_dim=4, **kwargs)
    await venv.reset(seed=0)
    if busy:
        venv.send(np.zeros(4, dtype=np.int64))  # workers are inside a 60 s step when the parent dies
    else:
        await venv.step(np.zeros(4, dtype=np.int64))
    print(json.dumps([w["pid"] for w in venv.stats()["workers"]]), flush=True)
{body}

if __name__ == "__main__":
    aiovec.run(main(sys.argv[1], sys.argv[2] == "1"))
"""


def _start_script(tmp_path: Path, body: str, *args: str) -> subprocess.Popen:
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(PARENT_SCRIPT.format(body=body)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path, preexec_fn=default_signals)


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise AssertionError(f"the script printed nothing within {timeout} s")
        line = proc.stdout.readline()
    finally:
        sel.close()
    if not line:
        raise AssertionError(f"the script exited ({proc.wait(5)}) without printing: {proc.stderr.read()}")
    return line


def _descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _reap_script(proc: subprocess.Popen, everything: list[int]) -> None:
    """Teardown of a child-script test: the script and every process it started are gone."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    _kill_all(everything)
    proc.stdout.close()
    proc.stderr.close()


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.mark.parametrize(("context", "busy"), [("forkserver", False), ("forkserver", True), ("spawn", True)], ids=["forkserver-idle", "forkserver-busy", "spawn-busy"])
def test_workers_exit_when_the_parent_is_sigkilled(tmp_path: Path, clean, context: str, busy: bool) -> None:
    """Seed defect 3: no orphans. The parent is SIGKILLed, so nothing of it can clean up."""
    proc = _start_script(tmp_path, "    await asyncio.sleep(600)", context, "1" if busy else "0")
    everything: list[int] = []
    try:
        pids = json.loads(_read_line(proc, 60.0))
        assert len(pids) == 2 and all(not pid_gone(p) for p in pids)
        everything = _descendants(proc.pid)
        assert set(pids) <= set(everything)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        still = wait_pids_gone(pids, 5.0)
        assert still == [], f"workers {still} outlived their SIGKILLed parent"
        rest = wait_pids_gone(everything, 10.0)
        assert rest == [], f"helper processes {rest} outlived their SIGKILLed parent"
    finally:
        _reap_script(proc, everything)
    assert_clean(clean)


CTRL_C_BODY = """
    async with venv:
        while True:
            if busy:
                await venv.recv(4)  # the 60 s steps sent above: Ctrl-C arrives inside them
            await venv.step(np.zeros(4, dtype=np.int64))
"""


@pytest.mark.parametrize("busy", [False, True], ids=["fast-steps", "slow-steps"])
def test_ctrl_c_stops_the_script_and_its_workers(tmp_path: Path, clean, busy: bool) -> None:
    """aiovec.run(main()) + Ctrl-C: the script exits, ``async with`` closes the workers."""
    proc = _start_script(tmp_path, CTRL_C_BODY, "forkserver", "1" if busy else "0")
    everything: list[int] = []
    try:
        pids = json.loads(_read_line(proc, 60.0))
        everything = _descendants(proc.pid)
        time.sleep(0.2)  # let it step a little
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError("the script did not exit within 30 s of Ctrl-C") from None
        stderr = proc.stderr.read()
        assert proc.returncode != 0  # interrupted, reported as such
        assert "KeyboardInterrupt" in stderr or proc.returncode == -signal.SIGINT, stderr
        assert "leaked" not in stderr, stderr
        assert "Future exception was never retrieved" not in stderr, stderr
        still = wait_pids_gone(pids, 5.0)
        assert still == [], f"workers {still} survived Ctrl-C of their parent"
    finally:
        _reap_script(proc, everything)
    assert_clean(clean)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_never_closed_env_does_not_outlive_its_loop(loop_name: str, clean) -> None:
    """An env the caller forgot to close: its workers go when the env is garbage-collected."""

    async def main() -> list[int]:
        venv = AsyncVecEnv([functools.partial(gym.make, "CartPole-v1")] * 2, num_workers=2)
        await wait(venv.reset(seed=0))
        return worker_pids(venv)

    pids = run_on(loop_name, main())
    gc.collect()
    assert wait_pids_gone(pids, 5.0) == [], "workers of an unreferenced, unclosed env keep running"


def _fault_env_marking_close(i: int, marks: str) -> gym.Env:
    """A hanging FaultEnv whose close() leaves a file ``marks/closed-i`` (factories are pickled: a file, not a list)."""
    env = gym.make("aiovec/Fault-v0", fault="hang", hang_s=0.6)
    inner_close = env.close

    def close() -> None:
        Path(marks, f"closed-{i}").touch()
        inner_close()

    env.close = close
    return env


def test_inline_envs_busy_in_a_helper_thread_at_close_are_closed_when_it_ends(run, clean, tmp_path: Path) -> None:
    """close() cannot interrupt an inline env's command running in a helper thread (a hung in-process env cannot
    be killed); once that command ends, the thread closes the envs (they were never closed)."""

    async def main() -> None:
        fns = [functools.partial(_fault_env_marking_close, i, str(tmp_path)) for i in range(2)]
        venv = aiovec.AsyncVecEnv(fns, num_workers=1, placement="inline", controller=None, close_timeout=0.1)
        await wait(venv.reset(seed=0))
        for f in tmp_path.iterdir():  # env 0's probe copy
            f.unlink()
        task = asyncio.ensure_future(venv.call("inject"))
        await asyncio.sleep(0.1)
        await wait(venv.close())
        with pytest.raises(aiovec.errors.ClosedError):
            await wait(task)
        for _ in range(100):
            if len(list(tmp_path.iterdir())) == 2:
                break
            await asyncio.sleep(0.05)
        assert sorted(f.name for f in tmp_path.iterdir()) == ["closed-0", "closed-1"]

    run(main())
