"""AsyncVecEnv: the asyncio API (reset, step, send, recv, call, close) over a pool of workers.

Each env has a state (idle, stepping, ready, resetting, broken, lost). ``send``
moves idle envs to stepping; a worker's reply moves them to ready and queues
them in arrival order; ``recv`` hands out the first ones to arrive; ``step`` is
``send`` to all plus waiting for all. State changes happen in reply handlers,
never in the awaiting coroutine, so cancelling an await or letting a deadline
expire cannot lose or misattribute a result: it waits, ready, for a later ``recv``.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from . import protocol as P
from .autoconf import SPIN_S, plan_workers, probe_step_cost, spin_for
from .backends.base import Backend
from .backends.process import ProcessBackend, get_context
from .control import ControlLoop
from .controller import AdaptiveController, Controller
from .errors import (
    AiovecError,
    ClosedError,
    ConfigError,
    EnvError,
    EnvStateError,
    StepTimeoutError,
    WorkerCrashedError,
)
from .infos import batch_infos
from .machine import available_cpus
from .pool import WorkerPool
from .shm import SharedBuffers
from .spaces import check_supported, put_rows, take, validate_actions
from .stats import Stats

IDLE, STEPPING, READY, RESETTING, BROKEN, LOST = range(6)
_STATE_NAMES = ("idle", "stepping", "ready (result not received yet)", "resetting", "broken (reset it)", "lost (worker died)")


class StepResult(NamedTuple):
    """What ``recv`` returns: a batch of transitions and the env each row belongs to.

    Row ``k`` of every field belongs to env ``env_ids[k]``; rows come in the order the
    envs finished, and ``infos`` is batched over the same rows (gymnasium's ``_key`` masks).

    >>> async def main():
    ...     async with aiovec.make("CartPole-v1", 4, num_workers=2) as venv:
    ...         await venv.reset(seed=0)
    ...         venv.send(np.ones(4, dtype=np.int64))
    ...         r = await venv.recv(3)
    ...         await venv.drain()
    ...         return r.obs.shape, r.rewards.tolist(), len(set(r.env_ids.tolist()))
    >>> aiovec.run(main())
    ((3, 4), [1.0, 1.0, 1.0], 3)
    """

    obs: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    infos: dict[str, Any]
    env_ids: np.ndarray


class AsyncVecEnv:
    """A vector of gymnasium envs in worker processes, driven from asyncio.

    Args:
        env_fns: one zero-argument factory per env (lambdas and closures are fine).
        num_workers: worker processes; ``"auto"`` picks from the available CPUs and ``num_envs``.
        batch_size: how many results ``recv()`` returns by default (default ``num_envs``).
        autoreset_mode: gymnasium's NEXT_STEP (default), SAME_STEP or DISABLED.
        context: multiprocessing start method, ``"forkserver"`` (default) or ``"spawn"``.
        step_timeout: seconds a worker may spend on one step/reset command before it is
            killed and reported as crashed (``None``: no limit).
        close_timeout: grace period for workers to exit on ``close()`` before they are killed.
        controller: decides the worker count at run time (default with ``num_workers="auto"``:
            :class:`~aiovec.AdaptiveController`; with an int: none, the count stays).
        max_restarts: how many worker deaths to survive (budget over the vector env's life).
            A new worker takes over the dead one's envs; each interrupted episode comes back
            as ``truncated=True`` with ``infos["worker_restarted"]``, and the env continues
            from a fresh reset whose seed derives from its last seed and the restart count.
        restart_backoff: seconds before the first restart; doubles for restarts within 1 s.
        recycle_steps / recycle_rss_mb: replace a worker after that many env steps, or when its
            resident memory exceeds that many MiB (leaky envs); envs move at episode boundaries,
            so the caller sees nothing but ``stats()["recycled"]``.
        backend: ``"process"`` (default: worker processes on this machine) or ``"ray"``
            (workers are Ray actors; ``pip install 'aiovec[ray]'``). With ``"ray"``,
            ``ray_address`` names an existing cluster (default: a local Ray started for
            this vector env and shut down with it, unless Ray is already initialised) and
            ``ray_options`` pass through to the actors' ``.options()`` (``num_cpus``, resources).
        env_threads: threads per worker that step a command's envs concurrently; worth it for
            envs that wait with the GIL released (I/O, sleeps, C simulators), useless for
            pure-Python CPU-bound ones.
        check_obs: validate every observation against the declared space in the worker and
            raise ``EnvError`` naming the env (default: on in Python's development mode,
            ``python -X dev``, or with ``AIOVEC_DEBUG=1``; off otherwise, it costs a check per step).
        spin: let idle workers poll briefly for the next command instead of sleeping at once
            (``"auto"``: only while the workers leave the parent a CPU of its own, re-decided at each resize).

    Lock-step, as gymnasium's vector envs (``aiovec.make(env_id, n)`` builds the same from an env id):

    >>> async def main():
    ...     fns = [lambda: gym.make("CartPole-v1")] * 4          # lambdas and closures are fine
    ...     async with aiovec.AsyncVecEnv(fns, num_workers=2) as venv:
    ...         obs, infos = await venv.reset(seed=0)
    ...         obs, rewards, terminations, truncations, infos = await venv.step(np.zeros(4, dtype=np.int64))
    ...         return obs.shape, rewards.tolist(), venv.num_workers
    >>> aiovec.run(main())
    ((4, 4), [1.0, 1.0, 1.0, 1.0], 2)
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        num_workers: int | str = "auto",
        batch_size: int | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        context: str | None = None,
        step_timeout: float | None = None,
        close_timeout: float = 5.0,
        spin: bool | str = "auto",
        controller: Controller | None = None,
        max_restarts: int = 0,
        restart_backoff: float = 0.1,
        recycle_steps: int | None = None,
        recycle_rss_mb: float | None = None,
        backend: str = "process",
        ray_address: str | None = None,
        ray_options: dict[str, Any] | None = None,
        env_threads: int = 1,
        check_obs: bool | None = None,
    ) -> None:
        env_fns = list(env_fns)
        if not env_fns:
            raise ConfigError("env_fns is empty: pass at least one env factory")
        for i, fn in enumerate(env_fns):
            if not callable(fn):
                raise ConfigError(f"env_fns[{i}] is {fn!r}, not a callable that returns an env")
        self.num_envs = n = len(env_fns)
        self.batch_size = _positive_int(batch_size if batch_size is not None else n, "batch_size")
        if self.batch_size > n:
            raise ConfigError(f"batch_size={self.batch_size} exceeds num_envs={n}")
        try:
            self.autoreset_mode = AutoresetMode(autoreset_mode)
        except ValueError:
            raise ConfigError(f"autoreset_mode must be one of {[m.value for m in AutoresetMode]}, got {autoreset_mode!r}") from None
        if num_workers != "auto":
            _positive_int(num_workers, "num_workers")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ConfigError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        if not isinstance(restart_backoff, (int, float)) or restart_backoff < 0:
            raise ConfigError(f"restart_backoff must be >= 0 seconds, got {restart_backoff!r}")
        for name, value in (("recycle_steps", recycle_steps), ("recycle_rss_mb", recycle_rss_mb)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ConfigError(f"{name} must be a positive number or None, got {value!r}")
        self._recycle = (recycle_steps, recycle_rss_mb)
        if backend not in ("process", "ray"):
            raise ConfigError(f"backend must be 'process' or 'ray', got {backend!r}")
        self.backend = backend
        self.env_threads = _positive_int(env_threads, "env_threads")
        if check_obs is None:
            check_obs = bool(sys.flags.dev_mode or os.environ.get("AIOVEC_DEBUG"))
        self._host_options = {"env_threads": self.env_threads, "check_obs": bool(check_obs)}
        self._ray = (ray_address, ray_options)
        self.max_restarts = max_restarts
        self.restart_backoff = float(restart_backoff)
        if spin not in ("auto", True, False):
            raise ConfigError(f"spin must be 'auto', True or False, got {spin!r}")
        for name, value in (("step_timeout", step_timeout), ("close_timeout", close_timeout)):
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        self.step_timeout = step_timeout
        self.close_timeout = float(close_timeout)
        self._context_name = context
        get_context(context)  # reject a bad start method now, not at start
        self._factories = _pickle_factories(env_fns)

        # Spaces and metadata from one env made here, as gymnasium's AsyncVectorEnv does.
        try:
            probe = env_fns[0]()
        except Exception as exc:
            raise ConfigError(f"env_fns[0]() raised {type(exc).__name__}: {exc}") from exc
        try:
            self.single_observation_space = probe.observation_space
            self.single_action_space = probe.action_space
            self.metadata = dict(getattr(probe, "metadata", {}) or {})
            self.render_mode = getattr(probe, "render_mode", None)
            self.spec = getattr(probe, "spec", None)
            cost = probe_step_cost(probe) if num_workers == "auto" else None
        finally:
            probe.close()
        cpus = available_cpus()
        self._requested_workers = plan_workers(n, cost, cpus) if num_workers == "auto" else min(int(num_workers), n)
        self._spin_s = spin_for(self._requested_workers, cpus) if spin == "auto" else (SPIN_S if spin else 0.0)
        self._spin_auto = spin == "auto"
        self.probe_cost = cost
        check_supported(self.single_observation_space, "observation space")
        check_supported(self.single_action_space, "action space")
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)

        self._state = np.full(n, IDLE, dtype=np.int8)
        self._boundary = np.ones(n, dtype=np.bool_)  # at an episode boundary: may move between workers
        self._restarted: set[int] = set()  # idle envs whose worker was replaced: next send truncates
        self._seeds: list[int | None] = [None] * n  # last explicit seed per env (restarts derive from it)
        self._restart_counts = [0] * n
        self._ready: dict[int, dict | None] = {}  # env id -> info, in arrival order
        self._in_flight = 0
        self._errors: deque[AiovecError] = deque()
        self._lost: dict[int, WorkerCrashedError] = {}
        self._waiters: list[asyncio.Future] = []
        self._pool: WorkerPool | None = None
        self._views: Any = None
        self._stats = Stats()
        self._starting: asyncio.Future | None = None
        self._closed = False
        self._all = np.arange(n)
        self._busy_s = 0.0  # time with at least one step in flight: the caller's demand
        self._busy_since = 0.0
        self.controller = controller if controller is not None else (AdaptiveController() if num_workers == "auto" else None)
        self._control: ControlLoop | None = None
        self._control_task: asyncio.Task | None = None

    # -- lifetime -----------------------------------------------------------------------
    async def __aenter__(self) -> AsyncVecEnv:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the workers (``async with`` and the first ``reset`` do this for you).

        Worker processes start in a helper thread, so the event loop keeps running meanwhile.

        >>> async def main():
        ...     venv = aiovec.make("CartPole-v1", 4, num_workers=2)
        ...     before = venv.num_workers
        ...     await venv.start()
        ...     after = venv.num_workers
        ...     await venv.close()
        ...     return before, after
        >>> aiovec.run(main())
        (0, 2)
        """
        self._check_open()
        if self._pool is not None:
            return
        if self._starting is not None:
            await asyncio.shield(self._starting)
            return
        loop = asyncio.get_running_loop()
        self._starting = loop.create_future()
        try:
            backend = self._make_backend()
            pool = WorkerPool(backend, self._factories, self._stats, self._on_worker_lost, self.step_timeout,
                              self.max_restarts, self.restart_backoff, *self._recycle)
            pool.on_restart = self._on_worker_restarted
            pool.restart_state = self._restart_state
            try:
                await pool.start(self._requested_workers)
            except BaseException:
                pool.kill_all()
                await pool.close(self.close_timeout)
                raise
            if self._closed:  # close() ran while we were starting
                await pool.close(self.close_timeout)
                raise ClosedError("the vector env was closed while starting")
            pool.movable = self._movable
            self._pool = pool
            self._stats.t0 = time.perf_counter()  # rates count from here, not from start-up
            if self.controller is not None:
                self._control = ControlLoop(self, self.controller)
                self._control_task = loop.create_task(self._control.run())
            self._starting.set_result(None)
        except BaseException as exc:
            self._starting.set_exception(exc)
            self._starting.exception()  # mark retrieved
            self._starting = None
            raise

    def _make_backend(self) -> Backend:
        if self.backend == "ray":
            from .backends.ray import RayBackend

            rb = RayBackend(self.single_observation_space, self.single_action_space, self.num_envs,
                            self.autoreset_mode.value, *self._ray, host_options=self._host_options)
            self._views = rb.views
            return rb
        ctx = get_context(self._context_name)
        buffers = SharedBuffers(ctx, self.single_observation_space, self.single_action_space, self.num_envs)
        self._views = buffers.views()
        return ProcessBackend(ctx, buffers, self.autoreset_mode.value, self._spin_s, self._host_options)

    async def close(self) -> None:
        """Stop every worker (grace period ``close_timeout``, then kill). Idempotent; never hangs.

        Steps still in flight are abandoned; no process, thread or shared memory outlives it.

        >>> async def main():
        ...     venv = aiovec.make("CartPole-v1", 2, num_workers=1)
        ...     await venv.reset(seed=0)
        ...     venv.send(np.zeros(2, dtype=np.int64))   # closing with steps in flight is fine
        ...     await venv.close()
        ...     await venv.close()                        # and so is closing twice
        ...     return venv.closed, venv.num_workers
        >>> aiovec.run(main())
        (True, 0)
        """
        if self._closed:
            return
        self._closed = True
        self._wake()
        if self._control_task is not None:
            self._control_task.cancel()
            await asyncio.gather(self._control_task, return_exceptions=True)
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await pool.close(self.close_timeout)
        except BaseException:
            pool.kill_all()  # cancelled or failed mid-close: leave nothing running
            raise
        # The executors' queues sit in reference cycles; collect them now so their named
        # semaphores are gone when close() returns, not at some later collection.
        del pool
        gc.collect()

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None and not self._closed:
            pool.kill_all()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    @property
    def num_workers(self) -> int:
        """Worker processes currently running."""
        return self._pool.num_workers if self._pool is not None else 0

    # -- reset --------------------------------------------------------------------------
    async def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset all envs (or those in ``options["reset_mask"]``); gymnasium semantics.

        ``seed``: ``None``, an int (env ``i`` gets ``seed + i``) or one seed per env.
        Envs being reset must not have a step in flight or an unreceived result
        (``EnvStateError``); with a ``reset_mask`` the other envs may keep stepping.
        Returns the observations of all envs and the infos of the reset ones.

        >>> async def main():
        ...     async with aiovec.make("CartPole-v1", 3, num_workers=1) as venv:
        ...         obs, infos = await venv.reset(seed=7)             # env i gets seed 7 + i
        ...         venv.send(np.zeros(2, dtype=np.int64), env_ids=[1, 2])
        ...         again, _ = await venv.reset(seed=7, options={"reset_mask": np.array([True, False, False])})
        ...         await venv.drain()                                # envs 1 and 2 kept stepping
        ...         return obs.shape, bool((again[0] == obs[0]).all())
        >>> aiovec.run(main())
        ((3, 4), True)
        """
        await self.start()
        n = self.num_envs
        seeds = _normalize_seeds(seed, n)
        options = dict(options) if options else None
        ids = self._all
        if options is not None and "reset_mask" in options:
            ids = np.flatnonzero(_check_reset_mask(options.pop("reset_mask"), n))
        self._check_envs(ids, (IDLE, BROKEN), "reset")
        self._state[ids] = RESETTING
        for i in ids.tolist():
            self._restarted.discard(i)
            if seeds[i] is not None:
                self._seeds[i] = seeds[i]
        infos: dict[int, dict | None] = {}
        errors: list[AiovecError] = []
        done = asyncio.get_running_loop().create_future()
        remaining = [0]

        def handler(wid: int, reply: Any, error: BaseException | None) -> None:
            if error is not None:
                errors.append(error)  # envs marked lost by _on_worker_lost
            else:
                _, g, payload, errs, _ = reply
                failed = set()
                for e in errs or ():
                    err = EnvError(*e)
                    failed.add(err.env_id)
                    errors.append(err)
                    self._state[err.env_id] = BROKEN
                for k, i in enumerate(g):
                    if i not in failed:
                        self._state[i] = IDLE
                        self._boundary[i] = True
                        infos[i] = payload[k] if payload else None
                if self._pool is not None and self._pool.pending_moves:
                    self._pool.try_moves()
            remaining[0] -= 1
            if remaining[0] == 0 and not done.done():
                done.set_result(None)

        remaining[0] = self._pool.submit(  # type: ignore[union-attr]
            ids.tolist(), lambda g: (P.RESET, tuple(g), [seeds[i] for i in g], options), handler
        )
        await done
        if errors:
            raise errors[0]
        return take(self._views.obs, slice(None)), batch_infos(n, infos.items())

    # -- first-finished -----------------------------------------------------------------
    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Dispatch actions to idle envs (all envs when ``env_ids`` is None) and return at once.

        Everything is checked before anything is sent: env ids (exist, distinct,
        idle) and actions (count, shape, dtype, range). ``actions`` has one row per env
        in ``env_ids``. Collect the results with ``recv``.

        >>> async def main():
        ...     async with aiovec.make("CartPole-v1", 4, num_workers=2) as venv:
        ...         await venv.reset(seed=0)
        ...         venv.send(np.ones(4, dtype=np.int64))              # every env starts a step
        ...         first = await venv.recv(2)                          # the two that finish first
        ...         venv.send(np.zeros(2, dtype=np.int64), first.env_ids)  # and at once they go again
        ...         return sum(len(r.env_ids) for r in await venv.drain())
        >>> aiovec.run(main())
        4
        """
        self._check_started()
        ids = self._all if env_ids is None else self._check_env_ids(env_ids)
        acts = validate_actions(self.single_action_space, actions, len(ids))
        self._check_envs(ids, (IDLE,), "send to")
        if self.autoreset_mode == AutoresetMode.DISABLED:
            v = self._views
            done = v.terminations[ids] | v.truncations[ids]
            if done.any():
                raise EnvStateError(
                    f"envs {ids[done].tolist()} ended their episode and autoreset_mode is DISABLED: "
                    "reset them (options={'reset_mask': ...}) before stepping"
                )
        if self._restarted:
            ids, acts = self._truncate_restarted(ids, acts)
            if len(ids) == 0:
                return
        put_rows(self._views.actions, ids, acts)
        self._state[ids] = STEPPING
        if not self._in_flight:
            self._busy_since = time.perf_counter()
        self._in_flight += len(ids)
        self._pool.submit(None if env_ids is None else ids.tolist(), _step_msg, self._on_step_reply)  # type: ignore[union-attr]

    async def recv(self, batch_size: int | None = None, timeout: float | None = None) -> StepResult:
        """Await the first ``batch_size`` results to finish (default: the constructor's ``batch_size``).

        Returns fewer only when fewer are outstanding. ``timeout`` bounds the whole
        call; on expiry ``StepTimeoutError`` is raised and nothing is lost. An env
        error or a worker crash is raised here, once, as ``EnvError``/``WorkerCrashedError``.

        An EnvPool-style loop: 8 envs, act on whichever 4 finish first.

        >>> async def main():
        ...     async with aiovec.make("CartPole-v1", 8, num_workers=2, batch_size=4) as venv:
        ...         await venv.reset(seed=0)
        ...         venv.send(np.zeros(8, dtype=np.int64))
        ...         steps = 0
        ...         for _ in range(100):
        ...             r = await venv.recv()                             # batch_size results
        ...             steps += len(r.env_ids)
        ...             venv.send(np.ones(len(r.env_ids), dtype=np.int64), r.env_ids)
        ...         await venv.drain()
        ...         return steps
        >>> aiovec.run(main())
        400
        """
        k = self.batch_size if batch_size is None else _positive_int(batch_size, "batch_size")
        self._check_started()
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        while True:
            if self._errors:
                raise self._errors.popleft()
            outstanding = self._in_flight + len(self._ready)
            if outstanding == 0:
                raise EnvStateError("recv() with nothing in flight: send() actions first")
            need = min(k, outstanding)
            if len(self._ready) >= need:
                ids = np.fromiter(itertools.islice(self._ready, need), dtype=np.int64, count=need)
                return self._collect(ids, ordered=False)
            await self._wait(deadline)

    async def drain(self, timeout: float | None = None) -> list[StepResult]:
        """Receive everything outstanding (e.g. before a full reset in async mode).

        >>> async def main():
        ...     async with aiovec.make("CartPole-v1", 4, num_workers=2) as venv:
        ...         await venv.reset(seed=0)
        ...         venv.send(np.zeros(4, dtype=np.int64))
        ...         results = await venv.drain(timeout=10.0)
        ...         await venv.reset(seed=1)                              # every env idle again
        ...         return sorted(i for r in results for i in r.env_ids.tolist())
        >>> aiovec.run(main())
        [0, 1, 2, 3]
        """
        self._check_started()
        out = []
        while self._in_flight or self._ready:
            out.append(await self.recv(self._in_flight + len(self._ready), timeout))
        return out

    # -- lock-step ----------------------------------------------------------------------
    async def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env once and return gymnasium's 5-tuple, rows in env order.

        If cancelled, the step still completes and its results wait for ``recv()``.
        Episodes reset automatically following ``autoreset_mode``.

        >>> async def main():
        ...     async with aiovec.make("CartPole-v1", 2, num_workers=1) as venv:
        ...         await venv.reset(seed=0)
        ...         episodes, t = 0, 0
        ...         while episodes < 3:                                   # always push left: short episodes
        ...             obs, rewards, terms, truncs, infos = await venv.step(np.zeros(2, dtype=np.int64))
        ...             episodes += int(terms.sum() + truncs.sum())
        ...             t += 1
        ...         return obs.shape, t < 50
        >>> aiovec.run(main())
        ((2, 4), True)
        """
        self._check_started()
        if self._in_flight or self._ready:
            raise EnvStateError("step() needs every env idle, but some have steps in flight or unreceived results: recv()/drain() them first")
        self.send(actions)
        while self._in_flight:
            await self._wait(None)
        if self._errors:
            raise self._errors.popleft()
        r = self._collect(self._all, ordered=True)
        return r.obs, r.rewards, r.terminations, r.truncations, r.infos

    # -- attributes and methods ---------------------------------------------------------
    async def call(self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``env.name(*args, **kwargs)`` (or read the attribute) in each env; results in env order.

        ``env_ids`` picks a subset. Envs may be stepping meanwhile; an exception in one env
        is raised as ``EnvError`` naming it.

        >>> async def main():
        ...     async with aiovec.make("CartPole-v1", 3, num_workers=1) as venv:
        ...         await venv.reset(seed=0)
        ...         return await venv.call("get_wrapper_attr", "gravity", env_ids=[0, 2])
        >>> aiovec.run(main())
        (9.8, 9.8)
        """
        return await self._call("call", name, (args, kwargs), env_ids)

    async def get_attr(self, name: str, env_ids: Sequence[int] | None = None) -> tuple[Any, ...]:
        """Read attribute ``name`` of each env (or of those in ``env_ids``), through its wrappers.

        >>> async def main():
        ...     async with aiovec.make("CartPole-v1", 2, num_workers=1) as venv:
        ...         specs = await venv.get_attr("spec", env_ids=[1])
        ...         return specs[0].id, await venv.get_attr("gravity")
        >>> aiovec.run(main())
        ('CartPole-v1', (9.8, 9.8))
        """
        return await self._call("get", name, None, env_ids)

    async def set_attr(self, name: str, values: Any, env_ids: Sequence[int] | None = None) -> None:
        """Set attribute ``name`` on each env: one value for all, or a list with one per env.

        >>> async def main():
        ...     async with aiovec.make("CartPole-v1", 3, num_workers=1) as venv:
        ...         await venv.set_attr("gravity", [9.8, 1.6, 3.7])   # one value per env
        ...         await venv.set_attr("gravity", 24.8, env_ids=[0])  # one value for a subset
        ...         return await venv.get_attr("gravity")
        >>> aiovec.run(main())
        (24.8, 1.6, 3.7)
        """
        ids = self._all if env_ids is None else self._check_env_ids(env_ids)
        if not isinstance(values, (list, tuple)):
            values = [values] * len(ids)
        elif len(values) != len(ids):
            raise ConfigError(f"set_attr got {len(values)} values for {len(ids)} envs")
        await self._call("set", name, dict(zip(ids.tolist(), values)), ids)

    async def _call(self, kind: str, name: str, payload: Any, env_ids: Any) -> tuple[Any, ...]:
        await self.start()
        if not isinstance(name, str):
            raise ConfigError(f"attribute name must be a str, got {name!r}")
        ids = self._all if env_ids is None else self._check_env_ids(env_ids)
        self._check_envs(ids, (IDLE, STEPPING, READY, BROKEN), f"{kind} on")

        def build(g: list[int]) -> tuple[Any, ...]:
            return (P.CALL, tuple(g), kind, name, [payload[i] for i in g] if kind == "set" else payload)

        results, errors = await self._pool.request(ids.tolist(), build)  # type: ignore[union-attr]
        if errors:
            raise errors[0]
        return tuple(results.get(i) for i in ids.tolist())

    # -- resizing -----------------------------------------------------------------------
    async def resize(self, num_workers: int) -> None:
        """Change the number of worker processes while envs keep stepping.

        New workers start at once; each env moves only when it is idle at an episode
        boundary, carrying its ``np_random``, so no transition is lost, duplicated or
        reordered and every trajectory is the one it would have been without the move.
        Workers left without envs exit. ``num_workers`` tells the current count,
        ``pending_moves`` how many envs still wait for their episode to end.

        >>> async def main():
        ...     async with aiovec.make("CartPole-v1", 4, num_workers=1) as venv:
        ...         await venv.reset(seed=0)
        ...         await venv.resize(2)
        ...         for _ in range(600):                                  # every env ends an episode
        ...             await venv.step(np.zeros(4, dtype=np.int64))
        ...         return venv.num_workers, venv.pending_moves, venv.stats()["moves"] >= 1
        >>> aiovec.run(main())
        (2, 0, True)
        """
        await self.start()
        n, pool = _positive_int(num_workers, "num_workers"), self._pool
        try:
            await pool.resize(n)  # type: ignore[union-attr]
        finally:
            if self._spin_auto and pool is self._pool and not pool.closing:  # spin only while workers leave the parent a core
                pool.tune(spin_for(pool.target_workers, available_cpus()))

    @property
    def pending_moves(self) -> int:
        """Envs still waiting for an episode boundary to move to their new worker."""
        return self._pool.pending_moves if self._pool is not None else 0

    @property
    def control_history(self) -> list[dict[str, Any]]:
        """One entry per control interval: time, workers, steps/s, latency, decision and reason."""
        return self._control.history if self._control is not None else []

    def _busy_time(self) -> float:
        return self._busy_s + (time.perf_counter() - self._busy_since if self._in_flight else 0.0)

    def _movable(self, i: int) -> bool:
        return bool(self._boundary[i]) and self._state[i] not in (STEPPING, RESETTING, LOST)

    # -- stats --------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Steps, steps/s, batch latency percentiles (seconds), and the same per worker (with its pid and spin).

        Also the envs in flight or ready, and the counts of restarts, moves and recycled workers.

        >>> async def main():
        ...     async with aiovec.make("CartPole-v1", 4, num_workers=2) as venv:
        ...         await venv.reset(seed=0)
        ...         for _ in range(10):
        ...             await venv.step(np.zeros(4, dtype=np.int64))
        ...         s = venv.stats()
        ...         return s["steps"], s["num_workers"], len(s["workers"]), s["steps_per_s"] > 0
        >>> aiovec.run(main())
        (40, 2, 2, True)
        """
        snap = self._stats.snapshot()
        snap.update(num_envs=self.num_envs, num_workers=self.num_workers, in_flight=self._in_flight, ready=len(self._ready),
                    restarts=self._pool.restarts if self._pool is not None else 0,
                    moves=self._pool.moves if self._pool is not None else 0,
                    recycled=self._pool.recycled if self._pool is not None else 0)
        return snap

    # -- internals ----------------------------------------------------------------------
    def _on_step_reply(self, wid: int, reply: Any, error: BaseException | None) -> None:
        if error is not None:
            return  # the worker died; _on_worker_lost accounts for its envs
        _, ids, infos, errs, _ = reply
        state, ready = self._state, self._ready
        self._in_flight -= len(ids)
        if not self._in_flight:
            self._busy_s += time.perf_counter() - self._busy_since
        failed = ()
        if errs:
            failed = {e[0] for e in errs}
            for e in errs:
                state[e[0]] = BROKEN
                self._errors.append(EnvError(*e))
        if infos is None and not failed:
            state[list(ids)] = READY
            for i in ids:
                ready[i] = None
        else:
            for k, i in enumerate(ids):
                if i not in failed:
                    state[i] = READY
                    ready[i] = infos[k] if infos else None
        v, rows = self._views, list(ids)
        self._boundary[rows] = v.terminations[rows] | v.truncations[rows]
        pool = self._pool
        if pool is not None and pool.pending_moves:
            pool.try_moves()
        self._wake()

    def _restart_state(self, i: int) -> dict:
        """State for env ``i`` on its new worker: episode over, generator derived from its last seed."""
        self._restart_counts[i] += 1
        entropy = self._seeds[i] if self._seeds[i] is not None else np.random.SeedSequence().entropy
        gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy, spawn_key=(i, self._restart_counts[i]))))
        return {"kind": "ended", "np_random": gen, "needs_reset": self.autoreset_mode != AutoresetMode.DISABLED}

    def _synthesize_truncation(self, i: int) -> None:
        v = self._views
        v.rewards[i] = 0.0
        v.terminations[i] = False
        v.truncations[i] = True  # obs stays the last one delivered: do not bootstrap across it
        self._state[i] = READY
        self._boundary[i] = True
        self._ready[i] = {"worker_restarted": True}

    def _truncate_restarted(self, ids: np.ndarray, acts: Any) -> tuple[np.ndarray, Any]:
        hit = np.fromiter((i in self._restarted for i in ids.tolist()), dtype=np.bool_, count=len(ids))
        if not hit.any():
            return ids, acts
        for i in ids[hit].tolist():
            self._restarted.discard(i)
            self._synthesize_truncation(i)
        self._wake()
        keep = ~hit
        return ids[keep], _rows(acts, keep)

    def _on_worker_restarted(self, err: WorkerCrashedError) -> None:
        for i in err.env_ids:
            st = self._state[i]
            if st == STEPPING:
                self._in_flight -= 1
                self._synthesize_truncation(i)
            elif st == RESETTING:
                self._state[i] = BROKEN  # the reset raised; resetting again is allowed
            elif st in (IDLE, READY):
                self._restarted.add(i)
        if not self._in_flight and self._busy_since:
            self._busy_s += time.perf_counter() - self._busy_since
        self._wake()

    def _on_worker_lost(self, err: WorkerCrashedError) -> None:
        for i in err.env_ids:
            if self._state[i] == STEPPING:
                self._in_flight -= 1
            if self._state[i] != READY:  # a result already in shared memory stays deliverable
                self._state[i] = LOST
            self._lost[i] = err
        if not self._closed:
            self._errors.append(err)
        self._wake()

    def _collect(self, ids: np.ndarray, ordered: bool) -> StepResult:
        v, ready, state = self._views, self._ready, self._state
        rows = slice(None) if ordered and len(ids) == self.num_envs else ids
        rows_info = [(k, info) for k, i in enumerate(ids.tolist()) if (info := ready.pop(i)) is not None]
        infos = batch_infos(len(ids), rows_info) if rows_info else {}
        state[ids] = IDLE
        if self._lost:
            for i in ids.tolist():
                if i in self._lost:
                    state[i] = LOST
        return StepResult(
            take(v.obs, rows), v.rewards[rows].copy(), v.terminations[rows].copy(), v.truncations[rows].copy(), infos, ids.copy()
        )

    async def _wait(self, deadline: float | None) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiters.append(fut)
        handle = None
        if deadline is not None:
            handle = loop.call_at(deadline, _release, fut)
        try:
            await fut
        finally:
            if handle is not None:
                handle.cancel()
        if self._closed:
            raise ClosedError("the vector env was closed")
        if deadline is not None and loop.time() >= deadline and not self._errors:
            raise StepTimeoutError(f"deadline expired with {self._in_flight} envs still in flight; their results stay queued for a later recv()")

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the vector env is closed")

    def _check_started(self) -> None:
        self._check_open()
        if self._pool is None:
            raise EnvStateError("the vector env is not started: use `async with`, `await venv.start()` or `await venv.reset()` first")

    def _check_env_ids(self, env_ids: Any) -> np.ndarray:
        ids = np.asarray(env_ids)
        if ids.ndim == 0:
            ids = ids.reshape(1)
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise EnvStateError(f"env_ids must be a non-empty 1-d sequence of ints, got {env_ids!r}")
        ids = ids.astype(np.int64, copy=False)
        if ids.min() < 0 or ids.max() >= self.num_envs:
            raise EnvStateError(f"env_ids {ids.tolist()} out of range: this vector env has envs 0..{self.num_envs - 1}")
        if np.unique(ids).size != ids.size:
            raise EnvStateError(f"env_ids {ids.tolist()} contain duplicates")
        return ids

    def _check_envs(self, ids: np.ndarray, allowed: tuple[int, ...], what: str) -> None:
        st = self._state[ids]
        bad = ~np.isin(st, allowed) if len(allowed) > 1 else st != allowed[0]
        if bad.any():
            i = int(ids[np.argmax(bad)])
            if self._state[i] == LOST:
                raise self._lost[i]
            raise EnvStateError(f"cannot {what} env {i}: it is {_STATE_NAMES[self._state[i]]}")


def _rows(values: Any, mask: np.ndarray) -> Any:
    if isinstance(values, dict):
        return {k: _rows(v, mask) for k, v in values.items()}
    if isinstance(values, tuple):
        return tuple(_rows(v, mask) for v in values)
    return values[mask]


def _step_msg(ids: list[int]) -> tuple[Any, ...]:
    return (P.STEP, tuple(ids))


def _release(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _normalize_seeds(seed: Any, n: int) -> list[int | None]:
    if seed is None:
        return [None] * n
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(n)]
    seeds = list(seed)
    if len(seeds) != n:
        raise ConfigError(f"seed list has {len(seeds)} entries for {n} envs")
    return seeds


def _check_reset_mask(mask: Any, n: int) -> np.ndarray:
    if not isinstance(mask, np.ndarray):
        raise ConfigError(f"options['reset_mask'] must be a numpy array, got {type(mask).__name__}")
    if mask.shape != (n,) or mask.dtype != np.bool_:
        raise ConfigError(f"options['reset_mask'] must be a bool array of shape ({n},), got {mask.dtype} {mask.shape}")
    if not mask.any():
        raise ConfigError("options['reset_mask'] selects no env")
    return mask


def _pickle_factories(env_fns: list[Callable[[], gym.Env]]) -> list[bytes]:
    cache: dict[int, bytes] = {}
    out = []
    for i, fn in enumerate(env_fns):
        data = cache.get(id(fn))
        if data is None:
            try:
                data = cloudpickle.dumps(fn)
            except Exception as exc:
                raise ConfigError(
                    f"env_fns[{i}] ({fn!r}) cannot be sent to a worker process: {type(exc).__name__}: {exc}. "
                    "Workers are separate processes, so a factory must be picklable by cloudpickle: "
                    "don't capture locks, open files, sockets or live envs in it; build them inside the "
                    "factory, or use functools.partial(gymnasium.make, 'EnvId-v0', ...)."
                ) from exc
            cache[id(fn)] = data
        out.append(data)
    return out

