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
import functools
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import protocol as P
from .backends.base import Backend, WorkerHandle
from .errors import ClosedError, EnvError, WorkerCrashedError, describe_exit, env_error
from .hostload import read_proc
from .stats import Stats

ReplyHandler = Callable[[int, tuple[Any, ...] | None, BaseException | None], None]
"""``(worker_id, reply or None, error or None)``; the error is set when the worker died first."""


class _Pending(NamedTuple):
    """A command sent to a worker and not yet answered (a worker answers in order)."""

    op: int
    t_sent: float
    handler: ReplyHandler | None
    env_ids: np.ndarray | None  # for STEP_SHARD: the shard it stepped
    t_start: float | None = None  # when the worker started on it (commands queue there): set once it is the oldest


class _Worker:
    __slots__ = ("handle", "kind", "envs", "pending", "ready", "spin_s", "threads", "membership", "shard_step", "step_s",
                 "recycled", "parked_steps", "_shard")

    def __init__(self, handle: WorkerHandle, kind: str, spin_s: float, shard_step: bool = True, threads: int = 1) -> None:
        self.handle = handle
        self.kind = kind  # "process" (or the backend's name) or "inline"
        self.shard_step = shard_step  # it understands STEP_SHARD
        self.envs: set[int] = set()
        self.pending: deque[_Pending] = deque()
        self.ready = False
        self.spin_s = spin_s  # what it was started with or last told
        self.threads = threads  # env threads: what it was started with or last told
        self.membership = 0  # ADD/REMOVE commands not yet answered: the worker's env set is uncertain
        self.step_s: float | None = None  # how long its step commands take in the worker (moving average)
        self.recycled = False  # replaced for being old or fat: stopped once empty, never parked
        self.parked_steps = 0  # env steps before its parks (its stats restart at each return): its age for recycle_steps
        self._shard: np.ndarray | None = None

    @property
    def shard(self) -> np.ndarray:
        """Its envs, sorted (what STEP_SHARD steps once ``membership`` is 0)."""
        if self._shard is None:
            self._shard = np.array(sorted(self.envs), dtype=np.int64)
        return self._shard

    def placement_changed(self) -> None:
        self._shard = None


PLACEMENTS = ("process", "inline", "hybrid")

PARK_S = 5.0
"""How long a process worker that a shrink left without envs stays parked (alive, idle, not counted) before it
is stopped: a grow within that time takes it back at once instead of starting a process (0.3-1 s here). A
controller that tries fewer processes and finds them worse moves back within a few intervals."""

POLL_S = 250e-6
"""The longest the parent busy-polls for step replies that are due (:meth:`WorkerPool.poll_replies`); it holds
the event loop meanwhile, less than one slice of in-process stepping does (``backends.inline.SLICE_S``)."""

POLL_BACKOFF_MAX = 64
"""After a poll that timed out the parent skips the next poll, after two in a row the next two, and so on up to this
many. A poll times out when the replies need the CPU the parent spins on: with another process busy on one of 2
cores, 16 CartPoles in hybrid (a spinning worker, a polling parent) ran at 17-20k steps/s, 0.7 s of every 2 spent
polling, against 62-65k with neither spinning nor polling and 138-140k inline."""


def worker_kinds(placement: str, num_workers: int, num_envs: int) -> dict[str, int]:
    """How many workers of each kind a placement runs with ``num_workers`` workers in all.

    ``"hybrid"`` counts the inline worker as one of them (at least one process besides it).
    """
    n = max(1, min(int(num_workers), num_envs))
    if placement == "inline":
        return {"inline": 1}
    if placement == "hybrid":
        return {"inline": 1, "process": max(1, n - 1)} if num_envs > 1 else {"inline": 1}
    return {"process": n}


def split_envs(num_envs: int, num_workers: int) -> list[list[int]]:
    """Contiguous, balanced shards: sizes differ by at most one, no divisibility needed."""
    base, extra = divmod(num_envs, num_workers)
    out, start = [], 0
    for w in range(num_workers):
        size = base + (1 if w < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


def _host_threads(backend: Backend) -> int:
    """The env threads a backend starts its workers with (1 for backends without the option)."""
    return max(1, int(getattr(backend, "host_options", {}).get("env_threads", 1)))


class WorkerPool:
    """Owns the workers of one vector env and the env -> worker placement.

    Workers are of two kinds: those of ``backend`` (processes or Ray actors) and, when an
    ``inline`` backend is given, one inline worker in this process. A placement says which
    run: ``"process"`` (only processes), ``"inline"`` (only the inline worker) or ``"hybrid"``
    (the inline worker hosts one shard, as one worker among ``n``, processes the others).
    ``resize`` moves envs between them at episode boundaries.
    """

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
        inline: Backend | None = None,
    ) -> None:
        self.backend = backend
        self.backends: dict[str, Backend] = {"process": backend}
        if inline is not None:
            self.backends["inline"] = inline
        self.factories = list(factories)
        self.num_envs = len(factories)
        self.stats = stats
        self.on_lost = on_lost
        self.step_timeout = step_timeout
        # Restarts: a dead worker's envs go to a new worker while the budget lasts.
        self.restarts_left = max_restarts
        self.restarts = 0
        self.restart_backoff = restart_backoff
        self._respawn_at = -1e9  # when the last replacement worker started (after its backoff)
        self._backoff = restart_backoff
        self.on_restart: Callable[[WorkerCrashedError], None] | None = None  # set by the vector env
        self.on_step: Callable[[np.ndarray, P.InfoRecords | None], None] = lambda env_ids, infos: None  # a step of these envs finished without errors (set by the vector env)
        self.restart_state: Callable[[int], dict | None] = lambda env_id: None
        self.closing = False
        self.started = False
        # Recycling: replace a worker after so many steps or above an RSS limit (leaky envs).
        self.recycle_steps = recycle_steps
        self.recycle_rss_mb = recycle_rss_mb
        self.recycled = 0
        self.workers: dict[int, _Worker] = {}
        self.loc = np.full(self.num_envs, -1, dtype=np.int64)  # env -> hosting worker (-1: in transit or lost)
        self._next_id = 0
        self._loop = asyncio.get_running_loop()
        self._timed_out: dict[int, str] = {}  # workers killed by step_timeout -> what outlived it ("step", "reset")
        self._groups: list[tuple[int, np.ndarray]] | None = None  # all envs by worker, until placement changes
        self._share = 1  # the most envs the last plan gives one worker (what ``env_threads`` is sized for)
        self.kind = "process"  # the placement the last start/resize asked for: "process", "inline" or "hybrid"
        # Resizing: envs move one at a time, each at an episode boundary of its own.
        self.movable: Callable[[int], bool] = lambda env_id: True  # set by the vector env
        self._retiring: set[int] = set()
        self._parked: dict[int, tuple[_Worker, asyncio.TimerHandle]] = {}  # emptied by a shrink, kept PARK_S for a grow
        self._targets: dict[int, int] = {}  # env -> worker it should move to
        self._moving: dict[int, tuple[int, list]] = {}  # env -> (destination, deferred commands)
        self._stopping: list[asyncio.Task] = []
        self.abandoned = False  # close() was cancelled or failed: see abandon()
        self.moves = 0
        self.poll_s = 0.0  # time this process spent polling for replies (not bookkeeping: the controller subtracts it)
        self.replies = 0  # replies delivered, of any kind (counted in _after_reply)
        self._polling = False
        self.poll_timeouts = 0  # polls that ended before every reply they waited for came
        self._poll_backoff = 0  # polls the next timed-out poll skips (doubles while they time out)
        self._poll_skip = 0  # polls still to skip

    # -- start / stop -------------------------------------------------------------------
    async def start(self, num_workers: int, kind: str = "process") -> None:
        """Start ``num_workers`` workers for placement ``kind`` and place every env on one of them."""
        self.kind = kind
        counts = worker_kinds(kind, num_workers, self.num_envs)
        kinds = [k for k, c in counts.items() for _ in range(c)]
        shards = split_envs(self.num_envs, len(kinds))
        self._share = max(len(s) for s in shards)
        ids = [self._spawn(k) for k in kinds]
        waits = []
        for wid, shard in zip(ids, shards, strict=True):
            for env_id in shard:
                waits.append(self._add_env(wid, env_id, None))
        await self._gather(waits)
        self.started = True  # from now on a death may be survived (restarts)

    def _spawn(self, kind: str = "process") -> int:
        wid = self._next_id
        self._next_id += 1
        backend = self.backends[kind]
        handle = backend.start_worker(wid, functools.partial(self._on_reply, wid), functools.partial(self._on_exit, wid))
        handle.on_step_timing = functools.partial(self._on_step_timing, wid)
        w = self.workers[wid] = _Worker(handle, kind, backend.spin_s, backend.shard_step, _host_threads(backend))
        w.pending.append(_Pending(P.READY, time.perf_counter(), self._on_ready, None))
        ws = self.stats.worker(wid)
        ws.pid, ws.kind = getattr(handle, "pid", None), kind
        return wid

    def _on_ready(self, wid: int, reply: Any, error: BaseException | None) -> None:
        if reply is not None:
            self.workers[wid].ready = True
            ws = self.stats.worker(wid)
            ws.pid, ws.spin_s = reply.payload["pid"], reply.payload["spin_s"]
            ws.env_threads = reply.payload.get("env_threads", ws.env_threads)

    def _on_tuned(self, wid: int, reply: Any, error: BaseException | None) -> None:
        if reply is not None:
            ws = self.stats.worker(wid)
            if "spin_s" in reply.payload:
                ws.spin_s = reply.payload["spin_s"]
            if "env_threads" in reply.payload:
                ws.env_threads = reply.payload["env_threads"]

    def _add_env(self, wid: int, env_id: int, state: dict | None) -> asyncio.Future:
        fut = self._loop.create_future()
        w = self.workers[wid]
        self.loc[env_id] = wid
        w.envs.add(env_id)
        self._placement_changed(w)
        self.stats.worker(wid).envs += 1
        w.membership += 1
        self._send(wid, P.Add(env_id, self.factories[env_id], state), _chain(self._added, _resolver(fut)))
        return fut

    def _added(self, wid: int, reply: Any, error: BaseException | None) -> None:
        w = self.workers.get(wid)
        if w is not None:
            w.membership -= 1

    def _placement_changed(self, w: _Worker | None) -> None:
        self._groups = None
        if w is not None:
            w.placement_changed()

    async def close(self, grace: float) -> None:
        """CLOSE every worker, wait up to ``grace`` for each to exit, kill the rest."""
        self.closing = True
        for wid in list(self._parked):
            self._stop_parked(wid)
        for wid, w in self.workers.items():
            if w.handle.alive:
                self._send(wid, P.Close(), None)
        self._stopping += [self._loop.create_task(w.handle.stop(grace)) for w in self.workers.values()]
        # A worker that dies while closing (killed after the grace period) is reaped by _on_exit in a task
        # of its own, started after the ones above: close() returns only once that one is done too.
        while pending := [t for t in self._stopping if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)
        self._fail_outstanding(ClosedError("the vector env was closed before this command was answered"))
        for wid in list(self.workers):
            self.stats.retire(wid)
        self.workers.clear()
        for backend in self.backends.values():
            await backend.aclose()

    def _fail_outstanding(self, err: BaseException) -> None:
        """End every command still unanswered (a worker killed after the grace period may leave no exit report, an
        inline worker's queue is dropped), and those waiting behind a move: whoever awaits them gets ``err``."""
        for wid, w in list(self.workers.items()):
            _fail_pending(wid, w, err)
        for env in list(self._moving):
            dest, deferred = self._moving.pop(env)
            _fail_deferred(dest, deferred, err)

    def kill_all(self) -> None:
        for w in [*self.workers.values(), *(w for w, _ in self._parked.values())]:
            w.handle.kill()

    def abandon(self) -> None:
        """``close()`` was cancelled or failed: kill every worker now, cancel the tasks reaping them and start no
        more. Nobody would await them: a second Ctrl-C during ``close()`` left workers' ``stop()`` tasks pending
        when the loop closed ("Task was destroyed but it is pending!" at exit). The processes are killed here and
        reaped by their executors' threads."""
        self.abandoned = True
        self.kill_all()
        for t in self._stopping:
            t.cancel()

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def num_processes(self) -> int:
        """Workers that are processes (or actors), not inline."""
        return sum(1 for w in self.workers.values() if w.kind != "inline")

    # -- commands -----------------------------------------------------------------------
    def _send(self, wid: int, msg: Any, handler: ReplyHandler | None, env_ids: np.ndarray | None = None) -> None:
        w = self.workers[wid]
        t = time.perf_counter()
        op = P.STEP if msg is P.STEP_SHARD else getattr(msg, "op", msg[0])
        entry = _Pending(op, t, handler, env_ids, None if w.pending else t)
        w.pending.append(entry)
        w.handle.send(msg)  # an inline worker answers at once: the entry may be gone again
        if entry.t_start is not None and w.pending and w.pending[0] is entry:
            self._arm_deadline(wid, w)

    def _arm_deadline(self, wid: int, w: _Worker) -> None:
        """``step_timeout`` counts from when the worker starts on a step or reset: a command queued behind
        another one (a second ``send`` to the same worker, a slow ``call``) is not late for the wait."""
        head = w.pending[0]
        if self.step_timeout is not None and head.op in (P.STEP, P.RESET):
            self._loop.call_at(self._loop.time() + self.step_timeout, self._check_deadline, wid, head.t_start)

    def _check_deadline(self, wid: int, t_start: float) -> None:
        w = self.workers.get(wid)
        if w is None or not w.pending or not w.handle.alive:
            return
        head = w.pending[0].t_start
        if head is not None and head <= t_start:  # the command this deadline is for (or an older one) still runs
            self._timed_out[wid] = "reset" if w.pending[0].op == P.RESET else "step"
            w.handle.kill()  # a hung step: treated as a crash of its worker

    def groups(self, env_ids: np.ndarray | None) -> list[tuple[int, np.ndarray]]:
        """Env ids (None: all envs) by hosting worker (-1: in transit), order kept within a worker."""
        if env_ids is None:
            if self._groups is None:
                self._groups = self._group(np.arange(self.num_envs))
            return self._groups
        return self._group(env_ids)

    def _group(self, env_ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
        where = self.loc[env_ids]
        first = int(where[0])
        if (where == first).all():
            return [(first, env_ids)]
        order = np.argsort(where, kind="stable")
        bounds = np.flatnonzero(np.diff(where[order])) + 1
        return [(int(where[g[0]]), env_ids[g]) for g in np.split(order, bounds)]

    def step(self, env_ids: np.ndarray | None, handler: ReplyHandler) -> None:
        """Send STEP for ``env_ids`` (None: all envs), one message per worker.

        A worker whose whole, settled shard steps gets the one-byte STEP_SHARD; others get
        explicit ids. Envs in transit step on their new worker when they arrive.
        """
        if env_ids is None and len(self.workers) == 1 and self._step_solo_inline(handler):
            return
        inline = None
        for wid, ids in self.groups(env_ids):
            if wid < 0:
                self._defer(ids, _step_msg, handler)
            elif self.workers[wid].kind == "inline" and len(self.workers) > 1:
                inline = (wid, ids)  # sent last: the processes work while this process steps its own shard
            else:
                self._step_worker(wid, ids, env_ids is None, handler)
        if inline is not None:
            self._step_worker(*inline, env_ids is None, handler)

    def step_all_in_turn(self) -> tuple[Any, list | None, float] | None:
        """Every env lives on one idle inline worker: step them all in this turn, no command, no reply
        queue. Returns ``(infos, errors, wall_s)`` (infos as :func:`~aiovec.protocol.pack_step_infos`
        packs them) with the step recorded in the stats, or None where it cannot (nothing stepped)."""
        if len(self.workers) != 1:
            return None
        ((wid, w),) = self.workers.items()
        if w.kind != "inline" or w.pending or w.membership:
            return None
        done = w.handle.step_now()  # type: ignore[attr-defined]
        if done is None:
            return None
        infos, errors, cpu_s, wall_s = done
        self.stats.record(wid, len(w.envs), cpu_s, wall_s, 0.0, wall_s)
        return (None if infos is None else P.pack_step_infos(infos, errors)), errors, wall_s

    def _step_solo_inline(self, handler: ReplyHandler) -> bool:
        """:meth:`step_all_in_turn`, its result delivered like a worker's reply."""
        done = self.step_all_in_turn()
        if done is None:
            return False
        infos, errors, wall_s = done
        ((wid, w),) = self.workers.items()
        if P.is_fast_step(infos, errors):
            self.on_step(w.shard, infos)
        else:
            handler(wid, P.Reply(P.STEP, w.shard, infos, errors, P.Timing(wall_s, wall_s)), None)
        return True

    def _step_worker(self, wid: int, ids: np.ndarray, whole: bool, handler: ReplyHandler) -> None:
        w = self.workers[wid]
        if w.shard_step and not w.membership and len(ids) == len(w.shard) and (whole or np.array_equal(ids, w.shard)):
            self._send(wid, P.STEP_SHARD, handler, w.shard)
        else:
            self._send(wid, P.Step(tuple(ids.tolist())), handler, ids)

    def submit(self, env_ids: np.ndarray | None, build: Callable[[list[int]], Any], handler: ReplyHandler) -> int:
        """Send one command per worker for ``env_ids``; ``handler`` sees each worker's reply. Returns #messages."""
        sent = 0
        for wid, ids in self.groups(env_ids):
            if wid < 0:
                sent += self._defer(ids, build, handler)
            else:
                self._send(wid, build(ids.tolist()), handler)
                sent += 1
        return sent

    def _defer(self, ids: np.ndarray, build: Callable[[list[int]], Any], handler: ReplyHandler | None) -> int:
        """Queue a command for envs in transit: it follows each to its new worker."""
        for i in ids.tolist():
            self._moving[i][1].append((build, handler))
        return len(ids)

    async def request(self, env_ids: Sequence[int], build: Callable[[list[int]], Any]) -> tuple[dict[int, Any], list[EnvError]]:
        """Send a command for ``env_ids`` and await every reply: per-env payload items and env errors."""
        futs = []
        for wid, ids in self.groups(np.asarray(env_ids, dtype=np.int64)):
            for group in ([i] for i in ids.tolist()) if wid < 0 else (ids.tolist(),):
                fut = self._loop.create_future()
                if wid < 0:
                    self._moving[group[0]][1].append((build, _resolver(fut)))
                else:
                    self._send(wid, build(group), _resolver(fut))
                futs.append(fut)
        replies = await self._gather(futs)
        results: dict[int, Any] = {}
        errors: list[EnvError] = []
        for reply in replies:
            if reply.payload is not None:
                results.update(zip(reply.env_ids, reply.payload, strict=True))
            errors.extend(env_error(*e) for e in reply.errors or ())
        return results, errors

    async def _gather(self, futs: list[asyncio.Future]) -> list[Any]:
        # Wait for all; if any worker died, raise its error, but only after all settled.
        done = await asyncio.gather(*futs, return_exceptions=True)
        for r in done:
            if isinstance(r, BaseException):
                raise r
        for r in done:
            if r.errors and r.op == P.ADD:
                raise EnvError(*r.errors[0])
        return done

    # -- resizing -----------------------------------------------------------------------
    @property
    def target_workers(self) -> int:
        """Workers that are not being retired (what the last resize asked for)."""
        return len(self.workers) - len(self._retiring)

    @property
    def pending_moves(self) -> int:
        return len(self._targets) + len(self._moving)

    async def resize(self, n: int, kind: str | None = None, threads: int | None = None) -> None:
        """Aim for ``n`` workers of ``kind`` (default: the current kind; "inline" means one inline worker), with
        ``threads`` per process worker (default: as now).

        New workers start now (or a parked one is taken back); envs move as they reach episode
        boundaries; process workers left without envs are parked for :data:`PARK_S` (alive, idle,
        not counted in ``num_workers``), then stopped; inline ones are stopped at once. Workers that
        still hold envs bound elsewhere keep threads for them (:meth:`threads_for`).
        """
        if threads is not None:
            self._set_host_threads(threads)  # new workers start with it; the plan below retunes the others
        kind = self.kind if kind is None else kind
        self.kind = kind
        counts = worker_kinds(kind, n, self.num_envs)
        # Workers of a kind the placement does not use are retired as a whole.
        self._retiring.update(w for w, x in self.workers.items() if x.kind not in counts)
        new: list[int] = []
        for wkind, want in counts.items():
            active = sorted(w for w, x in self.workers.items() if x.kind == wkind and w not in self._retiring)
            if want > len(active):
                # Un-retire first (cheapest), then start new workers.
                revive = sorted(w for w in self._retiring if self.workers[w].kind == wkind)[: want - len(active)]
                self._retiring.difference_update(revive)
                missing = want - len(active) - len(revive)
                missing -= self._unpark(wkind, missing)
                new += [self._spawn(wkind) for _ in range(missing)]
            elif want < len(active):
                # Retire the workers hosting the fewest envs (fewest moves).
                by_load = sorted(active, key=lambda w: (len(self.workers[w].envs), -w))
                self._retiring.update(by_load[: len(active) - want])
        if new:
            waits = []
            for wid in new:
                fut = self._loop.create_future()
                pending = self.workers[wid].pending
                pending[0] = pending[0]._replace(handler=_chain(self._on_ready, _resolver(fut)))
                waits.append(fut)
            await asyncio.gather(*waits)
        self._plan()
        self.try_moves()
        self._stop_empty()

    def tune(self, spin_s: float) -> None:
        """Set the workers' spin: new workers start with it, running ones (not those being retired) get a TUNE."""
        if not self.backend.can_spin:
            return
        self.backend.spin_s = spin_s
        for wid, w in self.workers.items():
            if w.kind != "inline" and w.spin_s != spin_s and wid not in self._retiring and w.handle.alive:
                w.spin_s = spin_s
                self._send(wid, P.Tune({"spin_s": spin_s}), self._on_tuned)

    @property
    def env_threads(self) -> int:
        """Threads per process worker at its planned share of envs (the last ``set_threads`` or ``resize``)."""
        return _host_threads(self.backend)

    def set_threads(self, env_threads: int) -> None:
        """Threads per process worker that step a command's envs; each worker switches at its next command, and
        workers started from now on get it too (see :meth:`threads_for` for workers a resize has not yet emptied)."""
        self._set_host_threads(env_threads)
        self._retune()

    def _set_host_threads(self, env_threads: int) -> None:
        k = max(1, int(env_threads))
        for backend in self.backends.values():
            if backend.name != "inline":
                backend.host_options = {**getattr(backend, "host_options", {}), "env_threads": k}

    def threads_for(self, w: _Worker) -> int:
        """The threads worker ``w`` should step with now: ``env_threads`` while it holds at most its planned share of
        envs; while a resize has yet to move some of its envs away (they move at episode boundaries), as many more as
        keep each env's share of a thread, up to one per env. Threads are instant to change and processes are not: a
        move from 4p x 16t to 32p x 2t left 16 waiting envs on 2 threads in each old process until their episodes
        ended, 800 steps/s for seconds where either setting runs 7,500. A single thread (envs that compute) stays one.
        """
        k, e = self.env_threads, len(w.envs)
        if k <= 1 or e <= self._share:
            return k
        return min(e, -(-e * k // self._share))

    def _retune(self) -> None:
        """Send each process worker the threads :meth:`threads_for` asks for: more at once; fewer only once it is down
        to its share (a worker that still sends envs away keeps its threads: one TUNE, not one per env that leaves)."""
        for wid, w in self.workers.items():
            if w.kind == "inline" or not w.handle.alive:
                continue
            want = self.threads_for(w)
            if want > w.threads or (want != w.threads and len(w.envs) <= self._share):
                w.threads = want
                self._send(wid, P.Tune({"env_threads": want}), self._on_tuned)

    def _plan(self) -> None:
        active = sorted(w for w in self.workers if w not in self._retiring)
        if not active:  # every worker retiring or gone (a replacement died before hosting): nothing to aim for yet
            self._targets = {}
            return
        quota = dict(zip(active, (len(s) for s in split_envs(self.num_envs, len(active))), strict=True))
        kept = dict.fromkeys(active, 0)
        overflow = []
        for env in range(self.num_envs):
            where = self._moving[env][0] if env in self._moving else int(self.loc[env])
            if where < 0 and env not in self._moving:
                continue  # lost with its worker
            if where in quota and kept[where] < quota[where]:
                kept[where] += 1
            else:
                overflow.append(env)
        free = [w for w in active for _ in range(quota[w] - kept[w])]
        self._targets = dict(zip(overflow, free, strict=False))
        self._share = max(quota.values())
        self._retune()

    def try_moves(self) -> None:
        """Start every planned move whose env is idle at an episode boundary."""
        for env in [e for e in self._targets if e not in self._moving and self.movable(e)]:  # a moving env's target waits for it to land
            dest = self._targets.pop(env)
            src = int(self.loc[env])
            if src < 0 or src == dest or dest not in self.workers:
                continue
            self.loc[env] = -1
            w = self.workers[src]
            w.membership += 1
            self._placement_changed(w)
            self._moving[env] = (dest, [])
            self._send(src, P.Remove((env,)), lambda wid, reply, error, env=env: self._moved_out(env, wid, reply, error))

    def _moved_out(self, env: int, src: int, reply: Any, error: BaseException | None) -> None:
        dest, deferred = self._moving.pop(env)
        w = self.workers.get(src)
        if w is not None:
            w.membership -= 1
        if error is not None:
            _fail_deferred(src, deferred, error)
            return
        if reply.errors:  # not at a boundary after all: stay, and retry later (where a resize since planned, if one did)
            self.loc[env] = src
            if dest >= 0:
                self._targets.setdefault(env, dest)
            target = src
        else:
            if w is not None:
                w.envs.discard(env)
                self.stats.worker(src).envs -= 1
            # A resize while it moved may have planned it elsewhere (``dest`` retiring): straight there.
            replanned = self._targets.pop(env, None)
            target = next((t for t in (replanned, dest) if t is not None and t in self.workers), src)
            fut = self._add_env(target, env, reply.payload[env])
            fut.add_done_callback(lambda f, env=env, target=target: self._moved_in(env, target, f))
            self.moves += 1
        self._placement_changed(w)
        for build, handler in deferred:
            self._send(target, build([env]), handler, np.array([env]))
        self._retune()
        self._stop_empty()

    def _moved_in(self, env: int, wid: int, fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # the new worker died: on_lost reports it
        reply = fut.result()
        if reply.errors:
            err = WorkerCrashedError(wid, [env], None, reply.errors[0].traceback, "the env could not be re-created on its new worker")
            self.loc[env] = -1
            w = self.workers.get(wid)
            if w is not None:
                w.envs.discard(env)
                self._placement_changed(w)
            self.on_lost(err)

    def _check_recycle(self) -> None:
        if self.closing:  # a replacement started now would outlive close()
            return
        for wid, w in list(self.workers.items()):
            if wid in self._retiring or not w.envs or w.kind == "inline":
                continue
            ws = self.stats.worker(wid)
            old = self.recycle_steps is not None and ws.steps + w.parked_steps >= self.recycle_steps
            fat = self.recycle_rss_mb is not None and ws.pid is not None and _rss_mb(ws.pid) > self.recycle_rss_mb
            if old or fat:
                self.replace(wid)

    def replace(self, wid: int) -> None:
        """Retire a worker in favour of a fresh one; its envs move at their episode boundaries."""
        self.recycled += 1
        self._spawn(self.workers[wid].kind)
        self._retiring.add(wid)
        self.workers[wid].recycled = True
        self._plan()
        self.try_moves()

    def _reap(self, handle: WorkerHandle) -> None:
        if self._loop.is_closed() or self.abandoned:  # the kill was all there is (see abandon)
            return
        self._stopping = [t for t in self._stopping if not t.done()]
        self._stopping.append(self._loop.create_task(handle.stop(5.0)))

    def _stop_empty(self) -> None:
        """Retiring workers left without envs or commands leave the pool: parked (process workers a shrink
        emptied) or stopped (inline, recycled, or while closing)."""
        for wid in sorted(self._retiring):
            w = self.workers.get(wid)
            if w is None:
                self._retiring.discard(wid)
            elif not w.envs and not w.pending:
                self._retiring.discard(wid)
                del self.workers[wid]
                self._placement_changed(None)
                w.parked_steps += self.stats.worker(wid).steps
                self.stats.retire(wid)
                if w.kind == "inline" or w.recycled or self.closing or not w.handle.alive:
                    self._stop(w)
                else:
                    self._parked[wid] = (w, self._loop.call_later(PARK_S, self._stop_parked, wid))

    def _stop_parked(self, wid: int) -> None:
        """A parked worker's time is up (or the pool closes): stop it."""
        w, timer = self._parked.pop(wid)
        timer.cancel()
        self._stop(w)

    def _stop(self, w: _Worker) -> None:
        """CLOSE a worker that has left the pool, and reap it."""
        if w.handle.alive:
            w.handle.send(P.Close())
        self._reap(w.handle)

    def _unpark(self, kind: str, n: int) -> int:
        """Take back up to ``n`` parked workers of ``kind`` (newest first), told the settings of now; returns how many."""
        for w, _ in self._parked.values():
            w.handle.poll()  # reads an end of file that the event loop has not reported yet
        for wid in [wid for wid, (w, _) in self._parked.items() if not w.handle.alive]:
            self._stop_parked(wid)  # died while parked, its exit not reported yet: not one to take back
        taken = [wid for wid in sorted(self._parked, reverse=True) if self._parked[wid][0].kind == kind][:max(0, n)]
        backend = self.backends[kind]
        for wid in taken:
            w, timer = self._parked.pop(wid)
            timer.cancel()
            self.workers[wid] = w
            ws = self.stats.worker(wid)
            ws.pid, ws.kind, ws.spin_s = getattr(w.handle, "pid", None), kind, w.spin_s
            settings: dict[str, Any] = {}
            if backend.can_spin and w.spin_s != backend.spin_s:
                w.spin_s = settings["spin_s"] = backend.spin_s
            threads = getattr(backend, "host_options", {}).get("env_threads")
            if threads is not None:
                w.threads = settings["env_threads"] = threads
            if settings:
                self._send(wid, P.Tune(settings), self._on_tuned)
        return len(taken)

    # -- replies and deaths -------------------------------------------------------------
    def _on_reply(self, wid: int, reply: P.Reply) -> None:
        w = self.workers.get(wid)
        if w is None:
            return
        op, t_sent, handler, ids, _ = w.pending.popleft()
        if op == P.STEP:  # env ids as the array they were sent for (a STEP_SHARD reply names none)
            if type(reply) is P.Timing:  # the fast reply: no infos, no errors
                reply = P.Reply(P.STEP, ids, None, None, reply)
            else:
                if ids is None:
                    ids = np.asarray(reply.env_ids, dtype=np.int64)
                reply = P.Reply(P.STEP, ids, reply.payload, reply.errors, reply.timing)
            self.stats.record(wid, len(ids), *reply.timing, time.perf_counter() - t_sent)
        if handler is not None:
            handler(wid, reply, None)
        self._after_reply(wid, w)

    def _on_step_timing(self, wid: int, cpu_s: float, wall_s: float, runq_s: float, infos: P.InfoRecords | None) -> None:
        """A step reply without errors (infos None or records): the hot path, no reply object built."""
        w = self.workers.get(wid)
        if w is None:
            return
        p = w.pending.popleft()
        self.stats.record(wid, len(p.env_ids), cpu_s, wall_s, runq_s, time.perf_counter() - p.t_sent)
        w.step_s = wall_s if w.step_s is None else 0.75 * w.step_s + 0.25 * wall_s
        self.on_step(p.env_ids, infos)
        self._after_reply(wid, w)
        if w.kind == "inline" and len(self.workers) > 1:
            self.poll_replies()  # hybrid: this process stepped its shard; the workers' replies are likely due now

    def poll_replies(self) -> bool:
        """Busy-poll the worker processes for step replies due within :data:`POLL_S`, rather than sleep in the
        event loop until they arrive. True if any reply was delivered meanwhile (then whoever waits must look
        again: the replies may have done what it waits for, or started more commands).

        Sleeping costs a wake-up when the reply comes: on a VM whose idle CPUs halt at once, 30-150 us a batch,
        as long as a batch of 8 CartPoles. Polled only while the workers leave this process a CPU of its own
        (the same rule as the workers' spin, and off with ``spin=False``), only where every busy worker's next
        reply is a step that its measured duration says is due within :data:`POLL_S`, and never while this
        process still has envs of its own to step. Holds the loop for at most :data:`POLL_S`; a poll that times out
        makes the next ones skip (:data:`POLL_BACKOFF_MAX`). Not re-entrant: a reply handler that would poll again
        (hybrid) finds a poll already running.
        """
        if self._polling or self.backend.spin_s <= 0 or self.closing:
            return False
        waiting = [w for w in self.workers.values() if w.pending]
        if not waiting:
            return False
        due, steps = 0.0, 0
        for w in waiting:
            p = w.pending[0]
            if w.kind == "inline" or w.step_s is None or p.op != P.STEP:
                return False
            due = max(due, p.t_sent + w.step_s)
            steps += sum(1 for q in w.pending if q.op == P.STEP)
        clock = time.perf_counter
        start = clock()
        if due - start > POLL_S:
            return False
        if self._poll_skip:
            self._poll_skip -= 1
            return False
        first, end = self.replies, start + POLL_S
        self._polling = True
        try:
            while self.replies - first < steps and clock() < end:
                for w in waiting:
                    if w.pending:
                        w.handle.poll()
        finally:
            self._polling = False
        self.poll_s += clock() - start
        if self.replies - first < steps:  # timed out: the CPU the replies need may be this one (see POLL_BACKOFF_MAX)
            self.poll_timeouts += 1
            self._poll_backoff = min(max(1, 2 * self._poll_backoff), POLL_BACKOFF_MAX)
            self._poll_skip = self._poll_backoff
        else:
            self._poll_backoff = 0
        return self.replies > first

    def _after_reply(self, wid: int, w: _Worker) -> None:
        """Housekeeping after any reply: count it, start the next command's clock, retire an emptied worker, recycle
        old or fat ones."""
        self.replies += 1
        if w.pending and w.pending[0].t_start is None:
            w.pending[0] = w.pending[0]._replace(t_start=time.perf_counter())
            self._arm_deadline(wid, w)
        if self._retiring and wid in self._retiring and not w.pending:
            self._stop_empty()
        if (self.recycle_steps or self.recycle_rss_mb) and self.replies % 64 == 0:
            self._check_recycle()

    def _on_exit(self, wid: int, exitcode: int | None, tb: str | None) -> None:
        if wid in self._parked:  # it hosted nothing: nothing is lost, nothing restarts
            self._stop_parked(wid)
            return
        w = self.workers.pop(wid, None)
        if w is None:
            return
        env_ids = sorted(w.envs)
        self._placement_changed(None)
        self.loc[env_ids] = -1
        cause = None
        what = self._timed_out.pop(wid, None)
        if what is not None:
            cause = f"killed after a {what} exceeded step_timeout={self.step_timeout}s"
        if not self.started and cause is None:
            cause = (f"{describe_exit(exitcode)} while starting; see its output above. If your script creates the "
                     "vector env at import time, put that under `if __name__ == '__main__':` (workers import "
                     "the main module under the forkserver and spawn start methods)")
        err = WorkerCrashedError(wid, env_ids, exitcode, tb, cause)
        self.stats.retire(wid)
        _fail_pending(wid, w, err)
        # Reap it now (a long run with many restarts must not accumulate dead workers).
        self._reap(w.handle)
        retiring = wid in self._retiring
        self._retiring.discard(wid)
        # Envs on their way into it lose nothing: their state is still on its way out of the source, in the
        # reply to REMOVE, and lands where the plan of the workers left says (or back on the source).
        inbound = [e for e, (dest, _) in self._moving.items() if dest == wid]
        for env in inbound:
            self._moving[env] = (-1, self._moving[env][1])
        if inbound or self._targets:
            self._plan()  # moves planned into it go to the workers left
        if not env_ids and self.started:  # it hosted nothing: nothing lost, nothing restarts
            self.try_moves()
            return
        if self.restarts_left > 0 and env_ids and self.started and not self.closing and self.on_restart is not None:
            self.restarts_left -= 1
            self.restarts += 1
            now = time.perf_counter()
            # Backoff doubles while workers die within a second of their replacement's start (measured from the
            # crash before, the gap held the backoff itself, so any backoff of 1 s or more reset it).
            self._backoff = min(self._backoff * 2, 5.0) if now - self._respawn_at < 1.0 else self.restart_backoff
            self._respawn_at = now + self._backoff
            for env in env_ids:
                self._moving.setdefault(env, (-1, []))
            self.on_restart(err)
            self._loop.call_later(self._backoff, self._respawn, sorted(env_ids), w.kind, retiring)
        else:
            for env in env_ids:
                if env in self._moving:
                    _fail_deferred(wid, self._moving.pop(env)[1], err)
            self.on_lost(err)

    def _respawn(self, env_ids: list[int], kind: str, retiring: bool = False) -> None:
        """A new worker for a dead one's envs; retiring too where the dead one was (a shrink stays a shrink)."""
        if self.closing:
            return
        wid = self._spawn(kind)
        if retiring:
            self._retiring.add(wid)
        for env in env_ids:
            _, deferred = self._moving.pop(env, (-1, []))
            fut = self._add_env(wid, env, self.restart_state(env))
            fut.add_done_callback(lambda f, env=env, wid=wid: self._moved_in(env, wid, f))
            for build, handler in deferred:
                self._send(wid, build([env]), handler, np.array([env]))
        if self._targets or self._retiring:
            self._plan()


def _fail_pending(wid: int, w: _Worker, err: BaseException) -> None:
    """End a worker's unanswered commands with ``err`` (it died, or the pool closed without its replies)."""
    pending, w.pending = list(w.pending), deque()
    for p in pending:
        if p.handler is not None:
            p.handler(wid, None, err)


def _fail_deferred(wid: int, deferred: list, err: BaseException) -> None:
    """End the commands that waited for a move that will not happen."""
    for _build, handler in deferred:
        if handler is not None:
            handler(wid, None, err)


def _rss_mb(pid: int) -> float:
    """Resident memory of a process in MiB (Linux /proc; 0 where unavailable)."""
    try:
        return int(read_proc(f"/proc/{pid}/statm").split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
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


def _step_msg(ids: list[int]) -> P.Step:
    return P.Step(tuple(ids))
