"""Atari (ale-py): ``aiovec.make`` registers the ALE namespace itself, and envs that move keep their trajectories,
the emulator's own random generator (sticky actions) included."""

from __future__ import annotations

import subprocess
import sys

import ale_py
import gymnasium as gym
import numpy as np
import pytest
from conftest import assert_clean, wait

import aiovec
from aiovec import ConfigError
from aiovec.make import PLUGINS

ENV_ID = "ALE/Breakout-v5"  # sticky actions (repeat_action_probability 0.25): the emulator's generator acts every step


def _sync(n: int) -> gym.vector.SyncVectorEnv:
    gym.register_envs(ale_py)
    return gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID)] * n)


def _compare(got: tuple, want: tuple, t: int) -> None:
    for k, (a, b) in enumerate(zip(got[:4], want[:4], strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {t}, field {k}")


def test_moved_atari_envs_keep_their_trajectories(run_uv, clean) -> None:
    """Envs move between this process and worker processes at episode ends (an emulator past its last episode) and
    right after an unseeded reset (an emulator about to start one); every row equals SyncVectorEnv's."""
    n = 3

    async def main() -> None:
        ref = _sync(n)
        async with aiovec.make(ENV_ID, n, num_workers=2, placement="hybrid") as venv:
            np.testing.assert_array_equal((await wait(venv.reset(seed=7)))[0], ref.reset(seed=7)[0])
            rng = np.random.default_rng(0)
            plan = {10: ("process", 2), 400: ("inline", 1), 800: ("hybrid", 2)}
            ended = 0
            for t in range(1200):
                if t in plan:
                    where, k = plan[t]
                    await wait(venv.resize(k, placement=where))
                if t == 600:  # an unseeded reset, then a move before any step: the move replays that reset
                    np.testing.assert_array_equal((await wait(venv.reset()))[0], ref.reset()[0])
                    await wait(venv.resize(2, placement="process"))
                actions = rng.integers(0, 4, n)
                got = await wait(venv.step(actions))
                _compare(got, ref.step(actions), t)
                ended += int(np.sum(got[2] | got[3]))
            assert ended >= n, "episodes must end for the envs to move"
            assert venv.stats()["moves"] >= 2 * n
        ref.close()

    run_uv(main())
    assert_clean(clean)


SCRIPT = """
import sys
import gymnasium as gym
import numpy as np
import aiovec

async def main():
    async with aiovec.make("ALE/Breakout-v5", 2, num_workers=1, placement="process") as venv:
        obs, _ = await venv.reset(seed=0)
        obs, *_ = await venv.step(np.zeros(2, dtype=np.int64))
        return obs.shape

if __name__ == "__main__":
    assert "ale_py" not in sys.modules and "ALE/Breakout-v5" not in gym.registry
    print(aiovec.run(main()))
"""


def test_make_registers_the_ale_namespace(tmp_path) -> None:
    """In a fresh process nothing has imported ale-py: ``gymnasium.make`` would not know the id, ``aiovec.make`` does."""
    script = tmp_path / "atari.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "(2, 210, 160, 3)", out.stdout
    assert "Warning" not in out.stderr, out.stderr


def test_an_unknown_namespace_is_a_config_error_that_names_the_package(monkeypatch) -> None:
    monkeypatch.setitem(PLUGINS, "Nowhere", "aiovec_no_such_module")
    with pytest.raises(ConfigError, match=r"unknown env id 'Nowhere/Game-v0': .*pip install aiovec-no-such-module"):
        aiovec.make("Nowhere/Game-v0", 2)
    with pytest.raises(ConfigError, match="unknown env id 'Elsewhere/Game-v0'"):
        aiovec.make("Elsewhere/Game-v0", 2)
