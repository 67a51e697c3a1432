"""The public API against gymnasium's own SyncVectorEnv and in-process reference envs.

Seed defects covered here (see shared/docs/seed.md): 6 (no barrier: first-finished
recv), 7 (observations travel through shared memory, not pickles), 8 (final
observation kept, terminated and truncated apart), 9 (gymnasium API and seeding),
11 (per-env step and reset, no divisibility constraint).
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
import pytest
from conftest import RefEnv, assert_clean, assert_rows_match, assert_tree_equal, batch_reference_infos, pid_gone, wait
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import aiovec
from aiovec import AsyncVecEnv, EnvStateError, StepResult

N = 5  # not divisible by 2 or 3 workers

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "cartpole": ("CartPole-v1", {"max_episode_steps": 30}),  # Discrete actions, terminations and truncations
    "pendulum": ("Pendulum-v1", {"max_episode_steps": 15}),  # continuous actions, truncations
    "frozenlake": ("FrozenLake-v1", {}),  # Discrete observations, infos ({"prob": ...})
}
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def factory(case: str) -> functools.partial:
    env_id, kwargs = CASES[case]
    return functools.partial(gym.make, env_id, **kwargs)


def action_table(space: spaces.Space, n: int, steps: int, seed: int = 0) -> np.ndarray:
    """``table[t]``: a batch of ``n`` valid actions for step ``t`` (float32 for Box, like the buffer)."""
    rng = np.random.default_rng(seed)
    if isinstance(space, spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=(steps, n))
    assert isinstance(space, spaces.Box)
    return rng.uniform(space.low, space.high, size=(steps, n, *space.shape)).astype(space.dtype)


# -- lock-step == gymnasium.vector.SyncVectorEnv -----------------------------------------
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_lockstep_matches_sync_vector_env(run, clean, case: str, num_workers: int, mode: AutoresetMode) -> None:
    fn = factory(case)
    seed: int | list[int] = 42 if num_workers != 2 else [11, 5, 3, 8, 2]
    steps = 60
    sync = SyncVectorEnv([fn] * N, autoreset_mode=mode)
    table = action_table(sync.single_action_space, N, steps)

    async def main() -> tuple[int, int]:
        venv = AsyncVecEnv([fn] * N, num_workers=num_workers, autoreset_mode=mode)
        async with venv:
            assert venv.num_envs == N
            assert venv.num_workers == num_workers
            assert venv.single_observation_space == sync.single_observation_space
            assert venv.single_action_space == sync.single_action_space
            assert venv.observation_space == sync.observation_space
            assert venv.action_space == sync.action_space
            assert venv.metadata["autoreset_mode"] == mode == sync.metadata["autoreset_mode"]

            obs, infos = await wait(venv.reset(seed=seed))
            sobs, sinfos = sync.reset(seed=seed)
            assert_tree_equal(obs, sobs, "reset obs")
            assert_tree_equal(infos, sinfos, "reset infos")
            dones = finals = masked_resets = 0
            for t in range(steps):
                got = await wait(venv.step(table[t]))
                want = sync.step(table[t])
                for name, g, w in zip(("obs", "rewards", "terminations", "truncations", "infos"), got, want, strict=True):
                    assert_tree_equal(g, w, f"step {t} {name}")
                done = want[2] | want[3]
                dones += int(done.sum())
                finals += int("final_obs" in want[4])
                if mode == AutoresetMode.DISABLED and done.any():
                    reset_seed = None if masked_resets % 2 == 0 else 1000 + t
                    masked_resets += 1
                    obs, infos = await wait(venv.reset(seed=reset_seed, options={"reset_mask": done.copy()}))
                    sobs, sinfos = sync.reset(seed=reset_seed, options={"reset_mask": done.copy()})
                    assert_tree_equal(obs, sobs, f"masked reset after step {t}: obs")
                    assert_tree_equal(infos, sinfos, f"masked reset after step {t}: infos")
        return dones, finals

    try:
        dones, finals = run(main())
    finally:
        sync.close()
    assert dones > 0, "the run should cross episode boundaries, or autoreset is not tested"
    if mode == AutoresetMode.SAME_STEP:
        assert finals > 0
    assert_clean(clean)


@pytest.mark.parametrize("seed", [7, [3, 1, 4, 15, 9]], ids=["int", "list"])
def test_seeds_match_gymnasium_and_differ_between_envs(run, clean, seed: int | list[int]) -> None:
    fn = factory("cartpole")
    sync = SyncVectorEnv([fn] * N)
    sobs, _ = sync.reset(seed=seed)
    sync.close()

    async def main() -> None:
        async with AsyncVecEnv([fn] * N, num_workers=2) as venv:
            obs, _ = await wait(venv.reset(seed=seed))
            assert_tree_equal(obs, sobs)
            if isinstance(seed, int):
                # The seed's SubprocVecEnv users gave every env one seed; here env i gets seed + i.
                assert len({row.tobytes() for row in obs}) == N
            # Same seed, same start: reset is reproducible.
            obs2, _ = await wait(venv.reset(seed=seed))
            assert_tree_equal(obs2, obs)
            # No seed: envs still start apart.
            obs3, _ = await wait(venv.reset())
            assert len({row.tobytes() for row in obs3}) == N

    run(main())
    assert_clean(clean)


# -- send / recv -------------------------------------------------------------------------
async def interleaved(venv: AsyncVecEnv, fn: Any, seed: int, table: np.ndarray, rng: np.random.Generator | None) -> list[list[tuple]]:
    """Step every env ``len(table)`` times through send/recv, in random subsets and batch sizes.

    Every delivered row is checked against an in-process reference env of the same
    id stepped with the same actions. ``rng=None``: lock-step ``step()`` instead.
    Returns each env's trajectory.
    """
    n, steps = venv.num_envs, len(table)
    refs = [RefEnv(fn, seed + i) for i in range(n)]
    traj: list[list[tuple]] = [[] for _ in range(n)]
    try:
        obs, infos = await wait(venv.reset(seed=seed))
        for i, ref in enumerate(refs):
            assert_tree_equal(obs[i], np.asarray(ref.reset_obs, dtype=obs.dtype), f"env {i} reset obs")
        assert_tree_equal(infos, batch_reference_infos([ref.reset_info for ref in refs]), "reset infos")
        if rng is None:
            for t in range(steps):
                o, r, te, tr, inf = await wait(venv.step(table[t]))
                res = StepResult(o, r, te, tr, inf, np.arange(n))
                assert_rows_match(res, [refs[i].step(table[t][i]) for i in range(n)], f"step {t}")
                for i in range(n):
                    traj[i].append((o[i], r[i], te[i], tr[i]))
            return traj
        sent = [0] * n
        received = [0] * n
        in_flight: set[int] = set()
        while any(s < steps for s in sent) or in_flight:
            candidates = [i for i in range(n) if i not in in_flight and sent[i] < steps]
            if candidates:
                k = int(rng.integers(1, len(candidates) + 1))
                ids = [int(i) for i in rng.permutation(candidates)[:k]]  # any order, not sorted
                venv.send(np.stack([table[sent[i]][i] for i in ids]), env_ids=ids)
                in_flight.update(ids)
                for i in ids:
                    sent[i] += 1
            bs = None if rng.random() < 0.3 else int(rng.integers(1, n + 1))
            expect = min(venv.batch_size if bs is None else bs, len(in_flight))
            res = await wait(venv.recv(bs))
            assert isinstance(res, StepResult)
            ids = res.env_ids.tolist()
            assert len(ids) == expect, f"recv({bs}) returned {len(ids)} rows with {len(in_flight)} outstanding"
            assert len(set(ids)) == len(ids), f"an env delivered twice in one batch: {ids}"
            assert set(ids) <= in_flight, f"delivered envs {ids} that had nothing in flight ({sorted(in_flight)})"
            assert len(res.rewards) == len(res.terminations) == len(res.truncations) == len(res.obs) == len(ids)
            wants = []
            for k, i in enumerate(ids):
                wants.append(refs[i].step(table[received[i]][i]))
                traj[i].append((res.obs[k], res.rewards[k], res.terminations[k], res.truncations[k]))
                received[i] += 1
                in_flight.discard(i)
            assert_rows_match(res, wants, f"recv({bs}) of envs {ids} at steps {[received[i] - 1 for i in ids]}")
        assert received == sent == [steps] * n, "every transition is delivered exactly once"
        st = venv.stats()
        assert st["in_flight"] == 0 and st["ready"] == 0
        with pytest.raises(EnvStateError):
            await wait(venv.recv())
        return traj
    finally:
        for ref in refs:
            ref.close()


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("case", ["cartpole", "frozenlake"])
def test_send_recv_subsets_match_reference(run, clean, case: str, num_workers: int) -> None:
    fn = factory(case)
    steps = 25
    table = action_table(fn().action_space, N, steps, seed=1)

    async def main() -> None:
        async with AsyncVecEnv([fn] * N, num_workers=num_workers, batch_size=2) as venv:
            assert venv.batch_size == 2
            traj = await interleaved(venv, fn, 100, table, np.random.default_rng(num_workers))
            assert all(len(t) == steps for t in traj)

    run(main())
    assert_clean(clean)


def test_determinism_independent_of_workers_and_interleaving(run_uv, clean) -> None:
    fn = factory("frozenlake")
    steps = 30
    table = action_table(fn().action_space, N, steps, seed=2)

    async def one(num_workers: int, rng: np.random.Generator | None) -> list[list[tuple]]:
        async with AsyncVecEnv([fn] * N, num_workers=num_workers, batch_size=3) as venv:
            return await interleaved(venv, fn, 5, table, rng)

    async def main() -> None:
        base = await one(1, None)
        for nw, rng in ((3, np.random.default_rng(7)), (2, np.random.default_rng(8)), (1, np.random.default_rng(9))):
            other = await one(nw, rng)
            for i in range(N):
                assert len(other[i]) == len(base[i]) == steps
                for t, (a, b) in enumerate(zip(base[i], other[i], strict=True)):
                    for x, y in zip(a, b, strict=True):
                        assert x == y, f"env {i} step {t} differs with num_workers={nw}: {a} vs {b}"

    run_uv(main())
    assert_clean(clean)


def test_recv_batch_size_default_and_fewer_outstanding(run, clean) -> None:
    async def main() -> None:
        async with aiovec.make("CartPole-v1", N, num_workers=2, batch_size=2) as venv:
            await wait(venv.reset(seed=0))
            venv.send(np.zeros(N, dtype=np.int64))
            seen = []
            for expect in (2, 2, 1):  # the last recv gets only what is left
                res = await wait(venv.recv())
                assert len(res.env_ids) == expect
                seen += res.env_ids.tolist()
            assert sorted(seen) == list(range(N))
            venv.send(np.zeros(3, dtype=np.int64), env_ids=[4, 0, 2])
            res = await wait(venv.recv(5))  # more than outstanding: all three
            assert sorted(res.env_ids.tolist()) == [0, 2, 4]

    run(main())
    assert_clean(clean)


def test_first_finished_results_do_not_wait_for_the_slowest_env(run, clean) -> None:
    """Seed defect 6: results are consumed as they arrive, not at a barrier."""
    waits = [1000.0, 0.0, 0.0]
    fns = [functools.partial(gym.make, "aiovec/Sleep-v0", wait_ms=w, obs_dim=4) for w in waits]

    async def main() -> None:
        async with AsyncVecEnv(fns, num_workers=3) as venv:
            await wait(venv.reset(seed=0))
            venv.send(np.ones(3, dtype=np.int64))
            first = await wait(venv.recv(2))
            assert sorted(first.env_ids.tolist()) == [1, 2]
            assert venv.stats()["in_flight"] == 1  # the slow env is still stepping
            # The fast envs can go again while the slow one is busy.
            venv.send(np.ones(2, dtype=np.int64), env_ids=[1, 2])
            again = await wait(venv.recv(2))
            assert sorted(again.env_ids.tolist()) == [1, 2]
            last = await wait(venv.recv(1))
            assert last.env_ids.tolist() == [0]

    run(main())
    assert_clean(clean)


def test_per_env_reset_while_other_envs_step(run, clean) -> None:
    """Seed defect 11: per-env step and per-env reset, the rest of the vector keeps going."""
    fn = factory("cartpole")

    async def main() -> None:
        refs = [RefEnv(fn, 10 + i) for i in range(N)]
        async with AsyncVecEnv([fn] * N, num_workers=2) as venv:
            await wait(venv.reset(seed=10))
            venv.send(np.array([1, 0]), env_ids=[0, 1])
            mask = np.array([False, False, True, True, True])
            obs, infos = await wait(venv.reset(seed=50, options={"reset_mask": mask}))
            for i in (2, 3, 4):
                ref_obs, _ = refs[i].reset(seed=50 + i)
                assert_tree_equal(obs[i], ref_obs)
            res = await wait(venv.recv(2))
            assert_rows_match(res, [refs[i].step([1, 0][i]) for i in res.env_ids.tolist()], "recv")
            o, r, te, tr, _ = await wait(venv.step(np.ones(N, dtype=np.int64)))
            for i in range(N):
                want = refs[i].step(1)
                assert_tree_equal(o[i], want[0])
                assert r[i] == want[1]
        for ref in refs:
            ref.close()

    run(main())
    assert_clean(clean)


# -- autoreset semantics (seed defect 8) ------------------------------------------------------
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP], ids=lambda m: m.value)
def test_truncation_kept_apart_from_termination_and_final_obs_kept(run, clean, mode: AutoresetMode) -> None:
    # Env 0 is truncated by its time limit after 5 steps; env 1 (always pushed left) terminates by falling.
    fns = [functools.partial(gym.make, "CartPole-v1", max_episode_steps=5), functools.partial(gym.make, "CartPole-v1")]

    async def main() -> None:
        refs = [RefEnv(fns[i], i) for i in range(2)]
        seen_trunc = seen_term = False
        async with AsyncVecEnv(fns, num_workers=2, autoreset_mode=mode) as venv:
            await wait(venv.reset(seed=0))
            for t in range(20):
                obs, rew, term, trunc, infos = await wait(venv.step(np.zeros(2, dtype=np.int64)))
                for i in range(2):
                    if mode == AutoresetMode.NEXT_STEP:
                        want = refs[i].step(0)
                        assert_tree_equal(obs[i], want[0])
                        assert (term[i], trunc[i]) == (want[2], want[3]), f"step {t} env {i}"
                    else:
                        o, r, te, tr, _ = refs[i].env.step(0)
                        assert (term[i], trunc[i]) == (te, tr), f"step {t} env {i}"
                        assert rew[i] == r
                        if te or tr:
                            assert infos["_final_obs"][i]
                            assert_tree_equal(infos["final_obs"][i], o, "final obs")
                            o, _ = refs[i].env.reset()
                        else:
                            assert "_final_obs" not in infos or not infos["_final_obs"][i]
                        assert_tree_equal(obs[i], o)
                seen_trunc |= bool(trunc[0]) and not bool(term[0])
                seen_term |= bool(term[1]) and not bool(trunc[1])
                assert not trunc[1]  # env 1 falls long before its 500-step limit
        for ref in refs:
            ref.close()
        assert seen_trunc and seen_term

    run(main())
    assert_clean(clean)


def test_disabled_mode_requires_reset_of_finished_envs(run, clean) -> None:
    async def main() -> None:
        venv = aiovec.make("CartPole-v1", 2, num_workers=1, autoreset_mode=AutoresetMode.DISABLED, max_episode_steps=3)
        async with venv:
            await wait(venv.reset(seed=0))
            for _ in range(3):
                _, _, _, trunc, _ = await wait(venv.step(np.zeros(2, dtype=np.int64)))
            assert trunc.all()
            with pytest.raises(EnvStateError, match="reset"):
                venv.send(np.zeros(2, dtype=np.int64))
            assert venv.stats()["in_flight"] == 0
            await wait(venv.reset(options={"reset_mask": np.array([True, False])}))
            venv.send(np.zeros(1, dtype=np.int64), env_ids=[0])  # env 0 may go again, env 1 not yet
            res = await wait(venv.recv())
            assert res.env_ids.tolist() == [0]
            assert not res.truncations[0]

    run(main())
    assert_clean(clean)


# -- data path (seed defect 7) ------------------------------------------------------------------
def test_observations_travel_through_shared_memory_not_pickles(run, clean) -> None:
    """An env whose observations refuse to be pickled still works: nothing per step is pickled."""

    class _NoPickle(np.ndarray):
        def __reduce__(self) -> Any:
            raise TypeError("this observation must not be pickled: it should travel through shared memory")

    class NoPickleObsEnv(gym.Env):  # defined here, so cloudpickle sends the class by value
        def __init__(self) -> None:
            self.observation_space = spaces.Box(-np.inf, np.inf, (256,), np.float32)
            self.action_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
            self.t = 0

        def _obs(self, value: float) -> np.ndarray:
            return np.full(256, value, np.float32).view(_NoPickle)

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
            super().reset(seed=seed)
            self.t = 0
            return self._obs(float(seed or 0)), {}

        def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
            assert isinstance(action, np.ndarray) and action.shape == (3,) and action.dtype == np.float32
            self.t += 1
            return self._obs(float(action.sum()) + self.t), float(self.t), False, False, {}

    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(NoPickleObsEnv()._obs(1.0))

    async def main() -> None:
        async with AsyncVecEnv([NoPickleObsEnv] * 3, num_workers=2) as venv:
            obs, _ = await wait(venv.reset(seed=[1, 2, 3]))
            np.testing.assert_array_equal(obs[:, 0], [1, 2, 3])
            acts = np.array([[0.1, 0.2, 0.3], [0.0, 0.0, 0.0], [-1.0, 0.5, 0.25]], np.float32)
            for t in range(1, 4):
                obs, rew, _, _, _ = await wait(venv.step(acts))
                np.testing.assert_allclose(obs[:, 0], acts.sum(axis=1) + t, rtol=1e-6)
                np.testing.assert_array_equal(rew, [t] * 3)
            assert obs.shape == (3, 256)

    run(main())
    assert_clean(clean)


class ActionEcho(gym.Env):
    """Observes its last action as it arrived: its value in float64 and its dtype's size (a float32 Box)."""

    observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(2), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.array([float(action[0] * 3), action.dtype.itemsize]), 0.0, False, False, {}


@pytest.mark.parametrize("placement", ["inline", "process", "hybrid"])
def test_actions_reach_the_env_in_the_callers_dtype_as_sync_vector_env_passes_them(run_uv, clean, placement: str) -> None:
    """float64 actions for a float32 Box arrive as float64 rows, float32 ones as float32, whichever API sent them,
    as ``SyncVectorEnv`` hands over rows of the caller's array: so a float64 policy's trajectories (Pendulum's too)
    equal ``SyncVectorEnv``'s, not those of actions rounded to float32 on the way."""
    n = 4
    rng = np.random.default_rng(0)
    acts64 = rng.uniform(-2, 2, (60, n, 1))

    async def main() -> None:
        kw = {"num_workers": 2} if placement == "hybrid" else {}
        async with AsyncVecEnv([ActionEcho] * n, placement=placement, **kw) as venv:
            await wait(venv.reset(seed=0))
            ref = SyncVectorEnv([ActionEcho] * n)
            ref.reset(seed=0)
            for a in (acts64[0], acts64[1].astype(np.float32), acts64[2]):
                assert_tree_equal((await wait(venv.step(a)))[0], ref.step(a)[0])
            venv.send(acts64[3][:2], np.array([0, 1]))
            venv.send(acts64[3][2:].astype(np.float32), np.array([2, 3]))
            got = {int(i): r.obs[k] for r in await wait(venv.drain()) for k, i in enumerate(r.env_ids)}
            want = ref.step(np.concatenate([acts64[3][:2], acts64[3][2:].astype(np.float32).astype(np.float64)]))[0]
            assert [got[i][1] for i in range(n)] == [8.0, 8.0, 4.0, 4.0]
            assert [got[i][0] for i in range(n)] == [want[0][0], want[1][0],
                                                      float(acts64[3][2, 0].astype(np.float32) * 3), float(acts64[3][3, 0].astype(np.float32) * 3)]
            ref.close()
        async with aiovec.make("Pendulum-v1", n, placement=placement, **kw) as venv:
            ref = gym.make_vec("Pendulum-v1", n, vectorization_mode="sync")
            assert_tree_equal((await wait(venv.reset(seed=3)))[0], ref.reset(seed=3)[0])
            for t, a in enumerate(acts64):
                got, want = (await wait(venv.step(a)))[:2], ref.step(a)[:2]
                assert_tree_equal(got, want, f"step {t}")
            ref.close()

    run_uv(main())
    assert_clean(clean)


class OneElementFlags(gym.Env):
    """Returns ``terminated`` as a one-element array (``np.abs(x) > 1`` for a shape-(1,) state): numpy stores it in a
    bool row, so ``SyncVectorEnv`` takes it."""

    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.x = np.zeros(1, np.float32)
        return self.x.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.x += 0.4 + 0.1 * int(action)
        return self.x.copy(), 1.0, np.abs(self.x) > 1.0, False, {}


@pytest.mark.parametrize("placement", ["inline", "process", "hybrid"])
def test_one_element_array_flags_are_taken_as_sync_vector_env_takes_them(run_uv, clean, placement: str) -> None:
    async def main() -> None:
        kw = {"num_workers": 2} if placement == "hybrid" else {}
        async with AsyncVecEnv([OneElementFlags] * 4, placement=placement, **kw) as venv:
            ref = SyncVectorEnv([OneElementFlags] * 4)
            await wait(venv.reset(seed=0))
            ref.reset(seed=0)
            for t in range(8):
                a = np.array([t % 2, 1, 0, 1])
                assert_tree_equal((await wait(venv.step(a)))[:4], ref.step(a)[:4], f"step {t}")
            ref.close()

    run_uv(main())
    assert_clean(clean)


# -- factories -----------------------------------------------------------------------------
def test_lambda_closure_and_local_factories_work(run, clean) -> None:
    steps_limit = 4  # captured by the closure below

    def make_closure(k: int) -> Any:
        def f() -> gym.Env:
            return gym.make("CartPole-v1", max_episode_steps=steps_limit + k)

        return f

    class Local(gym.Wrapper):  # a class local to the test, sent by value
        def step(self, action: Any) -> Any:
            obs, r, te, tr, info = self.env.step(action)
            return obs, r * 2.0, te, tr, {"doubled": True}

    fns = [
        lambda: gym.make("CartPole-v1", max_episode_steps=4),
        make_closure(0),
        make_closure(1),
        lambda: Local(gym.make("CartPole-v1", max_episode_steps=4)),
        functools.partial(gym.make, "CartPole-v1", max_episode_steps=4),
    ]

    async def main() -> None:
        refs = [RefEnv(fn, i) for i, fn in enumerate(fns)]
        async with AsyncVecEnv(fns, num_workers=2) as venv:
            await wait(venv.reset(seed=0))
            for t in range(7):
                o, r, te, tr, infos = await wait(venv.step(np.ones(5, dtype=np.int64)))
                res = StepResult(o, r, te, tr, infos, np.arange(5))
                assert_rows_match(res, [refs[i].step(1) for i in range(5)], f"step {t}")
            assert (await wait(venv.get_attr("_max_episode_steps"))) == (4, 4, 5, 4, 4)
        for ref in refs:
            ref.close()

    run(main())
    assert_clean(clean)


def test_make_passes_env_kwargs_and_vector_options(run, clean) -> None:
    async def main() -> None:
        venv = aiovec.make("aiovec/Busy-v0", 3, num_workers=2, batch_size=2, cpu_ms=0.0, env_kwargs={"obs_dim": 6, "episode_len": 2})
        assert venv.batch_size == 2
        assert venv.single_observation_space.shape == (6,)
        async with venv:
            assert venv.num_workers == 2
            await wait(venv.reset(seed=0))
            assert (await wait(venv.get_attr("cpu_ms"))) == (0.0, 0.0, 0.0)
            for _ in range(2):
                _, _, term, trunc, _ = await wait(venv.step(np.zeros(3, dtype=np.int64)))
            assert trunc.all() and not term.any()

    run(main())
    assert_clean(clean)


# -- call / get_attr / set_attr -------------------------------------------------------------
def test_call_get_attr_set_attr_with_env_ids(run, clean) -> None:
    class WithMethod(gym.Wrapper):
        def scaled(self, x: float, *, factor: float = 1.0) -> float:
            return x * factor * self.env.unwrapped.gravity

    async def main() -> None:
        async with AsyncVecEnv([lambda: WithMethod(gym.make("CartPole-v1"))] * N, num_workers=2) as venv:
            await wait(venv.reset(seed=0))
            assert (await wait(venv.get_attr("gravity"))) == (9.8,) * N
            await wait(venv.set_attr("gravity", [1.0, 2.0], env_ids=[3, 1]))
            assert (await wait(venv.get_attr("gravity"))) == (9.8, 2.0, 9.8, 1.0, 9.8)
            await wait(venv.set_attr("gravity", 5.0, env_ids=[0]))
            assert (await wait(venv.get_attr("gravity", env_ids=[4, 0, 1]))) == (9.8, 5.0, 2.0)
            # call: a method with args and kwargs, results in the order of env_ids; a plain attribute is read.
            assert (await wait(venv.call("get_wrapper_attr", "gravity", env_ids=[1, 0]))) == (2.0, 5.0)
            assert (await wait(venv.call("scaled", 2.0, env_ids=[2, 1]))) == (2.0 * 9.8, 2.0 * 2.0)
            assert (await wait(venv.call("scaled", 1.0, factor=3.0, env_ids=[0]))) == (3.0 * 5.0,)
            assert (await wait(venv.call("gravity"))) == (5.0, 2.0, 9.8, 1.0, 9.8)
            # The changed physics really is used in the workers: compare with a reference env.
            ref = gym.make("CartPole-v1")
            ref.reset(seed=1)
            ref.unwrapped.gravity = 2.0
            want = ref.step(0)[0]
            await wait(venv.reset(seed=0))
            obs, *_ = await wait(venv.step(np.zeros(N, dtype=np.int64)))
            assert_tree_equal(obs[1], want)
            ref.close()
            # Attribute calls are allowed while a step is in flight; they queue behind it.
            venv.send(np.zeros(2, dtype=np.int64), env_ids=[0, 1])
            assert (await wait(venv.get_attr("gravity", env_ids=[0]))) == (5.0,)
            res = await wait(venv.drain())
            assert sorted(i for r in res for i in r.env_ids.tolist()) == [0, 1]

    run(main())
    assert_clean(clean)


# -- stats ---------------------------------------------------------------------------------
def test_stats_fields(run, clean) -> None:
    async def main() -> list[int]:
        async with aiovec.make("CartPole-v1", N, num_workers=2) as venv:
            st = venv.stats()
            assert st["num_envs"] == N and st["num_workers"] == 2
            assert st["steps"] == 0 and st["in_flight"] == 0 and st["ready"] == 0
            await wait(venv.reset(seed=0))
            for _ in range(3):
                await wait(venv.step(np.zeros(N, dtype=np.int64)))
            venv.send(np.zeros(2, dtype=np.int64), env_ids=[0, 4])
            st = venv.stats()
            assert st["in_flight"] == 2
            await wait(venv.recv(2))
            st = venv.stats()
            for key in ("steps", "elapsed_s", "steps_per_s", "latency_s", "workers", "num_envs", "num_workers", "in_flight", "ready"):
                assert key in st, key
            assert st["steps"] == 3 * N + 2
            assert st["in_flight"] == 0 and st["ready"] == 0
            assert st["elapsed_s"] > 0
            assert st["steps_per_s"] == pytest.approx(st["steps"] / st["elapsed_s"], rel=1e-9)
            assert set(st["latency_s"]) == {"p50", "p90", "p99"}
            assert 0 < st["latency_s"]["p50"] <= st["latency_s"]["p90"] <= st["latency_s"]["p99"]
            workers = st["workers"]
            assert len(workers) == 2
            assert sorted(w["worker_id"] for w in workers) == [0, 1]
            assert sum(w["envs"] for w in workers) == N
            assert sorted(w["envs"] for w in workers) == [2, 3]  # balanced, no divisibility needed
            assert sum(w["steps"] for w in workers) == st["steps"]
            for w in workers:
                for key in ("pid", "cpu_per_step_s", "wall_per_step_s", "runq_per_step_s", "latency_s"):
                    assert key in w, key
                assert w["cpu_per_step_s"] >= 0 and w["wall_per_step_s"] > 0 and w["runq_per_step_s"] >= 0
            pids = [w["pid"] for w in workers]
            assert len(set(pids)) == 2
            mine = {p.pid for p in psutil.Process().children(recursive=True)}
            assert set(pids) <= mine, "worker pids are this process's descendants"
            return pids

    pids = run(main())
    assert all(pid_gone(p) for p in pids)
    assert_clean(clean)


@pytest.mark.parametrize("placement", ["process", "inline"])
def test_cpu_accounting_tells_computing_envs_from_waiting_ones(run_uv, clean, placement: str) -> None:
    """The CPU clock is read on one step in CPU_SAMPLE; the others count CPU at the sampled share of
    their wall time. Over many steps the shares still separate envs that compute from envs that wait."""
    from aiovec.worker import CPU_SAMPLE

    async def share(env_id: str, **kwargs: float) -> float:
        async with aiovec.make(env_id, 2, num_workers=1, placement=placement, **kwargs) as venv:
            await venv.reset(seed=0)
            for _ in range(4 * CPU_SAMPLE):
                await venv.step(np.zeros(2, dtype=np.int64))
            (w,) = venv.stats()["workers"]
            return w["cpu_per_step_s"] / w["wall_per_step_s"]

    async def main() -> None:
        busy = await share("aiovec/Busy-v0", cpu_ms=1.0)
        idle = await share("aiovec/Sleep-v0", wait_ms=2.0)
        assert busy > 0.5 and idle < 0.25, (busy, idle)

    run_uv(main())
    assert_clean(clean)
