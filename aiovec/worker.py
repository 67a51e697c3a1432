"""The code that runs inside a worker: hosts a shard of envs and steps them.

:class:`EnvHost` executes protocol commands against its envs and writes results
into row-per-env buffers; it knows nothing of transports, so a process or an
actor can drive it. :func:`serve` is the process transport: a plain blocking
loop on one pipe. Nothing here imports asyncio.
"""

from __future__ import annotations

import copy
import os
import signal
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cloudpickle
from gymnasium.vector import AutoresetMode

from . import protocol as P
from .spaces import get_row, put_row

_SCHEDSTAT = "/proc/self/schedstat"


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


class _Slot:
    __slots__ = ("env", "needs_reset", "done", "steps", "pre_reset_rng", "reset_args")

    def __init__(self, env: Any) -> None:
        self.env = env
        self.needs_reset = False  # NEXT_STEP: the next step call resets instead
        self.done = False  # last transition ended the episode
        self.steps: int | None = None  # steps since the last reset (None: never reset)
        self.pre_reset_rng: Any = None  # np_random as it was just before the last reset
        self.reset_args: tuple[Any, Any] = (None, None)  # (seed, options) of the last reset

    def reset(self, seed: Any = None, options: Any = None) -> tuple[Any, dict]:
        """Reset, remembering enough to replay this reset elsewhere (see ``export``)."""
        self.pre_reset_rng = copy.deepcopy(self.env.unwrapped.np_random)
        self.reset_args = (seed, options)
        obs, info = self.env.reset(seed=seed, options=options)
        self.steps = 0
        self.needs_reset = self.done = False
        return obs, info

    def export(self) -> dict[str, Any]:
        """Portable state at an episode boundary; an env mid-episode cannot move."""
        if self.steps is None:
            return {"kind": "fresh"}
        if self.done:  # episode over, next call resets: only the generator matters
            return {"kind": "ended", "np_random": self.env.unwrapped.np_random, "needs_reset": self.needs_reset}
        if self.steps == 0:  # just reset: replay that reset from the generator it started with
            return {"kind": "replay", "np_random": self.pre_reset_rng, "reset_args": self.reset_args}
        raise RuntimeError(f"env is {self.steps} steps into an episode; it can only move at an episode boundary")

    def restore(self, state: dict[str, Any]) -> None:
        kind = state["kind"]
        if kind == "ended":
            self.env.unwrapped.np_random = state["np_random"]
            self.done, self.needs_reset, self.steps = True, state["needs_reset"], 1
        elif kind == "replay":
            self.env.unwrapped.np_random = state["np_random"]
            self.reset(*state["reset_args"])


class EnvHost:
    """Hosts envs by global env id and executes commands on them."""

    def __init__(self, views: Any, autoreset_mode: AutoresetMode, obs_space: Any, action_space: Any,
                 env_threads: int = 1, check_obs: bool = False) -> None:
        self.check_obs = check_obs  # validate every observation against the declared space
        self.views = views
        self.mode = autoreset_mode
        self.obs_space = obs_space
        self.action_space = action_space
        self.slots: dict[int, _Slot] = {}
        self._runq = _RunQueueClock()
        # env_threads > 1: step a command's envs concurrently (for envs that wait with the GIL
        # released: simulators over sockets, sleeps). CPU is then counted for the whole process.
        self._threads = ThreadPoolExecutor(env_threads, thread_name_prefix="aiovec-env") if env_threads > 1 else None
        self._cpu_clock = time.process_time if self._threads is not None else time.thread_time

    # -- commands -------------------------------------------------------------------
    def handle(self, msg: tuple[Any, ...]) -> tuple[Any, ...]:
        op = msg[0]
        c0, w0, r0 = self._cpu_clock(), time.perf_counter(), self._runq()
        errors: list[tuple[int, str, str, str]] = []
        if op == P.STEP:
            ids, payload = msg[1], self._step(msg[1], errors)
        elif op == P.RESET:
            ids, payload = msg[1], self._reset(msg[1], msg[2], msg[3], errors)
        elif op == P.CALL:
            ids, payload = msg[1], self._call(msg[1], msg[2], msg[3], msg[4], errors)
        elif op == P.ADD:
            ids, payload = (msg[1],), self._add(msg[1], msg[2], msg[3], errors)
        elif op == P.REMOVE:
            ids, payload = msg[1], self._remove(msg[1], errors)
        elif op == P.CLOSE:
            ids, payload = tuple(self.slots), self.close()
        else:
            raise ValueError(f"unknown command {op!r}")
        timing = (self._cpu_clock() - c0, time.perf_counter() - w0, self._runq() - r0)
        return (op, ids, payload, errors or None, timing)

    def _step(self, ids: tuple[int, ...], errors: list) -> list | None:
        if self._threads is not None and len(ids) > 1:
            results = list(self._threads.map(self._step_one, ids))
        else:
            results = [self._step_one(i) for i in ids]
        infos: list | None = None
        for k, (info, err) in enumerate(results):
            if err is not None:
                errors.append(err)
            elif info:
                if infos is None:
                    infos = [None] * len(ids)
                infos[k] = info
        return infos

    def _step_one(self, i: int) -> tuple[dict | None, tuple | None]:
        """Step (or autoreset) env ``i`` and write its row; rows are disjoint, so threads may share this."""
        v, slot = self.views, self.slots[i]
        try:
            if slot.needs_reset:
                obs, info = slot.reset()
                reward, term, trunc = 0.0, False, False
            else:
                obs, reward, term, trunc, info = slot.env.step(get_row(v.actions, i))
                slot.steps = (slot.steps or 0) + 1
                slot.done = bool(term or trunc)
                if slot.done:
                    if self.mode == AutoresetMode.SAME_STEP:
                        final = {"final_obs": obs, "final_info": info}
                        obs, info = slot.reset()
                        info = {**final, **info}
                    elif self.mode == AutoresetMode.NEXT_STEP:
                        slot.needs_reset = True
            if self.check_obs:
                self._check(obs)
            put_row(v.obs, i, obs)
        except Exception as exc:
            return None, _describe(i, exc)
        v.rewards[i] = reward
        v.terminations[i] = term
        v.truncations[i] = trunc
        return info, None

    def _reset(self, ids: tuple[int, ...], seeds: list, options: dict | None, errors: list) -> list | None:
        v = self.views
        infos: list | None = None
        for k, (i, seed) in enumerate(zip(ids, seeds)):
            slot = self.slots[i]
            try:
                obs, info = slot.reset(seed, options)
                if self.check_obs:
                    self._check(obs)
                put_row(v.obs, i, obs)
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

    def _remove(self, ids: tuple[int, ...], errors: list) -> dict[int, dict]:
        states = {}
        for i in ids:
            try:
                states[i] = self.slots[i].export()
            except Exception as exc:
                errors.append(_describe(i, exc))
                continue
            slot = self.slots.pop(i)
            try:
                slot.env.close()
            except Exception as exc:
                errors.append(_describe(i, exc))
        return states

    def close(self) -> None:
        for slot in self.slots.values():
            try:
                slot.env.close()
            except Exception:
                pass
        self.slots.clear()


def _describe(env_id: int, exc: BaseException) -> tuple[int, str, str, str]:
    return (env_id, type(exc).__name__, str(exc), "".join(traceback.format_exception(exc)))


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


def serve(autoreset_mode: str, spin_s: float = 0.0, host_options: dict | None = None) -> None:
    """The worker's whole life: answer commands until CLOSE; exit at once when the parent goes.

    ``spin_s`` > 0: after each reply, poll for the next command for that long before
    blocking. Waking a sleeping CPU costs ~50-100 us on many VMs, more than a cheap
    env step; the parent only asks for a spin when there is a spare core for it.
    """
    conn = _conn
    host = EnvHost(_buffers.views(), AutoresetMode(autoreset_mode), _buffers.obs_space, _buffers.action_space, **(host_options or {}))
    recv, send, poll = conn.recv_bytes, conn.send_bytes, conn.poll
    clock = time.perf_counter
    send(P.encode((P.READY, (), (os.getpid(), spin_s), None, (0.0, 0.0, 0.0))))
    while True:
        if spin_s > 0:
            end = clock() + spin_s
            while clock() < end and not poll(0):
                pass
        try:
            msg = P.decode(recv())
        except (EOFError, OSError):
            # The parent is gone (or closed us without CLOSE): the executor's own queues
            # would keep this process waiting forever, so leave now.
            os._exit(0)
        if msg[0] == P.TUNE:
            spin_s = float(msg[1].get("spin_s", spin_s))
            reply = (P.TUNE, (), {"spin_s": spin_s}, None, (0.0, 0.0, 0.0))
        else:
            reply = host.handle(msg)
        try:
            send(P.encode(reply))
        except (BrokenPipeError, OSError):
            os._exit(0)
        if msg[0] == P.CLOSE:
            conn.close()
            return
