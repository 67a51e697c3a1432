"""A small async web service that runs aiovec rollouts in the background while it serves requests.

    python examples/webservice.py --port 8080          # then open http://127.0.0.1:8080/

Everything runs on one event loop (uvloop where installed): the HTTP server, one asyncio task per
rollout driving its :class:`aiovec.AsyncVecEnv` through the awaitable API (``await venv.step`` or
``send``/``await recv``), a sampler per rollout that records a time series for the charts, and a
loop-lag monitor. Nothing blocking runs on the loop: building a vector env (``aiovec.make`` makes and
probes one env in this process) happens in a thread, the forkserver is warmed in a thread at start-up,
and the envs themselves step in aiovec's worker processes.

HTTP API (JSON everywhere; POST parameters may come as a JSON body, a form or the query string):

    POST /rollouts                    start: env_id (CartPole-v1), num_envs (8), num_workers ("auto" or int),
                                      mode ("step": lock-step, "recv": first-finished, half the envs per recv),
                                      seed (0), max_steps (none: until stopped)             -> 201 rollout info
    POST /rollouts/{id}/stop          stop it and close its vector env (idempotent)          -> final info
    GET  /rollouts                    every rollout, running or not (short info)
    GET  /rollouts/{id}               one rollout's live stats (as in /stats)
    GET  /stats                       live stats of every rollout plus the server's loop lag; per rollout:
                                      num_workers, steps, steps_per_s (recent and since start), step latency
                                      percentiles, episodes_finished, recent episode returns, a time series
                                      (?history=N points, default 120; 0 for none); loop lag over the
                                      last ?lag_window_s=S seconds (default: the last 2000 samples)
    GET  /rollouts/{id}/episodes      finished episodes, newest last (?since=index, ?limit=N)
    GET  /rollouts/{id}/episodes/{n}  episode n: env, return, length, per-step rewards and the
                                      returns-to-go G_t = r_t + gamma G_{t+1} (?gamma=0.99)
    GET  /                            the live page (examples/static/index.html + app.js)

Episode returns are computed here from the rewards, terminations and truncations each env reports,
with gymnasium's NEXT_STEP autoreset semantics: the step after an episode ends is the reset step of
the next episode (its reward is not part of any episode), so it is skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from gymnasium import spaces

import aiovec

STATIC = Path(__file__).resolve().parent / "static"
MAX_ENVS = 512
KEEP_EPISODES = 1000  # finished episodes kept per rollout (rewards included)
KEEP_RECENT = 200  # returns in the stats payload
SAMPLE_EVERY_S = 0.5  # time-series resolution
KEEP_SAMPLES = 1200  # 10 minutes of samples


def _num(x: Any) -> float | None:
    """A JSON-safe float (NaN and infinities become null)."""
    x = float(x)
    return x if math.isfinite(x) else None


def action_sampler(space: spaces.Space, rng: np.random.Generator):
    """``sample(k)``: ``k`` uniformly random actions as one batch, cheap for the common spaces."""
    if isinstance(space, spaces.Discrete):
        lo, n = int(space.start), int(space.n)
        return lambda k: rng.integers(lo, lo + n, size=k, dtype=space.dtype)
    if isinstance(space, spaces.Box) and space.is_bounded():
        lo, hi = space.low, space.high
        if space.dtype.kind == "f":
            return lambda k: rng.uniform(lo, hi, size=(k, *space.shape)).astype(space.dtype)
    space.seed(int(rng.integers(2**31)))
    return lambda k: np.stack([space.sample() for _ in range(k)])


class Rollout:
    """One vector env stepping with random actions in a background task, plus its bookkeeping."""

    def __init__(self, rid: int, venv: aiovec.AsyncVecEnv, env_id: str, mode: str, seed: int, max_steps: int | None) -> None:
        self.id, self.venv, self.env_id, self.mode, self.seed, self.max_steps = rid, venv, env_id, mode, seed, max_steps
        n = venv.num_envs
        self.num_envs = n
        self.state = "starting"
        self.error: str | None = None
        self.created = time.time()
        self.t0 = time.perf_counter()
        self.steps = 0  # env steps received by the rollout loop
        self._ret = np.zeros(n, dtype=np.float64)
        self._len = np.zeros(n, dtype=np.int64)
        self._rewards: list[list[float]] = [[] for _ in range(n)]
        self._autoreset = np.zeros(n, dtype=np.bool_)  # next result of env i is a reset step (NEXT_STEP)
        self.episodes: deque[dict[str, Any]] = deque(maxlen=KEEP_EPISODES)
        self.episodes_finished = 0
        self.history: deque[dict[str, Any]] = deque(maxlen=KEEP_SAMPLES)
        self.last_stats: dict[str, Any] = {}
        self.worker_pids: set[int] = set()
        self.task: asyncio.Task | None = None
        self.sampler: asyncio.Task | None = None

    # -- the rollout loop ---------------------------------------------------------------
    async def run(self) -> None:
        venv = self.venv
        try:
            async with venv:
                sample = action_sampler(venv.single_action_space, np.random.default_rng(self.seed))
                await venv.reset(seed=self.seed)
                self.state = "running"
                self.t0 = time.perf_counter()
                if self.mode == "step":
                    await self._run_lockstep(sample)
                else:
                    await self._run_first_finished(sample)
                self.state = "finished"  # max_steps reached
                self._sample_now()
        except asyncio.CancelledError:
            self.state = "stopped"
            raise
        except Exception as exc:
            self.state = "failed"
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            if self.state in ("starting", "running"):
                self.state = "stopped"

    def _done(self) -> bool:
        return self.max_steps is not None and self.steps >= self.max_steps

    async def _run_lockstep(self, sample) -> None:
        all_ids = np.arange(self.num_envs)
        while not self._done():
            _, rewards, terms, truncs, _ = await self.venv.step(sample(self.num_envs))
            self._record(all_ids, rewards, terms, truncs)

    async def _run_first_finished(self, sample) -> None:
        venv, k = self.venv, max(1, self.num_envs // 2)
        venv.send(sample(self.num_envs))
        while True:
            r = await venv.recv(k)  # the first k envs to finish; the others keep stepping
            self._record(r.env_ids, r.rewards, r.terminations, r.truncations)
            if self._done():
                break  # results still in flight are dropped by close()
            venv.send(sample(len(r.env_ids)), r.env_ids)  # recv() above is a checkpoint: other requests run meanwhile

    def _record(self, ids: np.ndarray, rewards: np.ndarray, terms: np.ndarray, truncs: np.ndarray) -> None:
        """Per-env returns from one batch of results (rows ``ids``), NEXT_STEP autoreset semantics."""
        self.steps += len(ids)
        live = ~self._autoreset[ids]  # rows that belong to an episode (not a reset step)
        live_ids = ids[live]
        r = rewards[live].astype(np.float64)
        self._ret[live_ids] += r
        self._len[live_ids] += 1
        for i, x in zip(live_ids.tolist(), r.tolist(), strict=True):
            self._rewards[i].append(x)
        ended = (terms | truncs) & live
        self._autoreset[ids] = ended
        for row in np.flatnonzero(ended).tolist():
            i = int(ids[row])
            self.episodes.append({
                "index": self.episodes_finished, "env": i, "return": float(self._ret[i]), "length": int(self._len[i]),
                "terminated": bool(terms[row]), "truncated": bool(truncs[row]), "t": time.perf_counter() - self.t0,
                "rewards": self._rewards[i],
            })
            self.episodes_finished += 1
            self._ret[i] = 0.0
            self._len[i] = 0
            self._rewards[i] = []

    # -- live numbers -------------------------------------------------------------------
    async def sample_forever(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY_S)
            self._sample_now()

    def _sample_now(self) -> None:
        if self.venv.closed or self.state not in ("running", "finished"):
            return
        st = self.venv.stats()
        self.last_stats = st
        self.worker_pids.update(w["pid"] for w in st["workers"] if w.get("pid"))
        now = time.perf_counter() - self.t0
        prev = self.history[-1] if self.history else None
        t_prev, steps_prev = (prev["t"], prev["steps"]) if prev else (0.0, 0)
        rate = (self.steps - steps_prev) / (now - t_prev) if now > t_prev else 0.0
        lat = st["latency_s"]
        self.history.append({
            "t": round(now, 3), "steps": self.steps, "steps_per_s": rate, "num_workers": st["num_workers"],
            "latency_p50_s": _num(lat["p50"]), "latency_p99_s": _num(lat["p99"]), "episodes_finished": self.episodes_finished,
        })

    def info(self) -> dict[str, Any]:
        return {"id": self.id, "env_id": self.env_id, "num_envs": self.num_envs, "mode": self.mode, "seed": self.seed,
                "max_steps": self.max_steps, "state": self.state, "error": self.error, "created": self.created}

    def stats(self, history: int = 120) -> dict[str, Any]:
        st = self.venv.stats() if not self.venv.closed else self.last_stats
        self.worker_pids.update(w["pid"] for w in st.get("workers", ()) if w.get("pid"))
        elapsed = time.perf_counter() - self.t0 if self.state == "running" else (self.history[-1]["t"] if self.history else 0.0)
        recent = list(itertools.islice(reversed(self.episodes), KEEP_RECENT))[::-1]
        lat = st.get("latency_s", {})
        last = self.history[-1] if self.history else {}
        return {
            **self.info(),
            "num_workers": self.venv.num_workers if not self.venv.closed else 0,
            "worker_pids": sorted(self.worker_pids),
            "steps": self.steps,
            "elapsed_s": elapsed,
            "steps_per_s": last.get("steps_per_s", 0.0),  # over the last sampling interval
            "steps_per_s_total": self.steps / elapsed if elapsed > 0 else 0.0,
            "latency_s": {k: _num(v) for k, v in lat.items()},  # per worker command (one batch step)
            "episodes_finished": self.episodes_finished,
            "recent_returns": [{"index": e["index"], "return": e["return"], "length": e["length"]} for e in recent],
            "mean_recent_return": float(np.mean([e["return"] for e in recent])) if recent else None,
            "last_decision": (self.venv.control_history[-1]["reason"] if self.venv.control_history else None),
            "history": list(self.history)[-history:] if history > 0 else [],
        }

    def episode(self, n: int, gamma: float) -> dict[str, Any] | None:
        if not self.episodes or not self.episodes[0]["index"] <= n <= self.episodes[-1]["index"]:
            return None
        ep = self.episodes[n - self.episodes[0]["index"]]
        g, rtg = 0.0, []
        for r in reversed(ep["rewards"]):
            g = r + gamma * g
            rtg.append(g)
        return {**ep, "rollout": self.id, "gamma": gamma, "returns_to_go": rtg[::-1]}

    async def stop(self, timeout: float = 15.0) -> None:
        for task in (self.sampler, self.task):
            if task is not None and not task.done():
                task.cancel()
        tasks = [t for t in (self.sampler, self.task) if t is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        await self.venv.close()  # the task's `async with` closed it already; idempotent and never hangs


class LoopLag:
    """How late a periodic timer fires: the event loop's responsiveness, as the server sees it.

    Measured with ``time.perf_counter`` (uvloop's ``loop.time()`` has only 1 ms resolution), so a sample is
    the sleep's overshoot to within the loop's timer granularity; each is kept with its time so a summary
    can cover just a recent window (``/stats?lag_window_s=10``: the last 10 s) instead of the server's life.
    """

    def __init__(self, interval: float = 0.05, keep: int = 2000) -> None:
        self.interval = interval
        self.samples: deque[tuple[float, float]] = deque(maxlen=keep)  # (when it fired, lag), seconds

    async def run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.interval)
            now = time.perf_counter()
            self.samples.append((now, max(0.0, now - t - self.interval)))

    def summary(self, window_s: float | None = None) -> dict[str, Any]:
        since = time.perf_counter() - window_s if window_s is not None else -math.inf
        lags = [lag for t, lag in self.samples if t >= since]
        out: dict[str, Any] = {"samples": len(lags), "interval_s": self.interval, "window_s": window_s}
        if lags:
            a = np.asarray(lags)
            p50, p99 = np.percentile(a, (50, 99))
            out.update({"p50_s": float(p50), "p99_s": float(p99), "max_s": float(a.max())})
        return out


# -- HTTP handlers ----------------------------------------------------------------------
ROLLOUTS = web.AppKey("rollouts", dict)
LAG = web.AppKey("lag", LoopLag)
BG = web.AppKey("background", list)
CLOSING = web.AppKey("closing", asyncio.Event)


def _bad(msg: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json_dumps({"error": msg}), content_type="application/json")


def json_dumps(obj: Any) -> str:
    return json.dumps(obj, allow_nan=False)


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status, dumps=json_dumps)


async def _params(request: web.Request) -> dict[str, Any]:
    out: dict[str, Any] = dict(request.query)
    if request.body_exists:
        if request.content_type == "application/json":
            try:
                body = await request.json()
            except ValueError:
                raise _bad("the body is not valid JSON") from None
            if not isinstance(body, dict):
                raise _bad("the JSON body must be an object")
            out.update(body)
        else:
            out.update(await request.post())
    return out


def _param(params: dict[str, Any], name: str, default: Any, cast: type, what: str) -> Any:
    v = params.get(name, default)
    if v is None or v == "":
        return default
    try:
        return cast(v)
    except (TypeError, ValueError):
        raise _bad(f"{name} must be {what}, got {v!r}") from None


def _int(params: dict[str, Any], name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    v = _param(params, name, default, int, "an integer")
    if v is not None and (v < lo or (hi is not None and v > hi)):
        raise _bad(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
    return v


def _float(params: dict[str, Any], name: str, default: float | None, above: float) -> float | None:
    v = _param(params, name, default, float, "a number")
    if v is not None and not (math.isfinite(v) and v > above):
        raise _bad(f"{name} must be a finite number > {above:g}, got {v!r}")
    return v


def _rollout(request: web.Request) -> Rollout:
    try:
        rid = int(request.match_info["rid"])
        return request.app[ROLLOUTS][rid]
    except (ValueError, KeyError):
        raise web.HTTPNotFound(text=json_dumps({"error": f"no rollout {request.match_info['rid']!r}"}),
                               content_type="application/json") from None


async def launch(app: web.Application, env_id: str, num_envs: int, *, num_workers: int | str = "auto", mode: str = "step",
                 seed: int = 0, max_steps: int | None = None) -> Rollout:
    """Make the vector env (in a thread: ``aiovec.make`` builds and probes one env here) and start its tasks."""
    # placement="process": a service keeps its envs out of its own process (an env that segfaults or hangs
    # must not take the server down), even cheap ones that aiovec would otherwise step on this loop.
    venv = await asyncio.to_thread(aiovec.make, env_id, num_envs, num_workers=num_workers, placement="process")
    if app[CLOSING].is_set():  # the app is shutting down: never start workers it would not stop
        await venv.close()
        raise aiovec.ClosedError("the service is shutting down")
    rollouts = app[ROLLOUTS]
    rid = max(rollouts, default=0) + 1
    ro = rollouts[rid] = Rollout(rid, venv, env_id, mode, seed, max_steps)
    ro.task = asyncio.create_task(ro.run(), name=f"rollout-{rid}")
    ro.sampler = asyncio.create_task(ro.sample_forever(), name=f"rollout-{rid}-sampler")
    ro.task.add_done_callback(lambda _t: ro.sampler.cancel())
    return ro


async def start_rollout(request: web.Request) -> web.Response:
    p = await _params(request)
    env_id = str(p.get("env_id", "CartPole-v1"))
    num_envs = _int(p, "num_envs", 8, 1, MAX_ENVS)
    workers = p.get("num_workers", "auto")
    num_workers: int | str = "auto" if workers in ("auto", "", None) else _int(p, "num_workers", None, 1, MAX_ENVS)
    mode = str(p.get("mode", "step"))
    if mode not in ("step", "recv"):
        raise _bad(f"mode must be 'step' or 'recv', got {mode!r}")
    seed = _int(p, "seed", 0, 0)
    max_steps = _int(p, "max_steps", None, 1)
    try:
        ro = await launch(request.app, env_id, num_envs, num_workers=num_workers, mode=mode, seed=seed, max_steps=max_steps)
    except aiovec.ConfigError as exc:
        raise _bad(str(exc)) from None
    except aiovec.ClosedError:
        raise web.HTTPServiceUnavailable(text=json_dumps({"error": "shutting down"}), content_type="application/json") from None
    except Exception as exc:
        raise _bad(f"cannot make {env_id!r}: {type(exc).__name__}: {exc}") from None
    return _json(ro.info(), status=201)


async def stop_rollout(request: web.Request) -> web.Response:
    ro = _rollout(request)
    await ro.stop()
    return _json(ro.stats(history=0))


async def list_rollouts(request: web.Request) -> web.Response:
    return _json({"rollouts": [ro.info() for ro in request.app[ROLLOUTS].values()]})


async def rollout_stats(request: web.Request) -> web.Response:
    return _json(_rollout(request).stats(history=_int(dict(request.query), "history", 120, 0)))


async def all_stats(request: web.Request) -> web.Response:
    history = _int(dict(request.query), "history", 120, 0)
    window = _float(dict(request.query), "lag_window_s", None, 0.0)
    return _json({
        "time": time.time(),
        "server": {"loop_lag": request.app[LAG].summary(window)},
        "rollouts": [ro.stats(history=history) for ro in request.app[ROLLOUTS].values()],
    })


async def list_episodes(request: web.Request) -> web.Response:
    ro = _rollout(request)
    q = dict(request.query)
    since = _int(q, "since", 0, 0)
    limit = _int(q, "limit", 100, 1, KEEP_EPISODES)
    eps = [{k: v for k, v in e.items() if k != "rewards"} for e in ro.episodes if e["index"] >= since][:limit]
    return _json({"rollout": ro.id, "episodes_finished": ro.episodes_finished, "episodes": eps})


async def get_episode(request: web.Request) -> web.Response:
    ro = _rollout(request)
    try:
        n = int(request.match_info["n"])
        gamma = float(request.query.get("gamma", 0.99))
    except ValueError:
        raise _bad("episode index must be an int and gamma a float") from None
    if not 0.0 <= gamma <= 1.0:
        raise _bad(f"gamma must be in [0, 1], got {gamma}")
    ep = ro.episode(n, gamma)
    if ep is None:
        first = ro.episodes[0]["index"] if ro.episodes else None
        raise web.HTTPNotFound(text=json_dumps({"error": f"episode {n} not kept: rollout {ro.id} has "
                                                f"{ro.episodes_finished} finished episodes, kept from index {first}"}),
                               content_type="application/json")
    return _json(ep)


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})


# -- the app --------------------------------------------------------------------------
def _warm_forkserver() -> None:
    """Start aiovec's forkserver (imports numpy and gymnasium there) so a first rollout doesn't wait on the loop."""
    import multiprocessing.forkserver as fs

    from aiovec.backends.process import get_context

    if get_context(None).get_start_method() == "forkserver":
        fs.ensure_running()


async def _on_startup(app: web.Application) -> None:
    lag = app[LAG]
    app[BG].append(asyncio.create_task(lag.run(), name="loop-lag"))
    with contextlib.suppress(Exception):
        await asyncio.to_thread(_warm_forkserver)


async def _on_cleanup(app: web.Application) -> None:
    """Stop every rollout (each closes its vector env: no worker outlives the app)."""
    app[CLOSING].set()
    await asyncio.gather(*(ro.stop() for ro in app[ROLLOUTS].values()), return_exceptions=True)
    for task in app[BG]:
        task.cancel()
    await asyncio.gather(*app[BG], return_exceptions=True)


def create_app() -> web.Application:
    app = web.Application()
    app[ROLLOUTS] = {}
    app[LAG] = LoopLag()
    app[BG] = []
    app[CLOSING] = asyncio.Event()
    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC)
    app.router.add_post("/rollouts", start_rollout)
    app.router.add_get("/rollouts", list_rollouts)
    app.router.add_get("/rollouts/{rid}", rollout_stats)
    app.router.add_post("/rollouts/{rid}/stop", stop_rollout)
    app.router.add_get("/rollouts/{rid}/episodes", list_episodes)
    app.router.add_get("/rollouts/{rid}/episodes/{n}", get_episode)
    app.router.add_get("/stats", all_stats)
    app.on_startup.append(_on_startup)
    app.on_cleanup.append(_on_cleanup)
    return app


async def serve(host: str, port: int, start: list[str], num_envs: int) -> None:
    runner = web.AppRunner(create_app())
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    print(f"aiovec web service on http://{host}:{port}/  (Ctrl-C stops it)", flush=True)
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError):  # SIGTERM stops it as cleanly as Ctrl-C
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        for env_id in start:
            await launch(runner.app, env_id, num_envs)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s; 0.0.0.0 for every interface)")
    ap.add_argument("--port", type=int, default=8080, help="TCP port to listen on (default: %(default)s)")
    ap.add_argument("--start", action="append", default=[], metavar="ENV_ID",
                    help="start a rollout of this gymnasium env id at once, e.g. CartPole-v1 (repeatable; default: none, "
                         "start rollouts from the page or with POST /rollouts)")
    ap.add_argument("--num-envs", type=int, default=8, help="envs per rollout started with --start (default: %(default)s)")
    args = ap.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        aiovec.run(serve(args.host, args.port, args.start, args.num_envs))


if __name__ == "__main__":
    main()
