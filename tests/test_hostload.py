"""The host's load as the control loop reads it: CPUs other processes take from this process's cores.

Real processes: a busy child that is not one of ours reads as foreign load; the same child named as one of the
vector env's workers does not, nor do a running vector env's own workers in its control history.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest

import aiovec
from aiovec.hostload import HostLoad, process_cpu_s
from aiovec.measured import FOREIGN_LOAD

BUSY = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


@pytest.fixture
def busy_child():
    child = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.3)  # the interpreter started and spins
        yield child
    finally:
        child.kill()
        child.wait()


def _reading(host: HostLoad, pids: list[int], seconds: float = 0.6) -> float:
    a = host.sample(pids)
    time.sleep(seconds)
    return HostLoad.foreign_cpus(a, host.sample(pids))


def test_a_busy_process_that_is_not_ours_is_foreign_load_and_one_of_our_workers_is_not(busy_child) -> None:
    host = HostLoad()
    assert _reading(host, []) >= FOREIGN_LOAD
    assert _reading(host, [busy_child.pid]) < FOREIGN_LOAD


def test_a_process_cpu_reads_its_user_and_system_time_and_none_once_it_is_gone(busy_child) -> None:
    first = process_cpu_s(busy_child.pid)
    time.sleep(0.3)
    assert first is not None and process_cpu_s(busy_child.pid) > first
    busy_child.kill()
    busy_child.wait()
    assert process_cpu_s(busy_child.pid) is None


def test_the_control_history_reads_its_own_busy_workers_as_no_foreign_load(run, clean) -> None:
    """Two worker processes and the parent keep both cores busy stepping; none of it is foreign."""
    async def main() -> list[float]:
        async with aiovec.make("CartPole-v1", 4, num_workers="auto", placement="process") as venv:
            await venv.reset(seed=0)
            acts = np.zeros(4, np.int64)
            end = time.perf_counter() + 1.5
            while time.perf_counter() < end:
                await venv.step(acts)
            return [h["foreign_cpus"] for h in venv.control_history]

    readings = run(main())
    assert len(readings) >= 3 and statistics.median(readings) < FOREIGN_LOAD, readings


def test_workers_stop_spinning_while_another_process_keeps_a_cpu_busy_and_spin_again_after(run, clean) -> None:
    """spin="auto": a worker polls for the next command only while the workers leave this process a CPU of its own.
    A busy process beside a hybrid vector env (this process and one worker per other CPU) takes that CPU: the
    control loop reads it as foreign load and turns the workers' spin off, then on again once the process is gone."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("hybrid needs 2 CPUs")

    async def spins(venv: aiovec.AsyncVecEnv, acts: np.ndarray, seconds: float) -> list[float]:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            await venv.step(acts)
        return [w["spin_s"] for w in venv.stats()["workers"] if w["pid"]]

    async def main() -> tuple[list[float], list[float], list[float]]:
        async with aiovec.make("CartPole-v1", 8, placement="hybrid") as venv:
            await venv.reset(seed=0)
            acts = np.zeros(8, np.int64)
            quiet = await spins(venv, acts, 1.5)
            child = subprocess.Popen([sys.executable, "-c", BUSY])
            try:
                loaded = await spins(venv, acts, 2.0)
            finally:
                child.kill()
                child.wait()
            after = await spins(venv, acts, 2.0)
            return quiet, loaded, after

    quiet, loaded, after = run(main())
    assert quiet and all(s > 0 for s in quiet), quiet
    assert loaded and all(s == 0 for s in loaded), loaded
    assert after and all(s > 0 for s in after), after
