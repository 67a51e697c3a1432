"""The model that proposes: predicted steps/s of a configuration from measured per-step costs.

Pure arithmetic, no clock. The controller ranks candidate configurations with it and then
measures the one it moves to; the model is never the last word (see :mod:`aiovec.measured`).

A lock-step batch is done when the busiest process is: it steps its shard of ``s`` envs on
``T`` threads, so waits overlap (``ceil(s / T)`` rounds of one env step) while CPU work
serialises on the process's GIL (``s * t_cpu``, and the last thread to get the GIL still waits
after it). The cores bound the batch too (every env's CPU plus the parent's, over ``C``). In
lock-step the parent's own work (collecting every result, the caller's turn, sending every action)
adds to the batch: the workers idle meanwhile. First-finished, it overlaps them and only bounds the
rate. Inline, the parent steps every env itself, one after another.

Fitted against the controller benchmark's static grid on 2 cores (64 envs waiting 5 ms: 1p x 8t
~42 ms a batch, 2p x 32t ~6.4 ms, 64p x 1t ~7.3 ms; 48 envs of 1 ms CPU + 10 ms waiting:
2p x 24t ~35 ms), within ~10%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .configs import Config, largest_shard

COMMAND_S = 40e-6
"""Parent and kernel CPU per command to a worker process (send, wake-up, reply): what a process costs per batch,
where the host's pace is unknown (see :data:`COMMAND_PACES`)."""

COMMAND_PACES = 11.0
"""The same cost in units of the host's interpreter pace (:func:`aiovec.autoconf.python_pace`), which moves with
the host's speed: 40 us where the pace was ~3.7 us (CartPole ~5 us a step); ~90 us on a VM whose pace is ~8 us,
where the fixed 40 us rated 2 processes (hybrid) 8-12% above inline for 8 CartPoles, and they measured 15-40%
below it (``python -m aiovec.bench controller``'s trace: every run started a process to find that out)."""


def command_cost(pace_s: float) -> float:
    """:data:`COMMAND_S` at this host's pace (``pace_s`` 0: unknown, the fixed figure)."""
    return COMMAND_PACES * pace_s if pace_s > 0 else COMMAND_S

THREAD_HANDOFF_S = 15e-6
"""Worker CPU per env step handed to a thread of its pool (queue, wake-up, GIL hand-over)."""

INLINE_MAIN_SHARE = 0.5
"""Share of the parent's per-step CPU with worker processes (sends, wake-ups, replies) that remains when envs
step inline (the batch bookkeeping): CartPole here, ~25 us a step with processes, ~11 us plus the env inline."""

UNEVEN_SHARE = 0.5
"""In lock-step, processes that do not divide evenly over the cores finish unevenly: with 3 processes on 2
cores, one core runs two shards while the other runs one and then idles until the scheduler moves work over.
The batch then ends this share of the way from the even split of all the CPU (``n * t / C``) to the uneven
one (``ceil(p / C)`` shards in turn). Measured here, 24 envs of 1 ms CPU, lock-step, 3 interleaved runs:
2 processes 12.4 ms a batch, 3 processes 14.4 ms (even 12.4, uneven 16.4: half way), 4 processes 12.8 ms."""

PARENT_LIMIT = 0.85
"""Share of one core the parent's event loop can spend on the vector env before it is the bottleneck."""

FIRST_FINISHED_WAVES = 2
"""First-finished, the caller takes the envs in batches (``recv(num_envs // 2)``, EnvPool's usual), so they step in
this many waves, and the parent's turn for one wave (its results, the caller, the next actions: the parent's work
for all envs over the waves) lies between a wave's replies and its next commands. Without it the model ranked
16 envs waiting 2 ms on 16 processes x 1 thread 20% above 2 x 8 (8,043 against 6,686 steps/s); measured at fixed
settings in one run they ran 5,696 and 5,992, the parent's CPU a step 43.5 us at 16 processes and 17.6 us at 2.
With it, from the reading at 2 processes: 6,702 and 6,244 (+7%, under what a move to more processes must promise).
Every round of that held-out workload had probed more processes on the model's word, measured no better, and come
back."""


@dataclass(frozen=True)
class Costs:
    """Per env step: CPU in the env, time it waits (GIL released), and the parent's CPU excluding env work."""

    cpu_s: float
    wait_s: float
    main_s: float

    @property
    def waiting_share(self) -> float:
        total = self.cpu_s + self.wait_s
        return self.wait_s / total if total > 0 else 0.0


def predict(c: Config, costs: Costs, num_envs: int, cpus: float, lockstep: bool = True, command: float = COMMAND_S) -> float:
    """Predicted steps/s of ``num_envs`` envs under configuration ``c`` on ``cpus`` CPUs; ``command``: what a
    command to a worker process costs (:func:`command_cost`).

    >>> cpu_bound = Costs(cpu_s=1e-3, wait_s=0.0, main_s=20e-6)
    >>> round(predict(Config("process", 2, 1), cpu_bound, 8, 2)) > round(predict(Config("process", 1, 1), cpu_bound, 8, 2))
    True
    >>> waiting = Costs(cpu_s=20e-6, wait_s=5e-3, main_s=20e-6)
    >>> predict(Config("process", 2, 8), waiting, 64, 2) > 3 * predict(Config("process", 2, 1), waiting, 64, 2)
    True
    """
    n = num_envs
    t_cpu, t_wait, t_main = max(costs.cpu_s, 1e-7), max(costs.wait_s, 0.0), max(costs.main_s, 0.0)
    if c.placement == "inline":
        return 1.0 / (t_cpu + t_wait + INLINE_MAIN_SHARE * t_main)
    if c.placement == "hybrid":  # this process steps a shard too, then does its turn; the processes only their shard
        p = max(2, min(c.processes, n))
        s = largest_shard(n, p) if lockstep else n / p
        shard = s * (t_cpu + t_wait)
        parent = n * t_main + (p - 1) * command / 2
        batch = max(shard + command, shard + parent, (n * t_cpu + parent + (p - 1) * command) / cpus)
        return n / batch
    p = max(1, min(c.processes, n))
    s = largest_shard(n, p) if lockstep else n / p
    t = max(1, min(c.threads, math.ceil(s)))
    handoff = THREAD_HANDOFF_S if t > 1 else 0.0
    worker = command_s(s, t, t_cpu, t_wait, lockstep, handoff)
    parent = n * t_main + p * command / 2
    if lockstep:  # the parent's turn is serial with the workers' (they idle meanwhile)
        cores = (n * (t_cpu + handoff) + p * command) / cpus
        if p > cpus and p % cpus:
            uneven = math.ceil(p / cpus) * (s * (t_cpu + handoff) + command)
            cores += UNEVEN_SHARE * max(0.0, uneven - cores)
        batch = parent + max(worker + command, cores)
    else:
        batch = max(worker + command + parent / FIRST_FINISHED_WAVES, (n * (t_cpu + handoff + t_main) + p * command) / cpus,
                    parent / PARENT_LIMIT)
    return n / batch


def command_s(shard: float, threads: int, cpu_s: float, wait_s: float, lockstep: bool = True, handoff_s: float = 0.0) -> float:
    """How long a worker takes to step its ``shard`` of envs on ``threads`` threads (one GIL).

    Each thread steps ``ceil(shard / threads)`` envs in turn (rounds of CPU plus waiting). Where the
    CPU parts fill the GIL, the envs' CPU serialises and the last wait hangs out after it: ``shard``
    CPU times plus one wait (24 envs of 1 ms CPU + 10 ms waiting on 24 threads: ~34 ms, not 11).
    ``handoff_s``: the worker's CPU to hand one env step to a thread (serialised, but not before the wait).

    >>> round(1e3 * command_s(24, 24, 1e-3, 10e-3), 1), round(1e3 * command_s(4, 1, 1e-3, 10e-3), 1)
    (34.0, 44.0)
    """
    t = max(1, min(threads, math.ceil(shard)))
    rounds = math.ceil(shard / t) if lockstep else shard / t
    return max(rounds * (cpu_s + handoff_s + wait_s), shard * (cpu_s + handoff_s), shard * cpu_s + wait_s)


def wait_from_command(command: float, shard: int, threads: int, cpu_s: float, runq_s: float = 0.0) -> float:
    """The per-step waiting that makes :func:`command_s` last ``command`` seconds (its inverse in ``wait_s``).

    ``runq_s``: what the command's threads together spent runnable but without a CPU; each thread loses
    its share of it. (Where the GIL serialises CPU-bound envs on more processes than cores, the holder's
    queueing holds the other threads up too, and some of that still reads as waiting: the controller's
    measurements, not this estimate, decide there.)

    >>> round(1e3 * wait_from_command(command_s(24, 24, 1e-3, 10e-3), 24, 24, 1e-3), 3)
    10.0
    >>> round(1e3 * wait_from_command(command_s(12, 4, 50e-6, 3e-3), 12, 4, 50e-6), 3)
    3.0
    >>> wait_from_command(14e-3, 12, 4, 1e-3, runq_s=8e-3)   # CPU-bound on 4 threads, queueing 0.5 ms a thread
    0.0
    """
    t = max(1, min(threads, shard))
    rounds = math.ceil(shard / t)
    mine = command - runq_s / t  # one thread's time, less its queueing for a CPU
    return max(0.0, min(mine / rounds - cpu_s, mine - shard * cpu_s))


# Envs whose step (CPU plus waiting) takes longer than INLINE_ENTER_S never run inline (INLINE_LEAVE_S once
# they do): a slice of the in-process rung holds the event loop for at least one env step. The same limits as
# auto placement's.
# Envs that mostly wait never run inline either (they would hold the loop).


def costs_from(cpu_per_step: float, env_step_s: float, main_per_step: float, placement: str, inline_share: float = 1.0) -> Costs:
    """Per-step costs from what one interval measured at some configuration.

    Inline, the parent's CPU includes the envs' own; hybrid, the CPU of the ``inline_share`` of envs
    it steps; with processes it includes a command per worker per batch, which :func:`predict` adds
    back per configuration.
    """
    wait = max(0.0, env_step_s - cpu_per_step)
    if placement == "inline":
        main = max(0.0, main_per_step - cpu_per_step) / INLINE_MAIN_SHARE
    elif placement == "hybrid":
        main = max(0.0, main_per_step - inline_share * cpu_per_step)
    else:
        main = main_per_step
    return Costs(cpu_per_step, wait, main)
