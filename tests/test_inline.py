"""In-process placements ("inline": every env here; "hybrid": one shard here, the others in
processes): same results as SyncVectorEnv, typed errors, moves every way."""

from __future__ import annotations

import asyncio
import os
import time

import gymnasium as gym
import numpy as np
import pytest
from conftest import assert_clean, wait
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec import ConfigError, EnvError
from aiovec.machine import available_cpus

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def _compare(got: tuple, want: tuple, t: int) -> None:
    for k, (a, b) in enumerate(zip(got[:4], want[:4], strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {t}, field {k}")
    assert sorted(got[4]) == sorted(want[4]), f"step {t}: info keys {sorted(got[4])} != {sorted(want[4])}"
    for key, value in want[4].items():
        if key in ("final_obs", "final_info"):
            continue
        np.testing.assert_array_equal(got[4][key], value, err_msg=f"step {t}, info {key}")


def _compare_reset(got: tuple, want: tuple) -> None:
    np.testing.assert_array_equal(got[0], want[0], err_msg="reset obs")
    assert sorted(got[1]) == sorted(want[1])


@pytest.mark.parametrize("placement", ["inline", "hybrid"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_inline_equals_sync_vector_env(run, clean, mode: AutoresetMode, env_id: str, placement: str) -> None:
    n = 5

    async def main() -> None:
        ref = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * n, autoreset_mode=mode)
        workers = 1 if placement == "inline" else 3
        async with aiovec.make(env_id, n, placement=placement, num_workers=workers, autoreset_mode=mode) as venv:
            assert venv.placement == placement and venv.num_workers == workers
            if placement == "hybrid":
                kinds = sorted(w["kind"] for w in venv.stats()["workers"])
                assert kinds == ["inline", "process", "process"] and [w["envs"] for w in venv.stats()["workers"]] == [2, 2, 1]
            _compare_reset(await wait(venv.reset(seed=3)), ref.reset(seed=3))
            space = ref.action_space
            space.seed(1)
            for t in range(300):
                actions = space.sample()
                got, want = await wait(venv.step(actions)), ref.step(actions)
                _compare(got, want, t)
                if mode == AutoresetMode.DISABLED and (want[2] | want[3]).any():
                    mask = want[2] | want[3]
                    _compare_reset(await wait(venv.reset(options={"reset_mask": mask})), ref.reset(options={"reset_mask": mask}))
            venv._table.check()
        ref.close()

    run(main())
    assert_clean(clean)


def test_auto_places_cheap_envs_inline_and_respects_opt_outs(run_uv, clean) -> None:
    async def main() -> None:
        async with aiovec.make("CartPole-v1", 4) as venv:  # num_workers="auto": cheap envs, few of them
            assert venv.placement == "inline" and isinstance(venv.controller, aiovec.MeasuredController)  # inline is one of its rungs
        async with aiovec.make("CartPole-v1", 4, step_timeout=5.0) as venv:  # a hung env must stay killable
            assert venv.placement == "process"
        async with aiovec.make("CartPole-v1", 4, placement="process") as venv:  # isolation asked for
            assert venv.placement == "process"
        async with aiovec.make("aiovec/Sleep-v0", 4) as venv:  # envs that wait overlap in processes
            assert venv.placement == "process"
        async with aiovec.make("CartPole-v1", 4, num_workers=2) as venv:  # an explicit count means processes
            assert venv.placement == "process" and venv.num_workers == 2
        # envs that compute, too costly for this process alone: it steps one shard, processes the others
        async with aiovec.make("aiovec/Busy-v0", 4, cpu_ms=0.2) as venv:
            two = available_cpus() > 1
            assert venv.placement == ("hybrid" if two else "inline") and venv.num_workers == min(available_cpus(), 4)
            assert isinstance(venv.controller, aiovec.MeasuredController)  # hybrid is one of its rungs
        async with aiovec.make("aiovec/Busy-v0", 4, cpu_ms=0.2, placement="process") as venv:
            assert venv.placement == "process"
        async with aiovec.make("aiovec/Busy-v0", 4, cpu_ms=1.0) as venv:  # one step would hold the loop 1 ms
            assert venv.placement == "process"
        async with aiovec.make("CartPole-v1", 4, placement="inline") as venv:  # chosen: nothing left to tune
            assert venv.placement == "inline" and venv.controller is None

    run_uv(main())
    assert_clean(clean)


def test_inline_refuses_what_it_cannot_honour(clean) -> None:
    with pytest.raises(ConfigError, match="step_timeout"):
        aiovec.make("CartPole-v1", 2, placement="inline", step_timeout=1.0)
    with pytest.raises(ConfigError, match="placement"):
        aiovec.make("CartPole-v1", 2, placement="elsewhere")
    with pytest.raises(ConfigError, match="num_workers >= 2"):
        aiovec.make("CartPole-v1", 2, placement="hybrid", num_workers=1)
    assert_clean(clean)


def test_inline_env_error_is_typed_and_the_others_go_on(run_uv, clean) -> None:
    async def main() -> None:
        venv = aiovec.make("aiovec/Fault-v0", 3, placement="inline", fault="raise", at_step=3)
        async with venv:
            await wait(venv.reset(seed=0))
            for _ in range(2):
                await wait(venv.step(np.zeros(3, dtype=np.int64)))
            with pytest.raises(EnvError) as info:
                await wait(venv.step(np.zeros(3, dtype=np.int64)))
            assert info.value.env_id in (0, 1, 2) and "injected" in str(info.value).lower()
            obs, _ = await wait(venv.reset(seed=1))  # a reset clears the broken envs
            assert obs.shape == (3, venv.single_observation_space.shape[0])

    run_uv(main())
    assert_clean(clean)


def test_moves_between_inline_and_processes_keep_trajectories(run_uv, clean) -> None:
    n = 4

    async def main() -> None:
        ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n)
        async with aiovec.make("CartPole-v1", n, num_workers=2) as venv:
            _compare_reset(await wait(venv.reset(seed=5)), ref.reset(seed=5))
            rng = np.random.default_rng(0)
            plan = {20: ("inline", 1), 300: ("hybrid", 2), 600: ("process", 2), 900: ("hybrid", 3), 1200: ("inline", 1)}
            for t in range(1500):
                if t in plan:
                    where, k = plan[t]
                    await wait(venv.resize(k, placement=where))
                actions = rng.integers(0, 2, n)
                _compare(await wait(venv.step(actions)), ref.step(actions), t)
            assert venv.stats()["moves"] >= 3 * n  # envs moved in every direction
            venv._table.check()
        ref.close()

    run_uv(main())
    assert_clean(clean)


def _normalized_cartpole() -> gym.Env:
    return gym.wrappers.NormalizeReward(gym.wrappers.NormalizeObservation(gym.make("CartPole-v1")))


def test_moves_carry_the_wrappers_state(run_uv, clean) -> None:
    """A moved env is rebuilt by its factory; its wrappers' running statistics move with it, so
    normalised observations and rewards stay those of SyncVectorEnv with the same wrappers."""
    n = 4

    async def main() -> None:
        ref = gym.vector.SyncVectorEnv([_normalized_cartpole] * n)
        async with aiovec.AsyncVecEnv([_normalized_cartpole] * n, num_workers=2) as venv:
            _compare_reset(await wait(venv.reset(seed=5)), ref.reset(seed=5))
            rng = np.random.default_rng(0)
            plan = {30: ("process", 1), 300: ("hybrid", 2), 600: ("process", 2)}
            for t in range(900):
                if t in plan:
                    where, k = plan[t]
                    await wait(venv.resize(k, placement=where))
                actions = rng.integers(0, 2, n)
                got, want = await wait(venv.step(actions)), ref.step(actions)
                for k, (a, b) in enumerate(zip(got[:4], want[:4], strict=True)):
                    np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=f"step {t}, field {k}")
            assert venv.stats()["moves"] >= 6  # 2 envs in each of the three resizes
        ref.close()

    run_uv(main())
    assert_clean(clean)


@pytest.mark.parametrize("placement", ["inline", "hybrid"])
def test_first_finished_recv_inline_returns_each_env_once(run_uv, clean, placement: str) -> None:
    async def main() -> None:
        async with aiovec.make("CartPole-v1", 6, placement=placement, num_workers=2, batch_size=2) as venv:
            await wait(venv.reset(seed=0))
            for _ in range(20):
                venv.send(np.zeros(6, dtype=np.int64))
                seen = []
                for _ in range(3):
                    r = await wait(venv.recv())
                    assert len(r.env_ids) == 2
                    seen += r.env_ids.tolist()
                assert sorted(seen) == list(range(6))
            with pytest.raises(aiovec.EnvStateError):
                await wait(venv.recv())

    run_uv(main())
    assert_clean(clean)


def test_close_while_inline_steps_are_queued(run_uv, clean) -> None:
    async def main() -> None:
        venv = aiovec.make("CartPole-v1", 64, placement="inline")
        await wait(venv.reset(seed=0))
        venv.send(np.zeros(64, dtype=np.int64))  # runs in slices: some of it is still queued
        await wait(venv.close())
        assert venv.closed and venv.num_workers == 0
        await asyncio.sleep(0.05)  # nothing scheduled by the closed worker runs any more

    run_uv(main())
    assert_clean(clean)


@pytest.mark.parametrize("variant", [{}, {"ragged": True}, {"numpy_bool": True}], ids=["same-keys", "ragged-keys", "numpy-bool"])
@pytest.mark.parametrize("placement", ["inline", "process", "hybrid"])
def test_step_infos_equal_sync_vector_env_key_by_key_and_dtype(run_uv, clean, variant: dict, placement: str) -> None:
    """Infos on every step (packed by workers when every env returns the same scalar keys) batch exactly
    as gymnasium's: same keys, masks, values and dtypes (float32 stays float32, bools stay bools)."""
    n = 5

    async def main() -> None:
        make = lambda: gym.make("aiovec/Info-v0", episode_len=7, **variant)  # noqa: E731
        ref = gym.vector.SyncVectorEnv([make] * n)
        async with aiovec.AsyncVecEnv([make] * n, placement=placement, num_workers=2 if placement != "inline" else "auto") as venv:
            _compare_reset(await wait(venv.reset(seed=2)), ref.reset(seed=2))
            rng = np.random.default_rng(0)
            for t in range(40):
                actions = rng.integers(0, 2, n)
                got, want = await wait(venv.step(actions)), ref.step(actions)
                _compare(got, want, t)
                for key, value in want[4].items():
                    assert got[4][key].dtype == value.dtype, (t, key, got[4][key].dtype, value.dtype)
        ref.close()

    run_uv(main())
    assert_clean(clean)


def test_a_next_step_autoreset_is_not_replayed_elsewhere(run_uv, clean) -> None:
    """Next-step autoreset skips the generator snapshot a replay needs; such an env is never at an episode
    boundary until its next step ends one, and exporting it in between says so instead of moving it wrong."""
    async def main() -> None:
        async with aiovec.make("CartPole-v1", 2, placement="inline") as venv:
            await venv.reset(seed=0)
            host = venv._pool.workers[next(iter(venv._pool.workers))].handle._host
            ended = False
            while not ended:  # push left until env 0's episode ends
                _, _, terms, truncs, _ = await venv.step(np.zeros(2, dtype=np.int64))
                ended = bool(terms[0] or truncs[0])
            assert venv._table.movable(0) and host.slots[0].export()["kind"] == "ended"
            await venv.step(np.zeros(2, dtype=np.int64))  # env 0 resets (next-step mode)
            assert not venv._table.movable(0)
            with pytest.raises(RuntimeError, match="only move at the end of its episode"):
                host.slots[0].export()

    run_uv(main())
    assert_clean(clean)


def test_one_slow_step_does_not_move_the_slice_estimate_two_in_a_row_do() -> None:
    """The per-env cost that sizes slices ignores one slow step (the host busy for a moment: otherwise the
    next batches of cheap envs leave the in-turn path), follows two at once, and falls back slowly."""
    from aiovec.backends.inline import PerEnvCost

    cost = PerEnvCost(250e-6)
    for _ in range(200):
        cost.add(80e-6, 8)  # 10 us an env
    assert cost.per_env_s == pytest.approx(10e-6, rel=0.01)
    cost.add(400e-6, 8)  # one hiccup: 50 us an env
    assert cost.per_env_s == pytest.approx(10e-6, rel=0.01)
    cost.add(80e-6, 8)
    cost.add(320e-6, 8)  # the env got costlier: 40 us, then 45 us an env
    cost.add(360e-6, 8)
    assert cost.per_env_s == pytest.approx(40e-6)  # raised at once, to the lower of the two
    cost.add(80e-6, 8)  # and back: it falls slowly
    assert 10e-6 < cost.per_env_s < 40e-6
    cost.add(0.0, 0)  # nothing stepped: nothing learned
    assert 10e-6 < cost.per_env_s < 40e-6


def _schedstat_fds() -> int:
    fds = os.listdir("/proc/self/fd")
    out = 0
    for fd in fds:
        try:
            out += os.readlink(f"/proc/self/fd/{fd}").endswith("/schedstat")
        except OSError:
            continue
    return out


@pytest.mark.parametrize("placement", ["inline", "hybrid"])
def test_closing_an_env_stepped_in_this_process_closes_its_run_queue_clock(run_uv, clean, placement: str) -> None:
    """Each in-process host reads this thread's schedstat through a file it opened: close() closes it."""
    before = _schedstat_fds()

    async def main() -> None:
        for _ in range(3):
            async with aiovec.make("CartPole-v1", 4, num_workers=1 if placement == "inline" else 2, placement=placement) as venv:
                await wait(venv.reset(seed=0))
                await wait(venv.step(np.zeros(4, dtype=np.int64)))
                assert _schedstat_fds() > before  # the clock is open while the env runs here

    run_uv(main())
    assert _schedstat_fds() == before
    assert_clean(clean)


@pytest.mark.parametrize("env_id", ["aiovec/Busy-v0", "aiovec/Info-v0"])
def test_steps_stepped_in_this_process_count_as_the_callers_demand(run_uv, clean, env_id: str) -> None:
    """The controller skips intervals in which the caller asked for few steps (its demand: time with a step in
    flight). A tight loop over envs stepped in the caller's turn asks for steps all the time, whether or not the
    envs return infos (MuJoCo and ALE do, every step): their batches left the turn as a worker's reply, after
    stepping, and counted ~0 s, so an env moved into this process was never measured again and stayed there."""

    async def main() -> float:
        async with aiovec.make(env_id, 4, placement="inline", env_kwargs={"cpu_ms": 0.05, "obs_dim": 8}) as venv:
            await wait(venv.reset(seed=0))
            actions = np.zeros(4, dtype=np.int64)
            await wait(venv.step(actions))
            busy0, t0 = venv._busy_time(), time.perf_counter()
            for _ in range(300):
                await venv.step(actions)
            return (venv._busy_time() - busy0) / (time.perf_counter() - t0)

    assert run_uv(main()) > 0.5
