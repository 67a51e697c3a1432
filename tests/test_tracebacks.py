"""Tracebacks from envs defined in the user's main script name that script, not ``<dynamic-code>``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import cloudpickle
import pytest

from aiovec.pickling import dumps

ROOT = Path(__file__).resolve().parents[1]


class _Raises:
    def step(self) -> None:
        raise ValueError("from a method")


def test_pickled_code_keeps_its_file_name() -> None:
    # Defined here, pickled by value (as cloudpickle does for everything in __main__).
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        factory = cloudpickle.loads(dumps(lambda: _Raises))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert factory.__code__.co_filename == __file__
    assert factory().step.__code__.co_filename == __file__


def test_code_named_dynamic_code_by_cloudpickle_gets_its_name_back() -> None:
    # cloudpickle >= 3.1.3 writes "<dynamic-code>" in place of the file name; the args of the
    # reduced code object must then carry the real one.
    from aiovec import pickling

    code = test_pickled_code_keeps_its_file_name.__code__
    real = pickling._code_reduce
    pickling._code_reduce = lambda c: (types.CodeType, tuple("<dynamic-code>" if a == c.co_filename else a for a in real(c)[1]))
    try:
        _, args = pickling._code_reduce_keeping_filename(code)
    finally:
        pickling._code_reduce = real
    assert __file__ in args and "<dynamic-code>" not in args


@pytest.mark.subprocess
def test_env_error_traceback_names_the_main_script(tmp_path: Path) -> None:
    script = tmp_path / "my_env_script.py"
    script.write_text(textwrap.dedent('''
        import gymnasium as gym
        import numpy as np
        import aiovec

        class Bad(gym.Env):
            observation_space = gym.spaces.Box(-1, 1, (2,))
            action_space = gym.spaces.Discrete(2)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                return np.zeros(2, np.float32), {}

            def step(self, action):
                raise ValueError("bad step")

        async def main():
            async with aiovec.AsyncVecEnv([Bad, Bad], num_workers=1) as venv:
                await venv.reset(seed=0)
                try:
                    await venv.step(np.zeros(2, dtype=np.int64))
                except aiovec.EnvError as exc:
                    print(exc.remote_traceback)

        if __name__ == "__main__":
            aiovec.run(main())
    '''))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f'File "{script}", line 15, in step' in proc.stdout, proc.stdout
    assert "<dynamic-code>" not in proc.stdout
