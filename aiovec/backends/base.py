"""What a backend provides: workers that take protocol commands and report replies and deaths.

The pool talks to workers only through :class:`WorkerHandle`; it never touches a
process, a pipe or an actor. A backend decides where results land: the process
backend's workers write into shared memory the parent reads directly; a backend
without shared memory copies reply arrays into the parent's buffers before it
calls ``on_reply``, so the pool and the vector env cannot tell the difference.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

ReplyCallback = Callable[[tuple[Any, ...]], None]
"""Called on the event loop with each decoded reply, in the order the worker sent them."""

ExitCallback = Callable[[int | None, str | None], None]
"""Called on the event loop once, when a worker is gone: ``(exitcode, remote_traceback)``."""


class WorkerHandle(ABC):
    """One worker: a process or an actor hosting a shard of envs."""

    worker_id: int
    on_step_timing: Callable[[float, float, float, Any], None] | None = None
    """Set by the pool: called with ``(cpu_s, wall_s, runq_s, infos)`` for a step reply without errors whose
    infos are None or :class:`~aiovec.protocol.InfoRecords` (the hot path: no reply object is built).
    Where it is None, such replies go to ``on_reply``."""

    @abstractmethod
    def send(self, msg: tuple[Any, ...]) -> None:
        """Queue one command; never blocks the event loop."""

    def poll(self) -> None:  # noqa: B027 - optional: backends that cannot read without the loop do nothing
        """Deliver the replies that have arrived, now, without waiting for the event loop to report them
        (the parent's short busy-wait for a reply that is due; see ``WorkerPool.poll_replies``)."""

    @abstractmethod
    async def stop(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for the worker to exit after CLOSE, then kill it; release everything."""

    @abstractmethod
    def kill(self) -> None:
        """Kill the worker now (hung env, parent shutting down); ``on_exit`` follows."""

    @property
    @abstractmethod
    def alive(self) -> bool:
        """False once the worker has exited or been killed."""


class Backend(ABC):
    """Starts workers for one vector env."""

    name: str = "?"
    can_spin: bool = False  # workers can poll for their next command (TUNE changes how long) before sleeping
    spin_s: float = 0.0  # that poll, for workers started from now on
    shard_step: bool = True  # workers understand STEP_SHARD ("step every env you host")

    @abstractmethod
    def start_worker(self, worker_id: int, on_reply: ReplyCallback, on_exit: ExitCallback) -> WorkerHandle:
        """Start a worker (it sends a READY reply when it can take commands)."""

    def cpus(self) -> float:
        """CPUs the workers can use (the controller's C)."""
        from ..machine import available_cpus

        return float(available_cpus())

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the backend itself holds (after every worker stopped)."""

    async def aclose(self) -> None:
        """``close()`` from the event loop; a backend whose release blocks for long runs it off the loop."""
        self.close()
