"""Parallelism configurations: where envs run, how many processes, how many threads per process.

Pure functions over ``(num_envs, cpus)``; no clock, no I/O. Shared by the controller (which
configurations it may propose) and the static-sweep benchmark (which it is judged against).
"""

from __future__ import annotations

from typing import NamedTuple

THREAD_LADDER = (1, 2, 4, 8, 16, 32)
"""Threads per worker the controller moves between (doubling: each rung is a measurable change)."""


class Config(NamedTuple):
    """One parallelism setting: ``placement`` ("process", "inline" or "hybrid"), processes, threads per process.

    Inline means one in-process worker stepping every env in turn (processes 1, threads 1). Hybrid
    means ``processes`` workers in all, one of them in this process (so ``processes - 1`` processes).

    >>> Config("process", 4, 2).label
    '4p x 2t'
    >>> Config.inline().label
    'inline'
    >>> Config.hybrid(2).label
    'inline + 1p'
    """

    placement: str
    processes: int
    threads: int

    @classmethod
    def inline(cls) -> Config:
        return cls("inline", 1, 1)

    @classmethod
    def hybrid(cls, workers: int) -> Config:
        return cls("hybrid", workers, 1)

    @property
    def label(self) -> str:
        if self.placement == "inline":
            return "inline"
        if self.placement == "hybrid":
            return f"inline + {self.processes - 1}p"
        return f"{self.processes}p x {self.threads}t"

    @property
    def concurrency(self) -> int:
        """Env steps that may be in progress at once."""
        return 1 if self.placement == "inline" else self.processes * self.threads


def largest_shard(num_envs: int, processes: int) -> int:
    """Envs on the busiest process when ``num_envs`` are split over ``processes`` (the lock-step critical path)."""
    return -(-num_envs // max(1, processes))


def balanced_counts(num_envs: int, upto: int | None = None) -> list[int]:
    """Process counts whose shards are all the same size (divisors of ``num_envs``), ascending.

    In lock-step a batch waits for the largest shard, so 20 workers for 24 envs perform like 12:
    only these counts make every added process shorten the critical path.

    >>> balanced_counts(24)
    [1, 2, 3, 4, 6, 8, 12, 24]
    >>> balanced_counts(64, upto=16)
    [1, 2, 4, 8, 16]
    """
    hi = num_envs if upto is None else min(num_envs, upto)
    return [p for p in range(1, hi + 1) if num_envs % p == 0]


def efficient_counts(num_envs: int, upto: int | None = None) -> list[int]:
    """For each possible largest shard, the fewest processes that reach it, ascending.

    These are the process counts worth running in lock-step: any other count has the critical path
    of a smaller one, with more processes (balanced counts are among them; 5 for 24 envs too).

    >>> efficient_counts(24)
    [1, 2, 3, 4, 5, 6, 8, 12, 24]
    >>> efficient_counts(7)
    [1, 2, 3, 4, 7]
    """
    hi = num_envs if upto is None else max(1, min(num_envs, upto))
    out, last = [], None
    for p in range(1, hi + 1):
        shard = largest_shard(num_envs, p)
        if shard != last:
            out.append(p)
            last = shard
    return out


def uneven(c: Config, num_envs: int) -> bool:
    """Whether ``c``'s shards differ in size (5 processes for 24 envs: 5, 5, 5, 5, 4).

    Where envs wait and every shard's envs step on threads at once it costs nothing, but once the
    env computes, lock-step waits for the largest shard: an even configuration keeps its balance
    when only the threads change (instantly), an uneven one needs envs to move (episodes).
    """
    return c.placement != "inline" and num_envs % c.processes != 0


def efficient_threads(shard: int, upto: int = THREAD_LADDER[-1]) -> list[int]:
    """For each number of rounds a worker needs for its ``shard``, the fewest threads that reach it.

    >>> efficient_threads(12)
    [1, 2, 3, 4, 6, 12]
    >>> efficient_threads(64, upto=32)[-3:]
    [16, 22, 32]
    """
    out = sorted({-(-shard // r) for r in range(1, shard + 1)})
    return [t for t in out if t <= upto] or [1]


def useful_threads(num_envs: int, processes: int, upto: int = THREAD_LADDER[-1]) -> list[int]:
    """Thread rungs that can all be busy on the largest shard (more threads than envs idle)."""
    shard = largest_shard(num_envs, processes)
    return [t for t in THREAD_LADDER if t <= min(shard, upto)]


def static_grid(num_envs: int, waiting: bool, inline: bool = True, max_processes: int | None = None,
                hybrid_cpus: int = 0) -> list[Config]:
    """The sweep the controller is judged against: balanced process counts (powers of two and ``num_envs``
    itself, as far as they divide it) x threads {1, 2, 4, 8} where envs wait (threads only as many as
    the largest shard), plus inline, and hybrid (this process as one of up to ``hybrid_cpus`` workers) where
    the caller says the env may step in this process (a step within the loop-hold limit).

    >>> [c.label for c in static_grid(8, waiting=False)]
    ['inline', '1p x 1t', '2p x 1t', '4p x 1t', '8p x 1t']
    >>> [c.label for c in static_grid(8, waiting=False, hybrid_cpus=2)][:2]
    ['inline', 'inline + 1p']
    >>> len(static_grid(64, waiting=True))
    23
    """
    counts = [p for p in balanced_counts(num_envs, max_processes) if p & (p - 1) == 0 or p == num_envs]
    out = [Config.inline()] if inline else []
    if inline:
        out.extend(Config.hybrid(p) for p in counts if 2 <= p <= hybrid_cpus)
    for p in counts:
        for t in useful_threads(num_envs, p, 8) if waiting else [1]:
            out.append(Config("process", p, t))
    return out
