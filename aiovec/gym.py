"""``aiovec.VectorEnv``: a synchronous ``gymnasium.vector.VectorEnv`` facade over :class:`AsyncVecEnv`.

The async vector env runs on a private event loop in a background thread (uvloop
where installed), so the facade works from plain scripts, from threads without a
loop, and from Jupyter cells whose loop is already running. ``close()`` stops the
workers, the loop and its thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import gymnasium as gym

from . import ctrlc, exits
from .errors import ClosedError, EnvError, StepTimeoutError, WorkerCrashedError
from .loop import has_uvloop
from .vecenv import AsyncVecEnv


class VectorEnv(gym.vector.VectorEnv):
    """Drop-in for ``gymnasium.vector.AsyncVectorEnv(env_fns, ...)``; same options as :class:`AsyncVecEnv`.

    A ``gymnasium.vector.VectorEnv`` for synchronous code: gymnasium's vector wrappers work on top,
    and for the same seeds and actions the results equal ``SyncVectorEnv``'s. It runs the async
    env on a private event loop in a thread, so it also works in threads and in Jupyter cells.

    >>> fns = [lambda: gym.make("CartPole-v1")] * 4
    >>> envs = gym.wrappers.vector.RecordEpisodeStatistics(aiovec.VectorEnv(fns, num_workers=2))
    >>> ref = gym.vector.SyncVectorEnv(fns)
    >>> obs, infos = envs.reset(seed=0)
    >>> ref_obs, _ = ref.reset(seed=0)
    >>> for t in range(100):
    ...     actions = np.array([t % 2, 0, 1, (t // 3) % 2])
    ...     obs, rewards, terms, truncs, infos = envs.step(actions)
    ...     ref_obs, *_ = ref.step(actions)
    ...     assert (obs == ref_obs).all()
    >>> envs.num_envs, envs.metadata["autoreset_mode"].name, "episode" in infos or t
    (4, 'NEXT_STEP', ...)
    >>> envs.close(); ref.close()
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], **options: Any) -> None:
        exits.refuse_main_reimport()
        self._init_with(AsyncVecEnv(env_fns, **options))

    @classmethod
    def wrap(cls, venv: AsyncVecEnv) -> VectorEnv:
        """A facade over an :class:`AsyncVecEnv` that has not been started yet."""
        self = cls.__new__(cls)
        self._init_with(venv)
        return self

    def _init_with(self, venv: AsyncVecEnv) -> None:
        exits.refuse_main_reimport()
        self._venv = venv
        self._pending: tuple[str, concurrent.futures.Future[Any]] | None = None  # an ``*_async`` call not yet waited for
        if has_uvloop():
            import uvloop

            self._loop = uvloop.new_event_loop()
        else:
            self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=_serve, args=(self._loop,), name="aiovec-loop", daemon=True)
        self._thread.start()
        self.num_envs = venv.num_envs
        self.single_observation_space = venv.single_observation_space
        self.single_action_space = venv.single_action_space
        self.observation_space = venv.observation_space
        self.action_space = venv.action_space
        self.metadata = venv.metadata
        self.render_mode = venv.render_mode
        self.spec = venv.spec
        self.closed = False
        try:
            self._run(venv.start())
        except BaseException as exc:
            self._abandon()
            if exits.is_no_guard_failure(exc):
                raise exits.MainGuardMissing() from None
            raise
        exits.track(self)

    def _abandon(self) -> None:
        """After a failed (or interrupted) start: close what started, within the close grace period, then the loop."""
        self.closed = True
        try:
            self._shut(timeout=self._venv_close_bound())
        except BaseException:  # noqa: BLE001 - the start's own error is the one to report
            pass

    def _shut(self, timeout: float | None = None) -> ctrlc.Presses:
        """Close the async vector env on the facade's loop (waiting at most ``timeout`` s), then stop the loop.

        A Ctrl-C meanwhile (in the main thread) kills the workers at once (the close is cancelled, and a cancelled
        close kills) instead of raising inside the wait: that stopped the loop with the close half done, the
        workers' semaphores still held ("leaked semaphore objects" at exit). Returns the presses it took.
        """
        hurry = asyncio.Event()

        def on_press() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed already: nothing left to hurry
                self._loop.call_soon_threadsafe(hurry.set)

        with ctrlc.hurrying(on_press) as presses:
            try:
                if self._thread.is_alive():
                    asyncio.run_coroutine_threadsafe(_close_unless_hurried(self._venv, hurry), self._loop).result(timeout)
            finally:
                self._stop_loop()
        return presses

    def _venv_close_bound(self) -> float:
        return float(getattr(self._venv, "close_timeout", None) or 5.0) + 10.0

    def _submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Run ``coro`` on the facade's loop; refused (and closed) when the facade is closed or, as in
        ``AsyncVectorEnv``, an ``*_async`` call is still pending: one call at a time."""
        if self.closed:
            coro.close()
            raise ClosedError("the vector env is closed")
        if self._pending is not None:
            coro.close()
            pending = self._pending[0]
            raise gym.error.AlreadyPendingCallError(f"a call to `{pending}_async` is pending: `{pending}_wait` for it first", pending)
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _run(self, coro: Coroutine[Any, Any, Any], kind: str | None = None) -> Any:
        """Run ``coro`` on the loop and wait for it. A ``reset``/``step``/``call`` (``kind``) that the wait gives up
        on (Ctrl-C) goes on, as ``AsyncVectorEnv``'s does: its result waits for ``{kind}_wait``, nothing is lost."""
        fut = self._submit(coro)
        try:
            return fut.result()
        except BaseException:
            if kind is not None and not fut.done():
                self._pending = (kind, fut)
            raise

    @property
    def async_env(self) -> AsyncVecEnv:
        """The underlying :class:`AsyncVecEnv` (lives on the facade's loop thread)."""
        return self._venv

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset all envs, or those in ``options["reset_mask"]``; ``seed``: an int (env i gets seed + i) or one per env.

        >>> envs = aiovec.make_vec("CartPole-v1", 3, num_workers=1)
        >>> obs, infos = envs.reset(seed=[5, 6, 7])
        >>> again, _ = envs.reset(seed=[5, None, None], options={"reset_mask": np.array([True, False, False])})
        >>> obs.shape, bool((again[0] == obs[0]).all())
        ((3, 4), True)
        >>> envs.close()
        """
        return self._run(self._venv.reset(seed=seed, options=options), "reset")

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step every env; gymnasium's 5-tuple with rows in env order and autoreset per ``autoreset_mode``.

        >>> envs = aiovec.make_vec("CartPole-v1", 2, num_workers=1, autoreset_mode="SameStep")
        >>> _ = envs.reset(seed=0)
        >>> for _ in range(200):
        ...     obs, rewards, terms, truncs, infos = envs.step(np.zeros(2, dtype=np.int64))
        ...     if terms.any():
        ...         break
        >>> sorted(k for k in infos if not k.startswith("_"))     # SAME_STEP: the final obs is in infos
        ['final_info', 'final_obs']
        >>> envs.close()
        """
        return self._run(_step_whole(self._venv, actions), "step")

    def call(self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``env.name(*args, **kwargs)`` (or read the attribute) in each env, or in those in ``env_ids``.

        >>> envs = aiovec.make_vec("CartPole-v1", 3, num_workers=1)
        >>> envs.call("get_wrapper_attr", "gravity", env_ids=[2])
        (9.8,)
        >>> envs.close()
        """
        return self._run(self._venv.call(name, *args, env_ids=env_ids, **kwargs), "call")

    def get_attr(self, name: str, env_ids: Sequence[int] | None = None) -> tuple[Any, ...]:
        """Read attribute ``name`` of each env (or of those in ``env_ids``), through its wrappers.

        >>> envs = aiovec.make_vec("CartPole-v1", 2, num_workers=1)
        >>> [spec.id for spec in envs.get_attr("spec")]
        ['CartPole-v1', 'CartPole-v1']
        >>> envs.close()
        """
        return self._run(self._venv.get_attr(name, env_ids=env_ids))

    def set_attr(self, name: str, values: Any, env_ids: Sequence[int] | None = None) -> None:
        """Set attribute ``name`` on each env (or those in ``env_ids``): one value for all, or one per env.

        >>> envs = aiovec.make_vec("CartPole-v1", 3, num_workers=1)
        >>> envs.set_attr("gravity", 1.6, env_ids=[0, 2])
        >>> envs.get_attr("gravity")
        (1.6, 9.8, 1.6)
        >>> envs.close()
        """
        self._run(self._venv.set_attr(name, values, env_ids=env_ids))

    def render(self) -> tuple[Any, ...] | None:
        """Each env's ``render()`` output (envs made with a ``render_mode``), in env order.

        >>> envs = aiovec.make_vec("aiovec/Busy-v0", 2, num_workers=1, render_mode="rgb_array")  # CartPole's needs pygame
        >>> _ = envs.reset(seed=0)
        >>> [frame.shape for frame in envs.render()]
        [(8, 8, 3), (8, 8, 3)]
        >>> envs.close()
        """
        return self.call("render")

    @property
    def np_random_seed(self) -> tuple[Any, ...]:
        """Each env's ``np_random_seed`` (as ``AsyncVectorEnv`` reports it)."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[Any, ...]:
        """Each env's random number generator (copies: the envs live in their workers)."""
        return self.get_attr("np_random")

    # -- gymnasium AsyncVectorEnv's split calls: start now, collect later ---------------------
    def reset_async(self, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None) -> None:
        """Start :meth:`reset`; :meth:`reset_wait` returns its result (``AsyncVectorEnv``'s split call)."""
        self._start_call("reset", self._venv.reset(seed=seed, options=options))

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """The result of :meth:`reset_async`; raises ``multiprocessing.TimeoutError`` after ``timeout`` seconds
        (the call stays pending: wait again), ``NoAsyncCallError`` without a pending reset."""
        return self._wait_call("reset", timeout)

    def step_async(self, actions: Any) -> None:
        """Start :meth:`step`; :meth:`step_wait` returns its result. Bad actions are raised by ``step_wait``.

        >>> envs = aiovec.make_vec("CartPole-v1", 2, num_workers=1)
        >>> _ = envs.reset(seed=0)
        >>> envs.step_async(np.zeros(2, dtype=np.int64))
        >>> obs, rewards, terms, truncs, infos = envs.step_wait(timeout=30)
        >>> obs.shape
        (2, 4)
        >>> envs.close()
        """
        self._start_call("step", _step_whole(self._venv, actions))

    def step_wait(self, timeout: float | None = None) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """The result of :meth:`step_async` (see :meth:`reset_wait` for ``timeout``)."""
        return self._wait_call("step", timeout)

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Start :meth:`call`; :meth:`call_wait` returns its result."""
        self._start_call("call", self._venv.call(name, *args, **kwargs))

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """The result of :meth:`call_async` (see :meth:`reset_wait` for ``timeout``)."""
        return self._wait_call("call", timeout)

    def _start_call(self, kind: str, coro: Coroutine[Any, Any, Any]) -> None:
        self._pending = (kind, self._submit(coro))

    def _wait_call(self, kind: str, timeout: float | None) -> Any:
        if self.closed:
            raise ClosedError("the vector env is closed")
        if self._pending is None or self._pending[0] != kind:
            raise gym.error.NoAsyncCallError(f"calling `{kind}_wait` without any prior call to `{kind}_async`", kind)
        fut = self._pending[1]
        try:
            result = fut.result(timeout)
        except concurrent.futures.TimeoutError:
            raise multiprocessing.TimeoutError(f"the call to `{kind}_wait` has timed out after {timeout} second(s)") from None
        finally:
            if fut.done():
                self._pending = None
        return result

    def resize(self, num_workers: int, placement: str | None = None) -> None:
        """Change the worker count (and placement); envs move at episode boundaries, trajectories stay the same.

        See :meth:`AsyncVecEnv.resize` (inline envs need ``placement="process"`` or ``"hybrid"`` to grow).

        >>> envs = aiovec.make_vec("CartPole-v1", 4, num_workers=1)
        >>> _ = envs.reset(seed=0)
        >>> envs.resize(2)
        >>> envs.num_workers
        2
        >>> envs.close()
        """
        self._run(self._venv.resize(num_workers, placement))

    @property
    def num_workers(self) -> int:
        """Workers currently running, this process counted as one where it steps envs (see
        :attr:`AsyncVecEnv.num_workers`)."""
        return self._venv.num_workers

    def stats(self) -> dict[str, Any]:
        """:meth:`AsyncVecEnv.stats`: steps, steps/s, latency percentiles, per-worker figures.

        Read on the loop's thread, which updates them, so any thread may ask while envs step.
        """
        if self.closed or not self._thread.is_alive() or threading.current_thread() is self._thread:
            return self._venv.stats()
        return asyncio.run_coroutine_threadsafe(_stats(self._venv), self._loop).result()

    def close_extras(self, **kwargs: Any) -> None:
        """Stop the workers, then the private loop and its thread (``close()`` calls this).

        A Ctrl-C during it kills the workers at once; it is raised as ``KeyboardInterrupt`` once everything is
        closed, unless an exception is unwinding already (``close()`` in a ``finally`` block after a Ctrl-C).
        """
        try:
            presses = self._shut()
        finally:
            self.closed = True  # gymnasium sets it after close_extras returns: not when a Ctrl-C is raised here
            exits.untrack(self)
        if ctrlc.owe_interrupt(presses):
            raise KeyboardInterrupt()

    def _stop_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        if not self._loop.is_closed():
            self._loop.close()

    def __del__(self) -> None:
        if getattr(self, "closed", True):
            return
        try:
            if threading.current_thread() is self._thread:
                self._close_from_loop_thread()
            else:
                self.close()
        except BaseException:  # noqa: BLE001 - raised in __del__, it would only be printed as ignored
            pass

    def _close_from_loop_thread(self) -> None:
        """Collected on its own loop's thread (the garbage collector breaking a reference cycle runs wherever an
        allocation triggers it, and that thread allocates all the time): waiting there for the loop would wait
        forever. The close runs as a task of the loop instead, which then stops, and its thread closes it."""
        self.closed = True
        loop, venv = self._loop, self._venv

        async def close_then_stop() -> None:
            try:
                await venv.close()
            finally:
                loop.stop()

        loop.create_task(close_then_stop())


async def _close_unless_hurried(venv: AsyncVecEnv, hurry: asyncio.Event) -> None:
    """``venv.close()``, then the end of every other task on the facade's loop (a start, step or call the caller
    stopped waiting for on Ctrl-C: left pending, it was destroyed with the loop, its clean-up cut short at exit).
    Once ``hurry`` is set, whatever still runs is cancelled (a cancelled close kills the workers) and awaited."""
    closing = asyncio.ensure_future(venv.close())
    await _finish({closing}, hurry)
    others = {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}
    for task in others:
        task.cancel()
    await _finish(others, hurry)
    if not closing.cancelled():
        closing.result()


async def _finish(tasks: set[asyncio.Future[Any]], hurry: asyncio.Event) -> None:
    """Wait until ``tasks`` are done; if ``hurry`` is set first, cancel those still running and wait for them."""
    pending = {t for t in tasks if not t.done()}
    if not pending:
        return
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        while pending and not hurried.done():
            _, pending = await asyncio.wait(pending | {hurried}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(hurried)
    finally:
        hurried.cancel()
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)


async def _stats(venv: AsyncVecEnv) -> dict[str, Any]:
    return venv.stats()


async def _step_whole(venv: AsyncVecEnv, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
    """Lock-step for a caller that cannot ``recv()``: where an env fails, the rest of the batch is discarded too.

    The async API keeps the other envs' results for ``recv()``; a synchronous caller has no way to take them,
    and they would refuse the ``reset()`` that must follow (as one may follow ``SyncVectorEnv``'s error).
    Further errors of the same batch are added to the one raised as notes.
    """
    try:
        return await venv.step(actions)
    except (EnvError, WorkerCrashedError, StepTimeoutError) as exc:
        while not venv.closed:
            try:
                await venv.drain()
                break
            except (EnvError, WorkerCrashedError, StepTimeoutError) as more:
                exc.add_note(f"in the same batch: {type(more).__name__}: {more}")
        raise


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The facade's loop thread: run the loop until stopped; a loop stopped from within (see
    ``VectorEnv._close_from_loop_thread``) is closed here, since no other thread will."""
    loop.run_forever()
    if not loop.is_closed():
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        if not pending:
            loop.close()


def make_vec(env_id: str, num_envs: int, **kwargs: Any) -> VectorEnv:
    """``aiovec.make(...)`` behind the synchronous gymnasium ``VectorEnv`` API.

    The counterpart of ``gymnasium.make_vec``: options :class:`AsyncVecEnv` knows configure the
    vector env, the rest go to ``gymnasium.make``.

    >>> envs = aiovec.make_vec("Pendulum-v1", 4, num_workers=2, g=9.81)
    >>> obs, infos = envs.reset(seed=1)
    >>> obs, rewards, terms, truncs, infos = envs.step(np.zeros((4, 1), dtype=np.float32))
    >>> obs.shape, rewards.dtype, envs.num_workers
    ((4, 3), dtype('float64'), 2)
    >>> envs.close()
    """
    from .make import make

    exits.refuse_main_reimport()
    return VectorEnv.wrap(make(env_id, num_envs, **kwargs))
