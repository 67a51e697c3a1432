"""The workers as a set: start, stop, resize; which env lives where; liveness.

The pool speaks to workers only through a :class:`~aiovec.backends.base.Backend`.
It groups per-env commands into one message per worker, matches each reply to
its command (a worker answers in order), and tells the vector env about
finished work and dead workers. Envs move between workers only at episode
boundaries, carrying their ``np_random`` state, so a move never changes a
trajectory.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from . import protocol as P
from .backends.base import Backend, WorkerHandle
from .errors import EnvError, WorkerCrashedError
from .stats import Stats

ReplyHandler = Callable[[int, tuple[Any, ...] | None, BaseException | None], None]
"""``(worker_id, reply or None, error or None)``; the error is set when the worker died first."""


class _Worker:
    __slots__ = ("handle", "envs", "pending", "ready")

    def __init__(self, handle: WorkerHandle) -> None:
        self.handle = handle
        self.envs: set[int] = set()
        self.pending: deque[tuple[int, float, ReplyHandler | None]] = deque()
        self.ready = False


def split_envs(num_envs: int, num_workers: int) -> list[list[int]]:
    """Contiguous, balanced shards: sizes differ by at most one, no divisibility needed."""
    base, extra = divmod(num_envs, num_workers)
    out, start = [], 0
    for w in range(num_workers):
        size = base + (1 if w < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


class WorkerPool:
    """Owns the workers of one vector env and the env -> worker placement."""

    def __init__(
        self,
        backend: Backend,
        factories: Sequence[bytes],
        stats: Stats,
        on_lost: Callable[[WorkerCrashedError], None],
        step_timeout: float | None = None,
    ) -> None:
        self.backend = backend
        self.factories = list(factories)
        self.num_envs = len(factories)
        self.stats = stats
        self.on_lost = on_lost
        self.step_timeout = step_timeout
        self.workers: dict[int, _Worker] = {}
        self.location: list[int | None] = [None] * self.num_envs
        self._next_id = 0
        self._loop = asyncio.get_running_loop()
        self._timed_out: set[int] = set()  # workers killed by step_timeout
        self._dead: list[WorkerHandle] = []  # exited workers not yet reaped
        self._all_groups: dict[int, list[int]] | None = None  # by_worker(all envs), until placement changes

    # -- start / stop -------------------------------------------------------------------
    async def start(self, num_workers: int) -> None:
        """Start ``num_workers`` workers and place every env on one of them."""
        shards = split_envs(self.num_envs, num_workers)
        ids = [self._spawn() for _ in shards]
        waits = []
        for wid, shard in zip(ids, shards):
            for env_id in shard:
                waits.append(self._add_env(wid, env_id, None))
        await self._gather(waits)

    def _spawn(self) -> int:
        wid = self._next_id
        self._next_id += 1
        handle = self.backend.start_worker(
            wid, lambda reply, wid=wid: self._on_reply(wid, reply), lambda code, tb, wid=wid: self._on_exit(wid, code, tb)
        )
        w = self.workers[wid] = _Worker(handle)
        w.pending.append((P.READY, time.perf_counter(), self._on_ready))
        self.stats.worker(wid).pid = getattr(handle, "pid", None)
        return wid

    def _on_ready(self, wid: int, reply: Any, error: BaseException | None) -> None:
        if reply is not None:
            self.workers[wid].ready = True
            self.stats.worker(wid).pid = reply[2]

    def _add_env(self, wid: int, env_id: int, state: dict | None) -> asyncio.Future:
        fut = self._loop.create_future()
        self._all_groups = None
        self.location[env_id] = wid
        self.workers[wid].envs.add(env_id)
        self.stats.worker(wid).envs += 1
        self._send(wid, (P.ADD, env_id, self.factories[env_id], state), _resolver(fut))
        return fut

    async def close(self, grace: float) -> None:
        """CLOSE every worker, wait up to ``grace`` for each to exit, kill the rest."""
        for wid, w in self.workers.items():
            if w.handle.alive:
                self._send(wid, (P.CLOSE,), None)
        handles = [w.handle for w in self.workers.values()] + self._dead
        self._dead = []
        await asyncio.gather(*(h.stop(grace) for h in handles), return_exceptions=True)
        self.workers.clear()
        self.backend.close()

    def kill_all(self) -> None:
        for w in self.workers.values():
            w.handle.kill()

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    # -- commands -----------------------------------------------------------------------
    def _send(self, wid: int, msg: tuple[Any, ...], handler: ReplyHandler | None) -> None:
        w = self.workers[wid]
        t = time.perf_counter()
        w.pending.append((msg[0], t, handler))
        w.handle.send(msg)
        if self.step_timeout is not None and msg[0] in (P.STEP, P.RESET):
            self._loop.call_at(self._loop.time() + self.step_timeout, self._check_deadline, wid, t)

    def _check_deadline(self, wid: int, t_sent: float) -> None:
        w = self.workers.get(wid)
        if w is not None and w.pending and w.pending[0][1] <= t_sent and w.handle.alive:
            self._timed_out.add(wid)
            w.handle.kill()  # a hung step: treated as a crash of its worker

    def by_worker(self, env_ids: Sequence[int] | None) -> dict[int, list[int]]:
        """Group env ids (None: all envs) by the worker hosting them, order kept within a worker."""
        if env_ids is None:
            if self._all_groups is None:
                self._all_groups = self.by_worker(range(self.num_envs))
            return self._all_groups
        groups: dict[int, list[int]] = {}
        loc = self.location
        for i in env_ids:
            groups.setdefault(loc[i], []).append(i)  # type: ignore[arg-type]
        return groups

    def submit(self, env_ids: Sequence[int] | None, build: Callable[[list[int]], tuple[Any, ...]], handler: ReplyHandler) -> int:
        """Send one command per worker for ``env_ids``; ``handler`` sees each worker's reply. Returns #messages."""
        groups = self.by_worker(env_ids)
        for wid, ids in groups.items():
            self._send(wid, build(ids), handler)
        return len(groups)

    async def request(self, env_ids: Sequence[int], build: Callable[[list[int]], tuple[Any, ...]]) -> tuple[dict[int, Any], list[EnvError]]:
        """Send a command for ``env_ids`` and await every reply: per-env payload items and env errors."""
        futs = []
        for wid, ids in self.by_worker(env_ids).items():
            fut = self._loop.create_future()
            self._send(wid, build(ids), _resolver(fut))
            futs.append(fut)
        replies = await self._gather(futs)
        results: dict[int, Any] = {}
        errors: list[EnvError] = []
        for reply in replies:
            _, ids, payload, errs, _ = reply
            if payload is not None:
                results.update(zip(ids, payload))
            errors.extend(EnvError(*e) for e in errs or ())
        return results, errors

    async def _gather(self, futs: list[asyncio.Future]) -> list[Any]:
        # Wait for all; if any worker died, raise its error, but only after all settled.
        done = await asyncio.gather(*futs, return_exceptions=True)
        for r in done:
            if isinstance(r, BaseException):
                raise r
        for r in done:
            if r[3]:
                if r[0] == P.ADD:
                    raise EnvError(*r[3][0])
        return done

    # -- replies and deaths -------------------------------------------------------------
    def _on_reply(self, wid: int, reply: tuple[Any, ...]) -> None:
        w = self.workers.get(wid)
        if w is None:
            return
        op, t_sent, handler = w.pending.popleft()
        if reply[0] == P.STEP:
            self.stats.record(wid, len(reply[1]), reply[4], time.perf_counter() - t_sent)
        if handler is not None:
            handler(wid, reply, None)

    def _on_exit(self, wid: int, exitcode: int | None, tb: str | None) -> None:
        w = self.workers.pop(wid, None)
        if w is None:
            return
        env_ids = sorted(w.envs)
        self._all_groups = None
        for i in env_ids:
            self.location[i] = None
        cause = None
        if wid in self._timed_out:
            self._timed_out.discard(wid)
            cause = f"killed after a step exceeded step_timeout={self.step_timeout}s"
        err = WorkerCrashedError(wid, env_ids, exitcode, tb, cause)
        self.stats.retire(wid)
        pending, w.pending = list(w.pending), deque()
        for _op, _t, handler in pending:
            if handler is not None:
                handler(wid, None, err)
        self.on_lost(err)
        # The handle is kept reachable until stopped, so close() can reap it.
        self._dead.append(w.handle)

    async def reap(self, grace: float) -> None:
        dead, self._dead = self._dead, []
        await asyncio.gather(*(h.stop(grace) for h in dead), return_exceptions=True)


def _resolver(fut: asyncio.Future) -> ReplyHandler:
    def handler(wid: int, reply: Any, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(reply)

    return handler
