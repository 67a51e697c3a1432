"""Inline workers: envs stepped inside the parent, on the event loop, for envs too cheap for IPC.

A CartPole step costs ~11 us; the bare round trip to another process costs 20 us or
more, so for a handful of cheap envs any worker process loses to stepping them here.
An inline worker speaks the same protocol as a process worker, into the same buffers
(the vector env's shared memory), so the pool treats it as one more worker and envs
move between it and worker processes at episode boundaries like any other move.

The event loop is never held for long: a step command runs in slices of at most
:data:`SLICE_S` of env work, yielding to the loop between slices; commands that may be
slow (building, resetting, closing an env, ``call``) run in a helper thread while the
worker's queue waits, so commands still execute one at a time and in order.

What it gives up: an env that segfaults takes the application with it, and an env that
hangs cannot be killed (so ``step_timeout`` and ``placement="process"`` exclude it).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from typing import Any

from gymnasium.vector import AutoresetMode

from .. import protocol as P
from ..loop import wait_done
from ..threads import in_thread
from ..worker import EnvHost
from .base import Backend, ExitCallback, ReplyCallback, WorkerHandle

SLICE_S = 500e-6
"""Env work done in one turn of the event loop before yielding (the loop stays responsive): the loop-hold goal
(``autoconf.INLINE_MAX_STEP_S``, 0.5 ms). Each slice boundary costs a turn of the loop and, in hybrid, delays
this process's share of the batch: 4 HalfCheetahs in this process (~90 us each) took two slices of 0.25 ms, one
of 0.45 ms, and hybrid HalfCheetah x8 measured 1.09-1.11x faster side by side (x16 1.03x, CartPole x64 1.05x).
At 0.45 ms the 4 HalfCheetahs of PPO's wrapped env (normalisation, ~120 us a step here) still took two slices:
0.5 ms steps them in one, 571-573 us a batch of 8 against 610-616 (hybrid, two interleaved pairs)."""


class PerEnvCost:
    """The measured cost of one env step in this process, which sizes the chunks of a slice.

    It falls slowly, and rises at once when two steps in a row cost more (to the lower of the two), so
    a slice overruns its budget at most twice after the env gets costlier. One slow step alone (the host
    busy for a moment) moves nothing: raised at once, it sent ~1 in 10 batches of 8 CartPoles on this
    VM down the sliced path (a loop turn and a wake-up more) for the next dozen batches.
    """

    def __init__(self, initial_s: float) -> None:
        self.per_env_s = initial_s
        self._higher = 0.0  # the last step's cost per env, where it was above the estimate (else 0)

    def add(self, wall_s: float, num_envs: int) -> None:
        """Fold in a step of ``num_envs`` envs that took ``wall_s``."""
        if not num_envs:
            return
        cost = wall_s / num_envs
        if cost > self.per_env_s:
            if self._higher:
                self.per_env_s = min(cost, self._higher)
            self._higher = cost
        else:
            self._higher = 0.0
            self.per_env_s = 0.9 * self.per_env_s + 0.1 * cost


class InlineWorker(WorkerHandle):
    """Envs hosted by an :class:`~aiovec.worker.EnvHost` in this process."""

    kind = "inline"

    def __init__(self, worker_id: int, views: Any, autoreset_mode: str, obs_space: Any, action_space: Any,
                 host_options: dict, on_reply: ReplyCallback, on_exit: ExitCallback) -> None:
        self.worker_id = worker_id
        self.pid = None  # no process of its own: its envs live in this one
        self._loop = asyncio.get_running_loop()
        self._on_reply = on_reply
        self._on_exit = on_exit
        self._host = EnvHost(views, AutoresetMode(autoreset_mode), obs_space, action_space, **host_options)
        self._queue: deque[Any] = deque()
        self._scheduled = False
        self._busy = False  # a command runs in the helper thread
        self._exited = False
        self._closed = self._loop.create_future()
        # The step in progress: (ids, next index, infos, errors, cpu0, wall0).
        self._step: list | None = None
        self._cost = PerEnvCost(SLICE_S)  # sizes the chunks (one env until measured)
        self._loop.call_soon(self._reply, P.Reply(P.READY, (), {"pid": None, "spin_s": None}, None, P.NO_TIMING))

    @property
    def alive(self) -> bool:
        return not self._exited

    def send(self, msg: tuple[Any, ...] | bytes) -> None:
        """Queue a command. A STEP_SHARD arriving at an idle worker starts at once, in the caller's
        turn (its first slice): the reply may then be delivered before ``send`` returns."""
        if self._exited:
            return
        if msg is P.STEP_SHARD and not self._queue and not self._busy and not self._scheduled:
            if self.on_step_timing is not None:
                done = self.step_now()
                if done is not None:
                    self._deliver_step(msg, self._host.shard, *done)
                    return
            self._queue.append(msg)
            self._run()
            return
        self._queue.append(msg)
        self._schedule()

    def step_now(self) -> tuple[list | None, list | None, float, float] | None:
        """Step the whole shard in the caller's turn, if this worker is idle and the shard fits one slice
        (the hot path: no queue, no slicing state): ``(infos, errors, cpu_s, wall_s)``; else None."""
        host, cost = self._host, self._cost
        n = len(host.shard)
        if self._exited or self._queue or self._busy or self._scheduled or cost.per_env_s * n > SLICE_S:
            return None
        cpu, wall, infos, errors = host.step_clocked(host.shard)
        cost.add(wall, n)
        return infos, errors, cpu, wall

    def _schedule(self) -> None:
        if not self._scheduled and not self._busy:
            self._scheduled = True
            self._loop.call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        deadline = time.perf_counter() + SLICE_S
        while self._queue and not self._exited and not self._busy:
            msg = self._queue[0]
            if isinstance(msg, bytes) or msg.op == P.STEP:
                if not self._run_step(msg, deadline):
                    self._schedule()  # more envs to step: let the loop breathe first
                    return
                self._queue.popleft()
                if time.perf_counter() >= deadline:
                    self._schedule()
                    return
            else:
                self._queue.popleft()
                self._run_in_thread(msg)
                return

    def _run_step(self, msg: Any, deadline: float) -> bool:
        """Step envs until done (True) or the slice is used up (False).

        Envs go in chunks sized from the measured cost per env (at least one env per chunk), so
        most batches of cheap envs run as one call of the host's stepping loop.
        """
        host, clock = self._host, time.perf_counter
        if self._step is None:
            ids = host.shard if isinstance(msg, bytes) else list(msg.env_ids)
            self._step = [ids, 0, None, None, host._cpu_clock(), clock()]
        st = self._step
        ids, k, n = st[0], st[1], len(st[0])
        first = True
        while k < n:
            t0 = clock()
            room = deadline - t0
            per_env = self._cost.per_env_s
            left = n - k
            if per_env * left <= room:
                m = left
            else:
                fit = int(room / per_env)
                if fit < 1 and not first:  # the next env would overrun this slice: it starts the next one
                    st[1] = k
                    return False
                # as few chunks as the slices need, of even size (5 envs for 1.6 slices: 3 + 2, not 4 + 1)
                m = max(1, min(fit, math.ceil(left / math.ceil(per_env * left / SLICE_S))))
            first = False
            infos, errors = host.step(ids[k : k + m])
            self._cost.add(clock() - t0, m)
            if errors:
                st[3] = [*(st[3] or ()), *errors]
            if infos:
                if st[2] is None:
                    st[2] = [None] * n
                st[2][k : k + m] = infos
            k += m
            if k < n and clock() >= deadline:
                st[1] = k
                return False
        self._step = None
        self._deliver_step(msg, ids, st[2], st[3], host._cpu_clock() - st[4], clock() - st[5])
        return True

    def _deliver_step(self, msg: Any, ids: list, infos: list | None, errors: list | None, cpu_s: float, wall_s: float) -> None:
        """Hand a finished step to the pool as a process worker would: the fast path when it had no errors."""
        infos = P.pack_step_infos(infos, errors)
        if P.is_fast_step(infos, errors) and self.on_step_timing is not None and not self._exited:
            self.on_step_timing(cpu_s, wall_s, 0.0, infos)
            return
        self._reply(P.Reply(P.STEP, None if isinstance(msg, bytes) else tuple(ids), infos, errors, P.Timing(cpu_s, wall_s)))

    def _run_in_thread(self, msg: Any) -> None:
        self._busy = True
        fut = in_thread(self._handle, msg)
        fut.add_done_callback(lambda f, msg=msg: self._thread_done(msg, f))

    def _handle(self, msg: Any) -> Any:
        """A command in the helper thread. A worker stopped or killed meanwhile left its envs to this thread, the
        only one using them: they are closed here (the event loop may be gone by the time the thread ends)."""
        try:
            return self._host.handle(msg)
        finally:
            if self._exited:
                self._host.close()

    def _thread_done(self, msg: Any, fut: asyncio.Future) -> None:
        self._busy = False
        if self._exited:
            self._host.close()  # stopped while the thread ran (the thread may have looked just before)
            return
        exc = fut.exception()
        if exc is not None:  # a bug in the host itself, not an env error: the worker is gone
            self._die(f"{type(exc).__name__}: {exc}")
            return
        self._reply(fut.result())
        if msg.op == P.CLOSE:
            self._exited = True
            if not self._closed.done():
                self._closed.set_result(None)
            return
        self._schedule()

    def _reply(self, reply: P.Reply | P.Timing) -> None:
        if not self._exited:
            self._on_reply(reply)

    def _die(self, tb: str | None) -> None:
        if self._exited:
            return
        self._exited = True
        self._queue.clear()
        if not self._busy:  # else the helper thread still uses the envs: it closes them when done
            self._host.close()
        if not self._closed.done():
            self._closed.set_result(None)
        self._on_exit(None, tb)

    def kill(self) -> None:
        """Drop the envs and report the worker gone (an env mid-step in a thread finishes first)."""
        if not self._exited:
            self._die("the inline worker was stopped")

    async def stop(self, grace: float) -> None:
        """Wait for the CLOSE already queued to run (up to ``grace``), then release everything."""
        if not self._exited:
            await wait_done(self._closed, grace)
        if not self._exited:
            self._exited = True
            self._queue.clear()
            if not self._busy:
                self._host.close()


class InlineBackend(Backend):
    """Starts inline workers over the parent's views of the vector env's buffers."""

    name = "inline"

    def __init__(self, views: Any, autoreset_mode: str, obs_space: Any, action_space: Any, host_options: dict | None = None) -> None:
        self.views = views
        self.autoreset_mode = autoreset_mode
        self.obs_space, self.action_space = obs_space, action_space
        # Threads inside the event loop's process would only contend with it: an inline worker steps in turn.
        self.host_options = {**(host_options or {}), "env_threads": 1}

    def start_worker(self, worker_id: int, on_reply: ReplyCallback, on_exit: ExitCallback) -> WorkerHandle:
        return InlineWorker(worker_id, self.views, self.autoreset_mode, self.obs_space, self.action_space,
                            self.host_options, on_reply, on_exit)

    def cpus(self) -> float:
        return 1.0
