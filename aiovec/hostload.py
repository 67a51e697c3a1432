"""How much of this process's cores other processes took: the control loop's check that a measurement was fair.

A configuration measured while another process kept a core busy (a compile, a second training, the hypervisor
stealing time) measures what that moment allowed, not what the configuration does: hybrid CartPole x16 beside a busy
process on one of 2 cores ran at 13-40k steps/s, alone at 165-185k. The controller marks such intervals and does
not let them decide against a configuration for good (see :mod:`aiovec.measured`).

Linux only (``/proc/stat``, ``/proc/<pid>/stat``): elsewhere :class:`HostLoad` reads nothing and reports 0.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (guest time is inside user)

MAX_PIDS = 32
"""Worker processes read per sample at most (each a read of ``/proc/<pid>/stat``, ~10 us on the loop); beyond, the
load is unknown (0)."""


@dataclass(frozen=True)
class LoadSample:
    """Busy CPU seconds of the cores (all processes, steal included) and this vector env's own CPU seconds."""

    t: float
    cores_busy_s: float
    parent_cpu_s: float
    workers_cpu_s: dict[int, float]  # per worker pid
    known: bool


def _cores_busy_s(cpus: frozenset[int]) -> float | None:
    """Busy seconds since boot of the cores in ``cpus`` (``/proc/stat``), or None where unreadable."""
    try:
        with open("/proc/stat", "rb") as f:
            lines = f.read().split(b"\n")
    except OSError:
        return None
    ticks = 0
    for line in lines:
        if not line.startswith(b"cpu") or line[3:4] == b" ":
            continue
        name, *fields = line.split()
        try:
            if int(name[3:]) in cpus:
                ticks += sum(int(fields[k]) for k in _BUSY_FIELDS if k < len(fields))
        except ValueError:
            continue
    return ticks / _TICK


def read_proc(path: str) -> bytes:
    """A small ``/proc`` file (a process's or thread's ``stat``, ``statm`` or ``schedstat``, under 4 KiB) in one read,
    without a Python file object: the control loop reads a few per worker each interval, and the pool a worker's
    ``statm`` where it recycles fat workers, on the event loop."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def process_cpu_s(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid``, all its threads (``/proc/<pid>/stat``); None if it is gone."""
    try:
        data = read_proc(f"/proc/{pid}/stat")
        fields = data[data.rindex(b")") + 2:].split()  # the name may hold spaces and parentheses
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


class HostLoad:
    """Samples whose difference (:meth:`foreign_cpus`) is the CPUs other processes took from this process's cores."""

    def __init__(self) -> None:
        try:
            self._cpus = frozenset(os.sched_getaffinity(0))
        except AttributeError:
            self._cpus = frozenset()
        self._readable = bool(self._cpus) and _cores_busy_s(self._cpus) is not None

    def sample(self, worker_pids: list[int]) -> LoadSample:
        """Now: the cores' busy time, and the CPU of this process plus its worker processes ``worker_pids``."""
        t = time.perf_counter()
        if not self._readable or len(worker_pids) > MAX_PIDS:
            return LoadSample(t, 0.0, 0.0, {}, False)
        workers = {pid: cpu for pid in worker_pids if (cpu := process_cpu_s(pid)) is not None}
        busy = _cores_busy_s(self._cpus)
        return LoadSample(t, busy or 0.0, time.process_time(), workers, busy is not None)

    @staticmethod
    def foreign_cpus(a: LoadSample, b: LoadSample) -> float:
        """CPUs, on average between ``a`` and ``b``, that processes other than these kept busy (0 where unknown).

        A worker that started in between counts as its own from its start; one that exited counts as foreign for
        its share (the intervals that see either are settling, which the controller does not count anyway).
        """
        dt = b.t - a.t
        if not (a.known and b.known) or dt <= 0:
            return 0.0
        own = b.parent_cpu_s - a.parent_cpu_s + sum(cpu - a.workers_cpu_s.get(pid, 0.0) for pid, cpu in b.workers_cpu_s.items())
        return max(0.0, (b.cores_busy_s - a.cores_busy_s - own) / dt)
