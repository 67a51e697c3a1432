"""Workers spin (poll briefly for the next command) only while they leave the parent a CPU: the choice
follows the worker count through resizes, as the workers themselves confirm, without disturbing results.

The CPU count is pinned (2, or 4 for the revive case) so every machine exercises both settings.
"""

from __future__ import annotations

import asyncio
import os
import signal

import gymnasium as gym
import numpy as np
import psutil
import pytest
from conftest import assert_clean

import aiovec
import aiovec.vecenv
from aiovec.autoconf import SPIN_S


def spins(venv: aiovec.AsyncVecEnv) -> list:
    return [w["spin_s"] for w in venv.stats()["workers"]]


@pytest.fixture
def cpus(monkeypatch):
    def pin(n: int) -> int:
        monkeypatch.setattr(aiovec.vecenv, "available_cpus", lambda: n)
        return n

    return pin


def test_auto_spin_follows_the_worker_count_and_results_stay_exact(cpus, clean):
    cpus(2)
    n = 3
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    rng = np.random.default_rng(0)

    async def main() -> None:
        async with aiovec.make("CartPole-v1", n, num_workers=2) as venv:
            obs, _ = await venv.reset(seed=0)
            np.testing.assert_array_equal(obs, ref.reset(seed=0)[0])
            assert spins(venv) == [0.0, 0.0]  # 2 workers on 2 CPUs: no spare core to spin on
            for target, spin in ((1, SPIN_S), (2, 0.0), (1, SPIN_S)):
                await venv.resize(target)
                for _ in range(400):  # every env ends an episode, so every move completes
                    a = rng.integers(0, 2, n)
                    got, want = await venv.step(a), ref.step(a)
                    for g, w in zip(got[:4], want[:4], strict=True):
                        np.testing.assert_array_equal(g, w)
                assert venv.num_workers == target and venv.pending_moves == 0
                assert spins(venv) == [spin] * target, venv.stats()["workers"]

    aiovec.run(main())
    ref.close()
    assert_clean(clean)


def test_a_revived_worker_is_told_the_current_spin(cpus, clean):
    cpus(4)

    async def main() -> None:
        async with aiovec.make("CartPole-v1", 8, num_workers=4) as venv:
            await venv.reset(seed=0)
            assert spins(venv) == [0.0] * 4
            await venv.resize(2)  # two workers retire once their envs move; the other two spin
            await venv.resize(3)  # before any env moved: one retiring worker is kept after all
            for _ in range(600):
                await venv.step(np.zeros(8, dtype=np.int64))
            assert venv.num_workers == 3 and venv.pending_moves == 0
            assert spins(venv) == [SPIN_S] * 3, venv.stats()["workers"]

    aiovec.run(main())
    assert_clean(clean)


def test_explicit_spin_is_kept_through_resizes(cpus, clean):
    cpus(2)

    async def main() -> None:
        for spin, expected in ((False, 0.0), (True, SPIN_S)):
            async with aiovec.make("CartPole-v1", 4, num_workers=1, spin=spin) as venv:
                await venv.reset(seed=0)
                assert spins(venv) == [expected]
                await venv.resize(2)
                await venv.resize(1)
                for _ in range(600):
                    await venv.step(np.zeros(4, dtype=np.int64))
                assert venv.num_workers == 1 and spins(venv) == [expected]

    aiovec.run(main())
    assert_clean(clean)


def test_the_spin_window_follows_the_parents_usual_gap():
    """A worker polls about as long as the parent usually takes to send its next command: long enough
    for a policy's forward pass between steps, never past the cap, and not at all where the parent
    usually takes longer than the cap (polling would only burn the core)."""
    from aiovec.worker import MIN_SPIN_S, SpinWindow

    cap = 2e-3
    w = SpinWindow(cap)
    assert MIN_SPIN_S <= w.window() <= cap  # before any gap: it polls
    for _ in range(100):
        w.saw(450e-6)  # a 200 us forward pass plus the parent's own work
    assert 450e-6 <= w.window() < 600e-6
    w.saw(5.0)  # one long pause (a PPO update) moves the window, but only by its clipped share
    assert w.window() <= cap
    for _ in range(40):
        w.saw(450e-6)
    assert 450e-6 <= w.window() < 600e-6
    for _ in range(100):
        w.saw(10e-6)  # a tight loop: the window shrinks to the least poll, not below
    assert w.window() == MIN_SPIN_S
    for _ in range(100):
        w.saw(3e-3)  # the parent usually takes longer than the cap: no polling at all
    assert w.window() == 0.0
    assert SpinWindow(100e-6).window() <= 100e-6  # a cap below the least poll still bounds it


def test_the_parent_polls_for_due_replies_only_while_workers_leave_it_a_cpu(cpus, clean):
    """With a CPU to spare the parent busy-polls a reply that is due (no wake-up of a sleeping loop), results
    exact; with as many workers as CPUs, or with spin=False, it sleeps in the loop as before."""
    cpus(2)
    n = 4
    rng = np.random.default_rng(1)

    async def main() -> None:
        ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
        async with aiovec.make("CartPole-v1", n, num_workers=1, placement="process") as venv:
            obs, _ = await venv.reset(seed=3)
            np.testing.assert_array_equal(obs, ref.reset(seed=3)[0])
            pool = venv._pool
            for _ in range(300):
                a = rng.integers(0, 2, n)
                got, want = await venv.step(a), ref.step(a)
                for g, w in zip(got[:4], want[:4], strict=True):
                    np.testing.assert_array_equal(g, w)
            assert pool.poll_s > 0, "one worker on 2 CPUs: the parent polls"
            await venv.resize(2)
            for _ in range(300):  # every env ends an episode: every move completes
                await venv.step(rng.integers(0, 2, n))
            assert venv.num_workers == 2 and venv.pending_moves == 0
            before = pool.poll_s
            for _ in range(200):
                await venv.step(rng.integers(0, 2, n))
            assert pool.poll_s == before, "2 workers on 2 CPUs: no CPU to poll on"
        ref.close()
        async with aiovec.make("CartPole-v1", n, num_workers=1, placement="process", spin=False) as venv:
            await venv.reset(seed=0)
            for _ in range(300):
                await venv.step(rng.integers(0, 2, n))
            assert venv._pool.poll_s == 0

    aiovec.run(main())
    assert_clean(clean)


def test_a_poll_that_times_out_is_skipped_next_time_and_polling_resumes_once_replies_come(cpus, clean):
    """A reply that does not come while the parent polls (here: the worker stopped with SIGSTOP; in real runs, the
    CPU it needs is the one the parent spins on) makes the parent skip its next polls, one more each time in a row,
    instead of spinning POLL_S every time; once replies come in time, it polls every time again. Results exact."""
    cpus(2)
    n = 4
    rng = np.random.default_rng(2)

    async def main() -> None:
        ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
        async with aiovec.make("CartPole-v1", n, num_workers=1, placement="process", spin=True) as venv:
            obs, _ = await venv.reset(seed=4)
            np.testing.assert_array_equal(obs, ref.reset(seed=4)[0])
            pool = venv._pool
            for k in range(2000):  # the worker's step time is known (its replies are due), and the last poll was in time
                a = rng.integers(0, 2, n)
                got, want = await venv.step(a), ref.step(a)
                np.testing.assert_array_equal(got[0], want[0])
                if k >= 50 and pool._poll_backoff == 0 and pool._poll_skip == 0:
                    break
            (pid,) = [w["pid"] for w in venv.stats()["workers"]]
            timeouts = pool.poll_timeouts
            os.kill(pid, signal.SIGSTOP)
            try:
                while psutil.Process(pid).status() != psutil.STATUS_STOPPED:  # before the command can reach it
                    await asyncio.sleep(0.001)
                a = rng.integers(0, 2, n)
                venv.send(a)
                await asyncio.sleep(0.01)  # long past due
                polled = []
                for _ in range(4):
                    before = pool.poll_s
                    assert not pool.poll_replies()
                    polled.append(pool.poll_s > before)
                assert polled == [True, False, True, False], polled  # timed out, skipped one; again, skipping two
                assert pool.poll_timeouts == timeouts + 2
            finally:
                os.kill(pid, signal.SIGCONT)
            got, want = await venv.recv(n, timeout=10), ref.step(a)
            np.testing.assert_array_equal(got.obs, want[0])
            for _ in range(200):  # replies come in time again: polls succeed, and every due reply is polled for
                a = rng.integers(0, 2, n)
                got, want = await venv.step(a), ref.step(a)
                np.testing.assert_array_equal(got[0], want[0])
            before = pool.poll_s
            await venv.step(rng.integers(0, 2, n))
            assert pool.poll_s > before
        ref.close()

    aiovec.run(main())
    assert_clean(clean)


@pytest.mark.parametrize("route", [("process", "inline", "process", "hybrid"), ("inline", "hybrid", "process", "inline")])
def test_polled_replies_that_start_moves_never_lose_the_wake_up(cpus, clean, route):
    """Moves between this process and one worker while the parent polls: a polled reply can complete the batch
    and send move commands in the same breath (once, step() then slept forever: the poll counted pending
    commands, not delivered replies). Every step completes and matches SyncVectorEnv."""
    cpus(2)
    n = 4
    rng = np.random.default_rng(2)

    async def main() -> None:
        ref = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
        async with aiovec.make("CartPole-v1", n, num_workers=2, placement="hybrid") as venv:  # may go inline later
            obs, _ = await venv.reset(seed=5)
            np.testing.assert_array_equal(obs, ref.reset(seed=5)[0])
            for placement in route:
                await venv.resize(1 if placement != "hybrid" else 2, placement=placement)
                for _ in range(150):  # CartPole's episodes end within ~50 random steps: every move completes
                    a = rng.integers(0, 2, n)
                    got = await asyncio.wait_for(venv.step(a), 30)
                    want = ref.step(a)
                    for g, w in zip(got[:4], want[:4], strict=True):
                        np.testing.assert_array_equal(g, w)
                assert venv.pending_moves == 0 and venv.placement == placement
        ref.close()

    aiovec.run(main())
    assert_clean(clean)
