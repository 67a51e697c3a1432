"""Dict and Tuple spaces (nested, every leaf kind) through every placement: the same transitions as gymnasium.

The README promises Box, Discrete, MultiDiscrete, MultiBinary "and Dict/Tuple of them". Each env here echoes its
last action in its observation and ends its episodes at seeded, different lengths, so a part of a transition that
reaches the wrong env, the wrong row or the wrong dtype, or an autoreset taken at the wrong step, shows as a
difference from ``SyncVectorEnv`` (lock-step) or from one reference env per env id (first-finished).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import RefEnv, assert_clean, assert_tree_equal, wait
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv
from gymnasium.vector.utils import batch_space

import aiovec
from aiovec import AsyncVecEnv, InvalidActionError


class NestedEcho(gym.Env):
    """Dict observations and actions, a Tuple inside each, every leaf kind; the observation echoes the action."""

    observation_space = spaces.Dict({
        "pos": spaces.Box(-np.inf, np.inf, (3,), np.float32),
        "count": spaces.Discrete(100),
        "flags": spaces.MultiBinary(2),
        "last": spaces.Tuple((spaces.Discrete(3), spaces.Box(-10.0, 10.0, (2,), np.float64), spaces.MultiDiscrete([2, 5]))),
        "itemsize": spaces.Discrete(9),
    })
    action_space = spaces.Dict({
        "move": spaces.Box(-1.0, 1.0, (2,), np.float32),
        "pick": spaces.Tuple((spaces.Discrete(3), spaces.MultiDiscrete([2, 5]))),
    })

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(2, 7))
        self.pos = self.np_random.normal(size=3).astype(np.float32)
        return self._obs(0, np.zeros(2, np.float32), np.zeros(2, np.int64)), {"length": self.length}

    def _obs(self, pick: int, move: np.ndarray, multi: np.ndarray) -> dict:
        # ``move * 3`` in the dtype the action arrived in: float64 actions rounded to float32 on the way would show.
        return {"pos": self.pos.copy(), "count": self.t, "flags": np.array([self.t % 2, pick == 1], np.int8),
                "last": (pick, (move * 3).astype(np.float64), np.asarray(multi, np.int64).copy()),
                "itemsize": move.dtype.itemsize}

    def step(self, action: dict) -> tuple[dict, float, bool, bool, dict]:
        pick, multi = action["pick"]
        self.t += 1
        self.pos[:2] += np.asarray(action["move"], np.float32)
        obs = self._obs(int(pick), action["move"], multi)
        done = self.t >= self.length
        return obs, float(action["move"].sum()) + int(pick), done and self.t % 2 == 0, done and self.t % 2 == 1, {"t": self.t}


class TupleEcho(gym.Env):
    """A Tuple at the top of both spaces, a Dict inside the observation's."""

    observation_space = spaces.Tuple((spaces.Box(0.0, 1.0, (2, 2), np.float32),
                                      spaces.Dict({"k": spaces.Discrete(7), "b": spaces.MultiBinary(3)})))
    action_space = spaces.Tuple((spaces.Discrete(7), spaces.MultiBinary(3)))

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[tuple, dict]:
        super().reset(seed=seed)
        self.t = 0
        self.img = self.np_random.uniform(size=(2, 2)).astype(np.float32)
        return (self.img.copy(), {"k": 0, "b": np.zeros(3, np.int8)}), {}

    def step(self, action: tuple) -> tuple[tuple, float, bool, bool, dict]:
        k, b = action
        self.t += 1
        self.img = np.roll(self.img, int(k))
        return (self.img.copy(), {"k": int(k), "b": np.asarray(b, np.int8).copy()}), float(k), self.t >= 3 + int(k) % 3, False, {}


def _actions(space: spaces.Space, n: int, seed: int) -> spaces.Space:
    batched = batch_space(space, n)
    batched.seed(seed)
    return batched


def _in_float64(a: Any, t: int) -> Any:
    """Every other batch: NestedEcho's float32 ``move`` as float64 values float32 cannot hold (a float64 policy)."""
    if not isinstance(a, dict) or t % 2 == 0:
        return a
    return {**a, "move": a["move"].astype(np.float64) + 1e-9 * (1 + np.arange(a["move"].size).reshape(a["move"].shape))}


def _row(tree: Any, k: int) -> Any:
    """Row ``k`` of a batched tree of arrays."""
    if isinstance(tree, dict):
        return {key: _row(v, k) for key, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_row(v, k) for v in tree)
    return tree[k]


def _as_leaf_dtypes(value: Any, space: spaces.Space) -> Any:
    """One env's own value in the dtypes of its space's leaves (as a vector env's buffers hold them)."""
    if isinstance(space, spaces.Dict):
        return {k: _as_leaf_dtypes(value[k], s) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_as_leaf_dtypes(v, s) for v, s in zip(value, space.spaces, strict=True))
    return np.asarray(value, dtype=space.dtype)


@pytest.mark.parametrize("env_cls", [NestedEcho, TupleEcho])
@pytest.mark.parametrize("placement", ["inline", "process", "hybrid"])
def test_nested_spaces_step_as_sync_vector_env_does(run, clean, placement: str, env_cls: type[gym.Env]) -> None:
    """Lock-step, with autoresets at different steps per env: every leaf of every batch equals SyncVectorEnv's,
    dtypes included, and the batched spaces are gymnasium's. A float leaf of the action reaches the env in the
    dtype the caller gave it (float64 for a float32 Box, as SyncVectorEnv hands over rows of the caller's arrays)."""
    n, steps = 5, 24
    kw = {"num_workers": 2} if placement != "inline" else {}

    async def main() -> None:
        ref = SyncVectorEnv([env_cls] * n)
        async with AsyncVecEnv([env_cls] * n, placement=placement, **kw) as venv:
            assert venv.single_observation_space == env_cls.observation_space
            assert venv.observation_space == ref.observation_space and venv.action_space == ref.action_space
            obs, _ = await wait(venv.reset(seed=11))
            assert_tree_equal(obs, ref.reset(seed=11)[0], "reset")
            acts = _actions(env_cls.action_space, n, seed=3)
            for t in range(steps):
                a = _in_float64(acts.sample(), t)
                got, want = await wait(venv.step(a)), ref.step(a)
                for i, what in enumerate(("obs", "rewards", "terminations", "truncations")):
                    assert_tree_equal(got[i], want[i], f"step {t} {what}")
        ref.close()

    run(main())
    assert_clean(clean)


@pytest.mark.parametrize("placement", ["process", "hybrid"])
def test_nested_spaces_first_finished_rows_belong_to_their_env(run_uv, clean, placement: str) -> None:
    """send()/recv() of subsets: each row of a nested result is its env's next transition, whatever the order the
    envs finish in and however the batch is cut."""
    n = 6
    rng = np.random.default_rng(5)

    async def main() -> None:
        refs = [RefEnv(NestedEcho, seed=20 + i) for i in range(n)]
        async with AsyncVecEnv([NestedEcho] * n, placement=placement, num_workers=3) as venv:
            obs, _ = await wait(venv.reset(seed=[20 + i for i in range(n)]))
            for i in range(n):
                assert_tree_equal(_row(obs, i), _as_leaf_dtypes(refs[i].reset_obs, NestedEcho.observation_space), f"reset {i}")
            acts = _actions(NestedEcho.action_space, n, seed=8)
            pending: dict[int, Any] = {}
            for rnd in range(30):
                idle = [i for i in range(n) if i not in pending]
                ids = np.array(sorted(rng.choice(idle, size=rng.integers(1, len(idle) + 1), replace=False)))
                a = _in_float64(acts.sample(), rnd)
                sub = _row(a, ids)
                venv.send(sub, ids)
                for k, i in enumerate(ids):
                    pending[int(i)] = _row(sub, k)
                r = await wait(venv.recv(int(rng.integers(1, len(pending) + 1))))
                for k, i in enumerate(r.env_ids.tolist()):
                    want_obs, want_r, term, trunc, _ = refs[i].step(pending.pop(i))
                    what = f"round {rnd} env {i}"
                    assert_tree_equal(_row(r.obs, k), _as_leaf_dtypes(want_obs, NestedEcho.observation_space), f"{what} obs")
                    assert (r.rewards[k], bool(r.terminations[k]), bool(r.truncations[k])) == (want_r, term, trunc), what
            for r in await wait(venv.drain()):
                for k, i in enumerate(r.env_ids.tolist()):
                    want_obs = refs[i].step(pending.pop(i))[0]
                    assert_tree_equal(_row(r.obs, k), _as_leaf_dtypes(want_obs, NestedEcho.observation_space), f"drain env {i}")
            assert not pending
        for ref in refs:
            ref.close()

    run_uv(main())
    assert_clean(clean)


def test_a_bad_nested_action_is_refused_by_its_path_before_anything_is_sent(run_uv, clean) -> None:
    """A missing key, a Tuple of the wrong length, a value outside a nested Discrete, a wrong shape: each raises
    InvalidActionError naming the part, and the envs never see it (the next good step equals SyncVectorEnv's)."""
    n = 3

    async def main() -> None:
        ref = SyncVectorEnv([NestedEcho] * n)
        async with AsyncVecEnv([NestedEcho] * n, num_workers=2) as venv:
            assert_tree_equal((await wait(venv.reset(seed=1)))[0], ref.reset(seed=1)[0])
            good = _actions(NestedEcho.action_space, n, seed=0).sample()
            bad_pick = (np.array([0, 3, 1]), good["pick"][1])
            cases = [
                ({"move": good["move"]}, "missing keys ['pick']"),
                ({"move": good["move"], "pick": (good["pick"][0],)}, "actions['pick'] must be a tuple of 2"),
                ({"move": good["move"], "pick": bad_pick}, "actions['pick'][0]: action 3 at position 1"),
                ({"move": good["move"][:, :1], "pick": good["pick"]}, "actions['move']: expected shape (3, 2)"),
                ({"move": good["move"], "pick": (good["pick"][0], good["pick"][1] + np.array([0, 5]))}, "actions['pick'][1]"),
            ]
            for bad, message in cases:
                with pytest.raises(InvalidActionError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
                    await wait(venv.step(bad))
                with pytest.raises(InvalidActionError):
                    venv.send(bad)
            got, want = await wait(venv.step(good)), ref.step(good)
            for i in range(4):
                assert_tree_equal(got[i], want[i])
            assert venv.stats()["steps"] == n
        ref.close()

    run_uv(main())
    assert_clean(clean)


def test_the_gym_facade_steps_nested_spaces_as_sync_vector_env_does(clean) -> None:
    """``aiovec.VectorEnv`` (the synchronous gymnasium facade) over a Tuple-of-Dict env: reset and step equal
    ``SyncVectorEnv``'s."""
    n = 4
    env, ref = aiovec.VectorEnv([TupleEcho] * n, num_workers=2), SyncVectorEnv([TupleEcho] * n)
    try:
        assert_tree_equal(env.reset(seed=4)[0], ref.reset(seed=4)[0])
        acts = _actions(TupleEcho.action_space, n, seed=2)
        for t in range(12):
            a = acts.sample()
            got, want = env.step(a), ref.step(a)
            for i in range(4):
                assert_tree_equal(got[i], want[i], f"step {t} field {i}")
    finally:
        env.close()
        ref.close()
    assert_clean(clean)
