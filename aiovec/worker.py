"""The code that runs inside a worker: hosts a shard of envs and steps them.

:class:`EnvHost` executes protocol commands against its envs and writes results
into row-per-env buffers; it knows nothing of transports, so a process or an
actor can drive it. :func:`serve` is the process transport: a plain blocking
loop on one pipe. Nothing here imports asyncio.
"""

from __future__ import annotations

import bisect
import copy
import inspect
import os
import pickle
import select
import signal
import struct
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from . import protocol as P
from .spaces import dtype_of_code, row_reader, row_writer

_SCHEDSTAT = "/proc/self/schedstat"

CPU_SAMPLE = 8
"""Whole steps per read of the CPU clock (:meth:`EnvHost.step_clocked`) where steps are short: the controller
sums CPU over intervals of thousands of them, so a sampled share of the wall time serves as well."""

CPU_ALWAYS_S = 1e-3
"""After a step that took longer, the clock is read every time: its cost (~1 us) is then negligible, and a
change of the env's cost shows in the very next interval even where an interval holds few steps."""


class _RunQueueClock:
    """Seconds this thread spent runnable but waiting for a CPU (Linux schedstat)."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open(_SCHEDSTAT, os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> float:
        if self._fd is None:
            return 0.0
        return int(os.pread(self._fd, 64, 0).split()[1]) * 1e-9

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Slot:
    __slots__ = ("env", "needs_reset", "done", "steps", "was_reset", "pre_reset_rng", "pre_reset_emulator", "reset_args")

    def __init__(self, env: Any) -> None:
        self.env = env
        self.needs_reset = False  # NEXT_STEP: the next step call resets instead
        self.done = False  # last transition ended the episode
        self.steps = 0  # steps since the last reset
        self.was_reset = False  # never reset yet: its state is fresh
        self.pre_reset_rng: Any = None  # np_random as it was just before the last reset
        self.pre_reset_emulator: Any = None  # the same for an emulator's own state (see _emulator_state), if any
        self.reset_args: tuple[Any, Any] = (None, None)  # (seed, options) of the last reset

    def reset(self, seed: Any = None, options: Any = None, replayable: bool = True) -> tuple[Any, dict]:
        """Reset, remembering enough to replay this reset elsewhere (see ``export``). A next-step
        autoreset is not ``replayable``: its env is never at an episode boundary before its next step
        ends one, so it only moves as ``"ended"`` (this saves a generator snapshot per episode)."""
        self.pre_reset_rng = _snapshot(self.env.unwrapped.np_random) if replayable else None
        # A seeded reset re-seeds an emulator too: only an unseeded one continues from the state it was in.
        self.pre_reset_emulator = _emulator_state(self.env) if replayable and seed is None else None
        self.reset_args = (seed, options)
        obs, info = self.env.reset(seed=seed, options=options)
        self.steps = 0
        self.was_reset = True
        self.needs_reset = self.done = False
        return obs, info

    def export(self) -> dict[str, Any]:
        """Portable state at an episode boundary; an env mid-episode cannot move.

        Besides the generator it carries the wrappers' own attributes (a normalisation's running
        statistics, counters), when they pickle, and an emulator's state where the env has one that its
        next episodes depend on (:func:`_emulator_state`); the env under the wrappers is rebuilt by its factory.
        """
        if not self.was_reset:
            return {"kind": "fresh"}
        if self.done:  # episode over, next call resets: the generators (np_random, an emulator's) are what matter
            state = {"kind": "ended", "np_random": self.env.unwrapped.np_random, "needs_reset": self.needs_reset,
                     "emulator": _emulator_state(self.env)}
        elif self.steps == 0:  # just reset: replay that reset from the generator it started with
            if self.pre_reset_rng is None:
                raise RuntimeError("env was just reset by a next-step autoreset; it can only move at the end of its episode")
            state = {"kind": "replay", "np_random": _restore(self.pre_reset_rng), "reset_args": self.reset_args,
                     "emulator": self.pre_reset_emulator}
        else:
            raise RuntimeError(f"env is {self.steps} steps into an episode; it can only move at an episode boundary")
        state["wrappers"] = _wrapper_state(self.env)
        return state

    def restore(self, state: dict[str, Any]) -> None:
        kind = state["kind"]
        if kind == "ended":
            self.env.unwrapped.np_random = state["np_random"]
            _restore_emulator(self.env, state.get("emulator"))
            self.done, self.needs_reset, self.steps, self.was_reset = True, state["needs_reset"], 1, True
        elif kind == "replay":
            self.env.unwrapped.np_random = state["np_random"]
            _restore_emulator(self.env, state.get("emulator"))
            self.reset(*state["reset_args"])
        # after a replayed reset: the wrappers' state at export already counted that reset once
        _restore_wrappers(self.env, state.get("wrappers"))


def _emulator_state(env: Any) -> Any:
    """State outside ``np_random`` that an env's next episodes depend on, where aiovec knows it; else None.

    An Atari env (ale-py) keeps the emulator's own random generator (sticky actions, the noise of ``reset``), which an
    unseeded ``reset()`` continues from: rebuilt elsewhere, a moved Breakout took other paths from its next episode
    on. ``clone_state(include_rng=True)`` (~60 us, ~14 KB) carries it and ``restore_state`` puts it back."""
    unwrapped = env.unwrapped
    if type(unwrapped).__module__.startswith("ale_py"):
        return unwrapped.clone_state(include_rng=True)
    return None


def _restore_emulator(env: Any, state: Any) -> None:
    """Put back what :func:`_emulator_state` took (None: nothing to put back)."""
    if state is not None:
        env.unwrapped.restore_state(state)


def _wrapper_state(env: Any) -> bytes | None:
    """Each wrapper's attributes but its inner env, outermost first, pickled; None if one does not pickle
    (a lambda, a window): then the wrappers start fresh on the new worker, as before this existed."""
    chain = []
    while isinstance(env, gym.Wrapper):
        chain.append((type(env), {k: v for k, v in vars(env).items() if k != "env"}))
        env = env.env
    try:
        return pickle.dumps(chain, pickle.HIGHEST_PROTOCOL)
    except Exception:
        return None


def _restore_wrappers(env: Any, blob: bytes | None) -> None:
    """Put back what :func:`_wrapper_state` saved, if the rebuilt env has the same wrappers in the same order."""
    if blob is None:
        return
    chain = pickle.loads(blob)
    wrappers = []
    while isinstance(env, gym.Wrapper):
        wrappers.append(env)
        env = env.env
    if [type(w) for w in wrappers] != [kind for kind, _ in chain]:
        return
    for wrapper, (_, attrs) in zip(wrappers, chain, strict=True):
        _set_attributes(wrapper, attrs)


def _set_attributes(obj: Any, attrs: dict[str, Any]) -> None:
    """Set instance attributes as ``vars(obj).update(attrs)`` would, without touching ``obj.__dict__``.

    On CPython 3.11+ reading an instance's ``__dict__`` materialises it, and every later attribute read of
    that object takes a slower path: a CartPole whose wrappers were restored that way stepped ~3% slower
    for the rest of its life (7.0 against 6.8 us a step), in every worker it moved to.
    """
    cls = type(obj)
    for name, value in attrs.items():
        if inspect.isdatadescriptor(inspect.getattr_static(cls, name, None)):  # the instance entry hides behind one
            vars(obj)[name] = value
        else:
            object.__setattr__(obj, name, value)


def _snapshot(rng: Any) -> Any:
    """A cheap copy of a generator's state (a deepcopy of the Generator costs ~100x more)."""
    if isinstance(rng, np.random.Generator):
        bits = rng.bit_generator
        return (type(bits), bits.state)
    return copy.deepcopy(rng)


def _restore(snapshot: Any) -> Any:
    if isinstance(snapshot, tuple) and len(snapshot) == 2 and isinstance(snapshot[0], type):
        bits = snapshot[0]()
        bits.state = snapshot[1]
        return np.random.Generator(bits)
    return snapshot


class EnvHost:
    """Hosts envs by global env id and executes commands on them.

    ``views`` are row-per-env buffers (shared memory, or the parent's own arrays for an
    inline worker); the host writes only the rows of the envs it hosts.
    """

    def __init__(self, views: Any, autoreset_mode: AutoresetMode, obs_space: Any, action_space: Any,
                 env_threads: int = 1, check_obs: bool = False, measure_runq: bool = False) -> None:
        self.check_obs = check_obs  # validate every observation against the declared space
        self.views = views
        self.mode = autoreset_mode
        self.obs_space = obs_space
        self.action_space = action_space
        self.slots: dict[int, _Slot] = {}
        self.shard: list[int] = []  # hosted env ids, sorted: what STEP_SHARD steps
        self._runq = _RunQueueClock()
        self.measure_runq = measure_runq  # read schedstat per command (only while a controller needs it)
        self._threads: ThreadPoolExecutor | None = None
        self.env_threads = 1
        self._cpu_clock = time.thread_time
        self._timed, self._cpu_share, self._last_wall = 0, 1.0, 0.0  # step_clocked's calls, its CPU / wall at the last sample
        self._runq_share = 0.0  # run-queue wait / wall at step_timed's last sample
        self.set_threads(env_threads)
        # Flat spaces (one array per buffer) skip the generic row helpers on the hot path.
        flat_act = isinstance(views.actions, np.ndarray)
        self._scalar_actions = flat_act and views.actions.ndim == 1
        self._get_action = (_flat_action(views.actions, views.action_dtypes) if flat_act
                            else row_reader(views.actions, action_space, views.action_dtypes))
        self._put_obs = row_writer(views.obs)  # an env's value of another shape is its error, never broadcast
        self._flat_obs = isinstance(views.obs, np.ndarray)
        self._obs_shape = views.obs.shape[1:] if self._flat_obs else None

    def set_threads(self, env_threads: int) -> None:
        """Step a command's envs on ``env_threads`` threads (for envs that wait with the GIL released).

        The calling thread is one of them (:meth:`step` keeps it busy), so the pool has ``env_threads - 1``.
        With threads, CPU time is counted for the whole process (all its threads), not this thread.
        """
        env_threads = max(1, int(env_threads))
        if env_threads == self.env_threads and (self._threads is not None) == (env_threads > 1):
            return
        helpers = ThreadPoolExecutor(env_threads - 1, thread_name_prefix="aiovec-env") if env_threads > 1 else None
        old, self._threads = self._threads, helpers
        self.env_threads = env_threads
        if old is not None:
            old.shutdown(wait=True)
        self._cpu_clock = time.process_time if self._threads is not None else time.thread_time
        self._timed = 0  # the next step samples the new clock

    # -- commands -------------------------------------------------------------------
    def handle(self, msg: Any) -> P.Reply:
        """Execute one named command and return its :class:`~aiovec.protocol.Reply`."""
        op = getattr(msg, "op", None)
        c0, w0 = self._cpu_clock(), time.perf_counter()
        r0 = self._runq() if self.measure_runq else 0.0
        errors: list[P.ErrorInfo] = []
        ids = getattr(msg, "env_ids", ())
        if op == P.STEP:
            payload, errs = self.step(msg.env_ids)
            errors = errs or errors
        elif op == P.RESET:
            payload = self._reset(msg.env_ids, msg.seeds, msg.options, errors)
        elif op == P.CALL:
            payload = self._call(msg.env_ids, msg.kind, msg.name, msg.payload, errors)
        elif op == P.ADD:
            ids, payload = (msg.env_id,), self._add(msg.env_id, msg.factory, msg.state, errors)
        elif op == P.REMOVE:
            payload = self._remove(msg.env_ids, errors)
        elif op == P.CLOSE:
            ids, payload = tuple(self.slots), self.close()
        elif op == P.TUNE:
            payload = self.tune(msg.options)
        else:
            raise ValueError(f"unknown command {msg!r:.100}")
        timing = P.Timing(self._cpu_clock() - c0, time.perf_counter() - w0, self._runq() - r0 if self.measure_runq else 0.0)
        return P.Reply(op, ids, payload, errors or None, timing)

    def tune(self, options: dict) -> dict:
        """Apply run-time settings this host owns; returns them as now in effect."""
        if "env_threads" in options:
            self.set_threads(options["env_threads"])
        if "measure_runq" in options:
            self.measure_runq = bool(options["measure_runq"])
        return {"env_threads": self.env_threads, "measure_runq": self.measure_runq}

    def step_shard(self) -> tuple[P.Timing, list | None, list | None]:
        """Step every hosted env (STEP_SHARD): ``(timing, infos or None, errors or None)``."""
        return self.step_timed(self.shard)

    def step_timed(self, ids: Any) -> tuple[P.Timing, list | None, list | None]:
        """:meth:`step` and what it cost: ``(timing, infos or None, errors or None)``; see :meth:`step_clocked`.

        The run-queue clock (a read of schedstat, ~1 us) is sampled with the CPU clock, on the same calls; the
        others count it at the last sampled share of their wall time."""
        if not self.measure_runq:
            cpu, wall, infos, errors = self.step_clocked(ids)
            return P.Timing(cpu, wall, 0.0), infos, errors
        sample = self._samples_cpu()
        r0 = self._runq() if sample else 0.0
        cpu, wall, infos, errors = self.step_clocked(ids)
        if sample:
            runq = self._runq() - r0
            self._runq_share = runq / wall if wall > 0 else 0.0
        else:
            runq = self._runq_share * wall
        return P.Timing(cpu, wall, runq), infos, errors

    def _samples_cpu(self) -> bool:
        """Whether the next :meth:`step_clocked` reads the CPU clock."""
        return not self._timed % CPU_SAMPLE or self._last_wall > CPU_ALWAYS_S

    def step_clocked(self, ids: Any) -> tuple[float, float, list | None, list | None]:
        """:meth:`step` and its CPU and wall time: ``(cpu_s, wall_s, infos or None, errors or None)``.

        The CPU clock is a system call (~1 us here, 1-2% of a batch of 8 CartPoles): for short steps it
        is read on one call in :data:`CPU_SAMPLE`, the others count CPU at the last sampled share of their
        wall time; after a step longer than :data:`CPU_ALWAYS_S` it is read every time."""
        sample = self._samples_cpu()
        self._timed += 1
        c0 = self._cpu_clock() if sample else 0.0
        w0 = time.perf_counter()
        infos, errors = self.step(ids)
        wall = self._last_wall = time.perf_counter() - w0
        if sample:
            cpu = self._cpu_clock() - c0
            self._cpu_share = cpu / wall if wall > 0 else 1.0
        else:
            cpu = self._cpu_share * wall
        return cpu, wall, infos, errors

    def step(self, ids: Any) -> tuple[list | None, list | None]:
        """Step (or autoreset) each env in ``ids``: ``(infos aligned with ids or None, errors or None)``.

        An env's own failure is its error; a failure of this code is every env's, so no command goes unanswered
        (in this process, an exception here would leave its step in flight for good)."""
        try:
            return self._step(ids)
        except Exception as exc:
            return None, [_describe(i, exc) for i in ids]

    def _step(self, ids: Any) -> tuple[list | None, list | None]:
        if self._threads is not None and len(ids) > 1:
            results = self._step_threaded(ids)
            infos = errors = None
            for k, (info, err) in enumerate(results):
                if err is not None:
                    errors = [*(errors or ()), err]
                elif info:
                    if infos is None:
                        infos = [None] * len(ids)
                    infos[k] = info
            return infos, errors
        # step_one, inlined: this loop is the worker's whole hot path. Results are gathered in lists and written
        # with one slice assignment per buffer where the envs are a contiguous run of rows (a shard, as placed).
        infos = errors = None
        slots, v = self.slots, self.views
        same_step, next_step, check = self.mode == AutoresetMode.SAME_STEP, self.mode == AutoresetMode.NEXT_STEP, self.check_obs
        scalar_actions = v.actions if self._scalar_actions else None  # Discrete: a numpy scalar, no copy needed
        action = scalar_actions.__getitem__ if scalar_actions is not None else self._get_action
        n = len(ids)
        obs_out, rew_out, term_out, trunc_out = [None] * n, [0.0] * n, [False] * n, [False] * n
        for k, i in enumerate(ids):
            slot = slots[i]
            try:
                if slot.needs_reset:
                    obs, info = slot.reset(replayable=False)
                    reward = term = trunc = False
                else:
                    obs, reward, term, trunc, info = slot.env.step(action(i))
                    slot.steps += 1
                    if term or trunc:
                        slot.done = True
                        if same_step:
                            final = {"final_obs": obs, "final_info": info}
                            obs, info = slot.reset()
                            info = {**final, **info}
                        elif next_step:
                            slot.needs_reset = True
                    elif slot.done:
                        slot.done = False
                if check:
                    self._check(obs)
            except Exception as exc:
                errors = [*(errors or ()), _describe(i, exc)]
                continue
            obs_out[k] = obs
            rew_out[k] = reward
            term_out[k] = term
            trunc_out[k] = trunc
            if info:
                if infos is None:
                    infos = [None] * n
                infos[k] = info
        if errors is None and n > 1 and ids is self.shard and ids[-1] - ids[0] == n - 1 and self._flat_obs:
            # One slice assignment per buffer, where every observation is an array of its row's shape (anything else
            # numpy would broadcast across rows) and every value fits; else row by row, where a misfit is its env's error.
            shape = self._obs_shape
            for o in obs_out if shape else ():  # scalar rows: a misfit cannot broadcast, the assignment raises
                if type(o) is not np.ndarray or o.shape != shape:
                    break
            else:
                rows = slice(ids[0], ids[-1] + 1)  # the shard is sorted: its ids ascend, here without a gap
                try:
                    v.obs[rows] = obs_out
                    v.rewards[rows] = rew_out
                    v.terminations[rows] = term_out
                    v.truncations[rows] = trunc_out
                except Exception:
                    pass
                else:
                    return infos, None
        return infos, self._write_rows(ids, obs_out, rew_out, term_out, trunc_out, errors)

    def _step_threaded(self, ids: Any) -> list[tuple[dict | None, P.ErrorInfo | None]]:
        """:meth:`step_one` for each of ``ids`` on ``env_threads`` threads, this one included: they all take the
        next env from one shared iterator (a C iterator: each ``next`` is atomic under the GIL) until none is
        left. One hand-off to each helper thread a command, rather than one a env, and no idle caller."""
        results: list[Any] = [None] * len(ids)
        work = enumerate(ids)
        step_one = self.step_one

        def drain() -> None:
            for k, i in work:
                results[k] = step_one(i)

        helpers = [self._threads.submit(drain) for _ in range(min(self.env_threads, len(ids)) - 1)]  # type: ignore[union-attr]
        drain()
        for f in helpers:
            f.result()
        return results

    def _write_rows(self, ids: Any, obs_out: list, rew_out: list, term_out: list, trunc_out: list,
                    errors: list | None) -> list | None:
        """Write :meth:`step`'s results row by row, skipping envs that raised; an observation that does not fit
        its row is that env's error. Returns the errors."""
        v, put_obs = self.views, self._put_obs
        failed = {e[0] for e in errors} if errors else ()
        for k, i in enumerate(ids):
            if i in failed:
                continue
            try:
                put_obs(i, obs_out[k])
                v.rewards[i] = rew_out[k]
                v.terminations[i] = term_out[k]
                v.truncations[i] = trunc_out[k]
            except Exception as exc:
                errors = [*(errors or ()), _describe(i, exc)]
        return errors

    def step_one(self, i: int) -> tuple[dict | None, P.ErrorInfo | None]:
        """Step (or autoreset) env ``i`` and write its row; rows are disjoint, so threads may share this."""
        v, slot = self.views, self.slots[i]
        try:
            if slot.needs_reset:
                obs, info = slot.reset(replayable=False)
                reward, term, trunc = 0.0, False, False
            else:
                obs, reward, term, trunc, info = slot.env.step(self._get_action(i))
                slot.steps += 1
                if term or trunc:
                    slot.done = True
                    if self.mode == AutoresetMode.SAME_STEP:
                        final = {"final_obs": obs, "final_info": info}
                        obs, info = slot.reset()
                        info = {**final, **info}
                    elif self.mode == AutoresetMode.NEXT_STEP:
                        slot.needs_reset = True
                else:
                    slot.done = False
            if self.check_obs:
                self._check(obs)
            self._put_obs(i, obs)
            v.rewards[i] = reward
            v.terminations[i] = term
            v.truncations[i] = trunc
        except Exception as exc:
            return None, _describe(i, exc)
        return info, None

    def _reset(self, ids: tuple[int, ...], seeds: list, options: dict | None, errors: list) -> list | None:
        v = self.views
        infos: list | None = None
        for k, (i, seed) in enumerate(zip(ids, seeds, strict=True)):
            slot = self.slots[i]
            try:
                obs, info = slot.reset(seed, options)
                if self.check_obs:
                    self._check(obs)
                self._put_obs(i, obs)
            except Exception as exc:
                errors.append(_describe(i, exc))
                continue
            v.rewards[i] = 0.0
            v.terminations[i] = v.truncations[i] = False
            if info:
                if infos is None:
                    infos = [None] * len(ids)
                infos[k] = info
        return infos

    def _check(self, obs: Any) -> None:
        if not self.obs_space.contains(obs):
            shape = getattr(obs, "shape", None)
            dtype = getattr(obs, "dtype", type(obs).__name__)
            raise ValueError(f"observation (shape {shape}, dtype {dtype}) is outside the declared observation space {self.obs_space}: {obs!r:.200}")

    def _call(self, ids: tuple[int, ...], kind: str, name: str, payload: Any, errors: list) -> list:
        results: list[Any] = [None] * len(ids)
        for k, i in enumerate(ids):
            env = self.slots[i].env
            try:
                if kind == "get":
                    results[k] = env.get_wrapper_attr(name)
                elif kind == "set":
                    env.set_wrapper_attr(name, payload[k])
                else:
                    attr = env.get_wrapper_attr(name)
                    args, kwargs = payload
                    results[k] = attr(*args, **kwargs) if callable(attr) else attr
            except Exception as exc:
                errors.append(_describe(i, exc))
        return results

    def _add(self, env_id: int, factory: bytes, state: dict | None, errors: list) -> None:
        try:
            env = cloudpickle.loads(factory)()
            for what, got, want in (
                ("observation space", env.observation_space, self.obs_space),
                ("action space", env.action_space, self.action_space),
            ):
                if got != want:
                    raise ValueError(f"env {env_id} has {what} {got}, but env 0 has {want}; all envs must agree")
        except Exception as exc:
            errors.append(_describe(env_id, exc))
            return
        slot = _Slot(env)
        if state is not None:
            try:
                slot.restore(state)
            except Exception as exc:
                errors.append(_describe(env_id, exc))
                return
        self.slots[env_id] = slot
        bisect.insort(self.shard, env_id)

    def _remove(self, ids: tuple[int, ...], errors: list) -> dict[int, dict]:
        states = {}
        for i in ids:
            try:
                states[i] = self.slots[i].export()
            except Exception as exc:
                errors.append(_describe(i, exc))
                continue
            slot = self.slots.pop(i)
            self.shard.remove(i)
            try:
                slot.env.close()
            except Exception:  # its state left with the reply: a failing close of the copy left behind moves nothing back
                pass
        return states

    def close(self) -> None:
        for slot in self.slots.values():
            try:
                slot.env.close()
            except Exception:
                pass
        self.slots.clear()
        self.shard.clear()
        self._runq.close()
        if self._threads is not None:
            self._threads.shutdown(wait=False)


def _flat_action(actions: np.ndarray, dtypes: np.ndarray | None = None) -> Any:
    """Row ``i`` of a flat action buffer, as the single space's sample would look; where the buffer is wider than
    the space (``dtypes``: see :func:`~aiovec.spaces.action_buffer_space`), in the dtype the caller gave it."""
    if dtypes is not None:
        def in_callers_dtype(i: int) -> np.ndarray:
            return actions[i].astype(dtype_of_code(dtypes.item(i)))  # a copy, as below
        return in_callers_dtype
    if actions.ndim == 1:
        return actions.__getitem__  # a numpy scalar: immutable, no copy needed
    # A copy, so an env that keeps its action never sees the next one overwrite it.
    return lambda i: actions[i].copy()


def _describe(env_id: int, exc: BaseException) -> P.ErrorInfo:
    return P.ErrorInfo(env_id, type(exc).__name__, str(exc), "".join(traceback.format_exception(exc)))


# -- process transport ----------------------------------------------------------------
_conn: Any = None
_buffers: Any = None


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the process that started it dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _release_forkserver() -> None:
    """Drop the fork server's "alive" fd that every forkserver child inherits.

    While any child holds it, the fork server outlives a SIGKILLed parent, and so the
    parent-death signal (armed against the fork server, our parent) never fires: a worker
    busy in a long or hung step would then outlive the parent.
    """
    try:
        from multiprocessing import forkserver

        fd = forkserver._forkserver._forkserver_alive_fd
        if fd is not None:
            os.close(fd)
            forkserver._forkserver._forkserver_alive_fd = None
    except (AttributeError, OSError):
        pass


def initialize(conn: Any, buffers: Any) -> None:
    """``ProcessPoolExecutor`` initializer: keeps the pipe and the shared buffers."""
    global _conn, _buffers
    _conn, _buffers = conn, buffers
    _release_forkserver()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _die_with_parent()
    if os.getppid() == 1:  # parent already gone before PDEATHSIG was armed
        os._exit(0)


class _Channel:
    """The worker's end of its socket: length-prefixed frames (multiprocessing's), raw fd I/O.

    The fd is non-blocking; :meth:`wait` blocks in ``poll`` (or spins on it first).
    """

    def __init__(self, conn: Any) -> None:
        self._conn = conn  # kept so the fd stays open
        self.fd = conn.fileno()
        os.set_blocking(self.fd, False)
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)
        self._buf = b""

    def recv(self, spin_s: float) -> bytes:
        """The next frame, polling up to ``spin_s`` before sleeping; raises EOFError when the parent is gone."""
        while True:
            buf = self._buf
            if len(buf) >= 4:
                size = _HEADER.unpack_from(buf)[0]
                if len(buf) >= 4 + size:
                    self._buf = buf[4 + size :]
                    return buf[4 : 4 + size]
            if spin_s > 0:
                end = time.perf_counter() + spin_s
                while not self._poll.poll(0) and time.perf_counter() < end:
                    pass
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                self._poll.poll()
                continue
            if not chunk:
                raise EOFError
            self._buf = buf + chunk if buf else chunk

    def send(self, payload: bytes) -> None:
        data = memoryview(_HEADER.pack(len(payload)) + payload)
        while data:
            try:
                data = data[os.write(self.fd, data) :]
            except BlockingIOError:
                select.select([], [self.fd], [])

    def close(self) -> None:
        self._conn.close()


_HEADER = struct.Struct("!i")  # multiprocessing.Connection's frame header


MIN_SPIN_S = 200e-6
"""The shortest poll of a worker that spins at all."""


class SpinWindow:
    """How long a worker polls for its next command before it sleeps: about as long as the parent
    usually takes to send it, never more than ``cap`` (the parent's spin setting).

    Waking a sleeping worker costs ~30-150 us on a VM whose idle CPUs halt, more than a cheap
    env step; a fixed short poll misses every command that comes after the parent's own work
    (a policy's forward pass, stepping its own shard). So the worker learns the gap between its
    reply and the next command (an exponential mean and mean deviation, each gap clipped to
    ``2 * cap`` so one long pause cannot dominate) and polls for mean + 2 deviations, at least
    :data:`MIN_SPIN_S` (a stray slow turn of the parent should not cost a wake-up); where the
    parent usually takes longer than ``cap``, polling would only burn the core, so it sleeps at once.
    """

    __slots__ = ("cap", "mean", "dev", "least")

    def __init__(self, cap: float) -> None:
        self.cap = cap
        self.least = min(cap, MIN_SPIN_S)
        self.mean = 0.0
        self.dev = cap / 4  # until gaps are seen: poll for half the cap

    def window(self) -> float:
        if self.mean > self.cap:
            return 0.0
        return min(self.cap, max(self.least, self.mean + 2 * self.dev))

    def saw(self, gap: float) -> None:
        """Record one gap between a reply and the next command (seconds)."""
        d = min(gap, 2 * self.cap) - self.mean
        self.mean += d / 8
        self.dev += (abs(d) - self.dev) / 8


def serve(autoreset_mode: str, spin_s: float = 0.0, host_options: dict | None = None) -> None:
    """The worker's whole life: answer commands until CLOSE; exit at once when the parent goes.

    ``spin_s`` > 0: after each reply, poll for the next command before blocking, for at most
    that long (:class:`SpinWindow` says how long); the parent only asks for a spin when there
    is a spare core for it.
    """
    chan = _Channel(_conn)
    host = EnvHost(_buffers.views(), AutoresetMode(autoreset_mode), _buffers.obs_space, _buffers.action_space, **(host_options or {}))
    encode, step_frame, step_shard = P.encode, P.step_frame, host.step_shard
    schemas: dict[tuple, int] = {}  # info schemas sent so far (see protocol.records_reply)
    chan.send(encode(P.Reply(P.READY, (), {"pid": os.getpid(), "spin_s": spin_s, "env_threads": host.env_threads}, None, P.NO_TIMING)))
    spin = SpinWindow(spin_s)
    clock = time.perf_counter
    while True:
        try:
            if spin_s > 0:
                sent = clock()
                frame = chan.recv(spin.window())
                spin.saw(clock() - sent)
            else:
                frame = chan.recv(0.0)
        except (EOFError, OSError):
            # The parent is gone (or closed us without CLOSE): the executor's own queues
            # would keep this process waiting forever, so leave now.
            os._exit(0)
        if frame == P.STEP_SHARD:
            timing, infos, errors = step_shard()
            infos = P.pack_step_infos(infos, errors)
            out = step_frame(timing, infos, schemas) if errors is None else None
            if out is None:
                out = encode(P.Reply(P.STEP, None, infos, errors, timing))
            msg = None
        else:
            msg = P.decode(frame)
            op = getattr(msg, "op", None)
            if op == P.TUNE and "spin_s" in msg.options:
                spin_s = float(msg.options["spin_s"])
                spin = SpinWindow(spin_s)
            reply = host.handle(msg)  # an unknown command raises: the worker dies with the reason
            out = None
            if op == P.TUNE:
                reply = reply._replace(payload={**reply.payload, "spin_s": spin_s})
            elif op == P.STEP and reply.errors is None:  # the parent knows the ids it sent: the step's frames serve
                out = step_frame(reply.timing, P.pack_step_infos(reply.payload, None), schemas)
            if out is None:
                out = encode(reply)
        try:
            chan.send(out)
        except OSError:
            os._exit(0)
        if msg is not None and op == P.CLOSE:
            chan.close()
            return
