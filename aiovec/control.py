"""The control loop: samples measurements each interval, asks the controller, applies its decision.

Runs as a task beside the vector env. An interval lasts until it has seen at
least ``max(30, 8 * workers)`` completed steps and ``min_interval`` seconds (at most
``max_interval``), jittered by +-10% so it does not lock onto periodic behaviour. A few
times per interval it looks at what the caller is awaiting (``step()``: lock-step;
``recv()``: first-finished), which tells the controller how the caller steps.

A decision may change three things, applied in this order: the placement (inline or
processes: envs move at episode boundaries), the threads per worker process (instant,
a TUNE to every worker) and the process count (envs move at episode boundaries).
A v1 controller's decision (threads and placement None) changes only the process count.
"""

from __future__ import annotations

import asyncio
import enum
import os
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .autoconf import python_pace
from .controller import Controller, Decision, Measurement
from .hostload import HostLoad, LoadSample, read_proc
from .machine import available_cpus
from .measured import config_of

if TYPE_CHECKING:
    from .vecenv import AsyncVecEnv


class Applied(enum.Enum):
    """What :meth:`ControlLoop.apply` changed."""

    NOTHING = enum.auto()  # the decision holds the configuration
    THREADS = enum.auto()  # threads per worker process (instant: a TUNE to each worker)
    MOVE = enum.auto()  # placement or processes: envs move at episode boundaries, the next intervals settle


@dataclass
class _Sample:
    t: float
    steps: int
    commands: int
    cpu: float
    wall: float
    runq: float
    main_cpu: float
    busy: float
    moves: int
    load: LoadSample
    in_step: float  # the caller's seconds inside step() so far
    task_runq: dict[int, float] | None = None  # per worker pid: run-queue wait of all its threads (s), when threaded


def _task_runq(pids: list[int]) -> dict[int, float]:
    """Per process: seconds its threads spent runnable but waiting for a CPU (Linux ``/proc/<pid>/task/*/schedstat``).

    Empty where that is not readable (another OS, a kernel without schedstats).
    """
    out: dict[int, float] = {}
    for pid in pids:
        try:
            total = 0
            for tid in os.listdir(f"/proc/{pid}/task"):
                total += int(read_proc(f"/proc/{pid}/task/{tid}/schedstat").split()[1])
            out[pid] = total / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return out


class ControlLoop:
    def __init__(self, venv: AsyncVecEnv, controller: Controller, min_interval: float = 0.25, max_interval: float = 5.0, seed: int = 0) -> None:
        self.venv = venv
        self.controller = controller
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.history: list[dict[str, Any]] = []
        self.cost_s = 0.0  # CPU the loop itself used
        self._rng = random.Random(seed)
        self._cpus = venv._pool.backend.cpus() if venv._pool is not None else float(available_cpus())
        # Knobs the user set: a number of workers, or any number of threads (the default is None).
        self.fixed_workers = venv._num_workers_arg != "auto"
        self.fixed_threads = getattr(venv, "_env_threads_arg", None) is not None
        self.fixed_placement = venv.placement_arg != "auto"
        self._paces: deque[float] = deque(maxlen=8)
        self._seen = [0, 0]  # wake-ups that found the caller in step() (lock-step) / in recv() (first-finished)
        pool = venv._pool
        self.inline_ok = pool is not None and "inline" in pool.backends and venv.placement_arg != "process" and not self.fixed_workers
        self._handed_over = False  # the caller resized by hand: workers and placement are theirs
        self._host = HostLoad() if venv.backend == "process" else None  # remote workers: this host's load says nothing
        self._load_before: LoadSample | None = None  # the host's load at the start of the interval before the last

    def hand_over_workers(self) -> None:
        """The caller called ``resize()``: the worker count and placement are theirs from now on; threads stay tuned."""
        self.fixed_workers = self.fixed_placement = self._handed_over = True
        self.inline_ok = False

    def _sample(self) -> _Sample:
        stats = self.venv._stats
        workers = [*stats.workers.values(), stats.retired]
        pool = self.venv._pool
        threaded = self.venv.env_threads > 1 and pool is not None and pool.kind == "process"
        pids = [w.pid for w in stats.workers.values() if w.pid]
        return _Sample(
            time.perf_counter(), sum(w.steps for w in workers), sum(w.commands for w in workers), sum(w.cpu_s for w in workers),
            sum(w.wall_s for w in workers), sum(w.runq_s for w in workers), time.process_time() - (pool.poll_s if pool else 0.0),
            self.venv._busy_time(), pool.moves if pool else 0,
            self._host.sample(pids) if self._host is not None else LoadSample(0.0, 0.0, 0.0, {}, False),
            self.venv._in_step_s, _task_runq(pids) if threaded else None,
        )

    def _pace(self) -> float:
        """The host's interpreter pace: the median of the last few intervals' readings (one reading is noisy)."""
        self._paces.append(python_pace(5))
        return statistics.median(self._paces)

    def _largest_shard(self) -> int:
        pool = self.venv._pool
        return max((len(w.envs) for w in pool.workers.values()), default=0) if pool is not None else 0

    def measure(self, a: _Sample, b: _Sample, settling: bool) -> Measurement:
        """One interval's :class:`Measurement` from two samples (per env step; see ``blocked_per_step``)."""
        venv, pool = self.venv, self.venv._pool
        steps = b.steps - a.steps
        per = max(steps, 1)
        cpu, wall, runq = (b.cpu - a.cpu) / per, (b.wall - a.wall) / per, (b.runq - a.runq) / per
        if a.task_runq is not None and b.task_runq is not None:
            # A worker measures the run queue of its own thread; its env threads queue for the CPUs too, and unseen
            # that reads as waiting (more processes, when the cores are what is short). The parent reads them all.
            both = [pid for pid in b.task_runq if pid in a.task_runq]
            if both:
                runq = max(runq, sum(b.task_runq[q] - a.task_runq[q] for q in both) / per * len(b.task_runq) / len(both))
        dt = b.t - a.t
        placement = pool.kind if pool is not None else "process"
        threads = 1 if placement == "inline" else max(1, venv.env_threads)
        shard = self._largest_shard()
        # Lock-step: every command steps a worker's whole shard. First-finished: commands carry fewer envs.
        commands = b.commands - a.commands
        live = max(1, venv.num_workers)
        lock, first = self._seen
        self._seen = [0, 0]
        awaiting = min(1.0, max(0.0, (b.in_step - a.in_step) / dt)) if dt > 0 else 0.0
        if lock or first:  # what the caller was awaiting when the loop looked: step() or recv()
            lockstep: bool | None = lock >= first
        elif awaiting > 0:  # no look found it waiting, but it called step(): lock-step, with work of its own between
            lockstep = True
        else:  # commands that each step a worker's whole shard (a recv() whose batch is a shard looks the same)
            lockstep = None if commands <= 0 else steps / commands >= 0.9 * venv.num_envs / live
        if threads > 1:  # a command's wall time is shared by its envs' threads: per env step it is longer
            wall *= max(1, min(threads, shard or 1))
        return Measurement(
            interval_s=dt, num_workers=pool.target_workers if pool is not None else 0, num_envs=venv.num_envs, steps=steps,
            cpu_per_step=cpu, blocked_per_step=max(0.0, wall - cpu - runq), runq_per_step=runq,
            main_cpu_per_step=(b.main_cpu - a.main_cpu) / per, demand=min(1.0, (b.busy - a.busy) / dt) if dt > 0 else 0.0,
            cpus=self._cpus, settling=settling, live_workers=venv.num_workers,
            threads=threads, placement=placement, lockstep=lockstep, largest_shard=shard,
            fixed_workers=self.fixed_workers, fixed_threads=self.fixed_threads, inline_ok=self.inline_ok,
            fixed_placement=self.fixed_placement, pace_s=self._pace(), foreign_cpus=self._foreign_cpus(a.load, b.load),
            awaiting=awaiting if lockstep else 0.0,
        )

    def _foreign_cpus(self, a: LoadSample, b: LoadSample) -> float:
        """Other processes' CPUs over this interval and the one before: ``/proc/stat`` accounts a CPU's busy time
        lazily (a tickless kernel), so one quarter-second interval of 24 waiting envs read -0.5 and the next +0.44
        with nothing else running; over two intervals such lags cancel, and a busy process still reads ~1."""
        before, self._load_before = self._load_before, a
        return HostLoad.foreign_cpus(before if before is not None and before.t < a.t else a, b)

    async def apply(self, m: Measurement, d: Decision) -> Applied:
        """Carry out a decision; what it changed (envs that have to move make the next intervals settling)."""
        venv, pool = self.venv, self.venv._pool
        if pool is None:
            return Applied.NOTHING
        if d.placement is not None and d.placement != m.placement and not self.fixed_workers and not self.fixed_placement:
            new = d.placement == "process" and d.threads is not None and d.threads != venv.env_threads
            await venv._resize(max(1, d.target), d.placement, d.threads if new else None)
            return Applied.MOVE
        threads = d.threads if d.threads is not None and d.threads != m.threads and m.placement == "process" and not self.fixed_threads else None
        if d.target != m.num_workers and not (self.fixed_workers and d.placement is not None) and not self._handed_over:
            await venv._resize(d.target, None, threads)  # one change: workers still sending envs away keep their threads
            return Applied.MOVE
        if threads is not None:
            await venv.set_env_threads(threads)
            return Applied.THREADS
        return Applied.NOTHING

    def _look(self) -> None:
        """Note whether the caller is awaiting a lock-step ``step()`` or a first-finished ``recv()`` right now."""
        waiters = getattr(self.venv, "_waiters", ())
        if waiters:
            self._seen[0 if any(batch for _, batch in waiters) else 1] += 1

    async def run(self) -> None:
        prev = self._sample()
        settle = False
        due = prev.t + self.min_interval * self._rng.uniform(0.9, 1.1)
        while True:
            await asyncio.sleep(self.min_interval / 4)  # a few looks at what the caller awaits per interval
            self._look()
            if time.perf_counter() < due:
                continue
            c0 = time.thread_time()
            cur = self._sample()
            self.cost_s += time.thread_time() - c0
            if cur.steps - prev.steps < max(30, 8 * self.venv.num_workers) and cur.t - prev.t < self.max_interval:
                continue
            await asyncio.sleep(0)  # the host's reads and the decision are two turns of the loop, not one
            c0 = time.thread_time()
            pool = self.venv._pool
            if pool is None:
                return
            m = self.measure(prev, cur, settle or cur.moves != prev.moves or pool.pending_moves > 0)
            self.venv._tune_spin(m.foreign_cpus)
            d: Decision = self.controller.decide(m)
            threads = getattr(d, "threads", None)
            placement = getattr(d, "placement", None)
            self.history.append({
                "t": cur.t - self.venv._stats.t0, "workers": m.num_workers, "steps_per_s": m.throughput,
                "latency_p50_s": self.venv._stats.latency.percentiles((50,))["p50"], "target": d.target,
                "reason": d.reason, "measured": d.measured, "runq_share": m.runq_share, "foreign_cpus": m.foreign_cpus,
                "demand": m.demand, "awaiting": m.awaiting,
                "threads": m.threads, "placement": m.placement, "lockstep": m.lockstep,
                "config": config_of(m).label,
                "target_threads": threads, "target_placement": placement,
            })
            self.cost_s += time.thread_time() - c0
            c0 = time.thread_time()
            applied = await self.apply(m, Decision(d.target, d.reason, d.measured, threads, placement))
            settle = applied is Applied.MOVE
            # A hold changes nothing: this interval's end is the next one's start (no gap, and one read of the host
            # less per interval); after a change the next interval starts once it is made.
            prev = cur if applied is Applied.NOTHING else self._sample()
            self.cost_s += time.thread_time() - c0
            due = prev.t + self.min_interval * self._rng.uniform(0.9, 1.1)
