"""The floor: the bare minimum of aiovec's process design, to measure aiovec's own overhead against.

Worker processes (forkserver, never fork) each host a contiguous shard of envs. On a
one-byte command from their socketpair they step every env of the shard (NEXT_STEP
autoreset inside the worker, like gymnasium's default), reading actions from and
writing observations, rewards and terminated/truncated flags to shared memory, and
answer with one byte. Between commands they idle with aiovec's spin policy
(:func:`aiovec.autoconf.spin_for`: poll after a reply, here for the whole cap of
:data:`aiovec.autoconf.SPIN_S`, only while the workers leave the parent a CPU).
The uvloop parent writes the actions, sends the commands, awaits every reply through
``loop.add_reader`` and copies the results out of shared memory: lock-step, nothing else.
aiovec / floor is the cost of everything aiovec adds.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import signal
import socket
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory

import aiovec
from aiovec.autoconf import spin_for
from aiovec.machine import available_cpus

from .peers import Runner, _actions, _atimed, make_env

STEP, QUIT = b"s", b"q"


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the kernel kills this worker when the benchmark process dies, however it dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class _Shared:
    """The floor's shared memory: one row per env, as gymnasium's AsyncVectorEnv lays it out."""

    def __init__(self, ctx: Any, obs_space: gym.Space, action_space: gym.Space, n: int) -> None:
        self.obs_space, self.action_space, self.n = obs_space, action_space, n
        self.obs = create_shared_memory(obs_space, n, ctx)
        self.actions = create_shared_memory(action_space, n, ctx)
        self.rewards = ctx.RawArray(ctypes.c_double, n)
        self.flags = ctx.RawArray(ctypes.c_bool, 2 * n)  # terminated rows, then truncated rows

    def views(self) -> tuple[Any, Any, np.ndarray, np.ndarray, np.ndarray]:
        flags = np.frombuffer(self.flags, dtype=np.bool_)
        return (read_from_shared_memory(self.obs_space, self.obs, self.n),
                read_from_shared_memory(self.action_space, self.actions, self.n),
                np.frombuffer(self.rewards, dtype=np.float64), flags[: self.n], flags[self.n:])


def serve(sock: socket.socket, shared: _Shared, env_id: str, kwargs: dict, lo: int, hi: int, seed: int, spin_s: float) -> None:
    """A floor worker: host envs ``lo:hi``, step them all on each command, answer one byte."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    obs, actions, rewards, terms, truncs = shared.views()
    envs = [make_env(env_id, **kwargs) for _ in range(lo, hi)]
    done = [False] * len(envs)
    for k, env in enumerate(envs):
        obs[lo + k] = env.reset(seed=seed + lo + k)[0]
    buf = bytearray(1)
    clock = time.perf_counter
    sock.send(b"r")
    while True:
        got = 0
        if spin_s > 0:
            end = clock() + spin_s
            while clock() < end:
                try:
                    got = sock.recv_into(buf, 1, socket.MSG_DONTWAIT)
                    break
                except BlockingIOError:
                    pass
        if not got:
            got = sock.recv_into(buf, 1)
        if not got or buf[0] == QUIT[0]:  # EOF: the parent is gone
            return
        for k, env in enumerate(envs):
            i = lo + k
            if done[k]:  # NEXT_STEP: the step after an episode's end is its reset
                obs[i] = env.reset()[0]
                rewards[i], terms[i], truncs[i], done[k] = 0.0, False, False, False
            else:
                o, rewards[i], terms[i], truncs[i], _ = env.step(actions[i])
                obs[i] = o
                done[k] = bool(terms[i] or truncs[i])
        sock.send(b"d")


class FloorVecEnv:
    """The floor's parent side: ``await step(actions)`` returns copies, like a vector env's lock-step ``step``."""

    def __init__(self, env_id: str, n: int, kwargs: dict, num_workers: int, seed: int = 0) -> None:
        probe = make_env(env_id, **kwargs)
        self.single_action_space = probe.action_space
        obs_space = probe.observation_space
        probe.close()
        ctx = multiprocessing.get_context("forkserver")
        num_workers = max(1, min(num_workers, n))
        self.n, self.num_workers = n, num_workers
        self._shared = _Shared(ctx, obs_space, self.single_action_space, n)
        self._obs, self._actions, self._rewards, self._terms, self._truncs = self._shared.views()
        self._socks: list[socket.socket] = []
        self._procs: list[Any] = []
        spin = spin_for(num_workers, available_cpus())
        bounds = np.linspace(0, n, num_workers + 1).round().astype(int)
        try:
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
                mine, theirs = socket.socketpair()
                proc = ctx.Process(target=serve, args=(theirs, self._shared, env_id, kwargs, int(lo), int(hi), seed, spin), daemon=True)
                proc.start()
                theirs.close()
                self._socks.append(mine)
                self._procs.append(proc)
        except BaseException:
            self.close()
            raise
        self._waiting = 0
        self._done: asyncio.Future[None] | None = None

    async def start(self) -> None:
        """Register the replies with the running loop and wait until every worker has reset its envs."""
        loop = asyncio.get_running_loop()
        for s in self._socks:
            s.setblocking(False)
            loop.add_reader(s.fileno(), self._on_reply, s)
        await self._wait()

    def _on_reply(self, sock: socket.socket) -> None:
        if not sock.recv(1):
            if self._done is not None and not self._done.done():
                self._done.set_exception(RuntimeError("a floor worker died"))
            return
        self._waiting -= 1
        if not self._waiting and self._done is not None:
            self._done.set_result(None)

    async def _wait(self) -> None:
        self._waiting = len(self._socks)
        self._done = asyncio.get_running_loop().create_future()
        await asyncio.wait_for(self._done, 60)

    async def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One lock-step step of every env: actions in, copies of the results out."""
        self._actions[:] = actions
        self._waiting = len(self._socks)
        self._done = asyncio.get_running_loop().create_future()
        for s in self._socks:
            s.send(STEP)
        await self._done
        return self._obs.copy(), self._rewards.copy(), self._terms.copy(), self._truncs.copy()

    def close(self) -> None:
        """Stop the workers: QUIT, then a short grace, then SIGKILL; always reaps them."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        for s in self._socks:
            try:
                if loop is not None:
                    loop.remove_reader(s.fileno())
                s.setblocking(True)
                s.send(QUIT)
            except OSError:
                pass
            s.close()
        for p in self._procs:
            p.join(2)
            if p.is_alive():
                p.kill()
                p.join()
        self._socks, self._procs = [], []


async def _run(env_id: str, n: int, kwargs: dict, duration: float, num_workers: int) -> float:
    venv = FloorVecEnv(env_id, n, kwargs, num_workers)
    try:
        await venv.start()
        acts = _actions(venv.single_action_space, n)

        async def step(a: np.ndarray) -> int:
            await venv.step(a)
            return n

        return await _atimed(venv, acts, duration, step)
    finally:
        venv.close()


def floor_runner(num_workers: int) -> Runner:
    """A runner (see :mod:`.peers`) for the floor with this many workers."""

    def run(env_id: str, n: int, kwargs: dict, duration: float) -> float:
        return aiovec.run(_run(env_id, n, kwargs, duration, num_workers))

    return run


def sweep_counts(n: int, waiting: bool) -> list[int]:
    """The floor's small sweep: 1 and 2 workers; for waiting envs also 4, 8, ... up to ``n``."""
    counts = [1, 2]
    if waiting:
        while counts[-1] < n:
            counts.append(min(n, counts[-1] * 2))
    return [c for c in counts if c <= n]

