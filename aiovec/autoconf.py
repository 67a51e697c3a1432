"""A static choice of worker count (and spinning) from a probe of the env's step cost.

The adaptive controller refines this at run time; this is the starting point
(processes, threads per process, inline or not), and what ``num_workers="auto"`` means
when no controller runs.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

# One IPC round trip costs ~25-120 us here; a worker should get at least this much env
# work per command to make the trip worth it.
MIN_WORK_PER_COMMAND_S = 200e-6
SPIN_S = 2e-3
"""The most a worker with a spare CPU polls for its next command (it polls about as long as the
parent's usual gap, see worker.SpinWindow). PPO on Hopper x8, hybrid (this process and one worker),
40k steps, 3 seeds interleaved: time awaiting the envs 7.05 s -> 6.58 s (median) against a fixed 200 us poll,
which the command after a 200 us policy pass always missed."""


@dataclass(frozen=True)
class StepCost:
    """What one step of env 0 cost in the probe (typical: the lower quartile); ``pace_s``: this host's
    :func:`python_pace` then (None: unknown); ``mean_wall_s``: the mean step after the first quarter of the
    probe (its cold start), where a tail of slow steps shows (None: not measured)."""

    cpu_s: float
    wall_s: float
    pace_s: float | None = None
    mean_wall_s: float | None = None

    @property
    def waiting_share(self) -> float:
        return 0.0 if self.wall_s <= 0 else max(0.0, 1.0 - self.cpu_s / self.wall_s)


def probe_step_cost(env: Any, max_steps: int = 40, max_s: float = 0.05) -> StepCost | None:
    """Time up to ``max_steps`` random steps of ``env`` (at most ~``max_s``); None if it cannot step.

    The lower quartile, not the mean or the median: cold first steps of a fresh env (lazy imports,
    caches), a preemption on a busy machine and, for a probe in a helper thread, waits for the GIL
    only ever lengthen a step, and they would otherwise decide the placement and the worker count.
    """
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        cpu: list[float] = []
        wall: list[float] = []
        deadline = time.perf_counter() + max_s
        while len(wall) < max_steps and time.perf_counter() < deadline:
            action = env.action_space.sample()
            c0, w0 = time.thread_time(), time.perf_counter()
            _, _, term, trunc, _ = env.step(action)
            cpu.append(time.thread_time() - c0)
            wall.append(time.perf_counter() - w0)
            if term or trunc:
                env.reset()
        if not wall:
            return None
        warm = wall[len(wall) // 4 :]
        return StepCost(_lower_quartile(cpu), _lower_quartile(wall), python_pace(), sum(warm) / len(warm))
    except Exception:
        return None


def _reference_work() -> float:
    x = 0.0
    for i in range(100):
        x = x * 0.5 + math.sin(i)
    return x


def python_pace(repeats: int = 9) -> float:
    """Seconds this host takes, now, for a fixed bit of interpreter work (~2 us on a fast core, ~8 us on this
    project's slower VMs; the lower quartile of ``repeats``).

    The round trip to a worker is mostly interpreter and kernel work, so its price moves with the host's speed
    (the same VM measured CartPole's step at 11 and 21 us minutes apart): :func:`choose_placement` weighs an
    env's step against it in these units rather than in fixed microseconds.
    """
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _reference_work()
        times.append(time.perf_counter() - t0)
    return _lower_quartile(times)


def _lower_quartile(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=4)[0] if len(xs) >= 4 else min(xs)


def plan_workers(num_envs: int, cost: StepCost | None, cpus: int) -> int:
    """Worker processes for ``num_envs`` envs of this cost on ``cpus`` CPUs.

    No more processes than CPUs (waiting envs overlap their waits on threads inside the
    workers, see :func:`plan_threads`), and no more than keeps each command above
    ``MIN_WORK_PER_COMMAND_S``; the count is one whose busiest worker has fewer envs than with
    one process less (lock-step waits for the busiest worker: 5 processes for 8 envs run like 4).
    """
    from .configs import efficient_counts

    if cost is None or cost.waiting_share > 0.5:
        hi = min(num_envs, cpus)
    else:
        hi = min(num_envs, cpus, math.ceil(num_envs * cost.wall_s / MIN_WORK_PER_COMMAND_S))
    return max(1, efficient_counts(num_envs, max(1, hi))[-1])


def plan_threads(num_envs: int, cost: StepCost | None, cpus: int, workers: int, max_threads: int = 32) -> int:
    """Env threads per worker process to start with: the fewest the cost model expects to do as well as any.

    Only envs that mostly wait get threads (their waits overlap while the GIL is free); the
    controller then measures and corrects this guess.
    """
    if cost is None or cost.waiting_share <= 0.5 or workers < 1:
        return 1
    from .configs import Config, efficient_threads, largest_shard
    from .costmodel import Costs, predict

    costs = Costs(cost.cpu_s, max(0.0, cost.wall_s - cost.cpu_s), 20e-6)
    options = efficient_threads(largest_shard(num_envs, workers), max_threads)
    rated = [(predict(Config("process", workers, t), costs, num_envs, cpus), t) for t in options]
    top = max(r for r, _ in rated)
    return min(t for r, t in rated if r >= 0.97 * top)


def spin_for(num_workers: int, cpus: int) -> float:
    """Spin after replies only when workers leave the parent a CPU of its own."""
    return SPIN_S if num_workers < cpus else 0.0


ROUND_TRIP_S = 50e-6
"""What a batch stepped beside worker processes (hybrid) costs beyond the env work: a command to a
spinning worker, its reply, the parent's bookkeeping. Where ``n * t * (1 - 1/w)`` equals it, inline and
hybrid tie. Measured on 2 CPUs (same run, lock-step, x SyncVectorEnv, inline vs hybrid): CartPole x8
0.85 vs 0.66, x16 0.88 vs 0.89 (n t / 2 ~ 48 us: the tie), x24 0.88 vs 1.08, x32 0.85 vs 1.22, x64 0.88
vs 1.36; HalfCheetah x8 0.86 vs 1.15. Used where the host's pace is unknown; see ``ROUND_TRIP_PACES``."""

ROUND_TRIP_PACES = 10.0
"""The same round trip in units of :func:`python_pace` (it moves with the host's speed). On a VM ~3x slower
than the one above (CartPole ~11-21 us a step, pace ~8 us; the parent polling for replies): CartPole x8
inline 1.04 vs hybrid 0.90 x SyncVectorEnv, x16 0.86 vs 1.07, x32 1.19 vs 1.42: a tie between 8 and 16
envs, n t / 2 ~ 8 paces; on the faster host above the tie at 16 is ~11 paces (t ~ 1.35 paces, both hosts)."""

MEASURED_ROUND_TRIP_PACES = 6.0
""":data:`ROUND_TRIP_PACES` where the adaptive controller will measure both in-process rungs (see
``MeasuredController._other_rung``): lower, because the two ways of being wrong cost differently. A hybrid start
that loses is corrected by a look at inline, which starts nothing (a few intervals); an inline start that loses,
by a look at hybrid, which starts a process mid-run (1-2 s here at the slower rate, and one such look only). The
round trip's price varies by host more than the pace does: 16 CartPoles (48 us of env CPU moved off a batch, 6.7
paces of 7.2 us) stepped 1.27x faster hybrid than inline (178k vs 141k steps/s, medians of 3 interleaved rounds)
on a VM where 8 (3.3 paces) tied; on another the tie was near 8-11 paces.

Not lower than 6: the look at inline needs intervals in which the caller asks for steps, and a training loop
asks ~20% of the time (PPO on 8 CartPoles: every interval skipped, the look never came). At 5, 8 CartPoles
wrapped for PPO (~8 us a step, 4.6-4.8 paces probed in a warm process, above 5 in a fresh one) started hybrid in 4
of 10 runs of ``examples/ppo_speedup.py``, each 15-95% slower to 475 than the inline runs (set-up 0.3 s, not 0.02)."""

INLINE_MAX_BUILD_S = 0.25
"""Envs slower to build than this never step in this process (a heavy simulator earns its isolation;
Atari's ~0.1 s and MuJoCo's few ms do not count as heavy)."""


INLINE_MAX_STEP_S = 0.5e-3
"""The loop-hold goal for envs stepped in this process: a slice holds the loop for at least one step, so one
step should take about this long at most. The limits applied are :data:`INLINE_ENTER_S` and :data:`INLINE_LEAVE_S`."""

INLINE_ENTER_S = 1.2 * INLINE_MAX_STEP_S
"""Envs whose step measures longer never start in this process or move into it. Above the goal by what a step's
timing scatters on a busy or noisy host: on a 2-CPU VM ALE/Pong-v5 probed 0.34-0.36 ms alone, but 0.49-0.56 ms in
slow phases of the host lasting 50 ms or more (a fresh process's first probe in 2 of 3 processes), and it measured
0.45-0.5 ms with 4 of 8 envs in this process (hybrid) and 0.55-0.62 ms in 2 worker processes (other envs' state
evicts its caches, the sibling CPU is busy). Stepped hybrid, one env per turn, a task beside it saw a p99 gap of
0.55 ms between its turns."""

INLINE_LEAVE_S = 1.6 * INLINE_MAX_STEP_S
"""Envs stepping in this process leave it at once when a step measures longer. The band above
:data:`INLINE_ENTER_S` keeps a cost that scatters around one limit from moving the envs out and back on single
intervals; a turn of the loop stays well inside the 1 ms p99 the loop-hold benchmark allows."""


def choose_placement(num_envs: int, cost: StepCost | None, cpus: int, build_s: float, measured: bool = False) -> str:
    """Where CPU-bound envs step fastest: ``"inline"``, ``"hybrid"`` or ``"process"``.

    Inline, a batch costs ``n * t`` on this process alone. Hybrid, this process steps one shard
    of ``w = min(cpus, n)`` while ``w - 1`` worker processes step the others, so a batch costs
    about ``n * t / w`` plus a round trip: inline wins while ``n * t * (1 - 1/w)`` is at most the round
    trip (``ROUND_TRIP_PACES`` of the host's pace when the probe measured it, else ``ROUND_TRIP_S``),
    hybrid beyond. Processes alone leave this process idle while ``w`` workers share the
    CPUs with it, so they lose to hybrid for envs that compute; they win for envs that mostly
    wait (sleeps, I/O: overlapped on many processes and threads), for envs slow to build, and for
    envs whose one step would hold the event loop too long (``INLINE_ENTER_S``), typically or on average
    (a tail of slow steps: the controller, which sees the mean, would soon move them out).

    ``measured``: the adaptive controller will measure both in-process rungs, so where the host's pace is known the
    bound for inline is the lower :data:`MEASURED_ROUND_TRIP_PACES` (start hybrid, look at inline).
    """
    if cost is None or cost.waiting_share > 0.5 or build_s > INLINE_MAX_BUILD_S or cost.wall_s > INLINE_ENTER_S:
        return "process"
    if cost.mean_wall_s is not None and cost.mean_wall_s > INLINE_ENTER_S:  # typical steps are short, some are long
        return "process"
    w = max(1, min(cpus, num_envs))
    paces = MEASURED_ROUND_TRIP_PACES if measured else ROUND_TRIP_PACES
    round_trip = paces * cost.pace_s if cost.pace_s else ROUND_TRIP_S
    if num_envs * cost.wall_s * (1 - 1 / w) <= round_trip:
        return "inline"
    return "hybrid"
