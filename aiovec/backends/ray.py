"""Workers as Ray actors, behind the same protocol (imported only for ``backend="ray"``).

Each actor hosts a shard of envs in an :class:`~aiovec.worker.EnvHost` with buffers
of its own; there is no shared memory across nodes, so a STEP command carries its
action rows and the reply carries the result rows, which this backend copies into
the parent's buffers before the pool sees the reply. Calls are awaited through
Ray's object-ref futures on the event loop (never blocking it), and several may be
in flight per actor; replies are delivered in submission order.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any

import numpy as np
from gymnasium.vector.utils import create_empty_array

from .. import protocol as P
from ..shm import Views
from ..spaces import action_buffer_space, action_dtype_codes, put_rows, take
from .base import Backend, ExitCallback, ReplyCallback, WorkerHandle

try:
    import ray
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("backend='ray' needs Ray: pip install 'aiovec[ray]'") from exc


def local_views(obs_space: Any, action_space: Any, n: int) -> Views:
    return Views(
        obs=create_empty_array(obs_space, n, fn=np.zeros),
        actions=create_empty_array(action_buffer_space(action_space), n, fn=np.zeros),
        rewards=np.zeros(n, dtype=np.float64),
        terminations=np.zeros(n, dtype=np.bool_),
        truncations=np.zeros(n, dtype=np.bool_),
        action_dtypes=action_dtype_codes(action_space, n),
    )


class _Actor:
    """Runs inside a Ray worker process."""

    def __init__(self, obs_space: Any, action_space: Any, num_envs: int, autoreset_mode: str, host_options: dict) -> None:
        from gymnasium.vector import AutoresetMode

        from .. import envs as _envs  # noqa: F401  (registers aiovec/* ids on this node)
        from ..worker import EnvHost

        self.views = local_views(obs_space, action_space, num_envs)
        self.host = EnvHost(self.views, AutoresetMode(autoreset_mode), obs_space, action_space, **host_options)

    def pid(self) -> int:
        import os

        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this actor runs on (for placement checks and stats)."""
        return ray.get_runtime_context().get_node_id()

    def handle(self, msg: tuple, actions: Any, action_dtypes: np.ndarray | None = None) -> tuple[tuple, Any]:
        if actions is not None:
            put_rows(self.views.actions, list(msg.env_ids), actions)
        if action_dtypes is not None:
            self.views.action_dtypes[list(msg.env_ids)] = action_dtypes  # type: ignore[index]
        reply = self.host.handle(msg)
        if msg.op in (P.STEP, P.RESET):
            v, rows = self.views, list(reply.env_ids)
            return reply, (take(v.obs, rows), v.rewards[rows], v.terminations[rows], v.truncations[rows])
        return reply, None


class RayWorker(WorkerHandle):
    def __init__(self, worker_id: int, backend: RayBackend, on_reply: ReplyCallback, on_exit: ExitCallback) -> None:
        self.worker_id = worker_id
        self._b = backend
        self._loop = asyncio.get_running_loop()
        self._on_reply = on_reply
        self._on_exit = on_exit
        self._inflight: deque[list] = deque()  # [future, done, result]
        self._exited = False
        self._closing = False
        self.pid: int | None = None
        self.actor = backend.actor_cls.options(**backend.actor_options).remote(
            backend.obs_space, backend.action_space, backend.num_envs, backend.autoreset_mode, backend.host_options
        )
        self._track(self.actor.pid.remote(), ready=True)

    @property
    def alive(self) -> bool:
        return not self._exited

    def send(self, msg: tuple[Any, ...]) -> None:
        if self._exited:
            return
        actions = dtypes = None
        if msg.op == P.STEP:
            rows = list(msg.env_ids)
            actions = take(self._b.views.actions, rows)
            if self._b.views.action_dtypes is not None:
                dtypes = self._b.views.action_dtypes[rows]
        self._track(self.actor.handle.remote(msg, actions, dtypes))

    def _track(self, ref: Any, ready: bool = False) -> None:
        entry: list = [ready, False, None]
        self._inflight.append(entry)
        fut = ref.future()
        fut.add_done_callback(lambda f: self._loop.call_soon_threadsafe(self._done, entry, f))

    def _done(self, entry: list, fut: Any) -> None:
        entry[1], entry[2] = True, fut
        while self._inflight and self._inflight[0][1] and not self._exited:
            is_ready, _, f = self._inflight.popleft()
            try:
                result = f.result()
            except Exception as exc:
                self._die(exc)
                return
            if is_ready:
                self.pid = result
                self._on_reply(P.Reply(P.READY, (), {"pid": result, "spin_s": None}, None, P.NO_TIMING))
                continue
            reply, arrays = result
            if arrays is not None:
                v, rows = self._b.views, list(reply.env_ids)
                put_rows(v.obs, rows, arrays[0])
                v.rewards[rows], v.terminations[rows], v.truncations[rows] = arrays[1], arrays[2], arrays[3]
            self._on_reply(reply)

    def _die(self, exc: BaseException) -> None:
        if self._exited:
            return
        self._exited = True
        self._inflight.clear()
        if not self._closing:
            self._on_exit(None, f"{type(exc).__name__}: {exc}")

    def kill(self) -> None:
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:
            pass

    async def stop(self, grace: float) -> None:
        self._closing = True
        deadline = self._loop.time() + grace
        while self._inflight and self._loop.time() < deadline and not self._exited:
            await asyncio.sleep(0.01)
        self._exited = True
        self.kill()


class _OwnRay:
    """The Ray session aiovec started, shared by the vector envs that run on it; the last to close stops it.

    A Ray vector env opened with no Ray running starts one (locally, or joined to ``address``); one opened while
    that session runs joins it; closing one only stops the session once no other runs on it (stopping it under
    another would kill that one's actors). A session the caller started with ``ray.init()`` is theirs: aiovec
    joins it and never stops it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # vector envs may open and close on event loops in several threads
        self.users = 0  # vector envs on the session aiovec started
        self._session: tuple[str, str] | None = None  # which one: (job, node) of this driver in it

    @staticmethod
    def _current() -> tuple[str, str]:
        ctx = ray.get_runtime_context()
        return ctx.get_job_id(), ctx.get_node_id()

    def join(self, address: str | None) -> bool:
        """Join Ray, starting it when none runs; True when the session is aiovec's (``leave()`` once when done)."""
        with self._lock:
            if ray.is_initialized():
                if not self.users or self._current() != self._session:
                    return False  # the caller's session
            else:
                import aiovec

                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         runtime_env={"py_modules": [aiovec]} if address else None)
                self._session = self._current()
            self.users += 1
            return True

    def leave(self) -> None:
        """One vector env on aiovec's session is done with it; the last one stops it (if it still runs)."""
        with self._lock:
            self.users -= 1
            if not self.users:
                if ray.is_initialized() and self._current() == self._session:
                    ray.shutdown()
                self._session = None


_OWN_RAY = _OwnRay()


class RayBackend(Backend):
    """``backend="ray"``: workers are Ray actors; ``ray_options`` pass through to ``.options()``."""

    name = "ray"
    shard_step = False  # an actor gets explicit ids: its command carries the action rows

    def __init__(self, obs_space: Any, action_space: Any, num_envs: int, autoreset_mode: str,
                 address: str | None = None, actor_options: dict | None = None, host_options: dict | None = None) -> None:
        self.host_options = host_options or {}
        self.obs_space, self.action_space, self.num_envs = obs_space, action_space, num_envs
        self.autoreset_mode = autoreset_mode
        self.on_own_ray = _OWN_RAY.join(address)
        # A token CPU share by default so more actors than CPUs can run (waiting envs), spread
        # over nodes; pass ray_options={"num_cpus": 1, ...} to reserve whole CPUs.
        self.actor_options = {"num_cpus": 0.01, "max_restarts": 0, "scheduling_strategy": "SPREAD", **(actor_options or {})}
        self.actor_cls = ray.remote(_Actor)
        self.views = local_views(obs_space, action_space, num_envs)

    def start_worker(self, worker_id: int, on_reply: ReplyCallback, on_exit: ExitCallback) -> WorkerHandle:
        return RayWorker(worker_id, self, on_reply, on_exit)

    def cpus(self) -> float:
        try:
            return float(ray.cluster_resources().get("CPU", 1.0))
        except Exception:
            return 1.0

    def close(self) -> None:
        if self.on_own_ray:
            self.on_own_ray = False
            _OWN_RAY.leave()

    async def aclose(self) -> None:
        """As ``close()``, in a thread: stopping a Ray that aiovec started takes seconds (its processes exit).

        Cancelled, the thread still finishes (the loop's executor, which ``asyncio.run`` waits for).
        """
        if self.on_own_ray:
            await asyncio.to_thread(self.close)
