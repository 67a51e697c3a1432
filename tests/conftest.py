"""Shared helpers: running coroutines on uvloop and asyncio, leak checks, reference envs.

No mocks anywhere: every test drives real worker processes, real gymnasium envs and
a real event loop. A hang must fail a test instead of blocking the suite, so every
coroutine runs under a guard (``GUARD_S``) and every await that could block has its
own ``asyncio.wait_for``.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
import pytest
import uvloop

import aiovec  # noqa: F401  (registers the aiovec/* envs in this process)

GUARD_S = 60.0  # a whole test coroutine
WAIT_S = 30.0  # one await that could hang
LOOPS = ("uvloop", "asyncio")
SHM = "/dev/shm"


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(filename: str) -> Iterator[Any]:
    """Import ``examples/<filename>`` as a module for the duration of a fixture (yield from this).

    It is registered in ``sys.modules`` meanwhile, so cloudpickle can send functions defined in
    it (env factories) to worker processes by value.
    """
    name = "aiovec_example_" + Path(filename).stem
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / filename)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(name, None)


def default_signals() -> None:
    """``preexec_fn`` for child scripts that a test interrupts: Ctrl-C and SIGTERM act as in a terminal.

    A suite started in the background (``cmd &`` in a non-interactive shell, ``nohup``) inherits SIGINT
    ignored, and a Python started with SIGINT ignored installs no KeyboardInterrupt handler, so a test
    that sends SIGINT to its script would wait for an exit that never comes.
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def pytest_configure(config: pytest.Config) -> None:
    """Environment for this process and every script and worker the suite starts (before any test module imports).

    One OpenMP/MKL thread per process (torch): the suite runs many processes on few cores, where OpenMP's
    spinning threads thrash (a CleanRL test took 78 s instead of 14 s on a busy 2-core machine). And Ray's
    crash handler off, so that a crash inside Ray shows its tracebacks in the test log.
    """
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    # Ray's crash handler stays installed after its session ends (the one crash CI saw printed nothing);
    # without it Python's faulthandler (on under pytest) prints every thread's traceback to the test log.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")


# -- running coroutines -----------------------------------------------------------------
def run_on(loop_name: str, coro: Coroutine[Any, Any, Any], guard: float = GUARD_S) -> Any:
    """Run ``coro`` on a fresh uvloop or default asyncio loop, under a ``guard``-second limit."""

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        if loop_name == "uvloop":
            assert isinstance(loop, uvloop.Loop), f"expected a uvloop loop, got {type(loop)}"
        else:
            assert not isinstance(loop, uvloop.Loop), "expected asyncio's own loop, got uvloop"
        return await asyncio.wait_for(coro, guard)

    if loop_name == "uvloop":
        return uvloop.run(main())
    if loop_name == "asyncio":
        return asyncio.run(main())
    raise ValueError(loop_name)


@pytest.fixture(params=LOOPS)
def run(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``run(coro)``: run a coroutine, once on uvloop and once on asyncio's default loop."""
    name = request.param
    return lambda coro, guard=GUARD_S: run_on(name, coro, guard)


@pytest.fixture
def run_uv() -> Callable[..., Any]:
    """``run_uv(coro)``: run a coroutine on uvloop only (for tests that need not be run twice)."""
    return lambda coro, guard=GUARD_S: run_on("uvloop", coro, guard)


def wait(aw: Any, timeout: float = WAIT_S) -> Any:
    """``asyncio.wait_for`` with the suite's generous default: a hang fails, it does not block."""
    return asyncio.wait_for(aw, timeout)


# -- leak checks -----------------------------------------------------------------------
@dataclass
class Snapshot:
    pids: set[int]
    shm: set[str]
    threads: set[int]


def _is_mp_singleton(p: psutil.Process) -> bool:
    """multiprocessing's fork server and resource tracker: process-wide, started once, kept.

    Only direct children count: workers forked by the fork server carry the same
    command line, but they are its children (our grandchildren), and they must go.
    """
    try:
        if p.ppid() != os.getpid():
            return False
        cmd = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
    return "forkserver" in cmd or "resource_tracker" in cmd


def _live_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue  # exited; its parent reaps it
        except psutil.NoSuchProcess:
            continue
        if not _is_mp_singleton(p):
            out.append(p)
    return out


def _mapped_shm_inodes() -> set[int]:
    """Inodes of the ``/dev/shm`` files this process has mapped (named semaphores, shared memory)."""
    inodes = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith(SHM + "/"):
                inodes.add(int(parts[4]))
    return inodes


def _shm_entries() -> set[str]:
    """Entries of ``/dev/shm`` that belong to this process.

    ``/dev/shm`` is machine-wide: other test runs on the machine create and remove
    their own ``sem.mp-*`` files all the time. An entry is ours when this process maps
    it (glibc maps a named semaphore under a temporary name, so match by inode).
    """
    try:
        names = os.listdir(SHM)
    except FileNotFoundError:
        return set()
    mine = _mapped_shm_inodes()
    out = set()
    for name in names:
        try:
            if os.stat(os.path.join(SHM, name)).st_ino in mine:
                out.add(name)
        except FileNotFoundError:
            pass
    return out


def _nondaemon_threads() -> dict[int, threading.Thread]:
    return {t.ident: t for t in threading.enumerate() if not t.daemon and t is not threading.main_thread() and t.ident}


def snapshot() -> Snapshot:
    """What exists before a test: compare with :func:`assert_clean` afterwards."""
    gc.collect()
    return Snapshot({p.pid for p in _live_children()}, _shm_entries(), set(_nondaemon_threads()))


def _describe(p: psutil.Process) -> str:
    try:
        return f"pid {p.pid} ({p.status()}, ppid {p.ppid()}): {' '.join(p.cmdline())[:120]}"
    except psutil.Error:
        return f"pid {p.pid} (gone)"


def assert_clean(before: Snapshot, kill: bool = True, grace: float = 0.0,
                 ignore: Callable[[str], bool] | None = None) -> None:
    """No worker process, no new ``/dev/shm`` entry and no new non-daemon thread is left.

    Strict: checked right after the vector env was closed, with no grace period for
    processes by default (``close()`` promises its workers have exited when it returns;
    zombies count as gone). ``grace``: seconds to wait for processes that another system
    ends asynchronously (Ray kills actors in the background); ``ignore(cmdline)``: processes
    that are not the vector env's (Ray's daemons and its pool of idle workers). Leftovers are
    killed afterwards (``kill``), so one leaking test does not make every later one fail too.
    """

    def left() -> list[psutil.Process]:
        out = []
        for p in _live_children():
            if p.pid in before.pids:
                continue
            if ignore is not None:
                try:
                    if ignore(" ".join(p.cmdline())):
                        continue
                except psutil.Error:
                    continue
            out.append(p)
        return out

    # Processes and threads first: the collection below takes long enough to hide a race.
    leftovers = left()
    end = time.monotonic() + grace
    while leftovers and time.monotonic() < end:
        time.sleep(0.1)
        leftovers = left()
    threads = {i: t for i, t in _nondaemon_threads().items() if i not in before.threads}
    gc.collect()  # multiprocessing unlinks its semaphores from finalizers
    new_shm = _shm_entries() - before.shm
    problems = []
    if leftovers:
        problems.append("child processes left running: " + "; ".join(_describe(p) for p in leftovers))
    if new_shm:
        problems.append(f"new entries in {SHM}: {sorted(new_shm)}")
    if threads:
        problems.append(f"non-daemon threads left running: {[t.name for t in threads.values()]}")
    if kill:
        for p in leftovers:
            try:
                p.kill()
            except psutil.Error:
                pass
        for t in threads.values():
            t.join(timeout=5.0)
    assert not problems, "\n".join(problems)


def not_a_ray_actor(cmdline: str) -> bool:
    """For ``assert_clean(ignore=...)``: Ray's daemons and idle pooled workers outlive a vector env by design."""
    return not cmdline.startswith("ray::") or cmdline.startswith("ray::IDLE")


@pytest.fixture
def clean() -> Any:
    """Snapshot before the test; the test calls ``assert_clean(clean)`` at its end.

    Teardown is a safety net only (it asserts nothing): whatever a failed test left
    running is killed, so later tests start clean. Not autouse: other test modules
    keep helper processes (a Ray cluster) across tests on purpose.
    """
    before = snapshot()
    yield before
    for p in _live_children():
        if p.pid not in before.pids:
            try:
                p.kill()
            except psutil.Error:
                pass


def pid_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie has exited: it only waits to be reaped)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_pids_gone(pids: list[int], timeout: float) -> list[int]:
    """Poll until every pid is gone or ``timeout`` passes; returns those still running."""
    end = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < end:
        alive = [p for p in alive if not pid_gone(p)]
        if alive:
            time.sleep(0.05)
    return [p for p in alive if not pid_gone(p)]


# -- comparing results ------------------------------------------------------------------
def assert_tree_equal(a: Any, b: Any, path: str = "") -> None:
    """Exact equality of obs/infos trees: dicts, tuples, arrays (with dtype), object arrays, scalars."""
    if isinstance(a, dict) or isinstance(b, dict):
        assert isinstance(a, dict) and isinstance(b, dict), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        assert set(a) == set(b), f"{path}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            assert_tree_equal(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, tuple) and not isinstance(a, np.ndarray):
        assert isinstance(b, tuple) and len(a) == len(b), f"{path}: {a!r} vs {b!r}"
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_tree_equal(x, y, f"{path}[{k}]")
    elif isinstance(a, np.ndarray) and a.dtype == object:
        assert isinstance(b, np.ndarray) and b.dtype == object and a.shape == b.shape, f"{path}: {a!r} vs {b!r}"
        for k, (x, y) in enumerate(zip(a.ravel(), b.ravel(), strict=True)):
            assert_tree_equal(x, y, f"{path}[{k}]")
    elif a is None or b is None:
        assert a is None and b is None, f"{path}: {a!r} vs {b!r}"
    else:
        xa, xb = np.asarray(a), np.asarray(b)
        if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
            assert xa.dtype == xb.dtype, f"{path}: dtype {xa.dtype} vs {xb.dtype}"
        np.testing.assert_array_equal(xa, xb, err_msg=f"at {path}")


def unbatch_info(infos: dict[str, Any], row: int) -> dict[str, Any]:
    """The info dict of one row of a vectorised info (``key`` + ``_key`` masks)."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        assert mask is not None, f"info key {key!r} has no '_{key}' mask"
        if not mask[row]:
            continue
        out[key] = unbatch_info(value, row) if isinstance(value, dict) else value[row]
    return out


def assert_info_equal(got: Any, want: dict[str, Any], path: str = "info") -> None:
    """A single env's info as delivered (numpy scalars) against the env's own (python values)."""
    assert set(got) == set(want), f"{path}: keys {sorted(got)} vs {sorted(want)}"
    for k, w in want.items():
        g = got[k]
        if isinstance(w, dict):
            assert_info_equal(g, w, f"{path}[{k!r}]")
        else:
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=f"at {path}[{k!r}]")


class RefEnv:
    """One env stepped in this process with gymnasium's NEXT_STEP autoreset: the ground truth."""

    def __init__(self, make: Callable[[], gym.Env], seed: int | None) -> None:
        self.env = make()
        self.done = False
        self.reset_obs, self.reset_info = self.env.reset(seed=seed)

    def reset(self, seed: int | None = None) -> tuple[Any, dict]:
        self.done = False
        return self.env.reset(seed=seed)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self.done:
            obs, info = self.env.reset()
            r, term, trunc = 0.0, False, False
        else:
            obs, r, term, trunc, info = self.env.step(action)
        self.done = bool(term or trunc)
        return obs, r, term, trunc, info

    def close(self) -> None:
        self.env.close()


def batch_reference_infos(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """Reference infos, one per row, batched the way gymnasium's own vector envs batch them.

    gymnasium fixes an info array's dtype from the first row that has the key (an int
    ``prob`` from FrozenLake's reset makes a later float ``prob`` of the same batch an
    int), so rows are compared as a batch, never one by one against raw env infos.
    """

    class _Batcher:
        _add_info = gym.vector.VectorEnv._add_info

        def __init__(self, n: int) -> None:
            self.num_envs = n

    batcher = _Batcher(len(infos))
    out: dict[str, Any] = {}
    for row, info in enumerate(infos):
        out = batcher._add_info(out, info, row)
    return out


def assert_row_matches(res: aiovec.StepResult, k: int, want: tuple[Any, float, bool, bool, dict], what: str) -> None:
    """Row ``k`` of a recv() result equals one reference transition (infos: see :func:`assert_rows_match`)."""
    obs, r, term, trunc, _info = want
    assert_tree_equal(res.obs[k], np.asarray(obs, dtype=res.obs.dtype), f"{what} obs")
    assert res.rewards[k] == r, f"{what}: reward {res.rewards[k]} vs {r}"
    assert bool(res.terminations[k]) == bool(term), f"{what}: terminated {res.terminations[k]} vs {term}"
    assert bool(res.truncations[k]) == bool(trunc), f"{what}: truncated {res.truncations[k]} vs {trunc}"


def assert_rows_match(res: aiovec.StepResult, wants: list[tuple[Any, float, bool, bool, dict]], what: str) -> None:
    """Every row of a recv() result equals its reference transition, infos included."""
    assert len(wants) == len(res.env_ids)
    for k, want in enumerate(wants):
        assert_row_matches(res, k, want, f"{what} row {k} (env {res.env_ids[k]})")
    assert_tree_equal(res.infos, batch_reference_infos([w[4] for w in wants]), f"{what} infos")


# -- markers ----------------------------------------------------------------------------
# Registered in pyproject.toml. The fast subset for the edit-test loop (< 1 minute on 2 cores):
#   python -m pytest -q -m "not slow and not ray and not browser"
# Whole modules are marked here; single tests carry their marks in their own files too.
MODULE_MARKS: dict[str, tuple[str, ...]] = {
    "test_ray.py": ("ray", "slow"),
    "test_webservice_browser.py": ("browser", "slow"),
    "test_webservice.py": ("slow",),
    "test_ppo.py": ("slow",),
    "test_cleanrl_ppo.py": ("slow",),
    "test_soak.py": ("slow",),
    "test_demo.py": ("slow", "subprocess"),
    "test_bench_cli.py": ("slow", "subprocess"),
    "test_exits.py": ("slow", "subprocess"),
    "test_sb3.py": ("slow",),
    "test_torch.py": ("slow",),
}
# Single tests that take seconds (measured with --durations on a loaded 2-core machine).
TEST_MARKS: dict[str, tuple[str, ...]] = {
    "test_docs.py::test_readme_python_block_runs": ("slow", "subprocess"),
    "test_docs.py::test_public_name_has_an_example_that_runs": ("slow",),
    "test_faults.py::test_workers_exit_when_the_parent_is_sigkilled": ("slow", "subprocess"),
    "test_faults.py::test_ctrl_c_stops_the_script_and_its_workers": ("slow", "subprocess"),
    "test_faults.py::test_close_with_steps_in_flight_has_released_everything_when_it_returns": ("slow",),
    "test_faults.py::test_hung_step_is_killed_after_step_timeout": ("slow",),
    "test_faults.py::test_close_kills_a_hung_worker": ("slow",),
    "test_faults.py::test_cancelled_step_leaves_results_for_recv": ("slow",),
    "test_faults.py::test_worker_crash_under_spawn_and_first_finished_recv": ("slow",),
    "test_resize.py::test_random_interleavings_of_send_recv_resize": ("slow",),
    "test_restart.py::test_hung_env_is_killed_by_step_timeout_and_restarted": ("slow",),
    "test_restart.py::test_recycling_replaces_workers_without_changing_trajectories": ("slow",),
    "test_spin.py::test_auto_spin_follows_the_worker_count_and_results_stay_exact": ("slow",),
    "test_spin.py::test_a_revived_worker_is_told_the_current_spin": ("slow",),
    "test_misuse.py::test_recv_timeout_loses_nothing_and_late_result_keeps_its_env_id": ("slow",),
    "test_misuse.py::test_recv_timeout_with_partial_batch_keeps_ready_results": ("slow",),
    "test_tracebacks.py::test_env_error_traceback_names_the_main_script": ("subprocess",),
    "test_ray.py::test_a_ray_started_by_the_vector_env_stops_with_it": ("subprocess",),
}


def _param_marks(item: pytest.Item) -> tuple[str, ...]:
    """The fast subset runs each test once, on uvloop; the whole suite also on asyncio's own loop
    (``run`` fixture) and with 3 workers where 1 and 2 are tested too."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    slow = params.get("run") == "asyncio" or (item.path.name == "test_api.py" and params.get("num_workers") == 3)
    return ("slow",) if slow else ()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.name
        name = f"{module}::{getattr(item, 'originalname', item.name)}"
        for mark in MODULE_MARKS.get(module, ()) + TEST_MARKS.get(name, ()) + _param_marks(item):
            if mark not in item.keywords:
                item.add_marker(getattr(pytest.mark, mark))
