"""The control loop: samples measurements each interval, asks the controller, resizes the pool.

Runs as a task beside the vector env. An interval lasts until it has seen at
least ``max(30, 8 * workers)`` completed steps and ``min_interval`` seconds (at most
``max_interval``), jittered by +-10% so it does not lock onto periodic behaviour.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .controller import Controller, Decision, Measurement
from .machine import available_cpus

if TYPE_CHECKING:
    from .vecenv import AsyncVecEnv


@dataclass
class _Sample:
    t: float
    steps: int
    cpu: float
    wall: float
    runq: float
    main_cpu: float
    busy: float
    moves: int


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

    def _sample(self) -> _Sample:
        stats = self.venv._stats
        workers = [*stats.workers.values(), stats.retired]
        return _Sample(
            time.perf_counter(), sum(w.steps for w in workers), sum(w.cpu_s for w in workers),
            sum(w.wall_s for w in workers), sum(w.runq_s for w in workers), time.process_time(),
            self.venv._busy_time(), self.venv._pool.moves if self.venv._pool else 0,
        )

    def measure(self, a: _Sample, b: _Sample, settling: bool) -> Measurement:
        steps = b.steps - a.steps
        per = max(steps, 1)
        cpu, wall, runq = (b.cpu - a.cpu) / per, (b.wall - a.wall) / per, (b.runq - a.runq) / per
        dt = b.t - a.t
        return Measurement(
            interval_s=dt, num_workers=self.venv._pool.target_workers, num_envs=self.venv.num_envs, steps=steps,
            cpu_per_step=cpu, blocked_per_step=max(0.0, wall - cpu - runq), runq_per_step=runq,
            main_cpu_per_step=(b.main_cpu - a.main_cpu) / per, demand=min(1.0, (b.busy - a.busy) / dt) if dt > 0 else 0.0,
            cpus=self._cpus, settling=settling, live_workers=self.venv.num_workers,
        )

    async def run(self) -> None:
        prev = self._sample()
        settle = False
        while True:
            await asyncio.sleep(self.min_interval * self._rng.uniform(0.9, 1.1))
            cur = self._sample()
            if cur.steps - prev.steps < max(30, 8 * self.venv.num_workers) and cur.t - prev.t < self.max_interval:
                continue
            c0 = time.thread_time()
            pool = self.venv._pool
            if pool is None:
                return
            m = self.measure(prev, cur, settle or cur.moves != prev.moves or pool.pending_moves > 0)
            d: Decision = self.controller.decide(m)
            self.history.append({
                "t": cur.t - self.venv._stats.t0, "workers": m.num_workers, "steps_per_s": m.throughput,
                "latency_p50_s": self.venv._stats.latency.percentiles((50,))["p50"], "target": d.target,
                "reason": d.reason, "measured": d.measured, "runq_share": m.runq_share,
            })
            self.cost_s += time.thread_time() - c0
            settle = d.target != m.num_workers
            if settle:
                c0 = time.thread_time()
                await self.venv.resize(d.target)
                self.cost_s += time.thread_time() - c0
            prev = self._sample()
