"""Latency and throughput accounting, shared by the vector env, the controller and the benchmarks."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np


class LatencyRing:
    """The last ``size`` latencies (seconds), for percentiles without unbounded memory."""

    def __init__(self, size: int = 4096) -> None:
        self._buf: deque[float] = deque(maxlen=size)
        self.add = self._buf.append  # one C call per sample: this runs once per batch

    def percentiles(self, qs: tuple[float, ...] = (50, 90, 99)) -> dict[str, float]:
        data = np.fromiter(self._buf, dtype=np.float64, count=len(self._buf))
        if data.size == 0:
            return {f"p{q:g}": float("nan") for q in qs}
        return {f"p{q:g}": float(v) for q, v in zip(qs, np.percentile(data, qs), strict=True)}


@dataclass
class WorkerStats:
    """Totals for one worker, fed by every reply it sends."""

    worker_id: int
    pid: int | None = None  # None for an inline worker (its envs live in this process)
    kind: str = "process"  # "process" (or a Ray actor) or "inline"
    envs: int = 0
    steps: int = 0
    commands: int = 0
    cpu_s: float = 0.0  # CPU time inside the worker (thread_time)
    wall_s: float = 0.0  # wall time inside the worker, per command
    runq_s: float = 0.0  # time runnable but waiting for a CPU (Linux schedstat)
    spin_s: float | None = None  # its poll after each reply, as the worker last confirmed (None: it cannot spin)
    env_threads: int | None = None  # threads stepping its envs, as the worker last confirmed (None: not asked yet)
    latency: LatencyRing = field(default_factory=lambda: LatencyRing(1024))

    def snapshot(self) -> dict:
        per = max(self.steps, 1)
        return {
            "worker_id": self.worker_id,
            "pid": self.pid,
            "kind": self.kind,
            "envs": self.envs,
            "steps": self.steps,
            "cpu_per_step_s": self.cpu_s / per,
            "wall_per_step_s": self.wall_s / per,
            "runq_per_step_s": self.runq_s / per,
            "spin_s": self.spin_s,
            "env_threads": self.env_threads,
            "latency_s": self.latency.percentiles(),
        }


class Stats:
    """Whole-vector-env counters: steps, steps/s since start, batch latency percentiles."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.steps = 0
        self.latency = LatencyRing()
        self.workers: dict[int, WorkerStats] = {}
        self.retired = WorkerStats(-1)  # totals of workers that are gone (kept as sums: bounded memory)

    def worker(self, worker_id: int) -> WorkerStats:
        ws = self.workers.get(worker_id)
        if ws is None:
            ws = self.workers[worker_id] = WorkerStats(worker_id)
        return ws

    def retire(self, worker_id: int) -> None:
        ws = self.workers.pop(worker_id, None)
        if ws is not None:
            r = self.retired
            r.steps += ws.steps
            r.commands += ws.commands
            r.cpu_s += ws.cpu_s
            r.wall_s += ws.wall_s
            r.runq_s += ws.runq_s

    def record(self, worker_id: int, nsteps: int, cpu_s: float, wall_s: float, runq_s: float, latency: float) -> None:
        """One step command of a worker: ``nsteps`` env steps, what they cost inside it, its round trip."""
        self.steps += nsteps
        self.latency.add(latency)
        ws = self.workers.get(worker_id) or self.worker(worker_id)
        ws.steps += nsteps
        ws.commands += 1
        ws.cpu_s += cpu_s
        ws.wall_s += wall_s
        ws.runq_s += runq_s
        ws.latency.add(latency)

    def snapshot(self) -> dict:
        elapsed = time.perf_counter() - self.t0
        return {
            "steps": self.steps,
            "elapsed_s": elapsed,
            "steps_per_s": self.steps / elapsed if elapsed > 0 else 0.0,
            "latency_s": self.latency.percentiles(),
            "workers": [w.snapshot() for w in self.workers.values()],
        }
