"""Misuse is rejected with a clear, typed error, before anything is sent, and leaves a usable env.

Seed defects covered here: 4 (fewer actions than envs), 5 (reset while a step is
pending), 1 under ``fork`` (refused), 11 (timeouts: a deadline that expires loses
nothing).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import RefEnv, _live_children, assert_clean, assert_row_matches, assert_tree_equal, wait
from gymnasium.vector import SyncVectorEnv

import aiovec
from aiovec import (
    AiovecError,
    AsyncVecEnv,
    ClosedError,
    ConfigError,
    EnvStateError,
    InvalidActionError,
    StepTimeoutError,
)

N = 3
WAIT_LONG = 30.0
CARTPOLE = functools.partial(gym.make, "CartPole-v1")
PENDULUM = functools.partial(gym.make, "Pendulum-v1")


def assert_idle(venv: AsyncVecEnv) -> None:
    st = venv.stats()
    assert st["in_flight"] == 0 and st["ready"] == 0, st


# -- invalid actions -------------------------------------------------------------------------
BAD_DISCRETE = {
    "too_few": np.zeros(N - 1, dtype=np.int64),  # seed defect 4: zip() would truncate silently
    "too_many": np.zeros(N + 1, dtype=np.int64),
    "empty": [],
    "scalar": 0,
    "2d": np.zeros((N, 1), dtype=np.int64),
    "float": np.zeros(N, dtype=np.float64),
    "string": np.array(["a"] * N),
    "ragged": [[0], [0, 1], []],
    "above_range": np.array([0, 2, 1]),
    "negative": np.array([0, -1, 1]),
    "huge": np.array([0, 1, 2**40]),
}
BAD_BOX = {
    "too_few": np.zeros((N - 1, 1), dtype=np.float32),
    "flat": np.zeros(N, dtype=np.float32),  # Pendulum wants (N, 1)
    "3d": np.zeros((N, 1, 1), dtype=np.float32),
    "string": np.array([["x"]] * N),
    "object": np.array([[None]] * N, dtype=object),
}


@pytest.mark.parametrize("bad", list(BAD_DISCRETE))
def test_invalid_discrete_actions_rejected_before_sending(run_uv, clean, bad: str) -> None:
    sync = SyncVectorEnv([CARTPOLE] * N)

    async def main() -> None:
        async with AsyncVecEnv([CARTPOLE] * N, num_workers=2) as venv:
            obs, _ = await wait(venv.reset(seed=3))
            assert_tree_equal(obs, sync.reset(seed=3)[0])
            for attempt in ("step", "send"):
                with pytest.raises(InvalidActionError):
                    if attempt == "step":
                        await wait(venv.step(BAD_DISCRETE[bad]))
                    else:
                        venv.send(BAD_DISCRETE[bad])
                assert_idle(venv)
            with pytest.raises(InvalidActionError):
                venv.send(np.array([5]), env_ids=[1])  # out of range, through a subset
            assert_idle(venv)
            # Nothing was applied: the trajectory continues exactly as gymnasium's.
            for t in range(5):
                acts = np.array([t % 2, 1, 0])
                got = await wait(venv.step(acts))
                want = sync.step(acts)
                for g, w in zip(got[:4], want[:4], strict=True):
                    assert_tree_equal(g, w, f"step {t}")

    try:
        run_uv(main())
    finally:
        sync.close()
    assert_clean(clean)


@pytest.mark.parametrize("bad", list(BAD_BOX))
def test_invalid_box_actions_rejected_before_sending(run_uv, clean, bad: str) -> None:
    async def main() -> None:
        async with AsyncVecEnv([PENDULUM] * N, num_workers=1) as venv:
            await wait(venv.reset(seed=0))
            with pytest.raises(InvalidActionError):
                venv.send(BAD_BOX[bad])
            assert_idle(venv)
            obs, *_ = await wait(venv.step(np.zeros((N, 1), dtype=np.float32)))
            assert obs.shape == (N, 3)

    run_uv(main())
    assert_clean(clean)


def test_invalid_action_error_is_a_value_error_and_names_the_problem(run_uv, clean) -> None:
    async def main() -> None:
        async with AsyncVecEnv([CARTPOLE] * N, num_workers=1) as venv:
            await wait(venv.reset(seed=0))
            with pytest.raises(ValueError, match=r"expected 3 actions.*got 2"):
                venv.send([0, 1])
            with pytest.raises(InvalidActionError, match="outside"):
                venv.send([0, 1, 7])

    run_uv(main())
    assert_clean(clean)


# -- state machine ----------------------------------------------------------------------------
def test_send_to_busy_or_unreceived_env_raises(run, clean) -> None:
    async def main() -> None:
        async with AsyncVecEnv([CARTPOLE] * N, num_workers=2) as venv:
            await wait(venv.reset(seed=0))
            venv.send(np.zeros(1, dtype=np.int64), env_ids=[1])
            with pytest.raises(EnvStateError, match="env 1"):
                venv.send(np.zeros(1, dtype=np.int64), env_ids=[1])
            with pytest.raises(EnvStateError, match="env 1"):
                venv.send(np.zeros(N, dtype=np.int64))  # all envs, one of them busy
            assert venv.stats()["in_flight"] == 1  # the refused sends sent nothing, not even to idle envs
            res = await wait(venv.recv())
            assert res.env_ids.tolist() == [1]
            # A result that arrived but was not received yet: still not idle.
            venv.send(np.zeros(1, dtype=np.int64), env_ids=[2])
            while venv.stats()["ready"] == 0:
                await asyncio.sleep(0.01)
            with pytest.raises(EnvStateError, match="env 2"):
                venv.send(np.zeros(1, dtype=np.int64), env_ids=[2])
            assert (await wait(venv.recv())).env_ids.tolist() == [2]
            await wait(venv.step(np.zeros(N, dtype=np.int64)))  # everything idle again

    run(main())
    assert_clean(clean)


@pytest.mark.parametrize("env_ids", [[3], [-1], [0, 0], [], [[0, 1]], [0.5], ["a"]], ids=str)
def test_bad_env_ids_rejected(run_uv, clean, env_ids: Any) -> None:
    async def main() -> None:
        async with AsyncVecEnv([CARTPOLE] * N, num_workers=1) as venv:
            await wait(venv.reset(seed=0))
            with pytest.raises(AiovecError):
                venv.send(np.zeros(max(len(env_ids), 1), dtype=np.int64), env_ids=env_ids)
            assert_idle(venv)
            with pytest.raises(AiovecError):
                await wait(venv.get_attr("gravity", env_ids=env_ids))
            await wait(venv.step(np.zeros(N, dtype=np.int64)))

    run_uv(main())
    assert_clean(clean)


def test_recv_with_nothing_in_flight_raises(run, clean) -> None:
    async def main() -> None:
        async with AsyncVecEnv([CARTPOLE] * N, num_workers=1) as venv:
            await wait(venv.reset(seed=0))
            with pytest.raises(EnvStateError, match="nothing in flight"):
                await wait(venv.recv())
            await wait(venv.step(np.zeros(N, dtype=np.int64)))
            with pytest.raises(EnvStateError):
                await wait(venv.recv())  # step() received everything
            venv.send(np.zeros(N, dtype=np.int64))
            await wait(venv.recv(N))
            with pytest.raises(EnvStateError):
                await wait(venv.recv(1))
            assert await wait(venv.drain()) == []

    run(main())
    assert_clean(clean)


def test_step_while_steps_in_flight_raises(run, clean) -> None:
    async def main() -> None:
        async with AsyncVecEnv([CARTPOLE] * N, num_workers=2) as venv:
            await wait(venv.reset(seed=0))
            venv.send(np.zeros(1, dtype=np.int64), env_ids=[0])
            with pytest.raises(EnvStateError):
                await wait(venv.step(np.zeros(N, dtype=np.int64)))
            st = venv.stats()
            assert st["in_flight"] + st["ready"] == 1, "the refused step sent nothing"
            res = await wait(venv.recv())
            assert res.env_ids.tolist() == [0]
            await wait(venv.step(np.zeros(N, dtype=np.int64)))

    run(main())
    assert_clean(clean)


def test_reset_while_step_in_flight_raises_and_keeps_protocol_in_sync(run, clean) -> None:
    """Seed defect 5: a reset during a pending step must not shift replies from then on."""

    async def main() -> None:
        refs = [RefEnv(CARTPOLE, 20 + i) for i in range(N)]
        async with AsyncVecEnv([CARTPOLE] * N, num_workers=2) as venv:
            await wait(venv.reset(seed=20))
            acts = np.array([1, 0, 1])
            venv.send(acts)
            with pytest.raises(EnvStateError):
                await wait(venv.reset(seed=99))
            with pytest.raises(EnvStateError):  # a mask that includes a stepping env
                await wait(venv.reset(options={"reset_mask": np.array([False, True, False])}))
            res = await wait(venv.recv(N))
            for k, i in enumerate(res.env_ids.tolist()):
                want = refs[i].step(acts[i])
                assert_tree_equal(res.obs[k], want[0], f"env {i}: the step's own result")
                assert res.rewards[k] == want[1]
            # A result not yet received also blocks a reset.
            venv.send(acts[:1], env_ids=[0])
            while venv.stats()["ready"] == 0:
                await asyncio.sleep(0.01)
            with pytest.raises(EnvStateError):
                await wait(venv.reset())
            res = await wait(venv.recv())
            assert_tree_equal(res.obs[0], refs[0].step(acts[0])[0])
            # Now a reset works, and later steps line up with the reference.
            obs, _ = await wait(venv.reset(seed=7))
            for i in range(N):
                assert_tree_equal(obs[i], refs[i].reset(seed=7 + i)[0])
            for t in range(3):
                obs, rew, *_ = await wait(venv.step(acts))
                for i in range(N):
                    want = refs[i].step(acts[i])
                    assert_tree_equal(obs[i], want[0], f"step {t} env {i}")
        for ref in refs:
            ref.close()

    run(main())
    assert_clean(clean)


def test_operations_before_start_are_refused(run_uv, clean) -> None:
    async def main() -> None:
        venv = AsyncVecEnv([CARTPOLE] * N, num_workers=1)
        with pytest.raises(EnvStateError, match="not started"):
            venv.send(np.zeros(N, dtype=np.int64))
        with pytest.raises(EnvStateError, match="not started"):
            await wait(venv.recv())
        with pytest.raises(EnvStateError, match="not started"):
            await wait(venv.step(np.zeros(N, dtype=np.int64)))
        await wait(venv.reset(seed=0))  # reset starts it
        assert venv.num_workers == 1
        await wait(venv.close())

    run_uv(main())
    assert_clean(clean)


# -- after close --------------------------------------------------------------------------------
def test_every_call_after_close_raises_closed_error(run, clean) -> None:
    async def main() -> None:
        venv = AsyncVecEnv([CARTPOLE] * N, num_workers=2)
        async with venv:
            await wait(venv.reset(seed=0))
            venv.send(np.zeros(1, dtype=np.int64), env_ids=[0])  # closed with a step in flight
        assert venv.closed
        assert venv.num_workers == 0
        acts = np.zeros(N, dtype=np.int64)
        with pytest.raises(ClosedError):
            await wait(venv.reset(seed=0))
        with pytest.raises(ClosedError):
            await wait(venv.step(acts))
        with pytest.raises(ClosedError):
            venv.send(acts)
        with pytest.raises(ClosedError):
            await wait(venv.recv())
        with pytest.raises(ClosedError):
            await wait(venv.drain())
        with pytest.raises(ClosedError):
            await wait(venv.call("render"))
        with pytest.raises(ClosedError):
            await wait(venv.get_attr("gravity"))
        with pytest.raises(ClosedError):
            await wait(venv.set_attr("gravity", 1.0))
        with pytest.raises(ClosedError):
            await wait(venv.start())
        with pytest.raises(ClosedError):
            async with venv:
                pass
        await wait(venv.close())  # idempotent
        st = venv.stats()  # still answers after close, with what happened before it
        assert st["num_envs"] == N and st["num_workers"] == 0 and st["placement"] == "closed"

    run(main())
    assert_clean(clean)


def test_drain_after_close_with_nothing_outstanding_raises_closed_error(run_uv, clean) -> None:
    async def main() -> None:
        venv = AsyncVecEnv([CARTPOLE] * N, num_workers=1)
        async with venv:
            await wait(venv.reset(seed=0))
        with pytest.raises(ClosedError):
            await wait(venv.drain())

    run_uv(main())
    assert_clean(clean)


def test_close_never_started_and_awaiting_recv_woken_by_close(run, clean) -> None:
    async def main() -> None:
        venv = AsyncVecEnv([CARTPOLE] * N, num_workers=1)
        await wait(venv.close())  # never started
        assert venv.closed
        slow = functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=5000.0, obs_dim=4)
        venv = AsyncVecEnv([slow] * 2, num_workers=1, close_timeout=0.5)
        await wait(venv.reset(seed=0))
        venv.send(np.zeros(2, dtype=np.int64))
        pending = asyncio.ensure_future(venv.recv())
        await asyncio.sleep(0)
        await wait(venv.close())
        with pytest.raises(ClosedError):
            await wait(pending)

    run(main())
    assert_clean(clean)


# -- configuration ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0},
        {"batch_size": -1},
        {"batch_size": N + 1},
        {"batch_size": 1.5},
        {"num_workers": 0},
        {"num_workers": -2},
        {"num_workers": "many"},
        {"num_workers": True},
        {"autoreset_mode": "x"},
        {"context": "fork"},
        {"context": "nonsense"},
        {"step_timeout": 0},
        {"step_timeout": -1.0},
        {"close_timeout": 0},
        {"spin": "sometimes"},
    ],
    ids=lambda kw: ",".join(f"{k}={v!r}" for k, v in kw.items()),
)
def test_bad_config_values_raise_config_error(clean, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        AsyncVecEnv([CARTPOLE] * N, **kwargs)
    with pytest.raises(ConfigError):
        aiovec.make("CartPole-v1", N, **kwargs)
    assert_clean(clean)


def test_fork_is_refused_with_the_reason(clean) -> None:
    """Seed defect 1 comes from fork: aiovec refuses it and says why."""
    with pytest.raises(ConfigError, match="fork.*(forkserver|spawn)"):
        AsyncVecEnv([CARTPOLE] * N, context="fork")
    assert_clean(clean)


@pytest.mark.parametrize("num_envs", [0, -1, 1.0, True])
def test_bad_num_envs_raises_config_error(clean, num_envs: Any) -> None:
    with pytest.raises(ConfigError):
        aiovec.make("CartPole-v1", num_envs)
    assert_clean(clean)


def test_bad_env_factories_raise_config_error(clean) -> None:
    with pytest.raises(ConfigError):
        AsyncVecEnv([])
    with pytest.raises(ConfigError):
        AsyncVecEnv([CARTPOLE, "CartPole-v1"])  # type: ignore[list-item]

    def broken() -> gym.Env:
        raise RuntimeError("no simulator here")

    with pytest.raises(ConfigError, match="no simulator here"):
        AsyncVecEnv([broken])
    assert_clean(clean)


def test_bad_env_id_in_make_raises_config_error(clean) -> None:
    with pytest.raises(ConfigError, match="NoSuchEnv-v0"):
        aiovec.make("NoSuchEnv-v0", 2)
    with pytest.raises(ConfigError):
        aiovec.make("aiovec/NoSuchEnv-v0", 2)
    assert_clean(clean)


def test_unpicklable_factory_raises_helpful_config_error(clean) -> None:
    lock = threading.Lock()

    def factory() -> gym.Env:
        with lock:
            return gym.make("CartPole-v1")

    with pytest.raises(ConfigError) as info:
        AsyncVecEnv([factory] * 2)
    msg = str(info.value)
    assert "env_fns[0]" in msg
    assert "pickl" in msg.lower()
    assert "lock" in msg.lower()
    assert "factory" in msg.lower()  # says what to do about it
    assert_clean(clean)


def test_bad_reset_arguments_raise_config_error(run_uv, clean) -> None:
    async def main() -> None:
        async with AsyncVecEnv([CARTPOLE] * N, num_workers=1) as venv:
            with pytest.raises(ConfigError):
                await wait(venv.reset(seed=[1, 2]))
            for mask in ([True, False, True], np.array([1, 0, 1]), np.array([True, False]), np.zeros(N, dtype=bool)):
                with pytest.raises(ConfigError):
                    await wait(venv.reset(options={"reset_mask": mask}))
            obs, _ = await wait(venv.reset(seed=[1, 2, 3]))
            assert obs.shape == (N, 4)
            await wait(venv.step(np.zeros(N, dtype=np.int64)))

    run_uv(main())
    assert_clean(clean)


def test_factory_failing_in_a_worker_fails_start_cleanly(run_uv, clean) -> None:
    # Only env_fns[0] is called in this process (for the spaces); env 2's factory first runs in a worker.
    def make(k: int) -> Any:
        def f() -> gym.Env:
            if k == 2:
                raise RuntimeError("env 2 cannot start in a worker")
            return gym.make("CartPole-v1")

        return f

    async def main() -> None:
        venv = AsyncVecEnv([make(k) for k in range(N)], num_workers=2)
        with pytest.raises(AiovecError, match="env 2 cannot start in a worker") as info:
            await wait(venv.reset(seed=0))
        assert "env 2" in str(info.value)
        await wait(venv.close())

    run_uv(main())
    assert_clean(clean)


# -- deadlines -----------------------------------------------------------------------------------
def test_recv_timeout_loses_nothing_and_late_result_keeps_its_env_id(run, clean) -> None:
    waits = [0.0, 1500.0, 0.0]  # far beyond the 50 ms timeouts below, however loaded the machine
    fns = [functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=w, obs_dim=4) for w in waits]

    async def main() -> None:
        refs = [RefEnv(fns[i], 30 + i) for i in range(3)]
        async with AsyncVecEnv(fns, num_workers=3) as venv:
            await wait(venv.reset(seed=30))
            venv.send(np.array([1]), env_ids=[1])
            with pytest.raises(StepTimeoutError):
                await venv.recv(timeout=0.05)
            assert venv.stats()["in_flight"] == 1
            # StepTimeoutError is an asyncio.TimeoutError, so generic timeout handling catches it.
            with pytest.raises(asyncio.TimeoutError):
                await venv.recv(timeout=0.01)
            # Fast envs keep working meanwhile.
            venv.send(np.array([0, 1]), env_ids=[2, 0])
            res = await wait(venv.recv(2, timeout=WAIT_LONG))
            assert sorted(res.env_ids.tolist()) == [0, 2]
            for k, i in enumerate(res.env_ids.tolist()):
                assert_tree_equal(res.obs[k], refs[i].step({2: 0, 0: 1}[i])[0])
            late = await wait(venv.recv(timeout=WAIT_LONG))
            assert late.env_ids.tolist() == [1]
            want = refs[1].step(1)
            assert_tree_equal(late.obs[0], want[0])
            assert late.rewards[0] == want[1]
            assert_idle(venv)

    run(main())
    assert_clean(clean)


def test_recv_timeout_with_partial_batch_keeps_ready_results(run, clean) -> None:
    waits = [0.0, 1500.0]  # far beyond the 100 ms timeout below, however loaded the machine
    fns = [functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=w, obs_dim=4) for w in waits]

    async def main() -> None:
        async with AsyncVecEnv(fns, num_workers=2) as venv:
            await wait(venv.reset(seed=0))
            venv.send(np.zeros(2, dtype=np.int64))
            with pytest.raises(StepTimeoutError):
                await venv.recv(2, timeout=0.1)  # env 0 is ready, env 1 is not
            got = []
            for r in await wait(venv.drain(timeout=WAIT_LONG)):
                got += r.env_ids.tolist()
            assert sorted(got) == [0, 1], "each result exactly once"
            assert_idle(venv)

    run(main())
    assert_clean(clean)


@pytest.mark.parametrize("n", [3, aiovec.spaces.SMALL_BATCH, aiovec.spaces.SMALL_BATCH + 1, 64])
def test_action_fast_path_checks_both_ends_of_a_discrete_space(n: int) -> None:
    """The checker's fast path (an array of the buffer's dtype) still rejects -1 and n, at any batch size."""
    checker = aiovec.spaces.ActionChecker(gym.spaces.Discrete(2), n)
    good = np.ones(n, dtype=np.int64)
    assert checker(good, n) is good  # accepted as is: no copy
    for bad_value in (-1, 2, np.iinfo(np.int64).min):
        bad = good.copy()
        bad[n // 2] = bad_value
        with pytest.raises(InvalidActionError, match=f"position {n // 2} is outside"):
            checker(bad, n)


# -- what the caller hands over is the caller's -----------------------------------------------
@pytest.mark.parametrize("placement", ["inline", "process", "hybrid"])
def test_send_keeps_its_own_copy_of_the_env_ids(run_uv, clean, placement: str) -> None:
    """A caller that refills its id array right after ``send`` (or reuses ``r.env_ids``) changes nothing sent."""
    refs = [RefEnv(CARTPOLE, 5 + i) for i in range(4)]
    workers = {"inline": 1, "process": 2, "hybrid": 2}[placement]

    async def main() -> None:
        async with AsyncVecEnv([CARTPOLE] * 4, num_workers=workers, placement=placement) as venv:
            await wait(venv.reset(seed=5))
            for ids_in, refill in (([0], [3]), ([1, 2], [0, 3])):
                ids = np.array(ids_in)
                venv.send(np.ones(len(ids), dtype=np.int64), env_ids=ids)
                ids[:] = refill
                r = await wait(venv.recv(len(ids_in)))
                assert sorted(r.env_ids.tolist()) == ids_in
                for k, i in enumerate(r.env_ids.tolist()):
                    assert_row_matches(r, k, refs[i].step(1), f"env {i}")
            assert_idle(venv)
            await wait(venv.step(np.zeros(4, dtype=np.int64)))  # every env idle, none stuck stepping

    run_uv(main())
    assert_clean(clean)


def test_a_second_close_returns_only_when_the_first_has_finished(run, clean) -> None:
    slow = functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=3000.0, obs_dim=4)

    async def main() -> None:
        venv = AsyncVecEnv([slow] * 2, num_workers=2, close_timeout=0.5)
        await wait(venv.reset(seed=0))
        venv.send(np.zeros(2, dtype=np.int64))  # the workers are busy: the first close waits, then kills
        first = asyncio.ensure_future(venv.close())
        await asyncio.sleep(0)
        await wait(venv.close())
        assert first.done()
        assert not [p for p in _live_children() if p.pid not in clean.pids]
        await wait(first)

    run(main())
    assert_clean(clean)


def test_bad_reset_seeds_and_options_are_refused_before_anything_is_sent(run_uv, clean) -> None:
    async def main() -> None:
        async with AsyncVecEnv([CARTPOLE] * N, num_workers=1) as venv:
            obs, _ = await wait(venv.reset(seed=[np.int64(1), 2, None]))  # numpy ints and None are seeds too
            for bad in ("abc", -5, True, 1.5, [1, 2.5, 3], [0, -1, 2], [True, 1, 2], {"a": 1}, object()):
                with pytest.raises(ConfigError, match="seed"):
                    await wait(venv.reset(seed=bad))
                assert_idle(venv)
            with pytest.raises(ConfigError, match="options"):
                await wait(venv.reset(options=[1, 2]))
            again, _ = await wait(venv.reset(seed=[1, 2, 3]))  # nothing broke: the envs reset as seeded
            assert_tree_equal(again[:2], obs[:2])
            venv.send(np.zeros(N, dtype=np.int64))
            for bad in ("x", -1.0, True):
                with pytest.raises(ConfigError, match="timeout"):
                    await wait(venv.recv(timeout=bad))
                with pytest.raises(ConfigError, match="timeout"):
                    await wait(venv.drain(timeout=bad))
            results = await wait(venv.drain())
            assert sorted(i for r in results for i in r.env_ids.tolist()) == list(range(N))

    run_uv(main())
    assert_clean(clean)


class _ByteActions(gym.Env):
    """Actions a uint8 Box: the env sees exactly the value sent, or the test fails."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(0, 255, (2,), np.uint8)

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.seen.append(np.asarray(action).tolist())
        return np.zeros(1, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize("acts", [np.array([[300, 1], [0, 0]]), np.array([[0, -1], [0, 0]]), np.array([[1e300, 0], [0, 0]])],
                         ids=["above_uint8", "below_uint8", "float_for_ints"])
def test_box_actions_the_buffer_dtype_cannot_hold_are_refused_not_wrapped(run_uv, clean, acts: np.ndarray) -> None:
    async def main() -> list[list[int]]:
        async with AsyncVecEnv([_ByteActions] * 2, placement="inline") as venv:
            await wait(venv.reset(seed=0))
            with pytest.raises(InvalidActionError):
                venv.send(acts)
            assert_idle(venv)
            await wait(venv.step(np.array([[255, 0], [7, 8]], dtype=np.int64)))  # in range: passed as it is
            return await wait(venv.get_attr("seen"))

    seen = run_uv(main())
    assert list(seen) == [[[255, 0]], [[7, 8]]]
    assert_clean(clean)


def test_float_box_actions_pass_as_numpy_casts_them() -> None:
    """Out of bounds and inf are the env's business; only integer Boxes are range-checked against their dtype."""
    space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    out = aiovec.spaces.validate_actions(space, np.array([[-5.0], [np.inf]]), 2)
    assert out.tolist() == [[-5.0], [np.inf]]


@pytest.mark.parametrize("placement", ["process", "hybrid", "inline"])
def test_a_start_cancelled_while_workers_start_leaves_the_envs_to_a_later_start(run_uv, clean, placement: str) -> None:
    """``wait_for(venv.reset(), t)`` timing out while the workers build their envs: the workers that start had
    begun are stopped, and that is no loss of the envs (they were LOST for good, every later call raised
    ``WorkerCrashedError`` about workers aiovec had killed itself): the next ``reset()`` starts afresh."""

    async def main() -> None:
        kw = {"num_workers": 1 if placement == "inline" else 2}
        venv = aiovec.make("aiovec/SlowStart-v0", 4, placement=placement, start_s=0.3, **kw)
        try:
            with pytest.raises(asyncio.TimeoutError):  # env 0's probe takes 0.3 s, then the workers build theirs
                await asyncio.wait_for(venv.reset(seed=0), 0.45)
            assert venv.num_workers == 0
            obs, _ = await wait(venv.reset(seed=0))
            assert obs.shape[0] == 4 and (venv._table.state == 0).all()
            await wait(venv.step(np.zeros(4, dtype=np.int64)))
        finally:
            await wait(venv.close())

    run_uv(main())
    assert_clean(clean)


def test_a_cancelled_start_leaves_the_other_waiting_task_to_start_it(run, clean) -> None:
    """Two tasks await ``start()``; the one doing the work is cancelled: the other is not, and starts the env."""

    async def main() -> None:
        venv = aiovec.make("aiovec/SlowStart-v0", 2, num_workers=1, start_s=0.3)
        try:
            first = asyncio.ensure_future(venv.start())
            await asyncio.sleep(0.05)  # env 0 is being built in a helper thread
            second = asyncio.ensure_future(venv.start())
            await asyncio.sleep(0)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            await wait(second)  # not cancelled: it started the env itself
            assert venv.num_workers == 1
            obs, _ = await wait(venv.reset(seed=0))
            assert obs.shape[0] == 2
        finally:
            await wait(venv.close())

    run(main())
    assert_clean(clean)


@pytest.mark.parametrize("placement", ["inline", "process"])
def test_a_masked_reset_gives_envs_still_stepping_zeros_not_a_row_being_written(run_uv, clean, placement: str) -> None:
    """Env 1 keeps stepping while env 0 is reset: its row is zeros (its observation comes with recv()), not a row
    a worker is writing, nor one not yet received; the idle env 2 keeps its last observation."""
    slow = functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=200.0, obs_dim=4)

    async def main() -> None:
        async with AsyncVecEnv([slow] * 3, num_workers=1 if placement == "inline" else 2, placement=placement) as venv:
            first, _ = await wait(venv.reset(seed=0))
            venv.send(np.zeros(1, dtype=np.int64), env_ids=[1])
            obs, infos = await wait(venv.reset(seed=5, options={"reset_mask": np.array([True, False, False])}))
            assert (obs[1] == 0).all()
            assert_tree_equal(obs[2], first[2])
            r = await wait(venv.recv())
            assert r.env_ids.tolist() == [1] and not (r.obs[0] == 0).all()

    run_uv(main())
    assert_clean(clean)


def test_infos_gymnasium_cannot_batch_arrive_as_objects_and_lose_nothing() -> None:
    """Arrays of other shapes per env, or an int beyond int64: object arrays, one value per env (raised, the error
    would cost the batch's transitions, already taken from the table)."""
    infos = aiovec.infos.batch_infos(3, [(0, {"a": np.zeros(1)}), (1, {"a": np.zeros(2)}), (2, {"b": 2**64})])
    assert infos["a"].dtype == object and infos["a"][1].shape == (2,) and infos["_a"].tolist() == [True, True, False]
    assert infos["b"][2] == 2**64 and infos["_b"].tolist() == [False, False, True]
    packed = aiovec.protocol.pack_infos([{"big": 2**64}, {"big": 1}])
    assert isinstance(packed, list)  # not records: they travel as they are


class _OddInfos(gym.Env):
    """Infos gymnasium cannot batch: an int beyond int64 on every step, arrays whose shape is the env's own."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, width: int = 1) -> None:
        self.width = width

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(1, np.float32), 1.0, False, False, {"big": 2**64, "wide": np.zeros(self.width)}


def test_odd_infos_lose_no_transition_in_this_process(run_uv, clean) -> None:
    fns = [functools.partial(_OddInfos, width=w) for w in (1, 2)]

    async def main() -> None:
        async with AsyncVecEnv(fns, placement="inline") as venv:
            await wait(venv.reset(seed=0))
            for _ in range(3):
                venv.send(np.zeros(2, dtype=np.int64))
                got = sorted(i for r in await wait(venv.drain()) for i in r.env_ids.tolist())
                assert got == [0, 1]
            *_, infos = await wait(venv.step(np.zeros(2, dtype=np.int64)))
            assert infos["big"].tolist() == [2**64, 2**64] and [w.shape for w in infos["wide"]] == [(1,), (2,)]

    run_uv(main())
    assert_clean(clean)
