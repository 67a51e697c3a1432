"""Exceptions raised by aiovec, all under :class:`AiovecError`."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence


class AiovecError(Exception):
    """Base class of every error aiovec raises: catch it to handle any of them.

    >>> try:
    ...     aiovec.make("NoSuchEnv-v0", 2)
    ... except aiovec.AiovecError as exc:
    ...     print(type(exc).__name__)
    ConfigError
    """


class ConfigError(AiovecError, ValueError):
    """An invalid constructor argument or environment factory, raised before any worker starts.

    It is also a ``ValueError``.

    >>> aiovec.make("CartPole-v1", 0)
    Traceback (most recent call last):
        ...
    aiovec.errors.ConfigError: num_envs must be a positive int, got 0
    >>> aiovec.make("CartPole-v1", 4, num_workers=-1)
    Traceback (most recent call last):
        ...
    aiovec.errors.ConfigError: num_workers must be a positive int, got -1
    """


class EnvStateError(AiovecError, RuntimeError):
    """An operation that the current state of an env does not allow.

    Examples: sending to an env that already has a step in flight, ``recv``
    with nothing in flight, resetting an env whose result was not received.
    Nothing is sent when it is raised; it is also a ``RuntimeError``.

    >>> async def main():
    ...     async with aiovec.make("CartPole-v1", 2, num_workers=1) as venv:
    ...         await venv.reset(seed=0)
    ...         venv.send(np.zeros(2, dtype=np.int64))
    ...         try:
    ...             venv.send(np.zeros(1, dtype=np.int64), env_ids=[1])  # env 1 is still stepping
    ...         except aiovec.EnvStateError as exc:
    ...             print(exc)
    ...         await venv.drain()
    >>> aiovec.run(main())
    cannot send to env 1: it is stepping
    """


class ClosedError(EnvStateError):
    """The vector env was closed; nothing more can be done with it but ``close()`` again.

    >>> async def main():
    ...     venv = aiovec.make("CartPole-v1", 2, num_workers=1)
    ...     await venv.reset(seed=0)
    ...     await venv.close()
    ...     await venv.reset()
    >>> aiovec.run(main())
    Traceback (most recent call last):
        ...
    aiovec.errors.ClosedError: the vector env is closed
    """


class InvalidActionError(AiovecError, ValueError):
    """Actions of the wrong count, shape, dtype or range; raised before anything is sent.

    It is also a ``ValueError``.

    >>> async def main():
    ...     async with aiovec.make("CartPole-v1", 4, num_workers=1) as venv:
    ...         await venv.reset(seed=0)
    ...         await venv.step(np.zeros(3, dtype=np.int64))  # 3 actions for 4 envs
    >>> aiovec.run(main())
    Traceback (most recent call last):
        ...
    aiovec.errors.InvalidActionError: ...
    """


class EnvError(AiovecError):
    """An exception raised inside an env's ``step``/``reset``/method, relayed from its worker.

    The worker survives; the env that raised must be reset before it is stepped again.

    >>> async def main():
    ...     async with aiovec.make("aiovec/Fault-v0", 2, num_workers=1, fault="raise", at_step=1) as venv:
    ...         await venv.reset(seed=0)
    ...         try:
    ...             await venv.step(np.zeros(2, dtype=np.int64))
    ...         except aiovec.EnvError as exc:
    ...             print(exc.env_id, exc.exc_type, "injected fault" in exc.remote_traceback)
    ...         await venv.drain()            # the other env's result was kept
    ...         obs, _ = await venv.reset()   # the env that raised is usable again
    ...         return obs.shape
    >>> aiovec.run(main())
    0 RuntimeError True
    (2, 4)
    """

    def __init__(self, env_id: int, exc_type: str, message: str, remote_traceback: str) -> None:
        self.env_id = env_id
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback
        super().__init__(
            f"env {env_id} raised {exc_type}: {message}\n--- remote traceback ---\n{remote_traceback}"
        )


class EnvAttributeError(EnvError, AttributeError):
    """An ``AttributeError`` raised in an env by ``call``/``get_attr``/``set_attr`` (an attribute it lacks).

    Also an ``AttributeError``, as gymnasium's vector envs raise it, so ``except AttributeError`` catches it.

    >>> async def main():
    ...     async with aiovec.make("CartPole-v1", 2, num_workers=1) as venv:
    ...         try:
    ...             await venv.get_attr("no_such_attribute")
    ...         except AttributeError as exc:
    ...             return type(exc).__name__, exc.env_id
    >>> aiovec.run(main())
    ('EnvAttributeError', 0)
    """


def env_error(env_id: int, exc_type: str, message: str, remote_traceback: str) -> EnvError:
    """The :class:`EnvError` for an env's exception of a call or an attribute (``EnvAttributeError`` for a missing one)."""
    cls = EnvAttributeError if exc_type == "AttributeError" else EnvError
    return cls(env_id, exc_type, message, remote_traceback)


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
    With ``max_restarts`` a new worker takes over instead, until the budget is spent.

    >>> async def main():
    ...     async with aiovec.make("aiovec/Fault-v0", 2, num_workers=1, fault="sigkill", at_step=1) as venv:
    ...         await venv.reset(seed=0)
    ...         try:
    ...             await venv.step(np.zeros(2, dtype=np.int64))
    ...         except aiovec.WorkerCrashedError as exc:
    ...             print(exc.env_ids, exc.signal)
    >>> aiovec.run(main())
    (0, 1) 9
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
    """A deadline expired. Nothing in flight is dropped: late results arrive later.

    It is also an ``asyncio.TimeoutError``. ``step_timeout=`` turns a hung worker into a crash instead.

    >>> async def main():
    ...     async with aiovec.make("aiovec/Sleep-v0", 2, num_workers=1, wait_ms=200) as venv:
    ...         await venv.reset(seed=0)
    ...         venv.send(np.zeros(2, dtype=np.int64))
    ...         try:
    ...             await venv.recv(2, timeout=0.01)
    ...         except aiovec.StepTimeoutError:
    ...             print("not yet")
    ...         r = await venv.recv(2)   # the same two results, when they are ready
    ...         return sorted(r.env_ids.tolist())
    >>> aiovec.run(main())
    not yet
    [0, 1]
    """
