"""The model that proposes: predicted steps/s of a configuration from measured per-step costs.

Pure arithmetic, no clock. The controller ranks candidate configurations with it and then
measures the one it moves to; the model is never the last word (see :mod:`aiovec.measured`).

A lock-step batch is done when the busiest process is: it steps its shard of ``s`` envs on
``T`` threads, so waits overlap (``ceil(s / T)`` rounds of one env step) while CPU work
serialises on the process's GIL (``s * t_cpu``). The cores bound the batch too (every env's
CPU plus the parent's, over ``C``), and so does the parent, which handles every step and
every command on one thread. Inline, the parent steps every env itself, one after another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .configs import Config, largest_shard

COMMAND_S = 40e-6
"""Parent and kernel CPU per command to a worker process (send, wake-up, reply): what a process costs per batch."""

THREAD_HANDOFF_S = 15e-6
"""Worker CPU per env step handed to a thread of its pool (queue, wake-up, GIL hand-over)."""

INLINE_MAIN_SHARE = 0.5
"""Share of the parent's per-step CPU with worker processes (sends, wake-ups, replies) that remains when envs
step inline (the batch bookkeeping): CartPole here, ~25 us a step with processes, ~11 us plus the env inline."""

PARENT_LIMIT = 0.85
"""Share of one core the parent's event loop can spend on the vector env before it is the bottleneck."""


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


def predict(c: Config, costs: Costs, num_envs: int, cpus: float, lockstep: bool = True) -> float:
    """Predicted steps/s of ``num_envs`` envs under configuration ``c`` on ``cpus`` CPUs.

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
    p = max(1, min(c.processes, n))
    s = largest_shard(n, p) if lockstep else n / p
    t = max(1, min(c.threads, math.ceil(s)))
    handoff = THREAD_HANDOFF_S if t > 1 else 0.0
    rounds = math.ceil(s / t) if lockstep else s / t
    worker = max(rounds * (t_cpu + t_wait + handoff), s * (t_cpu + handoff))
    cores = (n * (t_cpu + handoff + t_main) + p * COMMAND_S) / cpus
    parent = (n * t_main + p * COMMAND_S / 2) / PARENT_LIMIT
    batch = max(worker + COMMAND_S, cores, parent)
    return n / batch


def costs_from(cpu_per_step: float, env_step_s: float, main_per_step: float, placement: str) -> Costs:
    """Per-step costs from what one interval measured at some configuration.

    Inline, the parent's CPU includes the envs' own; with processes it includes a command per
    worker per batch, which :func:`predict` adds back per configuration.
    """
    wait = max(0.0, env_step_s - cpu_per_step)
    main = max(0.0, main_per_step - cpu_per_step) / INLINE_MAIN_SHARE if placement == "inline" else main_per_step
    return Costs(cpu_per_step, wait, main)
