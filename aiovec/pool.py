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
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from . import protocol as P
from .backends.base import Backend, WorkerHandle
from .errors import EnvError, WorkerCrashedError, describe_exit
from .stats import Stats

ReplyHandler = Callable[[int, tuple[Any, ...] | None, BaseException | None], None]
"""``(worker_id, reply or None, error or None)``; the error is set when the worker died first."""


class _Worker:
    __slots__ = ("handle", "envs", "pending", "ready", "spin_s")

    def __init__(self, handle: WorkerHandle, spin_s: float) -> None:
        self.handle = handle
        self.envs: set[int] = set()
        self.pending: deque[tuple[int, float, ReplyHandler | None]] = deque()
        self.ready = False
        self.spin_s = spin_s  # what it was started with or last told


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
        max_restarts: int = 0,
        restart_backoff: float = 0.1,
        recycle_steps: int | None = None,
        recycle_rss_mb: float | None = None,
    ) -> None:
        self.backend = backend
        self.factories = list(factories)
        self.num_envs = len(factories)
        self.stats = stats
        self.on_lost = on_lost
        self.step_timeout = step_timeout
        # Restarts: a dead worker's envs go to a new worker while the budget lasts.
        self.restarts_left = max_restarts
        self.restarts = 0
        self.restart_backoff = restart_backoff
        self._last_restart = -1e9
        self._backoff = restart_backoff
        self.on_restart: Callable[[WorkerCrashedError], None] | None = None  # set by the vector env
        self.restart_state: Callable[[int], dict | None] = lambda env_id: None
        self.closing = False
        self.started = False
        # Recycling: replace a worker after so many steps or above an RSS limit (leaky envs).
        self.recycle_steps = recycle_steps
        self.recycle_rss_mb = recycle_rss_mb
        self.recycled = 0
        self._replies = 0
        self.workers: dict[int, _Worker] = {}
        self.location: list[int | None] = [None] * self.num_envs
        self._next_id = 0
        self._loop = asyncio.get_running_loop()
        self._timed_out: set[int] = set()  # workers killed by step_timeout
        self._all_groups: dict[int, list[int]] | None = None  # by_worker(all envs), until placement changes
        # Resizing: envs move one at a time, each at an episode boundary of its own.
        self.movable: Callable[[int], bool] = lambda env_id: True  # set by the vector env
        self._retiring: set[int] = set()
        self._targets: dict[int, int] = {}  # env -> worker it should move to
        self._moving: dict[int, tuple[int, list]] = {}  # env -> (destination, deferred commands)
        self._stopping: list[asyncio.Task] = []
        self.moves = 0

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
        self.started = True  # from now on a death may be survived (restarts)

    def _spawn(self) -> int:
        wid = self._next_id
        self._next_id += 1
        handle = self.backend.start_worker(
            wid, lambda reply, wid=wid: self._on_reply(wid, reply), lambda code, tb, wid=wid: self._on_exit(wid, code, tb)
        )
        w = self.workers[wid] = _Worker(handle, self.backend.spin_s)
        w.pending.append((P.READY, time.perf_counter(), self._on_ready))
        self.stats.worker(wid).pid = getattr(handle, "pid", None)
        return wid

    def _on_ready(self, wid: int, reply: Any, error: BaseException | None) -> None:
        if reply is not None:
            self.workers[wid].ready = True
            ws = self.stats.worker(wid)
            ws.pid, ws.spin_s = reply[2] if isinstance(reply[2], tuple) else (reply[2], None)

    def _on_tuned(self, wid: int, reply: Any, error: BaseException | None) -> None:
        if reply is not None:
            self.stats.worker(wid).spin_s = reply[2]["spin_s"]

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
        self.closing = True
        for wid, w in self.workers.items():
            if w.handle.alive:
                self._send(wid, (P.CLOSE,), None)
        handles = [w.handle for w in self.workers.values()]
        await asyncio.gather(*(h.stop(grace) for h in handles), *self._stopping, return_exceptions=True)
        # A worker that dies while closing (killed after the grace period) is reaped by _on_exit in a task
        # of its own, started after the gather above: close() returns only once that one is done too.
        while pending := [t for t in self._stopping if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)
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
        sent = 0
        for wid, ids in groups.items():
            if wid is None:  # envs in transit: their commands follow them to the new worker
                for i in ids:
                    self._moving[i][1].append((build, handler))
                    sent += 1
            else:
                self._send(wid, build(ids), handler)
                sent += 1
        return sent

    async def request(self, env_ids: Sequence[int], build: Callable[[list[int]], tuple[Any, ...]]) -> tuple[dict[int, Any], list[EnvError]]:
        """Send a command for ``env_ids`` and await every reply: per-env payload items and env errors."""
        futs = []
        for wid, ids in self.by_worker(env_ids).items():
            for group in ([i] for i in ids) if wid is None else (ids,):
                fut = self._loop.create_future()
                if wid is None:
                    self._moving[group[0]][1].append((build, _resolver(fut)))
                else:
                    self._send(wid, build(group), _resolver(fut))
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

    # -- resizing -----------------------------------------------------------------------
    @property
    def target_workers(self) -> int:
        """Workers that are not being retired (what the last resize asked for)."""
        return len(self.workers) - len(self._retiring)

    @property
    def pending_moves(self) -> int:
        return len(self._targets) + len(self._moving)

    async def resize(self, n: int) -> None:
        """Aim for ``n`` workers: start new ones now; envs move as they reach episode boundaries;
        workers left without envs are stopped."""
        n = max(1, min(int(n), self.num_envs))
        active = sorted(w for w in self.workers if w not in self._retiring)
        if n > len(active):
            # Un-retire first (cheapest), then start new workers.
            revive = sorted(self._retiring)[: n - len(active)]
            self._retiring.difference_update(revive)
            new = [self._spawn() for _ in range(n - len(active) - len(revive))]
            if new:
                waits = []
                for wid in new:
                    fut = self._loop.create_future()
                    self.workers[wid].pending[0] = (P.READY, time.perf_counter(), _chain(self._on_ready, _resolver(fut)))
                    waits.append(fut)
                await asyncio.gather(*waits)
        elif n < len(active):
            # Retire the workers hosting the fewest envs (fewest moves).
            by_load = sorted(active, key=lambda w: (len(self.workers[w].envs), -w))
            self._retiring.update(by_load[: len(active) - n])
        self._plan()
        self.try_moves()
        self._stop_empty()

    def tune(self, spin_s: float) -> None:
        """Set the workers' spin: new workers start with it, running ones (not those being retired) get a TUNE."""
        if not self.backend.can_spin:
            return
        self.backend.spin_s = spin_s
        for wid, w in self.workers.items():
            if w.spin_s != spin_s and wid not in self._retiring and w.handle.alive:
                w.spin_s = spin_s
                self._send(wid, (P.TUNE, {"spin_s": spin_s}), self._on_tuned)

    def _plan(self) -> None:
        active = sorted(w for w in self.workers if w not in self._retiring)
        quota = dict(zip(active, (len(s) for s in split_envs(self.num_envs, len(active)))))
        kept = dict.fromkeys(active, 0)
        overflow = []
        for env in range(self.num_envs):
            where = self._moving[env][0] if env in self._moving else self.location[env]
            if where is None:
                continue  # lost with its worker
            if where in quota and kept[where] < quota[where]:
                kept[where] += 1
            else:
                overflow.append(env)
        targets = {}
        free = [w for w in active for _ in range(quota[w] - kept[w])]
        for env, wid in zip(overflow, free):
            targets[env] = wid
        self._targets = targets

    def try_moves(self) -> None:
        """Start every planned move whose env is idle at an episode boundary."""
        for env in [e for e in self._targets if self.movable(e)]:
            dest = self._targets.pop(env)
            src = self.location[env]
            if src is None or src == dest or dest not in self.workers:
                continue
            self.location[env] = None
            self._all_groups = None
            self._moving[env] = (dest, [])
            self._send(src, (P.REMOVE, (env,)), lambda wid, reply, error, env=env: self._moved_out(env, wid, reply, error))

    def _moved_out(self, env: int, src: int, reply: Any, error: BaseException | None) -> None:
        dest, deferred = self._moving.pop(env)
        w = self.workers.get(src)
        if error is not None:
            for _build, handler in deferred:
                if handler is not None:
                    handler(src, None, error)
            return
        _, _, states, errs, _ = reply
        if errs:  # not at a boundary after all: stay, and retry later
            self.location[env] = src
            self._targets[env] = dest
            target = src
        else:
            if w is not None:
                w.envs.discard(env)
                self.stats.worker(src).envs -= 1
            target = dest if dest in self.workers else src
            fut = self._add_env(target, env, states[env])
            fut.add_done_callback(lambda f, env=env, target=target: self._moved_in(env, target, f))
            self.moves += 1
        self._all_groups = None
        for build, handler in deferred:
            self._send(target, build([env]), handler)
        self._stop_empty()

    def _moved_in(self, env: int, wid: int, fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # the new worker died: on_lost reports it
        reply = fut.result()
        if reply[3]:
            err = WorkerCrashedError(wid, [env], None, reply[3][0][3], "the env could not be re-created on its new worker")
            self.location[env] = None
            self.workers[wid].envs.discard(env)
            self.on_lost(err)

    def _check_recycle(self) -> None:
        for wid, w in list(self.workers.items()):
            if wid in self._retiring or not w.envs:
                continue
            ws = self.stats.worker(wid)
            old = self.recycle_steps is not None and ws.steps >= self.recycle_steps
            fat = self.recycle_rss_mb is not None and ws.pid is not None and _rss_mb(ws.pid) > self.recycle_rss_mb
            if old or fat:
                self.replace(wid)

    def replace(self, wid: int) -> None:
        """Retire a worker in favour of a fresh one; its envs move at their episode boundaries."""
        self.recycled += 1
        self._spawn()
        self._retiring.add(wid)
        self._plan()
        self.try_moves()

    def _reap(self, handle: WorkerHandle) -> None:
        self._stopping = [t for t in self._stopping if not t.done()]
        self._stopping.append(self._loop.create_task(handle.stop(5.0)))

    def _stop_empty(self) -> None:
        for wid in sorted(self._retiring):
            w = self.workers.get(wid)
            if w is None:
                self._retiring.discard(wid)
            elif not w.envs and not w.pending:
                self._retiring.discard(wid)
                self._send(wid, (P.CLOSE,), None)
                del self.workers[wid]
                self.stats.retire(wid)
                self._reap(w.handle)

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
        if wid in self._retiring and not w.pending:
            self._stop_empty()
        if self.recycle_steps or self.recycle_rss_mb:
            self._replies += 1
            if self._replies % 64 == 0:
                self._check_recycle()

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
        if not self.started and cause is None:
            cause = (f"{describe_exit(exitcode)} while starting; see its output above. If your script creates the "
                     "vector env at import time, put that under `if __name__ == '__main__':` (workers import "
                     "the main module under the forkserver and spawn start methods)")
        err = WorkerCrashedError(wid, env_ids, exitcode, tb, cause)
        self.stats.retire(wid)
        pending, w.pending = list(w.pending), deque()
        for _op, _t, handler in pending:
            if handler is not None:
                handler(wid, None, err)
        # Reap it now (a long run with many restarts must not accumulate dead workers).
        self._reap(w.handle)
        for env in [e for e, (dest, _) in self._moving.items() if dest == wid]:
            self._moving[env] = (-1, self._moving[env][1])  # was moving into the dead worker
            env_ids.append(env)
        if self.restarts_left > 0 and env_ids and self.started and not self.closing and self.on_restart is not None:
            self.restarts_left -= 1
            self.restarts += 1
            now = time.perf_counter()
            # Backoff doubles while restarts come within a second of each other.
            self._backoff = min(self._backoff * 2, 5.0) if now - self._last_restart < 1.0 else self.restart_backoff
            self._last_restart = now
            for env in env_ids:
                self._moving.setdefault(env, (-1, []))
            self.on_restart(err)
            self._loop.call_later(self._backoff, self._respawn, sorted(env_ids))
        else:
            for env in env_ids:
                if env in self._moving:
                    for _build, handler in self._moving.pop(env)[1]:
                        if handler is not None:
                            handler(wid, None, err)
            self.on_lost(err)

    def _respawn(self, env_ids: list[int]) -> None:
        if self.closing:
            return
        wid = self._spawn()
        for env in env_ids:
            _, deferred = self._moving.pop(env, (-1, []))
            fut = self._add_env(wid, env, self.restart_state(env))
            fut.add_done_callback(lambda f, env=env, wid=wid: self._moved_in(env, wid, f))
            for build, handler in deferred:
                self._send(wid, build([env]), handler)
        if self._targets or self._retiring:
            self._plan()


def _rss_mb(pid: int) -> float:
    """Resident memory of a process in MiB (Linux /proc; 0 where unavailable)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def _chain(*handlers: ReplyHandler) -> ReplyHandler:
    def handler(wid: int, reply: Any, error: BaseException | None) -> None:
        for h in handlers:
            h(wid, reply, error)

    return handler


def _resolver(fut: asyncio.Future) -> ReplyHandler:
    def handler(wid: int, reply: Any, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(reply)

    return handler
