"""Exceptions raised by aiovec, all under :class:`AiovecError`."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence


class AiovecError(Exception):
    """Base class of every error aiovec raises."""


class ConfigError(AiovecError, ValueError):
    """An invalid constructor argument or environment factory."""


class EnvStateError(AiovecError, RuntimeError):
    """An operation that the current state of an env does not allow.

    Examples: sending to an env that already has a step in flight, ``recv``
    with nothing in flight, resetting an env whose result was not received.
    """


class ClosedError(EnvStateError):
    """The vector env was closed."""


class InvalidActionError(AiovecError, ValueError):
    """Actions of the wrong count, shape, dtype or range; raised before anything is sent."""


class EnvError(AiovecError):
    """An exception raised inside an env's ``step``/``reset``/method, relayed from its worker.

    The worker survives; the env that raised must be reset before it is stepped again.
    """

    def __init__(self, env_id: int, exc_type: str, message: str, remote_traceback: str) -> None:
        self.env_id = env_id
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback
        super().__init__(
            f"env {env_id} raised {exc_type}: {message}\n--- remote traceback ---\n{remote_traceback}"
        )


def describe_exit(exitcode: int | None) -> str:
    """Human-readable exit status: ``exit code 3``, ``killed by SIGKILL``."""
    if exitcode is None:
        return "unknown exit status"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class WorkerCrashedError(AiovecError):
    """A worker process (or actor) died; its envs' in-flight work is gone.

    ``env_ids`` are the envs it hosted, ``exitcode`` is negative for a signal,
    ``remote_traceback`` is what the worker reported before dying, if anything.
    """

    def __init__(
        self,
        worker_id: int,
        env_ids: Sequence[int],
        exitcode: int | None,
        remote_traceback: str | None = None,
        cause: str | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.env_ids = tuple(env_ids)
        self.exitcode = exitcode
        self.remote_traceback = remote_traceback
        how = cause or describe_exit(exitcode)
        msg = f"worker {worker_id} hosting envs {list(self.env_ids)} died ({how})"
        if remote_traceback:
            msg += f"\n--- remote traceback ---\n{remote_traceback}"
        super().__init__(msg)

    @property
    def signal(self) -> int | None:
        """The signal that killed the worker, if one did."""
        return -self.exitcode if self.exitcode is not None and self.exitcode < 0 else None


class StepTimeoutError(AiovecError, asyncio.TimeoutError):
    """A deadline expired. Nothing in flight is dropped: late results arrive later."""
