"""Every await of the API lets the application's other tasks run; building envs never stalls the loop.

A side task counts its turns while aiovec works. The assertions are on what happened (the side
task ran, many times), not on how long anything took.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_clean, wait

import aiovec


class Ticker:
    """A task that counts its turns of the loop: ``sleep(0)`` (every turn) or a short timer."""

    def __init__(self, period: float = 0.0) -> None:
        self.ticks = 0
        self.period = period
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(self.period)

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


@pytest.mark.parametrize("placement", ["inline", "process"])
def test_recv_is_a_checkpoint_even_when_results_are_waiting(run, clean, placement: str) -> None:
    n, rounds = 4, 200

    async def main() -> None:
        async with aiovec.make("CartPole-v1", n, placement=placement, num_workers=1 if placement == "process" else "auto") as venv:
            await wait(venv.reset(seed=0))
            with Ticker() as side:
                for _ in range(rounds):
                    venv.send(np.zeros(n, dtype=np.int64))
                    await asyncio.sleep(0.001 if placement == "process" else 0)  # results are waiting by now
                    before = side.ticks
                    r = await wait(venv.recv(n))
                    assert len(r.env_ids) == n
                    assert side.ticks > before, "recv() returned without letting the other task run"
            assert side.ticks >= rounds

    run(main())
    assert_clean(clean)


def test_inline_step_lets_other_tasks_run_between_batches(run_uv, clean) -> None:
    async def main() -> None:
        async with aiovec.make("CartPole-v1", 8, placement="inline") as venv:
            await wait(venv.reset(seed=0))
            with Ticker() as side:
                for _ in range(300):
                    before = side.ticks
                    await wait(venv.step(np.zeros(8, dtype=np.int64)))
                    assert side.ticks > before, "step() held the loop across a whole batch"

    run_uv(main())
    assert_clean(clean)


def test_inline_large_batch_yields_between_slices(run_uv, clean) -> None:
    """Envs that cost more than a slice together are stepped over several turns of the loop."""

    async def main() -> None:
        async with aiovec.make("aiovec/Busy-v0", 16, placement="inline", cpu_ms=0.2) as venv:
            await wait(venv.reset(seed=0))
            with Ticker() as side:
                before = side.ticks
                await wait(venv.step(np.zeros(16, dtype=np.int64)))  # 16 x 0.2 ms: >= 7 slices of <= 0.5 ms
                assert side.ticks - before >= 6, f"only {side.ticks - before} turns for the other task"

    run_uv(main())
    assert_clean(clean)


@pytest.mark.parametrize("start", ["sleep", "cpu"])
def test_slow_env_constructor_does_not_stall_the_loop(run_uv, clean, start: str) -> None:
    """Env 0 is built off the loop: a 0.5 s constructor leaves the other tasks running meanwhile."""

    async def main() -> None:
        with Ticker(period=0.005) as side:
            venv = aiovec.make("aiovec/SlowStart-v0", 2, num_workers=1, start_s=0.5, start=start)
            assert side.ticks <= 1  # the constructor has not run yet (nothing to learn without a loop turn)
            before = side.ticks
            async with venv:
                during = side.ticks - before
                assert venv.single_observation_space is not None
                await wait(venv.reset(seed=0))
        # env 0 (0.5 s) is built in a thread, the worker's envs in the worker process: >= 1 s in which
        # a 5 ms timer fires ~200 times; a stalled loop would have fired it about once.
        assert during >= 20, f"the side task ran only {during} times while the vector env started"

    run_uv(main())
    assert_clean(clean)


FORKSERVER_BESIDE_PROBE = """
import asyncio, os, time
from multiprocessing import forkserver
import gymnasium as gym, aiovec

MAIN = os.getpid()
seen = []

def make():
    env = gym.make("CartPole-v1")
    if os.getpid() == MAIN:  # the probe of env 0, in this process: a slow constructor
        time.sleep(0.4)
        seen.append(forkserver._forkserver._forkserver_pid is not None)
    return env

async def main():
    async with aiovec.AsyncVecEnv([make] * 2, num_workers=2, placement=PLACEMENT):
        print("fork server running as env 0's constructor ended:", seen[0])

if __name__ == "__main__":
    asyncio.run(main())
"""


@pytest.mark.parametrize("placement", ["process", "hybrid"])
def test_the_fork_server_starts_beside_the_probe_of_env_0(tmp_path, placement: str) -> None:
    """Where workers start whatever the probe says, the fork server's imports run while env 0 is built, not after.
    A fresh interpreter, so that no fork server runs yet."""
    script = tmp_path / "beside.py"
    script.write_text(FORKSERVER_BESIDE_PROBE.replace("PLACEMENT", repr(placement)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "True", proc.stdout


def test_broken_factory_inside_a_loop_fails_at_start_with_config_error(run_uv, clean) -> None:
    def broken():
        raise RuntimeError("no simulator here")

    async def main() -> None:
        venv = aiovec.AsyncVecEnv([broken] * 2, num_workers=1)  # in a running loop: nothing built yet
        with pytest.raises(aiovec.ConfigError, match="no simulator here"):
            await wait(venv.start())
        await wait(venv.close())

    run_uv(main())
    assert_clean(clean)
