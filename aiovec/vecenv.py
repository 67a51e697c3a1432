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
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, create_empty_array

from . import pickling
from . import protocol as P
from .autoconf import SPIN_S, StepCost, choose_placement, plan_workers, probe_step_cost, spin_for
from .backends.base import Backend
from .backends.inline import InlineBackend
from .backends.process import ProcessBackend, get_context, start_forkserver
from .control import ControlLoop
from .controller import Controller
from .envtable import BROKEN, IDLE, READY, STEPPING, EnvTable
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
from .loop import checkpoint
from .machine import available_cpus
from .measured import MeasuredController
from .pool import WorkerPool
from .shm import SharedBuffers
from .spaces import ActionChecker, check_supported, get_row, leaf_dtype_codes, put_row, put_rows, take
from .stats import Stats
from .threads import in_thread

PLACEMENTS = ("auto", "inline", "process", "hybrid")


@dataclass(frozen=True)
class _Probe:
    """What building env 0 told: its spaces and metadata, and what it costs to build and step."""

    observation_space: gym.Space
    action_space: gym.Space
    metadata: dict[str, Any]
    render_mode: str | None
    spec: Any
    build_s: float
    cost: StepCost | None


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
            :class:`~aiovec.MeasuredController`, which also turns ``env_threads`` and the inline
            rung; with an int: none, the count stays). A controller that raises (or a resize it asked for
            that fails) ends adaptation at the configuration of the moment; the next ``step()``/``recv()``
            raises that error once.
        max_restarts: how many worker deaths to survive (budget over the vector env's life).
            A new worker takes over the dead one's envs; each interrupted episode comes back
            as ``truncated=True`` with ``infos["worker_restarted"]``, and the env continues
            from a fresh reset whose seed derives from its last seed and the restart count.
            Under next-step autoreset an episode that had ended is not cut again: its reset row
            comes from the new worker (a step in flight for it is sent there again).
            Under same-step autoreset the truncation is a same-step row: the new worker resets the
            env, ``obs`` is the new episode's first observation and ``infos["final_obs"]`` the last
            one delivered (a step in flight is sent again; the next step is a real one).
            A reset in flight is sent again to the new worker, with the same seeds.
        restart_backoff: seconds before the first restart; doubles for restarts within 1 s.
        recycle_steps / recycle_rss_mb: replace a worker after that many env steps, or when its
            resident memory exceeds that many MiB (leaky envs); envs move at episode boundaries,
            so the caller sees nothing but ``stats()["recycled"]``.
        backend: ``"process"`` (default: worker processes on this machine) or ``"ray"``
            (workers are Ray actors; ``pip install 'aiovec[ray]'``). With ``"ray"``,
            ``ray_address`` names an existing cluster (default: a local Ray). With no Ray
            initialised, this vector env starts it, others opened meanwhile join it, and the
            last of them to close shuts it down; a Ray the caller initialised is left running.
            ``ray_options`` pass through to the actors' ``.options()`` (``num_cpus``, resources).
        env_threads: threads per worker that step a command's envs concurrently; worth it for
            envs that wait with the GIL released (I/O, sleeps, C simulators), useless for
            pure-Python CPU-bound ones. ``None`` (default): 1, or with ``num_workers="auto"`` the
            controller's choice (it starts from a probe and adjusts at run time); any number,
            1 included, fixes it. Above 1 it is sized for a worker's share of the envs: while a
            resize still has to move some envs off a worker (at their episode's end), that worker
            keeps threads for them, up to one per env.
        check_obs: validate every observation against the declared space in the worker and
            raise ``EnvError`` naming the env (default: on in Python's development mode,
            ``python -X dev``, or with ``AIOVEC_DEBUG=1``; off otherwise, it costs a check per step).
        spin: let idle workers poll for the next command instead of sleeping at once, for about the
            parent's usual gap between a reply and the next command, at most 2 ms, and let this process
            poll for a step reply due within 0.25 ms instead of sleeping until the loop reports it (it
            holds the loop meanwhile, as one slice of in-process stepping does). ``"auto"``: only while
            the workers leave the parent a CPU of its own, re-decided at each resize and, where a
            controller runs, at each control interval, counting the CPUs other processes keep busy.
        placement: where the envs run. ``"process"``: in worker processes (isolation: a crash or a
            hang in an env cannot take the application down). ``"inline"``: inside this process, on
            the event loop, in slices of at most ~0.5 ms that yield between them; no round trip,
            so for cheap envs (CartPole: ~11 us a step) it beats any worker process, but a segfault
            in an env takes the application with it and a hung env cannot be killed. ``"hybrid"``:
            this process steps one shard (in the same slices) while ``num_workers - 1`` worker
            processes step the others, so every CPU steps envs and a batch costs one round trip
            to a worker that had a CPU of its own; the caveats of inline hold for that shard.
            ``"auto"`` (default), with ``num_workers="auto"``, no ``step_timeout`` and the process
            backend: inline for envs measured so cheap that a round trip costs more than the
            parallelism gains, hybrid for other envs that compute, processes for envs that mostly
            wait, are slow to build (> 0.25 s) or take over 0.5 ms a step (one step is the least a
            slice can hold the loop); processes whenever a condition is not met. A placement you
            choose stays: the controller (``num_workers="auto"``) then tunes only within it
            (hybrid: how many processes; process: processes and threads; inline: nothing to tune).

    Env 0 is built once to learn the spaces. Constructed where no event loop runs (a plain
    script), that happens here and a factory that raises is a ``ConfigError`` at once. Constructed
    inside a running loop, it happens in a helper thread during ``start()``, so the application's
    other tasks keep running even if the constructor takes seconds; the ``ConfigError`` then comes
    from ``start()`` (or from reading ``single_observation_space`` or another space before it,
    which builds env 0 on the caller's thread).

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
        env_threads: int | None = None,
        check_obs: bool | None = None,
        placement: str = "auto",
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
            self._disabled = self.autoreset_mode == AutoresetMode.DISABLED
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
        if placement not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if placement in ("inline", "hybrid") and step_timeout is not None:
            raise ConfigError(f"placement={placement!r} cannot honour step_timeout: a hung env in this process cannot be killed; "
                              "use placement='process' (the default with step_timeout)")
        if placement in ("inline", "hybrid") and backend != "process":
            raise ConfigError(f"placement={placement!r} steps envs in this process; it does not combine with backend={backend!r}")
        if placement == "hybrid" and num_workers != "auto" and num_workers < 2:
            raise ConfigError(f"placement='hybrid' counts this process as one of num_workers, so it needs num_workers >= 2, got {num_workers}")
        self._env_threads_arg = env_threads  # None: not set by the user (the controller may turn it)
        if check_obs is None:
            check_obs = bool(sys.flags.dev_mode or os.environ.get("AIOVEC_DEBUG"))
        # What the backends start workers with; once started, the pool owns the thread count (see env_threads).
        self._host_options = {"env_threads": 1 if env_threads is None else _positive_int(env_threads, "env_threads"),
                              "check_obs": bool(check_obs)}
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
        self._env_fn0 = env_fns[0]
        self._num_workers_arg = num_workers
        self._spin_arg = spin
        self._spin_auto = spin == "auto"
        self.placement_arg = placement
        self._probe: _Probe | None = None
        self._batched_spaces: tuple[gym.Space, gym.Space] | None = None
        if not _loop_running():  # nothing to stall: learn the spaces now, so a broken factory fails here
            self._probed()

        self._table = EnvTable(n)
        self._seeds: list[int | None] = [None] * n  # last explicit seed per env (restarts derive from it)
        self._restart_counts = [0] * n
        self._errors: deque[AiovecError] = deque()
        self._waiters: list[tuple[asyncio.Future, bool]] = []  # (future, wake only when no step is in flight)
        self._in_step_s = 0.0  # wall time the caller spent inside step(): what the controller rates lock-step by
        self._pool: WorkerPool | None = None
        self._views: Any = None
        self._delivered: Any = None
        self._stats = Stats()
        self._starting: asyncio.Future[bool] | None = None  # True once started; False: the starter was cancelled
        self._start_task: asyncio.Task | None = None  # the task running start() now; close() cancels it
        self._start_stopped_by_close = False
        self._closed = False
        self._close_done: asyncio.Future[None] | None = None  # set when the first close() has finished
        self._all = np.arange(n)
        self._explicit_controller = controller
        tunable = num_workers == "auto" and placement != "inline"  # inline: one worker, nothing to tune
        self.controller = controller if controller is not None else (MeasuredController() if tunable else None)
        self._control: ControlLoop | None = None
        self._control_task: asyncio.Task | None = None
        self._control_error: BaseException | None = None  # what ended the control loop, raised once by step()/recv()

    # -- what env 0 tells -----------------------------------------------------------------
    def _probe_env0(self) -> _Probe:
        """Build env 0, read its spaces and metadata, time a few steps (``num_workers="auto"``); close it."""
        t0 = time.perf_counter()
        try:
            probe = self._env_fn0()
        except Exception as exc:
            raise ConfigError(f"env_fns[0]() raised {type(exc).__name__}: {exc}") from exc
        build_s = time.perf_counter() - t0
        try:
            obs_space, act_space = probe.observation_space, probe.action_space
            check_supported(obs_space, "observation space")
            check_supported(act_space, "action space")
            cost = probe_step_cost(probe) if self._num_workers_arg == "auto" else None
            return _Probe(obs_space, act_space, dict(getattr(probe, "metadata", {}) or {}), getattr(probe, "render_mode", None),
                          getattr(probe, "spec", None), build_s, cost)
        finally:
            try:
                probe.close()
            except Exception:  # the probe is a throwaway copy: what it told stands (workers' copies close alike)
                pass

    def _probed(self) -> _Probe:
        if self._probe is None:
            self._probe = self._probe_env0()
        return self._probe

    @property
    def single_observation_space(self) -> gym.Space:
        """One env's observation space (read before ``start()``, it builds env 0 on this thread)."""
        return self._probed().observation_space

    @property
    def single_action_space(self) -> gym.Space:
        """One env's action space (read before ``start()``, it builds env 0 on this thread)."""
        return self._probed().action_space

    @property
    def observation_space(self) -> gym.Space:
        """The batched observation space (``num_envs`` rows)."""
        return self._batched()[0]

    @property
    def action_space(self) -> gym.Space:
        """The batched action space (``num_envs`` rows)."""
        return self._batched()[1]

    def _batched(self) -> tuple[gym.Space, gym.Space]:
        if self._batched_spaces is None:
            p = self._probed()
            self._batched_spaces = (batch_space(p.observation_space, self.num_envs), batch_space(p.action_space, self.num_envs))
        return self._batched_spaces

    @property
    def metadata(self) -> dict[str, Any]:
        """Env 0's metadata, plus ``autoreset_mode``."""
        return {**self._probed().metadata, "autoreset_mode": self.autoreset_mode}

    @property
    def render_mode(self) -> str | None:
        """Env 0's render mode."""
        return self._probed().render_mode

    @property
    def spec(self) -> Any:
        """Env 0's ``EnvSpec`` (None for envs not made by ``gymnasium.make``)."""
        return self._probed().spec

    @property
    def probe_cost(self) -> StepCost | None:
        """Env 0's measured step cost (``num_workers="auto"`` only), or None."""
        return self._probe.cost if self._probe is not None else None

    @property
    def placement(self) -> str:
        """Where the envs run now: ``"inline"``, ``"hybrid"`` or ``"process"`` (``"unstarted"`` before ``start()``,
        ``"closed"`` after ``close()``)."""
        if self._pool is None:
            return "closed" if self._closed else "unstarted"
        return self._pool.kind

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
            if not await asyncio.shield(self._starting):  # the task that was starting it was cancelled: start here
                await self.start()
            return
        loop = asyncio.get_running_loop()
        self._starting = loop.create_future()
        self._start_task = asyncio.current_task()
        try:
            if self._probe is None:
                probe = in_thread(self._probed)  # env 0's constructor may take seconds
                if self._needs_processes():  # the fork server's imports run beside the probe
                    self._probe, _ = await asyncio.gather(probe, in_thread(start_forkserver, self._context_name))
                else:
                    self._probe = await probe
            kind, workers = self._plan_placement()
            self._host_options["measure_runq"] = False  # the inline backend copies its options now: no schedstat reads here
            backend, inline = self._make_backends()
            self._host_options["measure_runq"] = self.controller is not None  # worker processes: only for a controller
            pool = WorkerPool(backend, self._factories, self._stats, self._on_worker_lost, self.step_timeout,
                              self.max_restarts, self.restart_backoff, *self._recycle, inline=inline)
            pool.on_restart = self._on_worker_restarted
            pool.restart_state = self._restart_state
            pool.movable = self._table.movable
            pool.on_step = self._on_clean_step
            try:
                await pool.start(workers, kind)
            except BaseException:
                # The workers this start leaves behind are stopped here: their ends are no news to the envs, which
                # stay idle (not lost), so a later start() begins afresh.
                pool.on_lost, pool.on_restart = _ignore_crash, None
                pool.kill_all()
                try:
                    await pool.close(self.close_timeout)
                except BaseException:
                    pool.abandon()  # cancelled again (a second Ctrl-C): start no more, leave nothing pending
                    raise
                raise
            if self._closed:  # close() ran while we were starting
                await pool.close(self.close_timeout)
                raise ClosedError("the vector env was closed while starting")
            self._pool = pool
            self._stats.t0 = time.perf_counter()  # rates count from here, not from start-up
            self._check_actions = ActionChecker(self._probe.action_space, self.num_envs)
            self._flat_actions = isinstance(self._views.actions, np.ndarray)
            self._flat_obs = isinstance(self._views.obs, np.ndarray)
            # The last observation delivered per env, for the truncation a mid-step worker death leaves.
            self._delivered = create_empty_array(self._probe.observation_space, self.num_envs) if self.max_restarts else None
            if self.controller is not None:
                self._control = ControlLoop(self, self.controller)
                self._control_task = loop.create_task(self._control.run())
                self._control_task.add_done_callback(self._control_ended)
            self._starting.set_result(True)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and self._start_stopped_by_close and _uncancel(self._start_task):
                exc = ClosedError("the vector env was closed while starting")  # not this task's cancellation
            if isinstance(exc, asyncio.CancelledError):
                self._starting.set_result(False)  # the cancellation is this task's, not the other waiters'
            else:
                self._starting.set_exception(exc)
                self._starting.exception()  # mark retrieved
            self._starting = None
            if isinstance(exc, ClosedError):
                raise exc from None
            raise
        finally:
            self._start_task = None

    def _probe_places(self) -> bool:
        """Whether env 0's probe decides the placement (inline, hybrid or processes): everything left to "auto"."""
        auto = self.placement_arg == "auto" and self._num_workers_arg == "auto"
        return auto and self.step_timeout is None and self.backend == "process"

    def _needs_processes(self) -> bool:
        """Whether worker processes start whatever env 0's probe tells (else the placement waits for it)."""
        return self.backend == "process" and self.placement_arg != "inline" and not self._probe_places()

    def _plan_placement(self) -> tuple[str, int]:
        """Where to start the envs, ``(kind, workers)``, and which controller (if any) runs."""
        cpus = available_cpus()
        cost = self._probe.cost if self._probe is not None else None
        auto = self._num_workers_arg == "auto"
        kind = self.placement_arg
        if kind == "auto":
            measured = isinstance(self.controller, MeasuredController)  # the default controller is one too
            kind = choose_placement(self.num_envs, cost, cpus, self._probe.build_s, measured) if self._probe_places() else "process"
        workers = plan_workers(self.num_envs, cost, cpus) if auto else min(int(self._num_workers_arg), self.num_envs)
        if kind == "inline":
            workers = 1
        elif kind == "hybrid":
            workers = max(2, workers) if self._num_workers_arg == "auto" else workers
        if self._explicit_controller is None and self.controller is not None:  # the default controller (see __init__)
            from .measured import plan_start

            # Controller v2 (processes, threads per process, the inline rung), also for an inline start:
            # a cheap env that turns costly moves to processes, and back.
            self.controller = MeasuredController()
            if self._env_threads_arg is None and kind == "process" and cost is not None:
                # threads not set by the user: start where the model expects the best (corrected at run time)
                workers, threads = plan_start(self.num_envs, cost.cpu_s, cost.wall_s, cpus, workers, pace_s=cost.pace_s or 0.0)
                self._host_options["env_threads"] = threads
        spin = self._spin_arg
        processes = workers - 1 if kind == "hybrid" else workers  # this process steps a shard: it needs its CPU either way
        self._spin_s = spin_for(processes, cpus) if spin == "auto" else (SPIN_S if spin else 0.0)
        return kind, workers

    def _make_backends(self) -> tuple[Backend, Backend | None]:
        p = self._probe
        if self.backend == "ray":
            from .backends.ray import RayBackend

            rb = RayBackend(p.observation_space, p.action_space, self.num_envs,
                            self.autoreset_mode.value, *self._ray, host_options=self._host_options)
            self._views = rb.views
            return rb, None
        ctx = get_context(self._context_name)
        buffers = SharedBuffers(ctx, p.observation_space, p.action_space, self.num_envs)
        self._views = buffers.views()
        backend = ProcessBackend(ctx, buffers, self.autoreset_mode.value, self._spin_s, self._host_options)
        inline = None
        if self.placement_arg != "process" and self.step_timeout is None:
            inline = InlineBackend(self._views, self.autoreset_mode.value, p.observation_space, p.action_space, self._host_options)
        return backend, inline

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
            done = self._close_done
            if done is not None and not done.done() and done.get_loop() is asyncio.get_running_loop():
                await asyncio.shield(done)  # a close in progress in another task: return when it has finished
            return
        self._closed = True
        self._close_done = asyncio.get_running_loop().create_future()
        pool = None
        try:
            self._notify()
            starter = self._start_task
            if starter is not None and not starter.done() and starter is not asyncio.current_task():
                # Workers still being started would outlive this close: stop the start (its caller gets ClosedError).
                self._start_stopped_by_close = True
                starter.cancel()
                await asyncio.wait((starter,))
            if self._control_task is not None:
                self._control_task.cancel()
                await asyncio.gather(self._control_task, return_exceptions=True)
            pool = self._drop_pool()
            if pool is None:
                return
            await pool.close(self.close_timeout)
        except BaseException:
            if pool is None:  # cancelled before the pool's close began
                pool = self._drop_pool()
            if pool is not None:
                pool.abandon()  # cancelled or failed mid-close: leave nothing running, nor pending
            raise
        finally:
            self._close_done.set_result(None)
        # No gc.collect() here (it can hold the loop for long in a big application): each worker's
        # stop() drops the executor, its thread and its process, which hold the queues' semaphores.

    def _drop_pool(self) -> WorkerPool | None:
        """Detach the pool for closing; :attr:`env_threads` keeps the count it ran with last."""
        pool, self._pool = self._pool, None
        if pool is not None:
            self._host_options["env_threads"] = pool.env_threads
        return pool

    @property
    def env_threads(self) -> int:
        """Threads per worker process that step its envs concurrently (see :meth:`set_env_threads`): the worker
        pool's setting while it runs (the controller may turn it), the constructor's (or the start plan's) before,
        the last one after ``close()``."""
        pool = self._pool
        return pool.env_threads if pool is not None else self._host_options["env_threads"]

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
        """Workers currently running, this process counted as one where it steps envs (inline: 1, hybrid: 1 + the
        worker processes); 0 before ``start()`` and after ``close()``."""
        return self._pool.num_workers if self._pool is not None else 0

    # -- reset --------------------------------------------------------------------------
    async def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset all envs (or those in ``options["reset_mask"]``); gymnasium semantics.

        ``seed``: ``None``, an int (env ``i`` gets ``seed + i``) or one seed per env.
        Envs being reset must not have a step in flight or an unreceived result
        (``EnvStateError``); with a ``reset_mask`` the other envs may keep stepping.
        Returns the observations of all envs and the infos of the reset ones: an env left out of
        the mask keeps its last observation, or zeros while it is stepping (a worker may be writing
        its row; its next observation comes with ``recv()``).

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
        n, table = self.num_envs, self._table
        seeds = _normalize_seeds(seed, n)
        if options is not None and not isinstance(options, Mapping):
            raise ConfigError(f"options must be a dict or None, got {type(options).__name__}")
        options = dict(options) if options else None
        ids = self._all
        if options is not None and "reset_mask" in options:
            ids = np.flatnonzero(_check_reset_mask(options.pop("reset_mask"), n))
        self._require(ids, (IDLE, BROKEN), "reset")
        table.begin_reset(ids)
        for i in ids.tolist():
            if seeds[i] is not None:
                self._seeds[i] = seeds[i]
        infos: list[tuple[int, dict]] = []
        errors: list[AiovecError] = []
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        remaining = [0]

        def build(g: list[int]) -> P.Reset:
            return P.Reset(tuple(g), [seeds[i] for i in g], options)

        def handler(wid: int, reply: Any, error: BaseException | None) -> None:
            if isinstance(error, WorkerCrashedError):
                loop.call_soon(retry_or_fail, error)  # once the pool has decided: restart or loss
                return
            if error is not None:
                errors.append(error)
            else:
                failed = []
                for e in reply.errors or ():
                    errors.append(EnvError(*e))
                    failed.append(e[0])
                table.reset_done(reply.env_ids, failed)
                if reply.payload:
                    infos.extend((i, info) for i, info in zip(reply.env_ids, reply.payload, strict=True) if info and i not in failed)
                if self._pool is not None and self._pool.pending_moves:
                    self._pool.try_moves()
            settle_one()

        def retry_or_fail(error: WorkerCrashedError) -> None:
            """A worker died during the reset: a restarted worker's envs (their reset lost: BROKEN) reset again
            there, with the same seeds; lost envs (no restart left) raise the crash."""
            again = np.array([i for i in error.env_ids if table.state[i] == BROKEN and i not in table.lost and i in wanted],
                             dtype=np.int64)
            if len(again) and not self._closed and self._pool is not None:
                table.begin_reset(again)
                remaining[0] += self._pool.submit(again, build, handler)
            else:
                errors.append(error)  # envs marked lost by _on_worker_lost
            settle_one()

        def settle_one() -> None:
            remaining[0] -= 1
            if remaining[0] == 0 and not done.done():
                done.set_result(None)

        wanted = set(ids.tolist())
        remaining[0] = self._pool.submit(None if len(ids) == n else ids, build, handler)  # type: ignore[union-attr]
        await done
        if errors:
            for err in errors:
                self._reported(err)
            raise errors[0]
        obs = take(self._views.obs, slice(None))
        busy = np.flatnonzero((table.state == STEPPING) | (table.state == READY))  # left out by a reset_mask: a worker
        if busy.size:  # may be writing their rows, or they hold a result not yet received, which comes with recv()
            put_rows(obs, busy, create_empty_array(self._probe.observation_space, busy.size))
        if self._delivered is not None:
            put_rows(self._delivered, ids, take(obs, ids))
        return obs, batch_infos(n, sorted(infos, key=lambda r: r[0]))

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
        ids = None if env_ids is None else self._check_env_ids(env_ids)
        self._dispatch(actions, ids)

    def _dispatch(self, actions: Any, ids: np.ndarray | None) -> None:
        """Check and send actions to ``ids`` (None: every env); the one path of ``send`` and ``step``."""
        self._put_actions(actions, ids)
        self._send_put(ids)

    def _put_actions(self, actions: Any, ids: np.ndarray | None) -> None:
        """Check ``actions`` for ``ids`` (None: every env) and write them to the action buffer; raises
        before anything is sent (``InvalidActionError``, ``EnvStateError``)."""
        if ids is None:
            rows: Any = slice(None)
            acts = self._check_actions(actions, self.num_envs)
            table = self._table
            if not table.settled and np.count_nonzero(table.state):  # all idle (IDLE is 0) needs no further look
                self._require(rows, (IDLE,), "send to")
        else:
            rows = ids
            acts = self._check_actions(actions, len(ids))
            self._require(rows, (IDLE,), "send to")
        v = self._views
        if self._disabled:
            done = v.terminations[rows] | v.truncations[rows]
            if np.count_nonzero(done):
                raise EnvStateError(
                    f"envs {self._all[rows][done].tolist()} ended their episode and autoreset_mode is DISABLED: "
                    "reset them (options={'reset_mask': ...}) before stepping"
                )
        if self._flat_actions:
            self._write_flat_actions(rows, acts)
        else:
            put_rows(v.actions, rows, acts)
            if v.action_dtypes is not None:  # a Dict/Tuple with float leaves: each arrives in the caller's dtype
                v.action_dtypes[rows] = leaf_dtype_codes(self.single_action_space, acts)

    def _write_flat_actions(self, rows: Any, acts: np.ndarray) -> None:
        """Checked flat actions into their rows, with their dtype where the buffer is wider than the space (the env
        gets the caller's dtype: see :func:`~aiovec.spaces.action_buffer_space`)."""
        v = self._views
        v.actions[rows] = acts
        if v.action_dtypes is not None:
            v.action_dtypes[rows] = ord(acts.dtype.char)

    def _send_put(self, ids: np.ndarray | None) -> None:
        """Step ``ids`` (None: every env) with the actions :meth:`_put_actions` wrote."""
        table = self._table
        stepping, held = table.send(slice(None) if ids is None else ids)
        if held is not None:  # their worker was replaced while they were idle: they end truncated instead
            for i in held.tolist():
                self._write_truncation(i)
            table.truncate_restarted(held)
            self._notify()
            if not len(stepping):
                return
            ids = stepping
        self._pool.step(ids, self._on_step_reply)  # type: ignore[union-attr]

    def _step_in_turn(self) -> bool | None:
        """Step every env in this turn where one idle inline worker hosts them all (the hot path of
        cheap envs: no reply queue, no wake-up). None: it could not (nothing stepped); True: a clean
        batch, every env IDLE again (:meth:`EnvTable.stepped_in_turn`); False: a batch with errors
        or infos, accounted as a worker's reply (its envs READY or BROKEN, errors queued)."""
        table, pool = self._table, self._pool
        if pool.kind != "inline" or table.num_restarted or table.num_cut:  # type: ignore[union-attr]
            return None
        done = pool.step_all_in_turn()  # type: ignore[union-attr]
        if done is None:
            return None
        infos, errors, wall_s = done
        v = self._views
        if infos is None and errors is None:
            table.stepped_in_turn(v.terminations, v.truncations, wall_s)
            if pool.pending_moves:  # type: ignore[union-attr]
                pool.try_moves()  # type: ignore[union-attr]
            return True
        table.send(slice(None), ran_s=wall_s)
        self._stepped(self._all, infos, errors)
        return False

    def _control_ended(self, task: asyncio.Task) -> None:
        """The control loop stopped before close(): a controller that raised, or a resize that failed (a new worker
        that could not start). Adaptation ends there, at the current configuration; the next ``step()``/``recv()``
        raises the error once, on entry (nothing in flight is disturbed), so it is seen rather than lost in a task
        nobody awaits."""
        if task.cancelled() or self._closed:
            return
        self._control_error = task.exception()

    def _raise_control_error(self) -> None:
        err, self._control_error = self._control_error, None
        raise err  # type: ignore[misc]

    def _requeue_in_turn(self, batch: int) -> None:
        """A ``step()`` cancelled at its checkpoint after stepping in turn: the envs have moved on, so the batch
        waits for ``recv()`` as a worker's results would (READY, still in the buffers), unless another task has
        stepped or reset them since (then the buffers hold newer results, and the cancelled caller's are gone)."""
        table = self._table
        if self._closed or not table.settled or table.in_turn_batches != batch:
            return
        table.send(slice(None))
        self._stepped(self._all, None, None)

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
        if self._control_error is not None:
            self._raise_control_error()
        deadline = None if timeout is None else asyncio.get_running_loop().time() + _seconds(timeout, "timeout")
        table, yielded = self._table, False
        while True:
            if self._errors:
                raise self._errors.popleft()
            outstanding = table.in_flight + table.num_ready
            if outstanding == 0:
                raise EnvStateError("recv() with nothing in flight: send() actions first")
            need = min(k, outstanding)
            if table.num_ready >= need:
                if not yielded:  # a checkpoint even when results are waiting: other tasks get their turn
                    await checkpoint()
                    yielded = True
                    continue
                return self._collect(table.oldest_ready(need))
            await self._wait(deadline)
            yielded = True

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
        if timeout is not None:
            _seconds(timeout, "timeout")
        out, table = [], self._table
        while table.in_flight or table.num_ready:
            out.append(await self.recv(table.in_flight + table.num_ready, timeout))
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
        t0 = time.perf_counter()
        try:
            pool, table = self._pool, self._table
            if pool is None or self._closed:
                self._check_started()
            if table.in_flight or table.num_ready:
                raise EnvStateError("step() needs every env idle, but some have steps in flight or unreceived results: recv()/drain() them first")
            if self._control_error is not None:
                self._raise_control_error()
            if table.settled and self._flat_actions and not self._disabled:  # _put_actions' case of idle envs, flat actions
                self._write_flat_actions(slice(None), self._check_actions(actions, self.num_envs))
            else:
                self._put_actions(actions, None)
            stepped = self._step_in_turn()
            if stepped is None:
                self._send_put(None)
            elif stepped:  # clean, every env idle again: copy the results before another task may send
                v = self._views
                if self._flat_obs and self._delivered is None:  # _step_result's common case, one call less a batch
                    result = v.obs.copy(), v.rewards.copy(), v.terminations.copy(), v.truncations.copy(), {}
                else:
                    result = self._step_result({})
                batch = table.in_turn_batches
                try:
                    await checkpoint()  # stepped at once (inline): still a checkpoint for the other tasks
                except asyncio.CancelledError:
                    self._requeue_in_turn(batch)
                    raise
                return result
            if not table.in_flight:
                await checkpoint()  # stepped at once (inline): still a checkpoint for the other tasks
            while table.in_flight:
                await self._wait(None, batch=True)
            if self._errors:
                raise self._errors.popleft()
            rows_info, parts = table.collect(slice(None))
            return self._step_result(batch_infos(self.num_envs, rows_info, parts) if rows_info or parts else {})
        finally:
            self._in_step_s += time.perf_counter() - t0

    def _step_result(self, infos: dict[str, Any]) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """``step()``'s 5-tuple for every env: copies of the result buffers, so they stay the caller's."""
        v = self._views
        obs = v.obs.copy() if self._flat_obs else take(v.obs, slice(None))
        if self._delivered is not None:
            put_rows(self._delivered, slice(None), obs)
        return obs, v.rewards.copy(), v.terminations.copy(), v.truncations.copy(), infos

    # -- attributes and methods ---------------------------------------------------------
    async def call(self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``env.name(*args, **kwargs)`` (or read the attribute) in each env; results in env order.

        ``env_ids`` picks a subset. Envs may be stepping meanwhile; an exception in one env
        is raised as ``EnvError`` naming it (``EnvAttributeError``, also an ``AttributeError``, for an
        attribute the env lacks, as gymnasium's vector envs raise it).

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
        await self._call("set", name, dict(zip(ids.tolist(), values, strict=True)), ids)

    async def _call(self, kind: str, name: str, payload: Any, env_ids: Any) -> tuple[Any, ...]:
        await self.start()
        if not isinstance(name, str):
            raise ConfigError(f"attribute name must be a str, got {name!r}")
        ids = self._all if env_ids is None else self._check_env_ids(env_ids)
        self._require(ids, (IDLE, STEPPING, READY, BROKEN), f"{kind} on")

        def build(g: list[int]) -> P.Call:
            return P.Call(tuple(g), kind, name, [payload[i] for i in g] if kind == "set" else payload)

        try:
            results, errors = await self._pool.request(ids.tolist(), build)  # type: ignore[union-attr]
        except WorkerCrashedError as err:
            self._reported(err)  # raised here: not again by the next step()/recv()
            raise
        if errors:
            raise errors[0]
        return tuple(results.get(i) for i in ids.tolist())

    # -- resizing -----------------------------------------------------------------------
    async def resize(self, num_workers: int, placement: str | None = None) -> None:
        """Change the number of worker processes (or move the envs inline) while envs keep stepping.

        New workers start at once; each env moves only when it is idle at an episode
        boundary, carrying its ``np_random`` and its wrappers' attributes (when they pickle),
        so no transition is lost, duplicated or reordered and every trajectory is the one it
        would have been without the move.
        Workers left without envs exit. ``num_workers`` tells the current count,
        ``pending_moves`` how many envs still wait for their episode to end.
        ``placement="inline"`` moves every env into this process (``num_workers`` is then 1: the
        inline worker), ``"process"`` into ``num_workers`` processes, ``"hybrid"`` one shard into
        this process and the others into ``num_workers - 1`` processes; default: where they are
        (``ConfigError`` where the count does not fit there: inline is 1 worker, hybrid at least 2).
        With ``num_workers="auto"`` a call hands the worker count and placement to the caller: the
        controller keeps them from then on and tunes only the threads per process.

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
        n = _positive_int(num_workers, "num_workers")
        if placement not in (None, "inline", "process", "hybrid"):
            raise ConfigError(f"placement must be 'inline', 'process' or 'hybrid', got {placement!r}")
        if placement == "hybrid" and n < 2:
            raise ConfigError(f"placement='hybrid' counts this process as one of num_workers, so it needs num_workers >= 2, got {n}")
        await self.start()
        kind = placement or self._pool.kind  # type: ignore[union-attr]
        if placement is None and (kind == "inline" and n != 1 or kind == "hybrid" and n < 2):
            raise ConfigError(f"the envs step {kind} ({'this process' if kind == 'inline' else 'this process and worker processes'}): "
                              f"resize({n}) needs a placement that fits it, 'process' ({n} worker processes)"
                              f"{f' or hybrid (this process and {n - 1})' if n >= 2 else ' or inline'}")
        if self._control is not None:
            self._control.hand_over_workers()
        await self._resize(n, placement)

    async def _resize(self, n: int, placement: str | None, env_threads: int | None = None) -> None:
        """:meth:`resize` without the argument checks and without taking the knob from the controller (its own moves);
        ``env_threads``: threads per process worker from now on too (one change: new workers start with them, and
        workers that still hold envs bound elsewhere keep threads for those)."""
        pool = self._pool
        if pool is None:
            raise ClosedError("the vector env is closed")
        if placement in ("inline", "hybrid") and "inline" not in pool.backends:
            raise ConfigError("this vector env cannot step envs inline (placement='process', step_timeout or a Ray backend)")
        try:
            await pool.resize(n, placement, env_threads)
        finally:
            if pool is self._pool:
                self._tune_spin()

    def _tune_spin(self, foreign_cpus: float = 0.0) -> None:
        """With ``spin="auto"``: spin only while the workers leave the parent a CPU of its own, of the CPUs that other
        processes leave this one (``foreign_cpus``: what they kept busy in the last control interval). Beside a
        busy process on one of 2 CPUs, a spinning worker took the CPU that this process needed: hybrid CartPole x16
        stepped 42-46k steps/s spinning, 60-63k not."""
        pool = self._pool
        if self._spin_auto and pool is not None and not pool.closing:
            free = max(1, available_cpus() - int(foreign_cpus + 0.5))
            pool.tune(spin_for(pool.target_workers - (pool.kind == "hybrid"), free))

    async def set_env_threads(self, env_threads: int) -> None:
        """Threads per worker process that step its envs concurrently, changed while running.

        Instant (no env moves): each worker switches at its next command. Worth it for envs that
        wait with the GIL released; a worker's CPU time then counts all its threads. Workers
        confirm the setting in ``stats()["workers"][i]["env_threads"]``.

        >>> async def main():
        ...     async with aiovec.make("aiovec/Sleep-v0", 4, num_workers=1, wait_ms=1.0) as venv:
        ...         await venv.reset(seed=0)
        ...         await venv.set_env_threads(4)
        ...         await venv.step(np.zeros(4, dtype=np.int64))
        ...         return venv.env_threads, [w["env_threads"] for w in venv.stats()["workers"]]
        >>> aiovec.run(main())
        (4, [4])
        """
        k = _positive_int(env_threads, "env_threads")
        await self.start()
        self._pool.set_threads(k)  # type: ignore[union-attr]

    @property
    def pending_moves(self) -> int:
        """Envs still waiting for an episode boundary to move to their new worker."""
        return self._pool.pending_moves if self._pool is not None else 0

    @property
    def control_history(self) -> list[dict[str, Any]]:
        """One entry per control interval: time, workers, steps/s, latency, decision and reason."""
        return self._control.history if self._control is not None else []

    def _busy_time(self) -> float:
        return self._table.busy_time()

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
        snap.update(num_envs=self.num_envs, num_workers=self.num_workers, in_flight=self._table.in_flight, ready=self._table.num_ready,
                    placement=self.placement,
                    restarts=self._pool.restarts if self._pool is not None else 0,
                    moves=self._pool.moves if self._pool is not None else 0,
                    recycled=self._pool.recycled if self._pool is not None else 0)
        return snap

    # -- internals ----------------------------------------------------------------------
    def _on_step_reply(self, wid: int, reply: Any, error: BaseException | None) -> None:
        if error is not None:
            return  # the worker died; _on_worker_lost / _on_worker_restarted account for its envs
        self._stepped(reply.env_ids, reply.payload, reply.errors)

    def _on_clean_step(self, ids: np.ndarray, infos: P.InfoRecords | None) -> None:
        """The hot path: a worker stepped ``ids`` without errors (no reply object was built)."""
        self._stepped(ids, infos, None)

    def _stepped(self, ids: np.ndarray, infos: Any, errors: list | None) -> None:
        """A worker finished stepping ``ids``: into the table, then the moves and waiters it may free."""
        v = self._views
        if self._table.num_cut:
            infos = self._end_cut_episodes(ids, infos, errors)
        if self._table.step_done(ids, v.terminations, v.truncations, infos, errors):
            self._errors.extend(EnvError(*e) for e in errors)  # type: ignore[union-attr]
        pool = self._pool
        if pool is not None and pool.pending_moves:
            pool.try_moves()
        if self._waiters:
            self._notify()

    def _end_cut_episodes(self, ids: np.ndarray, infos: Any, errors: list | None) -> Any:
        """Same-step autoreset: the rows of envs whose worker died (flagged ``cut``), each a reset by the new worker,
        become the truncation of the episode the death cut, as a same-step row that ends an episode is: the new
        episode's first observation in ``obs``, the last one delivered in ``infos["final_obs"]``, no reward.
        Returns ``infos`` as one dict (or None) per id where it had to change."""
        cut = self._table.take_cut(ids)
        if errors:  # a reset that raised: that env is broken, and its next reset ends the cut episode
            cut = cut[~np.isin(cut, [e[0] for e in errors])]
        if not len(cut):
            return infos
        v = self._views
        per_id = infos.as_dicts() if isinstance(infos, P.InfoRecords) else list(infos or [None] * len(ids))
        where = {i: k for k, i in enumerate(ids.tolist())}
        for i in cut.tolist():
            v.rewards[i] = 0.0
            v.terminations[i] = False
            v.truncations[i] = True
            final = get_row(self._delivered, i) if self._delivered is not None else None
            k = where[i]
            per_id[k] = {"final_obs": final, "final_info": {}, "worker_restarted": True, **(per_id[k] or {})}
        return per_id

    def _restart_state(self, i: int) -> dict:
        """State for env ``i`` on its new worker: episode over, generator derived from its last seed."""
        self._restart_counts[i] += 1
        entropy = self._seeds[i] if self._seeds[i] is not None else np.random.SeedSequence().entropy
        gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy, spawn_key=(i, self._restart_counts[i]))))
        return {"kind": "ended", "np_random": gen, "needs_reset": self.autoreset_mode != AutoresetMode.DISABLED}

    def _write_truncation(self, i: int) -> None:
        """The result row of an episode its worker's death cut short: truncated, no reward, last obs kept.

        A worker that died mid-step may have written part of a new observation into the env's row,
        so the last delivered one is put back from the copy kept for this (``max_restarts > 0`` only).
        """
        v = self._views
        if self._delivered is not None:
            put_row(v.obs, i, get_row(self._delivered, i))
        v.rewards[i] = 0.0
        v.terminations[i] = False
        v.truncations[i] = True  # obs stays the last one delivered: do not bootstrap across it

    def _on_worker_restarted(self, err: WorkerCrashedError) -> None:
        mode = self.autoreset_mode
        truncated, resent = self._table.worker_restarted(list(err.env_ids), reset_rows_follow=mode == AutoresetMode.NEXT_STEP,
                                                         cut_rows_follow=mode == AutoresetMode.SAME_STEP)
        for i in truncated:
            self._write_truncation(i)
        if resent:  # their step was a reset row: the new worker gives it (restart_state: needs_reset)
            self._pool.step(np.array(resent, dtype=np.int64), self._on_step_reply)  # type: ignore[union-attr]
        self._notify()

    def _on_worker_lost(self, err: WorkerCrashedError) -> None:
        self._table.worker_lost(list(err.env_ids), err)
        if not self._closed:
            self._errors.append(err)
        self._notify()

    def _collect(self, ids: np.ndarray) -> StepResult:
        v = self._views
        rows_info, parts = self._table.collect(ids)
        infos = batch_infos(len(ids), rows_info, parts) if rows_info or parts else {}
        obs = take(v.obs, ids)
        if self._delivered is not None:
            put_rows(self._delivered, ids, obs)
        return StepResult(obs, v.rewards[ids], v.terminations[ids], v.truncations[ids], infos, ids)

    async def _wait(self, deadline: float | None, batch: bool = False) -> None:
        """Until something changes (``batch``: until no step is in flight), an error, a close or the deadline.

        A reply due within a fraction of a millisecond is polled for (``WorkerPool.poll_replies``), then
        the loop gets its turn: still a checkpoint."""
        loop = asyncio.get_running_loop()
        pool = self._pool
        if pool is not None and pool.poll_replies():
            await checkpoint()
        else:
            fut = loop.create_future()
            self._waiters.append((fut, batch))
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
            raise StepTimeoutError(f"deadline expired with {self._table.in_flight} envs still in flight; "
                                   "their results stay queued for a later recv()")

    def _notify(self) -> None:
        """Wake the waiters whose condition may hold now (one wake-up of ``step()`` per batch)."""
        if not self._waiters:
            return
        settled = not self._table.in_flight or bool(self._errors) or self._closed
        keep = []
        for fut, batch in self._waiters:
            if batch and not settled:
                keep.append((fut, batch))
            elif not fut.done():
                fut.set_result(None)
        self._waiters = keep


    def _require(self, ids: Any, allowed: tuple[int, ...], what: str) -> None:
        """The table's check; a lost env raises its worker's crash, reported then and not again by recv."""
        try:
            self._table.require(ids, allowed, what)
        except WorkerCrashedError as err:
            self._reported(err)
            raise

    def _reported(self, err: BaseException) -> None:
        """``err`` is raised by the call at hand: not again by the next ``step()``/``recv()``."""
        if err in self._errors:
            self._errors.remove(err)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the vector env is closed")

    def _check_started(self) -> None:
        self._check_open()
        if self._pool is None:
            raise EnvStateError("the vector env is not started: use `async with`, `await venv.start()` or `await venv.reset()` first")

    def _check_env_ids(self, env_ids: Any) -> np.ndarray:
        """The ids as a new int64 array (the caller may refill its own at once), or ``EnvStateError``."""
        try:
            ids = np.asarray(env_ids)
        except ValueError:  # ragged
            ids = np.empty(0)
        if ids.ndim == 0:
            ids = ids.reshape(1)
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise EnvStateError(f"env_ids must be a non-empty 1-d sequence of ints, got {env_ids!r}")
        ids = ids.astype(np.int64)  # a copy: the table and the pending commands keep these ids until the results arrive
        if ids.min() < 0 or ids.max() >= self.num_envs:
            raise EnvStateError(f"env_ids {ids.tolist()} out of range: this vector env has envs 0..{self.num_envs - 1}")
        if np.unique(ids).size != ids.size:
            raise EnvStateError(f"env_ids {ids.tolist()} contain duplicates")
        return ids


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _release(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not value >= 0:
        raise ConfigError(f"{name} must be a number of seconds >= 0 or None, got {value!r}")
    return float(value)


def _is_seed(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and x >= 0


def _bad_seed(seed: Any) -> ConfigError:
    return ConfigError(f"seed must be None, an int >= 0 or one such seed per env, got {seed!r}")


def _normalize_seeds(seed: Any, n: int) -> list[int | None]:
    """One seed (an int >= 0, as gymnasium's ``reset`` takes it, or None) per env, or ``ConfigError``."""
    if seed is None:
        return [None] * n
    if _is_seed(seed):
        return [int(seed) + i for i in range(n)]
    if isinstance(seed, (str, bytes, dict, float, bool, np.bool_, np.floating)):
        raise _bad_seed(seed)
    try:
        seeds = list(seed)
    except TypeError:
        raise _bad_seed(seed) from None
    if len(seeds) != n:
        raise ConfigError(f"seed list has {len(seeds)} entries for {n} envs")
    for i, x in enumerate(seeds):
        if x is not None and not _is_seed(x):
            raise ConfigError(f"seed[{i}] must be None or an int >= 0, got {x!r}")
    return [None if x is None else int(x) for x in seeds]


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
                data = pickling.dumps(fn)
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


def _uncancel(task: asyncio.Task | None) -> bool:
    """Take back one cancellation of ``task``; whether none is left (Python < 3.11 cannot count: True)."""
    uncancel = getattr(task, "uncancel", None)
    return uncancel is None or uncancel() == 0


def _ignore_crash(err: WorkerCrashedError) -> None:
    """The end of a worker that a failed or cancelled start stops itself."""
