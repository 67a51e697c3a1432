"""Adaptive controllers: pure decision logic, measurements in, a target worker count out.

No clock, no I/O, no asyncio: a controller is fed one :class:`Measurement` per
control interval and returns a :class:`Decision`, so it can be tested on
recorded or simulated traces and users can plug in their own (anything with a
``decide(measurement) -> Decision`` method).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Measurement:
    """What one control interval saw. Per-step times are seconds per env step.

    The control loop builds one per interval from the workers' counters; build your own
    to test a controller on a recorded or simulated trace.

    >>> m = aiovec.Measurement(interval_s=1.0, num_workers=2, num_envs=16, steps=1800, cpu_per_step=0.001,
    ...                        blocked_per_step=0.0, runq_per_step=0.0001, main_cpu_per_step=5e-5, demand=1.0, cpus=2)
    >>> m.throughput, round(m.runq_share, 3)
    (1800.0, 0.091)
    """

    interval_s: float
    num_workers: int
    num_envs: int
    steps: int
    cpu_per_step: float  # CPU inside workers
    blocked_per_step: float  # inside workers, neither running nor runnable (sleep, I/O)
    runq_per_step: float  # inside workers, runnable but waiting for a CPU
    main_cpu_per_step: float  # CPU of the parent process
    demand: float  # share of the interval in which the caller had steps in flight
    cpus: float  # CPUs available to this process
    settling: bool = False  # workers started or envs moved during the interval
    live_workers: int = 0  # worker processes that hosted envs (retiring ones included); 0: same as num_workers
    # v2 fields (optional: a v1 controller ignores them, a v1 trace leaves them at their defaults)
    threads: int = 1  # env threads per worker process during the interval
    placement: str = "process"  # "process", or "inline" (one in-process worker stepping every env)
    lockstep: bool | None = None  # True: the caller steps every env together; False: first-finished; None: unknown
    largest_shard: int = 0  # envs on the busiest worker (the lock-step critical path); 0: unknown
    fixed_workers: bool = False  # the user fixed the process count (num_workers=<int>)
    fixed_threads: bool = False  # the user fixed env_threads
    inline_ok: bool = False  # the in-process rungs may be used (no step_timeout, process backend, placement not "process")
    fixed_placement: bool = False  # the user chose the placement: configurations keep the current one
    pace_s: float = 0.0  # this host's interpreter pace during the interval (autoconf.python_pace); 0: unknown
    foreign_cpus: float = 0.0  # CPUs of this process's cores that other processes kept busy (hostload); 0: none or unknown
    awaiting: float = 0.0  # share of the interval the caller spent inside step() (lock-step); 0: none or unknown

    @property
    def stepping_rate(self) -> float:
        """Env steps per second of the caller's time inside ``step()`` (lock-step; elsewhere :attr:`throughput`).

        What lock-step configurations are ranked by: the caller's own work between steps (a policy's forward
        pass, the rest of a service) takes the same time whatever the configuration, so the time it waits in
        ``step()`` is what a configuration changes, and its rate holds while the caller's share of the time moves.
        """
        if self.lockstep is True and self.awaiting > 0 and self.interval_s > 0:
            return self.steps / (self.awaiting * self.interval_s)
        return self.throughput

    @property
    def throughput(self) -> float:
        """Env steps per second over the interval."""
        return self.steps / self.interval_s if self.interval_s > 0 else 0.0

    @property
    def env_step_s(self) -> float:
        """One env step's own time (CPU plus waiting, without run-queue wait): per-step wall times
        the envs a worker steps at once, since ``threads`` threads share a command's wall time."""
        return self.cpu_per_step + self.blocked_per_step

    @property
    def runq_share(self) -> float:
        """Share of a worker's step spent runnable but waiting for a CPU (oversubscription)."""
        total = self.cpu_per_step + self.blocked_per_step + self.runq_per_step
        return self.runq_per_step / total if total > 0 else 0.0


@dataclass(frozen=True)
class Decision:
    """A controller's answer for one interval: the worker count to run, and why (shown in ``control_history``).

    A v2 controller may also set ``threads`` (env threads per worker process, instant) and
    ``placement`` (``"inline"``: every env in this process); ``None`` leaves them as they are.

    >>> aiovec.Decision(4, "latency-bound: 4 workers keep the CPUs busy")
    Decision(target=4, reason='latency-bound: 4 workers keep the CPUs busy', measured=True, threads=None, placement=None)
    """

    target: int
    reason: str
    measured: bool = True  # False when the interval was skipped (no demand, settling)
    threads: int | None = None  # v2: env threads per worker process (None: leave as is)
    placement: str | None = None  # v2: "process" or "inline" (None: leave as is)


class Controller(Protocol):
    """Anything with ``decide(measurement) -> Decision`` can drive the worker count (``controller=``).

    >>> class Bounded:
    ...     "Adaptive, but never more than 2 workers."
    ...     def __init__(self):
    ...         self.inner = aiovec.AdaptiveController()
    ...     def decide(self, m):
    ...         d = self.inner.decide(m)
    ...         return aiovec.Decision(min(d.target, 2), d.reason + " (capped at 2)", d.measured)
    >>> venv = aiovec.make("CartPole-v1", 8, num_workers="auto", controller=Bounded())
    >>> type(venv.controller).__name__
    'Bounded'
    """

    def decide(self, m: Measurement) -> Decision:
        """The worker count (and, optionally, threads and placement) for the next interval, given what the last one measured."""
        ...


class StaticController:
    """Always the same worker count (what ``num_workers=<int>`` gives, as a controller object).

    >>> m = aiovec.Measurement(1.0, 2, 16, 1000, 1e-3, 0.0, 0.0, 5e-5, 1.0, 2)
    >>> aiovec.StaticController(3).decide(m)
    Decision(target=3, reason='static', measured=True, threads=None, placement=None)
    """

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers

    def decide(self, m: Measurement) -> Decision:
        """Always ``num_workers``."""
        return Decision(self.num_workers, "static")


class AdaptiveController:
    """Model-based worker count with guards and hysteresis (see docs/controller notes).

    Target from Little's law: the throughput the machine can sustain is
    ``X = min(C / (t_cpu + t_main), 0.85 / t_main)`` (CPUs, or the single-threaded
    parent, whichever binds), and each worker delivers ``1 / (t_cpu + t_blocked)``
    steps/s, so ``N = X * (t_cpu + t_blocked)``. Because per-step CPU hardly depends
    on N, "the env got heavier" is told apart from "the CPUs are oversubscribed"
    (which shows as run-queue wait, and caps N). Growth is at most x2 per interval,
    except right after a regime change, when it goes to the model's target at once;
    shrinking needs ``shrink_votes`` consecutive votes unless the run queue is
    badly oversubscribed, and so does growing back to a count it shrank away from
    in the last ``flap_window`` intervals (one noisy interval must not undo a
    measured shrink). Per-step costs are smoothed, and the smoothing restarts
    when the cost jumps (a regime change) so the controller re-adapts at once.

    Envs that wait 9 ms per step and use 1 ms of CPU, on 2 CPUs: 2 / 1 ms = 2000 steps/s are
    possible and each worker gives 100, so about 20 workers (24 with the margin for waiting
    envs), reached by doubling from 2.

    >>> ctrl = aiovec.AdaptiveController(max_workers=32)
    >>> n = 2
    >>> for _ in range(5):
    ...     m = aiovec.Measurement(interval_s=1.0, num_workers=n, num_envs=64, steps=200 * n, cpu_per_step=0.001,
    ...                            blocked_per_step=0.009, runq_per_step=0.0, main_cpu_per_step=5e-5, demand=1.0, cpus=2)
    ...     n = ctrl.decide(m).target
    ...     print(n, end=" ")
    4 8 16 24 24
    """

    def __init__(
        self,
        min_workers: int = 1,
        max_workers: int | None = None,
        shrink_votes: int = 3,
        min_demand: float = 0.5,
        runq_cap: float = 0.10,
        main_limit: float = 0.85,
        smoothing: float = 0.5,
        max_settling_skips: int = 3,
        flap_window: int = 40,
    ) -> None:
        if min_workers < 1 or (max_workers is not None and max_workers < min_workers):
            raise ValueError(f"need 1 <= min_workers <= max_workers, got {min_workers}, {max_workers}")
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.shrink_votes = shrink_votes
        self.min_demand = min_demand
        self.runq_cap = runq_cap
        self.main_limit = main_limit
        self.alpha = smoothing
        self.max_settling_skips = max_settling_skips
        self.flap_window = flap_window
        self._settling_skips = 0
        self._interval = 0  # measured intervals so far
        self._left: dict[int, int] = {}  # worker count shrunk away from -> interval it happened
        self._grow_votes = 0
        self._avg: tuple[float, float, float] | None = None  # (t_cpu, t_blocked, t_main)
        self._jumps = 0
        self._votes = 0
        self.main_bound = False

    def decide(self, m: Measurement) -> Decision:
        """The next worker count, with the reason; skipped intervals (no demand, settling) keep the count."""
        n = m.num_workers
        if m.steps == 0 or m.demand < self.min_demand:
            return Decision(n, f"skipped: caller asked for steps only {m.demand:.0%} of the interval", measured=False)
        if m.settling and self._settling_skips < self.max_settling_skips:
            # Envs move only at episode boundaries: with slow episodes a resize can take many
            # intervals, and a controller that waits for all of them is blind meanwhile.
            self._settling_skips += 1
            return Decision(n, "skipped: workers starting or envs moving", measured=False)
        self._settling_skips = 0
        self._interval += 1
        raw = (m.cpu_per_step, m.blocked_per_step, m.main_cpu_per_step)
        regime = ""
        if self._avg is None:
            self._avg = raw
        else:
            ratio = (raw[0] + raw[1]) / max(self._avg[0] + self._avg[1], 1e-9)
            self._jumps = self._jumps + 1 if not 0.8 <= ratio <= 1.25 else 0
            if self._jumps >= 2:
                self._avg, self._jumps, self._votes = raw, 0, 0
                if ratio > 1:  # heavier envs: counts left before may be right now. (Lighter ones are also
                    self._left.clear()  # what a shrink itself shows: less contention, less blocked time.)
                regime = "env cost changed; "
            else:
                a = self.alpha
                self._avg = tuple(a * r + (1 - a) * s for r, s in zip(raw, self._avg, strict=True))  # type: ignore[assignment]
        t_cpu, t_blk, t_main = self._avg
        t_main = max(t_main, 1e-6)
        x_cpu = m.cpus / max(t_cpu + t_main, 1e-9)
        x_main = self.main_limit / t_main
        self.main_bound = x_main < x_cpu
        x_max = min(x_cpu, x_main)
        # Waiting envs: throughput is flat above the optimum and steep below it, so lean up.
        waiting = t_blk / max(t_cpu + t_blk, 1e-9)
        model = x_max * (t_cpu + t_blk) * (1.0 + 0.25 * waiting)
        target = max(1, math.ceil(model - 0.15))
        why = (f"{regime}model: {x_max:.0f} steps/s possible "
               f"({'parent-bound: packing envs into fewer workers' if self.main_bound else 'CPU/latency-bound'}), "
               f"each worker step {1e3 * (t_cpu + t_blk):.2f} ms -> {model:.1f} workers")
        share = m.runq_share
        if share > self.runq_cap and target >= n:
            running = max(n, m.live_workers)  # while envs move, retiring workers still compete for the CPUs
            target = max(1, min(target, math.floor(running * (1 - share))))
            why += f"; run queue {share:.0%} of step time: capped"
        hi = min(self.max_workers or m.num_envs, m.num_envs)
        target = max(self.min_workers, min(hi, target))
        if target != n and abs(target - n) < max(1.0, 0.1 * n):  # dead-band against churn at large N
            self._votes = self._grow_votes = 0
            return Decision(n, f"hold (within 10%): {why}")
        if target > n:
            self._votes = 0
            if not regime:  # after a regime change the fresh model is trusted at once: one move, not log2(N) moves
                target = min(target, 2 * n)
                left = [k for k, when in self._left.items() if n < k <= target and self._interval - when <= self.flap_window]
                if left:
                    self._grow_votes += 1
                    if self._grow_votes < self.shrink_votes:
                        return Decision(n, f"hold (grow vote {self._grow_votes}/{self.shrink_votes}: "
                                           f"{min(left)} workers were left {self._interval - self._left[min(left)]} intervals ago): {why}")
            self._grow_votes = 0
            return Decision(target, f"grow: {why}")
        self._grow_votes = 0
        if target < n:
            self._votes += 1
            if self._votes < self.shrink_votes and share < 0.3:
                return Decision(n, f"hold (shrink vote {self._votes}/{self.shrink_votes}): {why}")
            self._votes = 0
            self._left[n] = self._interval
            return Decision(max(target, n // 2), f"shrink: {why}")
        self._votes = 0
        return Decision(n, f"hold: {why}")
